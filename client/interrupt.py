"""Ctrl-C and SIGTERM while a command waits: both end the wait the same way (a
``KeyboardInterrupt``), so the command gives up what it was waiting for before it exits, and
a second one meanwhile does not cut that short."""
from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Iterator


class Signal:
    """Which signal ended the wait (SIGINT until SIGTERM says otherwise)."""

    def __init__(self) -> None:
        self.number = signal.SIGINT

    @property
    def at_terminal(self) -> bool:
        """Ctrl-C: typed at a terminal, which echoed ^C."""
        return self.number == signal.SIGINT

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a process it ended: 130, or 143."""
        return 128 + int(self.number)


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[Signal]:
    """While inside: SIGTERM raises ``KeyboardInterrupt`` as Ctrl-C does (its default would
    end the process with nothing given back)."""
    got = Signal()

    def stopped(number, frame):
        got.number = signal.Signals(number)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stopped)
    try:
        yield got
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def not_interrupted() -> Iterator[None]:
    """While inside: Ctrl-C and SIGTERM are ignored (giving back what a wait held takes a
    request or two, each bounded by the client's timeout)."""
    previous = {number: signal.signal(number, signal.SIG_IGN) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
