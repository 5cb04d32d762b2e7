"""Switching through commands of the lab's own (a relay board's tool, a script), run
without a shell; an optional ``status`` command reads the state back."""
from __future__ import annotations

import time
from typing import Literal

from pydantic import Field, field_validator

from device_loop.plugin import OperationError, PowerReading, last_lines

from .keys import TEMPLATE_FIELDS, BackendKeys
from .programs import run_program


READ_BACK_S = 5.0  # how long a switch may take to report the state it was just told
POLL_S = 0.2


def argv_of(template: list[str], device: str) -> list[str]:
    """A command template with ``{device}`` filled in."""
    return [arg.format(device=device) for arg in template]


def _run(host, resource, template: list[str], deadline: float, *, switches: bool = True) -> str:
    argv = argv_of(template, resource.device)
    timeout = max(0.1, deadline - time.monotonic())
    code, output = run_program(host, resource, argv, timeout)
    if code != 0:
        raise OperationError(f"{argv[0]} failed (exit code {code})"
                             + (f": {last_lines(output)}" if output.strip() else ""),
                             changed=switches)
    return output


def _read(host, resource, deadline: float) -> str:
    status = resource.config.settings.status
    output = _run(host, resource, status, deadline, switches=False)
    words = output.split()
    state = words[0].lower() if words else ""
    if state not in ("on", "off"):
        raise OperationError(f"{status[0]} printed {output.strip()[:80]!r}, not on or off first",
                             changed=False)
    return state


def power(host, resource, action: str) -> PowerReading:
    """Run the ``on`` or ``off`` command, then ``status`` (if any) until it reads the same."""
    config = resource.config.settings
    deadline = time.monotonic() + config.timeout
    if action == "status":
        if config.status is None:
            return PowerReading(None, "no status command: not read back")
        state = _read(host, resource, deadline)
        return PowerReading(state, f"{config.status[0]} reads {state}")
    template = config.on if action == "on" else config.off
    _run(host, resource, template, deadline)
    done = f"{template[0]} switched {resource.device} {action}"
    if config.status is None:
        return PowerReading(None, f"{done}; not read back (no status command)")
    read_back_until = min(deadline, time.monotonic() + READ_BACK_S)
    try:
        while (state := _read(host, resource, deadline)) != action and time.monotonic() < read_back_until:
            time.sleep(POLL_S)
    except OperationError as exc:
        raise OperationError(f"{done}, but reading it back failed: {exc}") from None  # (it may have switched)
    if state != action:
        raise OperationError(f"{done}, but {config.status[0]} still reads {state}")
    return PowerReading(state, f"{done}; {config.status[0]} reads {state}")


class Keys(BackendKeys):
    """Commands that switch on and off (and read the state), run without a shell."""
    backend: Literal["command"]
    on: list[str] = Field(min_length=1, description="the command that switches on (an argv)")
    off: list[str] = Field(min_length=1, description="the command that switches off (an argv)")
    status: list[str] | None = Field(default=None, min_length=1,
                                     description="a command whose output's first word, on or off, is the state")

    @field_validator("on", "off", "status")
    @classmethod
    def _template(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not value[0].strip():
            raise ValueError("a command's program must not be blank")
        try:
            [arg.format(**{f: "" for f in TEMPLATE_FIELDS}) for arg in value]
        except (ValueError, KeyError, IndexError) as exc:
            raise ValueError(f"{value!r} is not a usable template ({exc}); fields: "
                             f"{', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)}") from None
        return value

    def programs(self, device: str) -> list[str]:
        return [argv_of(template, device)[0] for template in (self.on, self.off, self.status) if template]
