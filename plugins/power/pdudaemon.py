"""Switching an outlet through pdudaemon's HTTP listener (it cannot read an outlet back)."""
from __future__ import annotations

import socket
import urllib.error
import urllib.parse
import urllib.request

from device_loop.plugin import OperationError, PowerReading


def control_url(config, action: str) -> str:
    """The URL that asks pdudaemon to switch ``config``'s outlet ``action`` (on or off)."""
    host = f"[{config.host}]" if ":" in config.host else config.host
    query = urllib.parse.urlencode({"hostname": config.pdu, "port": config.outlet})
    return f"http://{host}:{config.port}/power/control/{action}?{query}"


def power(host, resource, action: str) -> PowerReading:
    """Ask pdudaemon to switch the outlet; its answer is all there is (no read-back)."""
    config = resource.config
    what = f"outlet {config.outlet} of {config.pdu}"
    if action == "status":
        return PowerReading(None, f"pdudaemon has no status: {what} not read back")
    url = control_url(config, action)
    try:
        with urllib.request.urlopen(url, timeout=config.timeout) as answer:
            said = answer.read(2000).decode(errors="replace").strip()
    except urllib.error.HTTPError as exc:
        said = exc.read(2000).decode(errors="replace").strip() if exc.fp else ""
        # pdudaemon answers 500 "Invalid request" when it refused the request before switching
        # (an unknown PDU, a missing parameter)
        refused = exc.code == 500 and "invalid request" in said.lower()
        hint = f" (is there a PDU {config.pdu!r} in its config?)" if refused else ""
        raise OperationError(f"pdudaemon refused {url}: HTTP {exc.code}" + (f" {said!r}" if said else "") + hint,
                             changed=not refused) from None
    except (TimeoutError, socket.timeout):
        raise OperationError(f"pdudaemon did not answer {url} within {config.timeout:g}s") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, (TimeoutError, socket.timeout)):
            raise OperationError(f"pdudaemon did not answer {url} within {config.timeout:g}s") from None
        refused = isinstance(reason, (ConnectionRefusedError, socket.gaierror))
        text = getattr(reason, "strerror", None) or str(reason)
        raise OperationError(f"cannot reach pdudaemon at {config.host}:{config.port} ({url}): {text}"
                             + (" (is pdudaemon running, with its http listener?)" if refused else ""),
                             changed=not refused) from None
    return PowerReading(None, f"pdudaemon switched {what} {action} ({said or 'no answer text'}); not read back")
