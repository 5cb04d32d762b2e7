"""The simulated boards' switch: a file holding ``on`` or ``off`` that the board watches;
the board writes the state it took to the same path with ``.state`` appended."""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Literal

from pydantic import Field

from device_loop.plugin import OperationError, PowerReading

from .keys import BackendKeys


READ_BACK_S = 5.0
POLL_S = 0.02


def switch_path(host, resource) -> Path:
    """The switch file: the entry's ``switch``, else ``STATE_DIR/sim/DEVICE.power``."""
    switch = resource.config.settings.switch
    return Path(switch) if switch else host.state_dir / "sim" / f"{resource.device}.power"


def state_path(switch: Path) -> Path:
    """Where the board says what it did: the switch's path with ``.state`` appended."""
    return switch.with_name(switch.name + ".state")


def read_state(switch: Path) -> str | None:
    """The state the board last said (on or off), None when it said nothing (yet)."""
    try:
        words = state_path(switch).read_text().split()
    except (OSError, UnicodeDecodeError):
        return None
    state = words[0].lower() if words else None
    return state if state in ("on", "off") else None


def write_switch(switch: Path, action: str) -> None:
    """Set the switch to ``action``, atomically: the board never reads half a word."""
    switch.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=switch.parent, prefix=f".{switch.name}.")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(f"{action}\n")
        os.replace(temporary, switch)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def power(host, resource, action: str) -> PowerReading:
    """Write the switch, then wait (up to 5 s) for the board to say it switched."""
    switch = switch_path(host, resource)
    if action == "status":
        state = read_state(switch)
        return PowerReading(state, f"simulated board {resource.device} says it is {state}" if state else
                            f"simulated board {resource.device} has said no state (in {state_path(switch)})")
    try:
        write_switch(switch, action)
    except OSError as exc:
        raise OperationError(f"cannot write the switch file {switch}: {exc.strerror or exc}", changed=False) from None
    until = time.monotonic() + min(READ_BACK_S, resource.config.timeout)
    while (state := read_state(switch)) != action and time.monotonic() < until:
        time.sleep(POLL_S)
    if state != action:
        raise OperationError(f"simulated board {resource.device} did not switch {action} within "
                             f"{min(READ_BACK_S, resource.config.timeout):g}s (its switch file {switch}; "
                             f"{state_path(switch).name} says {state or 'nothing'})")
    return PowerReading(state, f"simulated board {resource.device} switched {action}")


class Keys(BackendKeys):
    """A simulated board's switch file."""
    backend: Literal["sim"]
    switch: str | None = Field(default=None, min_length=1, description="the simulated board's switch file")
