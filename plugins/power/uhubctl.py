"""Switching a USB hub's port with uhubctl (per-port power switching), read back from its
port line."""
from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from device_loop.plugin import OperationError, PowerReading, last_lines

from .keys import BackendKeys
from .programs import run_program


def port_state(output: str, port: int) -> str | None:
    """The state of ``port`` in uhubctl's last status line of it ("Port 2: 0503 power ..."
    is on, "Port 2: 0000 off" is off), or None when it printed none."""
    lines = re.findall(rf"^\s*Port {port}: [0-9a-fA-F]{{4}}(.*)$", output, re.MULTILINE)
    if not lines:
        return None
    words = lines[-1].split()
    return "off" if "off" in words else "on" if "power" in words else None


def power(host, resource, action: str) -> PowerReading:
    """Switch (or read) the port; the state is uhubctl's own report after the change."""
    config = resource.config.settings
    argv = ["uhubctl", "-l", config.location, "-p", str(config.port)]
    if action != "status":
        argv += ["-a", action]
    code, output = run_program(host, resource, argv, config.timeout)
    where = f"port {config.port} of the hub at {config.location}"
    if "No compatible devices detected" in output:
        raise OperationError(f"no switchable hub at {config.location} (uhubctl: No compatible devices detected!)",
                             changed=False)
    if code != 0:
        raise OperationError(f"uhubctl failed on {where} (exit code {code}): {last_lines(output)}",
                             changed="Sent power" in output)
    state = port_state(output, config.port)
    if state is None:
        raise OperationError(f"uhubctl printed no status of {where}: {last_lines(output)}",
                             changed="Sent power" in output)
    if action != "status" and state != action:
        raise OperationError(f"uhubctl switched {where} {action}, but it reads {state} (does the hub switch "
                             f"its ports' power, or only signal it?)")
    done = "reads" if action == "status" else f"switched {action}; reads"
    return PowerReading(state, f"uhubctl: {where} {done} {state}")


class Keys(BackendKeys):
    """A port of a USB hub that switches its ports' power."""
    PROGRAMS: ClassVar[tuple[str, ...]] = ("uhubctl",)
    backend: Literal["uhubctl"]
    location: str = Field(description="the USB hub's location, as uhubctl names it (1-1)")
    port: int = Field(ge=1, le=65535, description="the hub's port")

    @field_validator("location")
    @classmethod
    def _location(cls, value: str) -> str:
        if not re.fullmatch(r"[0-9]+(-[0-9]+(\.[0-9]+)*)?", value):
            raise ValueError(f"a hub's location is as uhubctl names it (1-1, 2-1.4), not {value!r}")
        return value
