"""What an operation ends with when the exporter stops under it (docs/architecture.md,
"Operations"): not a failure of its own, and its report says so (``interrupted``), so the
coordinator never reads a plugin's words for it."""
from __future__ import annotations

from device_loop.core.model import OperationError


class Interrupted(OperationError):
    """The exporter stopped while the operation waited (a cooldown, a reboot, a power off-time).
    Raised by the exporter's own runners only; what a plugin raises is its operation's failure,
    whatever its words."""

    def __init__(self, what: str):
        super().__init__(f"interrupted while {what}: the exporter stopped")
