"""Watching a device's console during a power operation (docs/architecture.md, "Power"),
without taking a byte from anyone.

While a console service's bridge holds the node (a client is connected), it records what it
reads and what the client typed (``core/console_activity.py``): the watch reads that record.
While nobody holds the node, the watch opens it itself, exclusively, counts what comes, and
reopens it when it comes back after a hang-up (a USB serial adapter powered with the board);
it lets go the moment the bridge opens it again. A node another program holds (ser2net, an
orphan) is not read: that time counts as *blind*, and a verdict never rests on a window the
watch did not see.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, replace

import serial

from device_loop.core.console_activity import Activity, read_activity, record_path
from device_loop.core.holders import command_of, holders
from device_loop.core.host import HostContext
from device_loop.core.model import Resource

POLL_S = 0.02      # how often the record is read, and the node's bytes taken
HOLDERS_S = 0.5    # who else holds the node is asked at most this often (a pass over /proc)
DEFAULT_BAUD = 115200


@dataclass(frozen=True)
class Seen:
    """What a console had shown by one moment, since the watch began: ``bytes`` it printed and
    when it last did (``time.monotonic_ns``), how often it hung up or went away, bytes a person
    typed to it and when last, and the nanoseconds nobody could see it (``blind_ns``)."""

    bytes: int = 0
    last_ns: int = 0
    hangups: int = 0
    typed: int = 0
    typed_ns: int = 0
    blind_ns: int = 0


class _KeptPort(serial.Serial):
    """A port whose open keeps what the device printed before it (pyserial's drops it): a board
    prints its banner the moment it has power, before a reopen that looks every 100 ms."""

    def _reset_input_buffer(self):
        pass


class ConsoleWatch:
    """One device's console, watched for the length of a power operation by a thread of its
    own: ``seen()`` at any moment; ``how`` says through what; ``close()`` ends it."""

    def __init__(self, node: str, baud: int, record):
        self.node, self.baud, self.record = node, baud, record
        self.how = f"watched on {node} (through its console service while a client is connected)"
        self._lock = threading.Lock()
        self._seen = Seen()
        self._stopping = threading.Event()
        self._looks = 0  # looks ended (``settled`` waits for one begun after it was called)
        self._looked = threading.Condition()
        self._port: serial.Serial | None = None
        self._first_open = True
        self._present = os.path.exists(node)  # a node seen there that goes away has hung up, open or not
        self._last: Activity | None = read_activity(record)
        try:
            self._writer: int | None = os.stat(record).st_ino
        except OSError:
            self._writer = None
        self._misses = 0  # looks in a row that found the node gone while the watch had it open
        self._held_checked, self._held = 0.0, ""
        self._thread = threading.Thread(target=self._run, name=f"console-watch-{os.path.basename(node)}",
                                        daemon=True)
        self._thread.start()

    def seen(self) -> Seen:
        with self._lock:
            return self._seen

    def settled(self) -> Seen:
        """What it had shown once a whole look begun after this call ended: every byte printed
        before the call is counted by then (what a switch-on is then asked for cannot claim it)."""
        with self._looked:
            until = self._looks + 2
            self._looked.wait_for(lambda: self._looks >= until or not self._thread.is_alive(), timeout=1.0)
        return self.seen()

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(2)

    def _add(self, **more: int) -> None:
        with self._lock:
            seen = self._seen
            self._seen = replace(seen, **{k: getattr(seen, k) + v if k not in ("last_ns", "typed_ns") else v
                                          for k, v in more.items()})

    def _run(self) -> None:
        try:
            while not self._stopping.wait(POLL_S):
                began = time.monotonic_ns()
                by_bridge = self._from_record()
                if not (by_bridge if by_bridge is not None else self._from_node()):
                    self._add(blind_ns=time.monotonic_ns() - began + int(POLL_S * 1e9))
                with self._looked:
                    self._looks += 1
                    self._looked.notify_all()
        finally:
            self._let_go()

    def _from_record(self) -> bool | None:
        """The bridge's record: what it counted since the last look is added (a hang-up while it
        retries too). Whether the console was seen through it, or None when the bridge neither
        holds the node nor wants it (no client): then the node is the watch's to read."""
        record, last = read_activity(self.record), self._last
        self._last = record
        try:
            writer = os.stat(self.record).st_ino  # (in-process bridges share a pid: a new service, a new file)
        except OSError:
            writer = None
        last_writer, self._writer = self._writer, writer
        if record is None or not (record.open or record.client):
            return None
        self._let_go()  # the bridge has it, or wants it back for its client: never two readers
        if last is None or last.pid != record.pid or last_writer != writer:
            return False  # (a new writer: what it counted before is not ours, and this look saw nothing)
        more: dict[str, int] = {}
        if record.bytes > last.bytes:
            more |= {"bytes": record.bytes - last.bytes, "last_ns": record.last_ns}
        if record.hangups > last.hangups:
            more["hangups"] = record.hangups - last.hangups
        if record.typed > last.typed:
            more |= {"typed": record.typed - last.typed, "typed_ns": record.typed_ns}
        if more:
            self._add(**more)
        # a client's bridge retrying after a hang-up sees what there is to see: the node is not there
        return record.open or (record.client and not os.path.exists(self.node))

    def _from_node(self) -> bool:
        """The node itself, while nobody else holds it: True if the console was seen."""
        if self._port is None:
            if self._held_by_others(time.monotonic()):
                return False
            try:
                self._port = (serial.Serial if self._first_open else _KeptPort)(self.node, self.baud, timeout=0,
                                                                                 exclusive=True)
            except (serial.SerialException, OSError, ValueError):
                self._first_open = False
                if os.path.exists(self.node):
                    self._present = True
                    return False  # there, and not to be opened (held): not seen
                self._gone()
                return True  # a node that is not there: seen, powered off
            self._first_open = False
            self._present = True
        elif self._held_by_others(time.monotonic()):
            self._let_go()  # another program opened it meanwhile (ser2net for a client): it is theirs
            return False
        try:
            data = self._port.read(65536)
        except (serial.SerialException, OSError):
            self._gone()  # hung up: the board lost power, or its adapter went away
            return True
        if data:
            self._add(bytes=len(data), last_ns=time.monotonic_ns())
        if os.path.exists(self.node):
            self._misses = 0
        else:
            self._misses += 1
            if self._misses >= 2:  # (once could be a udev link being made again)
                self._gone()  # a pty whose link went while it printed nothing more
        return True

    def _gone(self) -> None:
        """The node hung up or went away: counted once, whether the watch had it open or not."""
        self._let_go()
        self._misses = 0
        if self._present:
            self._add(hangups=1)
        self._present = False

    def _held_by_others(self, now: float) -> bool:
        if now - self._held_checked >= HOLDERS_S:
            self._held_checked = now
            others = holders({self.node}, skip={os.getpid()}).get(self.node, set())
            self._held = f"{command_of(min(others))[:80] or 'a program'} (pid {min(others)})" if others else ""
            if self._held:
                self.how = f"partly not watched: {self.node} is held by {self._held}"
        return bool(self._held)

    def _let_go(self) -> None:
        if self._port is not None:
            port, self._port = self._port, None
            try:
                port.close()
            except (serial.SerialException, OSError):
                pass


def watch_console(host: HostContext, console: Resource | None) -> ConsoleWatch | str:
    """A watch on ``console`` (a resource of the device with a node: its UART), or why there is none."""
    if console is None or not console.node:
        return "the device has no console (a UART resource) to watch"
    baud = getattr(console.config, "baud", None)
    return ConsoleWatch(console.node, baud if isinstance(baud, int) and not isinstance(baud, bool) and baud > 0
                        else DEFAULT_BAUD, record_path(host.state_dir, console.identifier))
