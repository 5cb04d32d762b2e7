"""Who is calling: the one function every route asks (DESIGN §7)."""
from dataclasses import dataclass

from starlette.requests import Request

USER_HEADER = "X-Device-Loop-User"


@dataclass(frozen=True)
class Identity:
    name: str


def caller_identity(request: Request) -> Identity:
    """The caller of ``request``.

    This release runs in single-user trust mode only: the caller is whoever the
    ``X-Device-Loop-User`` header names (the CLI and client send the login name), or
    ``anonymous``. Nothing checks that claim; the README says so. Tokens (issue #4)
    plug in here and nowhere else.
    """
    name = request.headers.get(USER_HEADER, "").strip()[:64]
    return Identity(name or "anonymous")
