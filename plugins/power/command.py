"""Switching through commands of the lab's own (a relay board's tool, a script), run
without a shell; an optional ``status`` command reads the state back."""
from __future__ import annotations

import time

from device_loop.plugin import OperationError, PowerReading, last_lines

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
    output = _run(host, resource, resource.config.status, deadline, switches=False)
    words = output.split()
    state = words[0].lower() if words else ""
    if state not in ("on", "off"):
        raise OperationError(f"{resource.config.status[0]} printed {output.strip()[:80]!r}, not on or off first",
                             changed=False)
    return state


def power(host, resource, action: str) -> PowerReading:
    """Run the ``on`` or ``off`` command, then ``status`` (if any) until it reads the same."""
    config = resource.config
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
