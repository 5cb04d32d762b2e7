"""Talking to the coordinator's REST API, with retries that are safe to repeat.

Plain requests go through the standard library's ``http.client`` on one kept-alive
connection: a command starts for every ``device-loop exec`` a job runs, and importing and
setting up httpx2's transport cost some 300 ms of each. httpx2 is loaded only for what
needs it: uploads and event streams (``http``).

A request is asked again only if repeating it is safe: a GET, a request with an
Idempotency-Key (the coordinator answers a repeat once), or one its caller says is harmless
to repeat (a keep-alive). Such a request is sent again when it went unanswered (the
coordinator restarted, a kept-alive connection it closed) and after a "not now" with a short
Retry-After (429, a share's rate; 503, the lab's database away for a moment), while the
call's time lasts. Any other request is sent once, on a connection of its own: a refusal or
an unanswered request is reported in words.
"""
from __future__ import annotations

import getpass
import http.client
import json
import os
import threading
import time
import urllib.parse
import uuid
from typing import Any

from device_loop.core import API_PREFIX, TOKEN_IGNORED_HEADER
from device_loop.core.tokens import TokenFileError, load_token, token_source
from device_loop.core.errors import ErrorCode

DEFAULT_URL = "http://127.0.0.1:7420"
USER_HEADER = "X-Device-Loop-User"


class CoordinatorError(Exception):
    """The coordinator refused (``status`` 4xx) or could not be reached (``status`` 0)."""

    def __init__(self, code: str, message: str, status: int = 0):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


def default_url() -> str:
    return os.environ.get("DEVICE_LOOP_COORDINATOR", DEFAULT_URL)


def default_user() -> str:
    return os.environ.get("DEVICE_LOOP_USER") or getpass.getuser()


class Coordinator:
    def __init__(self, url: str | None = None, user: str | None = None, timeout: float = 15.0, retries: int = 3,
                 token: str | None = None):
        self.url = (url or default_url()).rstrip("/")
        self.user = user or default_user()
        self.retries = retries
        # a token found where load_token looks (not one passed in): a refusal of it says where it is
        self._token_found = not token
        try:
            token = token or load_token()
        except TokenFileError as exc:
            raise CoordinatorError(ErrorCode.TOKEN_FILE_UNSAFE, str(exc)) from None
        self._token_found = self._token_found and token is not None
        self.headers = {USER_HEADER: self.user} | ({"Authorization": f"Bearer {token}"} if token else {})
        self.timeout = timeout
        parts = urllib.parse.urlsplit(self.url)
        self._https = parts.scheme == "https"
        self._netloc, self._base_path = parts.netloc, parts.path.rstrip("/")
        # one kept-alive connection per thread: a Coordinator is shared by threads (a job's
        # cells, its beat) as httpx2's client was, and an http.client connection is not
        self._connections = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._all_lock = threading.Lock()
        self._http: Any = None
        self.token_ignored = False  # the coordinator said it did not use our token (the trust mode)

    @property
    def http(self):
        """An httpx2 client on the same coordinator (event streams), made when first asked for."""
        if self._http is None:
            import httpx2

            # a TLS context costs 30 ms: only an https:// coordinator needs one
            self._http = httpx2.Client(base_url=self.url, timeout=self.timeout, headers=self.headers,
                                       verify=self._https)
        return self._http

    def close(self) -> None:
        with self._all_lock:
            connections, self._all = self._all, []
        for connection in connections:
            connection.close()
        self._connections = threading.local()
        if self._http is not None:
            self._http.close()

    def get(self, path: str, **params):
        """A read; a long-poll (``wait=S``) gets S seconds more than the usual timeout."""
        return self._request("GET", path, params=params, timeout=self.timeout + float(params.get("wait", 0)))

    def post(self, path: str, body: dict | None = None, key: str | None = None, *, keyed: bool = True,
             timeout: float | None = None):
        """A mutating call: one Idempotency-Key (``key``, else a new one), reused on every retry;
        none when not ``keyed`` (a call that is harmless to repeat, and too frequent to have a
        key stored for each: a keep-alive). ``timeout``: each try's, else the client's."""
        headers = {"Content-Type": "application/json"} | ({"Idempotency-Key": key or uuid.uuid4().hex} if keyed else {})
        return self._request("POST", path, body=json.dumps(body or {}).encode(), headers=headers, timeout=timeout,
                             repeatable=True)

    def upload(self, path: str, params: dict, chunks):
        """POST a body streamed from ``chunks`` (an iterator of bytes); tried once: a body
        that was partly sent cannot be sent again. The upload itself may take long."""
        import httpx2

        try:
            response = self.http.request("POST", f"{API_PREFIX}{path}", params=params, content=chunks,
                                         timeout=httpx2.Timeout(self.timeout, write=None, read=600.0))
        except httpx2.TransportError as exc:
            raise CoordinatorError(ErrorCode.UNREACHABLE, f"cannot reach the coordinator at {self.url}: "
                                                          f"{exc}") from None
        return self._answer(response.status_code, response.content)

    def _request(self, method: str, path: str, params: dict | None = None, body: bytes | None = None,
                 headers: dict[str, str] | None = None, timeout: float | None = None, repeatable: bool = False):
        """The answer to one call; ``timeout``: each try's and the whole call's, else the
        client's. ``repeatable``: harmless to send twice, though neither a GET nor keyed."""
        target = f"{self._base_path}{API_PREFIX}{path}"
        if params:
            target += "?" + urllib.parse.urlencode({k: _query_value(v) for k, v in params.items()}, doseq=True)
        headers = self.headers | (headers or {})
        repeatable = repeatable or method == "GET" or "Idempotency-Key" in headers
        timeout = timeout or self.timeout
        deadline = time.monotonic() + timeout
        unanswered = 0
        while True:
            if not repeatable:  # (a kept-alive connection the coordinator closed meanwhile would lose it)
                self._drop()
            try:
                status, content, retry_after = self._exchange(method, target, body, headers, timeout)
            except (OSError, http.client.HTTPException) as exc:
                self._drop()  # a kept-alive connection the server closed, or no server: a new one
                unanswered += 1
                if not repeatable and not isinstance(exc, ConnectionRefusedError):  # (refused: nothing was sent)
                    raise CoordinatorError(ErrorCode.UNREACHABLE, f"the coordinator at {self.url} did not answer "
                                           f"{method} {path} ({exc}); it may or may not have been carried out, and "
                                           "was not sent again (it has no Idempotency-Key)") from None
                if unanswered == self.retries:
                    raise CoordinatorError(ErrorCode.UNREACHABLE,
                                           f"cannot reach the coordinator at {self.url}: {exc}") from None
                if not isinstance(exc, (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)):
                    time.sleep(0.2 * 2 ** (unanswered - 1))
                continue
            # "not now": a share's rate (429: nothing was done, docs/architecture.md "Shares of one lab"),
            # the lab's database away for a moment (503: repeated only if that is safe)
            if retry_after is not None and (status == 429 or status == 503 and repeatable) \
                    and time.monotonic() + retry_after < deadline:
                time.sleep(retry_after)
                continue
            return self._answer(status, content)

    def _exchange(self, method: str, target: str, body: bytes | None, headers: dict[str, str],
                  timeout: float) -> tuple[int, bytes, float | None]:
        """(status, body, how long a 429 or 503 asks to wait: its Retry-After, at most ``MAX_RETRY_AFTER_S``)."""
        connection = getattr(self._connections, "connection", None)
        if connection is None:
            connection_class = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            connection = self._connections.connection = connection_class(self._netloc, timeout=timeout)
            with self._all_lock:
                self._all.append(connection)
        connection.timeout = timeout
        if connection.sock is not None:
            connection.sock.settimeout(timeout)
        connection.request(method, target, body=body, headers=headers)
        response = connection.getresponse()
        content = response.read()
        if response.will_close:
            self._drop()
        if response.getheader(TOKEN_IGNORED_HEADER) and not self.token_ignored:
            self.token_ignored = True  # (said once: logging's last resort writes a warning to stderr)
            import logging  # (here, not at the top: every command's start would pay 4 ms for it)

            logging.getLogger("device_loop.client").warning(
                "device-loop: %s runs in the trust mode (device-loop up) and ignores tokens: yours was not used, "
                "and every local caller may do everything (a token's scope and budget do not apply here); a lab "
                "with tokens is started with `device-loop up --tokens`", self.url)
        return response.status, content, _retry_after(response.getheader("Retry-After"))

    def _drop(self) -> None:
        """Close this thread's connection; its next request opens another."""
        connection = getattr(self._connections, "connection", None)
        if connection is not None:
            self._connections.connection = None
            with self._all_lock:
                self._all = [c for c in self._all if c is not connection]
            connection.close()

    def _answer(self, status: int, content: bytes):
        try:
            data = json.loads(content)
        except ValueError:
            raise CoordinatorError(ErrorCode.BAD_ANSWER, f"{self.url} answered {status} without JSON; "
                                   "is that a device-loop coordinator?", status) from None
        if status >= 400:
            if not isinstance(data, dict):
                raise CoordinatorError(ErrorCode.ERROR, content.decode(errors="replace")[:2000], status)
            message = data.get("message", "")
            if data.get("error") == ErrorCode.BAD_TOKEN and self._token_found:  # (what to do next, and where it is)
                message += (f": the token in {token_source()} is not this lab's (a lab's admin makes one: device-loop "
                            f"admin token create NAME), or unset it for what anyone may read")
            raise CoordinatorError(data.get("error", "error"), message, status)
        return data


def _query_value(value):
    """A query parameter as httpx writes it: true/false, an empty value for None, lists repeated."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return [_query_value(v) for v in value]
    return value


MAX_RETRY_AFTER_S = 5.0  # a wait longer than this is the caller's to decide: the refusal is raised


def _retry_after(header: str | None) -> float | None:
    """A Retry-After in seconds worth waiting here, or None (absent, a date, or too long)."""
    try:
        seconds = float(header) if header is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds <= MAX_RETRY_AFTER_S else None
