"""Ctrl-C, SIGTERM and SIGHUP while a command waits: each ends the wait the same way (a
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


#: What a CI runner's cancel or a closed terminal sends (SIGINT is Ctrl-C's own)
STOPS = (signal.SIGTERM, signal.SIGHUP)


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[Signal]:
    """While inside: SIGTERM and SIGHUP raise ``KeyboardInterrupt`` as Ctrl-C does (their
    default would end the process with nothing given back)."""
    got = Signal()

    def stopped(number, frame):
        got.number = signal.Signals(number)
        raise KeyboardInterrupt

    previous = {number: signal.signal(number, stopped) for number in STOPS}
    try:
        yield got
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextmanager
def not_interrupted() -> Iterator[None]:
    """While inside: Ctrl-C, SIGTERM and SIGHUP are ignored (giving back what a wait held
    takes a request or two, each bounded by the client's timeout)."""
    previous = {number: signal.signal(number, signal.SIG_IGN) for number in (signal.SIGINT, *STOPS)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
