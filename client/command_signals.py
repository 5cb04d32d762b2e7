"""The signals that cancel a ``device-loop with`` (docs/architecture.md, "A lease bound to a
command"): SIGINT, SIGTERM and SIGHUP, as CI runners send them, raised as ``Cancelled``
while it waits for a device and recorded (waking the command's loop) while the command runs."""
from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

CANCEL_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Cancelled(BaseException):
    """A signal came while waiting for a device (not an Exception: nothing on the way swallows it)."""

    def __init__(self, number: int):
        super().__init__(number)
        self.number = number


class CancelSignals:
    """SIGINT, SIGTERM and SIGHUP for the whole of a ``with``: while it waits for a device the
    first raises ``Cancelled`` (the wait ends, what it held is given back); while the command
    runs each is recorded and wakes the command's loop (``_Run``); while a wait's holdings
    are given back, they are ignored (a request or two, each bounded; a runner's SIGKILL ends
    it anyway, and the keepalive frees the board)."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.raising = True
        self.wake: Callable[[], None] | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "CancelSignals":
        self._previous = {number: signal.signal(number, self._handle) for number in CANCEL_SIGNALS}
        return self

    def __exit__(self, *exc_info: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def _handle(self, number: int, frame: object) -> None:
        self.received.append(number)
        if self.raising:
            self.raising = False  # (once: giving back must not be cut short by the next one)
            raise Cancelled(number)
        if self.wake is not None:
            self.wake()

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """While inside, signals are only recorded."""
        raising, self.raising = self.raising, False
        try:
            yield
        finally:
            self.raising = raising and not self.received


class Wake:
    """A pipe that wakes the command's loop: a signal came, or the lease was lost."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)

    def wake(self) -> None:
        """Wake the loop (from a signal handler or another thread)."""
        with contextlib.suppress(BlockingIOError):  # (full: it is awake already)
            os.write(self.write_fd, b".")

    def drain(self) -> None:
        """Read what woke the loop, so that the next select waits again."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self.read_fd, 512):
                pass

    def close(self) -> None:
        """Close both ends (under the caller's lock: a late ``wake`` must not write to a reused fd)."""
        os.close(self.read_fd)
        os.close(self.write_fd)
