"""What a request body may be: how large, of which type, with how long a pause.

Each route declares the body it takes on its handler (``takes_body``; ``api.takes`` does it
for JSON models): the default is JSON of 1 MiB at most. ``BoundedBodies`` holds every reader
of the body to it (a handler, ``api.idempotent``'s fingerprint, the MCP SDK): a declared
Content-Length over the limit is refused before a byte is read, a chunked body as soon as
it passes it, and a body that stops arriving is cut. Bodies are read through the ASGI
``receive``, so what was not read yet stays in the kernel (uvicorn stops reading the
socket once 64 KiB wait), not in the coordinator's memory.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from device_loop.core.errors import ErrorCode

from .errors import APIError
from .identity import SAFE_METHODS

JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
MAX_BODY_BYTES = 1 << 20  # any JSON or form body, unless its route says otherwise
BODY_GAP_S = 30.0  # the longest a body may pause (no byte arriving), uploads included
# A body refused before its end is not read on (it may be a large one): the connection closes.
CLOSE = (b"connection", b"close")


@dataclass(frozen=True)
class Body:
    """The body a route takes."""
    max_bytes: int | None = MAX_BODY_BYTES  # None: a stream the handler bounds itself (an image)
    media_type: str | None = JSON           # None: any bytes


DEFAULT = Body()


def takes_body(max_bytes: int | None = MAX_BODY_BYTES, media_type: str | None = JSON):
    """Declare the body a handler (or an ASGI app) takes: at most ``max_bytes`` (None: it
    bounds its own stream) of ``media_type`` (None: any)."""
    def mark(handler):
        handler.request_body = Body(max_bytes, media_type)
        return handler
    return mark


def body_of(endpoint) -> Body:
    """The body ``endpoint`` (a route's handler, or None before routing) takes."""
    return getattr(endpoint, "request_body", DEFAULT)


def _readable_size(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n / 1024:g} KiB" if n >= 1024 else f"{n} bytes"


def _too_large(limit: int) -> APIError:
    return APIError(413, ErrorCode.TOO_LARGE, f"a request body may have at most {_readable_size(limit)} here: send a "
                                              "smaller one")


def check_media_type(body: Body, method: str, headers) -> None:
    """415 unless a request that sends a body says it is of the type its route takes: a web
    page on another site can send text/plain, a form or multipart without asking, never JSON."""
    if method in SAFE_METHODS or body.media_type is None:
        return
    sent = headers.get("content-type")
    if sent is None and not _has_body(headers):
        return
    if sent is None or sent.split(";")[0].strip().lower() != body.media_type:
        what = "JSON" if body.media_type == JSON else "a form"
        raise APIError(415, ErrorCode.UNSUPPORTED_MEDIA_TYPE,
                       f"send the body as {what}, with the header 'Content-Type: {body.media_type}'")


def _has_body(headers) -> bool:
    return headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in headers


class _Reader:
    """One request's ``receive``, held to its route's body."""

    def __init__(self, scope, receive, gap_s: float):
        self.scope, self.inner, self.gap_s = scope, receive, gap_s
        self.received = 0
        self.whole = False  # the body has ended: later calls only wait for a disconnect
        self.cut = False    # the body was refused before its end
        headers = dict(scope["headers"])
        self.declared = headers.get(b"content-length")
        if self.declared in (None, b"0") and b"transfer-encoding" not in headers:
            self.whole = True  # no body comes: nothing to bound or wait for

    async def receive(self):
        if self.whole:
            return await self.inner()
        limit = body_of(self.scope.get("endpoint")).max_bytes  # known once routed, i.e. when read
        if limit is not None and self.received == 0 and self.declared is not None \
                and int(self.declared) > limit:  # (uvicorn checked it is a number)
            self.cut = True
            raise _too_large(limit)
        try:
            async with asyncio.timeout(self.gap_s):
                message = await self.inner()
        except TimeoutError:
            self.cut = True
            raise APIError(408, ErrorCode.BODY_TIMEOUT, f"the request body stopped arriving for {self.gap_s:g} s: send "
                                                        "it again, without a pause") from None
        if message["type"] != "http.request":  # the caller left
            self.whole = True
            return message
        self.received += len(message.get("body", b""))
        if limit is not None and self.received > limit:
            self.cut = True
            raise _too_large(limit)
        self.whole = not message.get("more_body", False)
        return message


class BoundedBodies:
    """ASGI middleware: every request's body is read within its route's limits (above)."""

    def __init__(self, app, gap_s: float = BODY_GAP_S):
        self.app, self.gap_s = app, gap_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        reader = _Reader(scope, receive, self.gap_s)

        async def send_closing_if_cut(message) -> None:
            if message["type"] == "http.response.start" and reader.cut:
                message["headers"] = [*message.get("headers", []), CLOSE]
            await send(message)
        await self.app(scope, reader.receive, send_closing_if_cut)


async def read_body(receive) -> tuple[bytes, object]:
    """The whole body, read through ``receive`` (so within its limits), and a ``receive``
    that hands it over again, then waits for the disconnect as ``receive`` does: for an
    app that turns a failing read into a 500 of its own (the MCP SDK)."""
    chunks, more = [], True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    body, given = b"".join(chunks), False

    async def replay():
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}
    return body, replay
