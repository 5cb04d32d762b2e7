"""Errors a client can act on: a status, a short code and a sentence."""


class APIError(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def to_json(self) -> dict:
        return {"error": self.code, "message": self.message}


def not_found(what: str, name: str) -> APIError:
    return APIError(404, f"unknown_{what}", f"unknown {what} {name!r}")


def conflict(code: str, message: str) -> APIError:
    return APIError(409, code, message)


def bad_request(message: str, code: str = "bad_request") -> APIError:
    return APIError(400, code, message)
