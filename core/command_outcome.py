"""What ``device-loop with`` did, as one typed object (docs/architecture.md, "A lease bound
to a command"): its exit status and why, the device and lease, and how long each part took.
``--json`` prints it; a CI report (JUnit XML, markdown) is written from it, never from the
words on stderr.
"""
from __future__ import annotations

import signal
from dataclasses import asdict, dataclass, field
from typing import Any

from .vocabulary import LAB_FAILURE_STATUS, FailureKind

#: ``--max-time`` cut the command (as coreutils' ``timeout`` says it).
TIMEOUT_STATUS = 124
#: A signal N that cancelled the command: 128 + N, as a shell reports it.
SIGNAL_BASE = 128


def cancelled_status(number: int) -> int:
    """The exit status of a run a signal cancelled: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP."""
    return SIGNAL_BASE + number


def signal_name(number: int) -> str:
    """``SIGINT`` for 2 (a number this Python does not name: ``signal 64``)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass(frozen=True)
class Timings:
    """Seconds each part took: the wait for a ready device (queue included), the flash of
    ``--image``, the command itself, and all of it, from start to the lease given back."""
    wait_s: float = 0.0
    flash_s: float = 0.0
    run_s: float = 0.0
    total_s: float = 0.0


@dataclass(frozen=True)
class CommandOutcome:
    """How one ``device-loop with`` ended.

    ``status`` is its exit status: the command's own when it ran to its end (``failure`` is
    then None for 0, ``test`` otherwise, ``lab`` when the command itself exited 75), 128 + N
    when a signal cancelled it (``cancelled`` names it, ``failure`` None), 124 when
    ``--max-time`` cut it (``timeout``), 75 when the lab failed it (``lab``, ``reason`` says
    how). ``command_status`` is what the command's first process returned, when it ran
    (negative: the signal that ended it)."""
    command: tuple[str, ...]
    status: int
    failure: FailureKind | None = None
    reason: str | None = None
    cancelled: str | None = None           # the first signal that cancelled it (SIGINT, SIGTERM, SIGHUP)
    device: str | None = None
    lease: str | None = None
    image: str | None = None
    flashed: bool = False                  # --image was flashed first (the device did not run it)
    command_status: int | None = None
    started_at: float = 0.0                # Unix time
    timings: Timings = field(default_factory=Timings)
    attempts: int = 1                      # reservations made (a `with` makes one)

    @property
    def lab_failed(self) -> bool:
        """Whether the lab failed it (exit 75): not the command's verdict."""
        return self.failure == FailureKind.LAB

    def to_json(self) -> dict[str, Any]:
        """The outcome as ``--json`` prints it (one object)."""
        said = asdict(self)
        said["command"] = list(self.command)
        said["failure"] = None if self.failure is None else str(self.failure)
        return said


def command_status_outcome(command_status: int) -> tuple[int, FailureKind | None]:
    """The exit status and failure of a command that ran to its end with ``command_status``
    (a negative one: the signal that ended it, reported as a shell does, 128 + N). A command
    that exits 75 says the lab failed it (docs/architecture.md, "Lab failures")."""
    status = cancelled_status(-command_status) if command_status < 0 else command_status
    if status == 0:
        return 0, None
    return status, FailureKind.LAB if status == LAB_FAILURE_STATUS else FailureKind.TEST
