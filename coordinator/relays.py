"""What the coordinator relays for agents, who may have no terminal and no browser: one
camera snapshot, one short UART exchange (docs/architecture.md, "The parts": the only data
that passes through the coordinator, each bounded in size and time).

A snapshot is fetched only from the exporter host's own reported address, the camera
endpoint's own port and a plain path, and passed on only as a JPEG of bounded size: never
from a URL an exporter supplies, and never from an address the coordinator itself owns (its
own API, its database, what its admin named): no request at all is sent there. The address
is resolved once, and the request goes to what was checked.

An exchange's ``until`` (a regular expression an agent sends) is searched for by a child
process: a regular expression can take exponential time (``(a+)+$``), and Python's ``re``
holds the GIL all the while, which would stop every request of the coordinator.
"""
from __future__ import annotations

import asyncio
import codecs
import contextlib
import ipaddress
import os
import re
import select
import socket
import struct
import subprocess
import sys
import time
import urllib.parse
from typing import Sequence

import httpx2

from device_loop.core.gate import LocalForward
from device_loop.core.uart_client import open_uart
from device_loop.core.usage import EndpointJSON, camera_endpoint
from device_loop.core.vocabulary import EndpointRole

from device_loop.core.answers import LeaseAnswer
from device_loop.core.errors import ErrorCode
from .errors import APIError

EXCHANGE_MAX_WAIT_S = 10.0
EXCHANGE_MAX_BYTES = 64 * 1024
EXCHANGE_READ_S = 0.05  # one read of the console: how late a match may be seen
SNAPSHOT_TIMEOUT_S = 15.0  # the whole fetch of a camera's snapshot, not each read
SNAPSHOT_MAX_BYTES = 8 << 20
JPEG_MAGIC = b"\xff\xd8\xff"
_PATH_SEGMENT = re.compile(r"^[A-Za-z0-9._~-]+$")
_MEDIA_TYPE = re.compile(r"^[a-z0-9.+-]{1,30}/[a-z0-9.+-]{1,30}$")


async def camera_snapshot(lease: LeaseAnswer, host_address: str | None,
                          private: Sequence[tuple[str, int]] = ()) -> bytes:
    """The current frame of the lease's camera, as JPEG bytes (``APIError`` with the reason).
    ``private``: the addresses (host, port) the coordinator owns (``Settings.private_addresses``)."""
    device = lease["device"]
    if not lease["ready"]:
        raise APIError(409, ErrorCode.NOT_READY, f"{device}'s camera cannot be looked through now: {lease['reason']}")
    endpoint = camera_endpoint(lease)
    if endpoint is None:
        raise APIError(409, ErrorCode.NO_CAMERA, f"{device} has no camera (its endpoints: "
                                                 f"{', '.join(e['kind'] for e in lease['endpoints']) or 'none'})")
    try:
        address, port, path = _snapshot_place(host_address, lease["host"] or "", endpoint)
        ip = await _not_private(address, port, private)
        return await _fetch_snapshot(f"http://{f'[{ip}]' if ':' in ip else ip}:{port}{path}")
    except _Refused as why:
        raise APIError(409, ErrorCode.CAMERA_REFUSED, f"{device}'s camera {why}") from None


async def uart_exchange(lease: LeaseAnswer, send: str, wait_s: float, until: str | None = None) -> dict:
    """Send ``send`` to the lease's console once; what it printed within ``wait_s`` seconds, or
    until that matched the regular expression ``until``: {output, truncated, matched, waited_s}."""
    data = send.encode()
    if len(data) > EXCHANGE_MAX_BYTES:
        raise APIError(413, ErrorCode.TOO_LARGE, f"send is {len(data)} bytes; at most {EXCHANGE_MAX_BYTES // 1024} KiB "
                                                 f"go at once")
    consoles = sorted((e for e in lease["endpoints"] if e.get("role") == EndpointRole.CONSOLE),
                      key=lambda e: e.get("protocol") != "rfc2217")  # RFC 2217 sets the line; raw cannot
    if not lease["ready"] or not consoles:
        raise APIError(409, ErrorCode.NO_CONSOLE, f"{lease['device']} has no UART to talk to now: {lease['reason']}")
    wait = min(max(wait_s, 0.0), EXCHANGE_MAX_WAIT_S)
    try:
        return await asyncio.to_thread(_exchange, consoles[0], data, wait, consoles[0].get("secret"), until)
    except _NoSearcher as exc:
        raise APIError(503, ErrorCode.NO_SEARCHER, f"cannot search {lease['device']}'s output for until now: "
                                                   f"{exc}") from None
    except Exception as exc:  # the serial link: refused, lost, busy
        raise APIError(409, ErrorCode.CONSOLE_UNREACHABLE, f"cannot talk to {lease['device']}'s UART: {exc}") from None


def _exchange(endpoint: EndpointJSON, send: bytes, wait_s: float, secret: str | None, until: str | None) -> dict:
    """One exchange on a console (a worker thread's): send, then read until ``wait_s`` is up,
    ``EXCHANGE_MAX_BYTES`` came, or what came matched ``until``."""
    with contextlib.ExitStack() as stack:
        searcher = stack.enter_context(_Searcher(until)) if until is not None else None
        if secret:  # the local port lives only for this exchange
            endpoint = stack.enter_context(LocalForward(endpoint, secret)).endpoint
        port = stack.enter_context(contextlib.closing(open_uart(endpoint, timeout=EXCHANGE_READ_S)))
        port.write(send)
        output, matched = b"", False
        began = time.monotonic()
        deadline = began + wait_s
        while not matched and len(output) <= EXCHANGE_MAX_BYTES and time.monotonic() < deadline:
            read = port.read(4096)
            if searcher is not None:
                seen = read[:max(EXCHANGE_MAX_BYTES - len(output), 0)]  # only what the answer shows
                matched = searcher.matched(seen, min(EXCHANGE_READ_S, max(deadline - time.monotonic(), 0)))
            output += read
        waited = time.monotonic() - began
    cut = len(output) > EXCHANGE_MAX_BYTES
    return {"output": output[:EXCHANGE_MAX_BYTES].decode(errors="replace"), "truncated": cut, "matched": matched,
            "waited_s": round(waited, 3)}


class _NoSearcher(Exception):
    """The child process that searches for ``until`` could not start."""


# The searcher's program: the pattern, then pieces of text, each framed by its length; it
# answers each piece with b"1" once the text so far matches, else b"0". Its CPU time and
# memory are bounded, so that a search outlives no coordinator killed meanwhile.
_SEARCHER = """
import re, resource, struct, sys
cpu = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))
def piece():
    head = sys.stdin.buffer.read(4)
    if len(head) < 4:
        sys.exit(0)
    return sys.stdin.buffer.read(struct.unpack(">I", head)[0]).decode()
pattern, text = re.compile(piece()), ""
while True:
    text += piece()
    sys.stdout.buffer.write(b"1" if pattern.search(text) else b"0")
    sys.stdout.buffer.flush()
"""


class _Searcher:
    """``until`` searched for in the text a console printed so far (UTF-8, errors replaced),
    by a child process killed when the exchange ends, done searching or not. One search at a
    time: what arrives meanwhile is searched next, with all that came before."""

    def __init__(self, pattern: str):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._unsent, self._asked, self._gone = "", False, False
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _SEARCHER, str(int(EXCHANGE_MAX_WAIT_S) + 5)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        except OSError as exc:
            raise _NoSearcher(exc) from None
        self._tell(pattern)

    def __enter__(self) -> _Searcher:
        return self

    def __exit__(self, *_: object) -> None:
        self._child.kill()
        self._child.wait()
        for pipe in (self._child.stdin, self._child.stdout):
            with contextlib.suppress(OSError):  # what a failed write left unflushed goes nowhere
                if pipe is not None:
                    pipe.close()

    def matched(self, data: bytes, wait_s: float) -> bool:
        """Whether the text so far, ``data`` (just read) included, matched, as far as the child
        has searched it; its answer is waited for ``wait_s`` seconds at most."""
        self._unsent += self._decoder.decode(data)
        if not self._asked and self._unsent and not self._gone:
            self._tell(self._unsent)
            self._unsent, self._asked = "", True
        if not self._asked or self._gone:
            return False
        assert self._child.stdout is not None
        if not select.select([self._child.stdout], [], [], wait_s)[0]:
            return False  # still searching
        answer = os.read(self._child.stdout.fileno(), 1)
        self._asked = False
        self._gone = answer not in (b"0", b"1")  # it ran out of memory or CPU time: nothing matches now
        return answer == b"1"

    def _tell(self, text: str) -> None:
        data = text.encode()
        assert self._child.stdin is not None
        try:
            self._child.stdin.write(struct.pack(">I", len(data)) + data)
            self._child.stdin.flush()
        except OSError:  # it is gone (out of memory)
            self._gone = True


class _Refused(Exception):
    """Why a camera's snapshot is not handed to the agent (it follows "DEVICE's camera")."""


def _snapshot_place(address: str | None, host: str, endpoint: EndpointJSON) -> tuple[str, int, str]:
    """Where a camera's snapshot is fetched (never a URL an exporter supplies), as (address,
    port, path): the host's own address, the endpoint's port, and a plain path (its URL's,
    then its ``snapshot`` param, as the video plugin reports them)."""
    if address is None:
        raise _Refused(f"cannot be looked through: host {host}'s exporter did not report its address (an older "
                       "device-loop?), and the coordinator fetches a snapshot only from a host's own address; "
                       "upgrade that exporter")
    if endpoint["host"] != address:
        raise _Refused(f"is at {endpoint['host']}, not at host {host}'s own address {address}")
    try:
        base = urllib.parse.urlsplit(endpoint.get("url") or "/").path or "/"
    except ValueError:
        base = "?"
    path = base[:base.rindex("/") + 1] + endpoint["params"]["snapshot"] if "/" in base else "?"
    if not path.startswith("/") or not all(_PATH_SEGMENT.match(segment) and segment not in (".", "..")
                                           for segment in path.split("/")[1:]):
        raise _Refused(f"has a snapshot path that is not a plain path ({path[:100]!r}): letters, digits, "
                       "'.', '_', '~', '-' between slashes")
    return address, int(endpoint["port"]), path


def private_addresses(host: str, port: int, database_url: str,
                      named: Sequence[str] = ()) -> tuple[tuple[str, int], ...]:
    """What the coordinator owns, which a snapshot is never fetched from: where it listens
    (``host``, ``port``), its PostgreSQL server, and what its admin ``named`` (``HOST:PORT``,
    e.g. another coordinator process on this machine). Other ports of this machine may well be
    an exporter's services (``device-loop up`` runs both here)."""
    own = [(host, port)]
    database = urllib.parse.urlsplit(database_url)
    if database.scheme.startswith("postgres"):
        own.append((database.hostname or "127.0.0.1", database.port or 5432))
    for place in named:
        name, _, number = place.rpartition(":")
        if not name or not number.isdigit() or not 0 < int(number) < 65536:
            raise ValueError(f"{place!r} is not HOST:PORT")
        own.append((name.strip("[]"), int(number)))
    return tuple(own)


async def _not_private(address: str, port: int, private: Sequence[tuple[str, int]]) -> str:
    """``address`` resolved once, to the IP address the snapshot is fetched from; refused if
    it is one the coordinator owns at ``port`` (on this machine, any of its addresses)."""
    ips = await _resolve(address, port)
    if not ips:
        raise _Refused(f"cannot be reached: {address} resolves to no address")
    for own_host, own_port in private:
        if own_port != port:
            continue
        own_ips = await _resolve(own_host, own_port)
        if set(own_ips) & set(ips) or (any(map(_this_machine, ips)) and any(map(_this_machine, own_ips))):
            raise _Refused(f"is at {address}:{port}, an address the coordinator itself owns: it fetches nothing there")
    return ips[0]


async def _resolve(host: str, port: int) -> list[str]:
    """The IP addresses ``host`` names, in the resolver's order (an IPv4 address inside an
    IPv6 one as itself)."""
    try:
        found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    ips: dict[str, None] = {}
    for *_, sockaddr in found:
        ip = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        mapped = getattr(ip, "ipv4_mapped", None)
        ips[str(mapped or ip)] = None
    return list(ips)


def _this_machine(ip: str) -> bool:
    """Whether ``ip`` is an address of this machine (a wildcard one too): it can be bound."""
    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((ip, 0))
        except OSError:
            return False
    return True


async def _fetch_snapshot(url: str) -> bytes:
    """A camera's current frame: a JPEG (by its first bytes) of ``SNAPSHOT_MAX_BYTES`` at
    most, within ``SNAPSHOT_TIMEOUT_S``, no redirect followed, no proxy, nothing decompressed."""
    body = bytearray()
    try:
        async with asyncio.timeout(SNAPSHOT_TIMEOUT_S):
            async with httpx2.AsyncClient(timeout=SNAPSHOT_TIMEOUT_S, follow_redirects=False, trust_env=False) as http:
                async with http.stream("GET", url, headers={"Accept": "image/jpeg",
                                                            "Accept-Encoding": "identity"}) as answer:
                    _check_head(answer)
                    async for chunk in answer.aiter_raw():
                        body += chunk
                        if len(body) > SNAPSHOT_MAX_BYTES:
                            raise _Refused(f"sent more than {SNAPSHOT_MAX_BYTES >> 20} MiB: a snapshot is smaller")
    except TimeoutError:
        raise _Refused(f"did not send its frame within {SNAPSHOT_TIMEOUT_S:g} s") from None
    except httpx2.HTTPError as exc:
        raise _Refused(f"cannot be reached: {exc}") from None
    if not body.startswith(JPEG_MAGIC):
        raise _Refused("sent something that is not a JPEG image")
    return bytes(body)


def _check_head(answer: httpx2.Response) -> None:
    """Refuse an answer by its status and headers (what they say is the server's: only
    the status code and a well-formed media type are repeated)."""
    if 300 <= answer.status_code < 400:
        raise _Refused(f"answered {answer.status_code}, a redirect: the coordinator follows none")
    if answer.status_code != 200:
        raise _Refused(f"answered {answer.status_code}")
    media = answer.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "image/jpeg":
        raise _Refused(f"answered {media if _MEDIA_TYPE.match(media) else 'something'}, not image/jpeg")
    if answer.headers.get("content-encoding", "identity").strip().lower() not in ("", "identity"):
        raise _Refused("sent its frame encoded (compressed): the coordinator takes a plain JPEG only")
    declared = answer.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > SNAPSHOT_MAX_BYTES:
        raise _Refused(f"would send {int(declared) >> 20} MiB: a snapshot is at most {SNAPSHOT_MAX_BYTES >> 20} MiB")


