"""Errors a client can act on: a status, a short code (an ``ErrorCode``, core/errors.py) and
a sentence."""
from device_loop.core.errors import ErrorCode

from .store.outage import DatabaseUnavailable


class APIError(Exception):
    def __init__(self, status: int, code: ErrorCode, message: str):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers: dict[str, str] | None = None  # what REST answers besides (a 429's Retry-After)

    def to_json(self) -> dict:
        return {"error": self.code, "message": self.message}


def not_found(what: str, name: str) -> APIError:
    """404 ``unknown_WHAT`` (an ``ErrorCode``: ``ValueError`` for a ``what`` it lacks)."""
    return APIError(404, ErrorCode(f"unknown_{what}"), f"unknown {what} {name!r}")


def conflict(code: ErrorCode, message: str) -> APIError:
    return APIError(409, code, message)


def bad_request(message: str, code: ErrorCode = ErrorCode.BAD_REQUEST) -> APIError:
    return APIError(400, code, message)


def database_unavailable(exc: DatabaseUnavailable) -> APIError:
    """503 ``database_unavailable``, with the Retry-After the store asks for: the database
    cannot be reached for now (a refusal in words, never a 500)."""
    error = APIError(503, ErrorCode.DATABASE_UNAVAILABLE, str(exc))
    error.headers = {"Retry-After": str(exc.retry_after_s)}
    return error
