"""One HTTP request bounded by a total deadline, for the backends that speak HTTP (pdudaemon,
Redfish).

urllib's ``timeout`` bounds each socket operation, not the call: a server that sends a
byte a second holds a read for as long as it likes. Here the connection gets what is left
of the deadline as its socket timeout before each read, the answer is read in chunks (the
deadline checked between them, the body capped at ``limit`` bytes), and a watchdog cuts the
socket at the deadline, which also bounds a status line and headers sent slowly. The
request goes to the URL's own host: no proxy from the environment, and a redirect is
returned, not followed (the caller decides where its credentials may go).
"""
from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass

CHUNK = 16384


class Late(Exception):
    """The deadline passed before the answer was whole."""

    def __init__(self, sent: bool):
        super().__init__("the deadline passed")
        self.sent = sent  # whether the request had gone out (it may have been acted on)


class Broken(Exception):
    """No answer: the connection failed, or the server broke the protocol."""

    def __init__(self, reason: BaseException, sent: bool):
        super().__init__(str(reason))
        self.reason = reason
        self.sent = sent


@dataclass(frozen=True)
class Answer:
    status: int
    reason: str
    headers: http.client.HTTPMessage
    body: bytes        # at most ``limit`` bytes of it
    truncated: bool    # the body went on past ``limit``


def _cut(sock: socket.socket) -> None:
    """The watchdog: end what the socket is blocked in (a read then sees the end of the stream).

    ``socket.socket.shutdown`` on purpose: an ``SSLSocket``'s own would drop its TLS state
    under the thread reading it."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


def request(url: str, *, deadline: float, limit: int, method: str = "GET", body: bytes | None = None,
            headers: dict[str, str] | None = None, context: ssl.SSLContext | None = None) -> Answer:
    """``method url``, answered within ``deadline`` (``time.monotonic()``): any HTTP status is
    an ``Answer``; raises ``Late`` past the deadline, ``Broken`` when there is no answer."""
    parts = urllib.parse.urlsplit(url)
    target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    sent = False

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Late(sent)
        return remaining

    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        connection = http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=left(), context=context)
    else:
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=left())
    watchdog: threading.Timer | None = None
    try:
        try:
            connection.connect()
        except (TimeoutError, socket.timeout):
            raise Late(sent) from None
        except OSError as exc:
            raise Broken(exc, sent) from None
        sock = connection.sock  # kept: the connection drops it once the answer says it closes
        watchdog = threading.Timer(left(), _cut, (sock,))
        watchdog.daemon = True
        watchdog.start()
        try:
            connection.request(method, target, body=body, headers=headers or {})
            sent = True
            sock.settimeout(left())
            answer = connection.getresponse()
            chunks: list[bytes] = []
            size = 0
            while size <= limit:
                sock.settimeout(left())
                chunk = answer.read1(min(CHUNK, limit + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            left()  # the last chunk may have come just past the deadline
        except Late:
            raise
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if time.monotonic() >= deadline or isinstance(exc, (TimeoutError, socket.timeout)):
                raise Late(sent) from None  # the watchdog cut it, or a read waited out the deadline
            raise Broken(exc, sent) from None
        data = b"".join(chunks)
        return Answer(answer.status, answer.reason, answer.headers, data[:limit], len(data) > limit)
    finally:
        if watchdog is not None:
            watchdog.cancel()
        connection.close()
