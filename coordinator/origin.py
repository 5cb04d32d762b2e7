"""Requests from where they should come from: a known Host, and no cross-site browser.

Tokens travel in a header a web page cannot set, but tailnet identities and the trust
mode of ``up`` are ambient, like cookies: a page in someone's browser could use them.
So every route answers only the Host names this lab is reached by (loopback and what
the admin configured; anything else, e.g. DNS rebinding, gets 421), and refuses a
request a browser marks as coming from another site, except a person following a link
to one of the web pages (a navigation: a GET that shows the page to whoever clicked, and
whose answer the other site never sees).
"""
from __future__ import annotations

from urllib.parse import urlsplit

from starlette.responses import JSONResponse

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


def _page_navigation(scope, headers: dict[str, str]) -> bool:
    """A link followed to a web page (not to the API), into a window: a frame navigates too,
    and a page framed by another site could be clicked through (clickjacking)."""
    return (scope["method"] == "GET" and headers.get("sec-fetch-mode") == "navigate"
            and headers.get("sec-fetch-dest") == "document" and not scope["path"].startswith(("/api/", "/mcp")))


# browsers that send no Sec-Fetch headers still refuse to show any answer in another site's frame
NOT_IN_FRAMES = [(b"x-frame-options", b"DENY"), (b"content-security-policy", b"frame-ancestors 'none'")]


class KnownOrigins:
    """ASGI middleware: 421 for an unknown Host, 403 for a cross-site browser request."""

    def __init__(self, app, allowed: list[str]):
        self.app = app
        self.names = {_name(h) for h in LOOPBACK + list(allowed)}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode().lower(): v.decode(errors="replace") for k, v in scope["headers"]}
        problem = None
        if _name(headers.get("host", "")) not in self.names:
            problem = (421, "unknown_host", f"this coordinator does not answer to Host {headers.get('host', '')!r}; "
                                            "an admin adds it with --allowed-host")
        elif (headers.get("sec-fetch-site") == "cross-site" and not _page_navigation(scope, headers)) or (
                "origin" in headers and _name(urlsplit(headers["origin"]).netloc) not in self.names):
            problem = (403, "cross_site", "requests from another web site are refused")
        if problem:
            status, code, message = problem
            return await JSONResponse({"error": code, "message": message}, status_code=status)(scope, receive, send)

        async def send_not_in_frames(message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *NOT_IN_FRAMES]
            await send(message)
        return await self.app(scope, receive, send_not_in_frames)
