"""Talking to the coordinator's REST API, with retries that are safe to repeat."""
from __future__ import annotations

import getpass
import os
import time
import uuid

import httpx2

from device_loop.core.tokens import TokenFileError, load_token

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
        try:
            token = token or load_token()
        except TokenFileError as exc:
            raise CoordinatorError("token_file_unsafe", str(exc)) from None
        headers = {USER_HEADER: self.user} | ({"Authorization": f"Bearer {token}"} if token else {})
        # a TLS context costs 30 ms of every command's start: only an https:// coordinator needs one
        self.http = httpx2.Client(base_url=self.url, timeout=timeout, headers=headers,
                                  verify=self.url.startswith("https://"))

    def close(self) -> None:
        self.http.close()

    def get(self, path: str, **params):
        """A read; a long-poll (``wait=S``) gets S seconds more than the usual timeout."""
        timeout = (self.http.timeout.read or 0.0) + float(params.get("wait", 0))  # (read is set: __init__)
        return self._request("GET", path, params=params or None, timeout=timeout)

    def post(self, path: str, body: dict | None = None):
        """A mutating call: one Idempotency-Key, reused on every retry."""
        return self._request("POST", path, json=body or {}, headers={"Idempotency-Key": uuid.uuid4().hex})

    def upload(self, path: str, params: dict, chunks):
        """POST a body streamed from ``chunks`` (an iterator of bytes); tried once: a body
        that was partly sent cannot be sent again. The upload itself may take long."""
        timeout = httpx2.Timeout(self.http.timeout.read, write=None, read=600.0)
        return self._request("POST", path, params=params, content=chunks, timeout=timeout, retries=1)

    def _request(self, method: str, path: str, retries: int | None = None, **kwargs):
        retries = retries or self.retries
        for attempt in range(retries):
            try:
                response = self.http.request(method, f"/api/v1{path}", **kwargs)
                break
            except httpx2.TransportError as exc:
                if attempt == retries - 1:
                    raise CoordinatorError("unreachable",
                                           f"cannot reach the coordinator at {self.url}: {exc}") from None
                time.sleep(0.2 * 2 ** attempt)
        try:
            data = response.json()
        except ValueError:
            raise CoordinatorError("bad_answer", f"{self.url} answered {response.status_code} without JSON; "
                                   "is that a device-loop coordinator?", response.status_code) from None
        if response.status_code >= 400:
            raise CoordinatorError(data.get("error", "error"), data.get("message", response.text), response.status_code)
        return data
