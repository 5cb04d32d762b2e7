"""Watching a device's console during a power operation (docs/architecture.md, "Power"),
without taking a byte from anyone.

While a console service runs for the device, its bridge keeps the node open and records what
it reads (``core/console_activity.py``): the watch reads that record. With no service, the
watch opens the node itself, exclusively, and counts what comes (reopening it when it comes
back after a hang-up, as a USB serial adapter powered with the board does). A node another
program holds (ser2net, an orphan) is left alone: the console is then not watched, and says
why.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import serial

from device_loop.core.console_activity import read_activity, record_path
from device_loop.core.holders import command_of, holders
from device_loop.core.host import HostContext
from device_loop.core.model import Resource

REOPEN_S = 0.1  # a node that went away is looked for again this often
READ_S = 0.05   # one read's wait: how soon the reader sees that it is asked to stop
DEFAULT_BAUD = 115200


@dataclass(frozen=True)
class Seen:
    """What a console had printed at one moment: ``bytes`` so far, when it last printed
    (``time.monotonic_ns``), how often it hung up or went away, whether it is open now."""

    bytes: int
    last_ns: int
    hangups: int
    open: bool


class ConsoleWatch:
    """One device's console, watched for the length of a power operation: ``seen()`` at any
    moment; ``how`` says through what; ``close()`` ends it."""

    def __init__(self, how: str, seen, stop=lambda: None):
        self.how = how
        self._seen, self._stop = seen, stop

    def seen(self) -> Seen:
        return self._seen()

    def close(self) -> None:
        self._stop()


def watch_console(host: HostContext, console: Resource | None) -> ConsoleWatch | str:
    """A watch on ``console`` (a resource of the device with a node: its UART), or why there is none."""
    if console is None or not console.node:
        return "the device has no console (a UART resource) to watch"
    path = record_path(host.state_dir, console.identifier)
    if read_activity(path) is not None:
        return ConsoleWatch(f"through its console service on {console.node}", lambda: _from_record(path))
    others = holders({console.node}, skip={os.getpid()}).get(console.node, set())
    if others:
        pid = min(others)
        return f"its console {console.node} is held by {command_of(pid)[:80] or 'a program'} (pid {pid})"
    baud = getattr(console.config, "baud", None)
    reader = _Reader(console.node, baud if isinstance(baud, int) and not isinstance(baud, bool) and baud > 0
                     else DEFAULT_BAUD)
    return ConsoleWatch(f"on {console.node}", reader.seen, reader.stop)


def _from_record(path) -> Seen:
    record = read_activity(path)
    if record is None:  # the service stopped meanwhile (the lease ended): nothing more is seen
        return Seen(0, 0, 0, False)
    return Seen(record.bytes, record.last_ns, record.hangups, record.open)


class _KeptPort(serial.Serial):
    """A port whose open keeps what the device printed before it (pyserial's drops it): a board
    prints its banner the moment it has power, before a reopen that looks every 100 ms."""

    def _reset_input_buffer(self):
        pass


class _Reader:
    """The node, read in a thread of its own: counts what it prints, and its hang-ups. Its first
    open drops what was printed before the watch began; a reopen (the node came back) keeps it."""

    def __init__(self, node: str, baud: int):
        self.node, self.baud = node, baud
        self._lock = threading.Lock()
        self._state = Seen(0, 0, 0, False)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"console-watch-{os.path.basename(node)}", daemon=True)
        self._thread.start()

    def seen(self) -> Seen:
        with self._lock:
            return self._state

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(2)

    def _set(self, **changes) -> None:
        with self._lock:
            self._state = Seen(**{**self._state.__dict__, **changes})

    def _run(self) -> None:
        was_open, first = False, True
        while not self._stopping.is_set():
            try:
                port = (serial.Serial if first else _KeptPort)(self.node, self.baud, timeout=READ_S, exclusive=True)
            except (serial.SerialException, OSError, ValueError):
                first = False
                if self._stopping.wait(REOPEN_S):
                    return
                continue
            first = False
            self._set(open=True)
            was_open = True
            with port:
                try:
                    while not self._stopping.is_set():
                        data = port.read(4096)
                        if data:
                            with self._lock:
                                state = self._state
                                self._state = Seen(state.bytes + len(data), time.monotonic_ns(), state.hangups, True)
                        elif not os.path.exists(self.node):
                            break  # (a pty's link removed while it reads nothing yet)
                except (serial.SerialException, OSError):
                    pass  # hung up: the board lost power, or its adapter went away
            if was_open:
                with self._lock:
                    state = self._state
                    self._state = Seen(state.bytes, state.last_ns, state.hangups + 1, False)
                was_open = False
