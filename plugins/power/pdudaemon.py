"""Switching an outlet through pdudaemon's HTTP listener (it cannot read an outlet back)."""
from __future__ import annotations

import socket
import time
import urllib.parse
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from device_loop.plugin import OperationError, PowerReading

from . import web
from .keys import BackendKeys


ANSWER_LIMIT = 64 * 1024  # pdudaemon answers a line; more than this is not read


def control_url(config, action: str) -> str:
    """The URL that asks pdudaemon to switch ``config``'s outlet ``action`` (on or off)."""
    host = f"[{config.host}]" if ":" in config.host else config.host
    query = urllib.parse.urlencode({"hostname": config.pdu, "port": config.outlet})
    return f"http://{host}:{config.port}/power/control/{action}?{query}"


def power(host, resource, action: str) -> PowerReading:
    """Ask pdudaemon to switch the outlet; its answer is all there is (no read-back). The
    call, the answer's last byte included, takes at most the entry's ``timeout``."""
    config = resource.config.settings
    what = f"outlet {config.outlet} of {config.pdu}"
    if action == "status":
        return PowerReading(None, f"pdudaemon has no status: {what} not read back")
    url = control_url(config, action)
    try:
        answer = web.request(url, deadline=time.monotonic() + config.timeout, limit=ANSWER_LIMIT)
    except web.Late as exc:
        raise OperationError(f"pdudaemon did not answer {url} within {config.timeout:g}s",
                             changed=exc.sent) from None
    except web.Broken as exc:
        reason = exc.reason
        refused = not exc.sent and isinstance(reason, (ConnectionRefusedError, socket.gaierror))
        text = getattr(reason, "strerror", None) or str(reason) or type(reason).__name__
        raise OperationError(f"cannot reach pdudaemon at {config.host}:{config.port} ({url}): {text}"
                             + (" (is pdudaemon running, with its http listener?)" if refused else ""),
                             changed=exc.sent) from None
    said = answer.body[:2000].decode(errors="replace").strip()
    if answer.status >= 300:
        # pdudaemon answers 500 "Invalid request" when it refused the request before switching
        # (an unknown PDU, a missing parameter)
        refused = answer.status == 500 and "invalid request" in said.lower()
        hint = f" (is there a PDU {config.pdu!r} in its config?)" if refused else ""
        raise OperationError(f"pdudaemon refused {url}: HTTP {answer.status}" + (f" {said!r}" if said else "")
                             + hint, changed=not refused)
    return PowerReading(None, f"pdudaemon switched {what} {action} ({said or 'no answer text'}); not read back")


class Keys(BackendKeys):
    """An outlet of a PDU that pdudaemon drives, through its HTTP listener."""
    OFF_TIME: ClassVar[float] = 5.0
    backend: Literal["pdudaemon"]
    host: str = Field(default="127.0.0.1", min_length=1, description="pdudaemon's address")
    port: int = Field(default=16421, ge=1, le=65535, description="pdudaemon's port")
    pdu: str = Field(min_length=1, description="the PDU's name in pdudaemon's config")
    outlet: int | str = Field(description="the PDU's outlet")

    @field_validator("outlet")
    @classmethod
    def _outlet(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 0:
            raise ValueError(f"an outlet is a number from 0 or a name, not {value}")
        if isinstance(value, str) and not value.strip():
            raise ValueError("an outlet's name must not be blank")
        return value
