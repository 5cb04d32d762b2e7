"""Requests from where they should come from: a known Host, and no page of another origin.

Tokens travel in a header a web page cannot set, but tailnet identities and the trust
mode of ``up`` are ambient, like cookies: a page in someone's browser could use them.
So every route answers only the Host names this lab is reached by (loopback and what
the admin configured; anything else, e.g. DNS rebinding, gets 421), and refuses a
request a browser marks as coming from another origin, except a person following a link
to one of the web pages (a navigation: a GET that shows the page to whoever clicked, and
whose answer the other site never sees).

Same-site is not same-origin: a page on another port of the lab's host (any local web
server, another ``up``) is the same site, and its cookies and ours are shared. So an
``Origin`` must name the host *and port* the request was sent to, its ``Host``; the scheme
is not compared, since behind a proxy that terminates TLS the page is https and the
coordinator sees http (one port speaks one of them). ``Sec-Fetch-Site: same-site`` is
refused like ``cross-site``.
"""
from __future__ import annotations

from urllib.parse import urlsplit

from starlette.responses import JSONResponse

from device_loop.core.errors import ErrorCode

LOOPBACK = ["127.0.0.1", "localhost", "[::1]"]


def allowed_hosts(extra: list[str]) -> list[str]:
    """Host headers the coordinator answers: loopback plus what the admin configured, in
    the MCP SDK's form, which matches ``name:*`` only when a port is present (so each name
    goes in twice)."""
    def has_port(name: str) -> bool:
        return ":" in (name.rsplit("]", 1)[-1] if name.startswith("[") else name)

    names = LOOPBACK + [h for h in extra if h not in LOOPBACK]
    return [form for name in names for form in ((name,) if has_port(name) else (name, f"{name}:*"))]


def _name(host: str) -> str:
    """``Name:port`` -> ``name`` (``[::1]:7420`` -> ``[::1]``); host names know no case."""
    host = host.lower()
    if host.startswith("["):
        return host.split("]")[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_authority(origin: str) -> str | None:
    """``https://Lab.tailnet:443`` -> ``lab.tailnet``: the Host header a browser sends to
    that origin; None for what is no web origin (``null``, ``file:``...)."""
    parts = urlsplit(origin.lower())
    try:
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return parts.netloc.rsplit(":", 1)[0] if port == DEFAULT_PORTS[parts.scheme] else parts.netloc


def _from_elsewhere(scope, headers: dict[str, str]) -> bool:
    """Whether a browser says this request comes from a page of another origin."""
    if headers.get("sec-fetch-site") in ("cross-site", "same-site") and not _page_navigation(scope, headers):
        return True
    return "origin" in headers and _origin_authority(headers["origin"]) != headers.get("host", "").lower()


def _page_navigation(scope, headers: dict[str, str]) -> bool:
    """A link followed to a web page (not to the API), into a window: a frame navigates too,
    and a page framed by another site could be clicked through (clickjacking)."""
    return (scope["method"] == "GET" and headers.get("sec-fetch-mode") == "navigate"
            and headers.get("sec-fetch-dest") == "document" and not scope["path"].startswith(("/api/", "/mcp")))


# browsers that send no Sec-Fetch headers still refuse to show any answer in another site's frame
NOT_IN_FRAMES = [(b"x-frame-options", b"DENY"), (b"content-security-policy", b"frame-ancestors 'none'")]


class KnownOrigins:
    """ASGI middleware: 421 for an unknown Host, 403 for a browser's request from another origin."""

    def __init__(self, app, allowed: list[str]):
        self.app = app
        self.names = {_name(h) for h in LOOPBACK + list(allowed)}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode().lower(): v.decode(errors="replace") for k, v in scope["headers"]}
        problem = None
        if _name(headers.get("host", "")) not in self.names:
            host = headers.get("host", "")
            problem = (421, ErrorCode.UNKNOWN_HOST, f"this coordinator does not answer to Host {host!r}; an admin "
                                                    "adds it with --allowed-host")
        elif _from_elsewhere(scope, headers):
            problem = (403, ErrorCode.CROSS_SITE, "requests from a page of another web site, or of another port of "
                                                  "this host, are refused")
        if problem:
            status, code, message = problem
            return await JSONResponse({"error": code, "message": message}, status_code=status)(scope, receive, send)

        async def send_not_in_frames(message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *NOT_IN_FRAMES]
            await send(message)
        return await self.app(scope, receive, send_not_in_frames)
