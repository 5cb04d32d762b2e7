"""Stop signals (SIGTERM, SIGINT, SIGHUP) handed to a stop function without a lock taken in
the handler.

Python runs a signal handler in the main thread, between two of its bytecodes: if the main
thread holds a lock right then (inside ``Event.wait``, ``Event.clear``: an ``Event`` is a
``Condition`` over a plain ``Lock``), a handler that sets that ``Event`` waits for a lock its
own thread holds, forever, and the process ignores every signal after. So the handler only
starts a thread, and the stop runs there (docs/architecture.md, "Nothing that waits holds the lab")."""
from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Sequence

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # SIGHUP: the terminal closed


def on_stop_signals(stop: Callable[[int], object], signals: Sequence[int] = STOP_SIGNALS) -> None:
    """Call ``stop(signum)`` on a thread of its own when one of ``signals`` arrives."""
    def handler(signum: int, frame: object) -> None:
        threading.Thread(target=stop, args=(signum,), name=f"stop-on-{signal.Signals(signum).name}",
                         daemon=True).start()
    for number in signals:
        signal.signal(number, handler)
