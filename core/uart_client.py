"""Opening a lease's UART endpoint as a pyserial port: RFC 2217 or raw TCP."""
from __future__ import annotations

import serial

from .serial_bridge import parse_framing
from .usage import EndpointJSON


def open_uart(endpoint: EndpointJSON, baud: int | None = None, timeout: float = 0.1) -> serial.SerialBase:
    """A pyserial port on a UART endpoint, at the device's configured line settings
    (RFC 2217 sends them all when it opens) unless ``baud`` changes the speed."""
    params = endpoint.get("params") or {}
    settings = parse_framing(str(params.get("framing", "8N1")))
    speed = baud or int(params.get("baud", 115200))
    if endpoint.get("protocol") == "rfc2217":
        # ser2net on a pty never acknowledges DTR: without this, opening stalls for seconds
        url = f"rfc2217://{endpoint['host']}:{endpoint['port']}?ign_set_control"
    else:
        url = f"socket://{endpoint['host']}:{endpoint['port']}"
    return serial.serial_for_url(url, baudrate=speed, timeout=timeout, **settings)
