"""What a console server saw of its device, for the power operation to watch
(docs/architecture.md, "Power"): a small record file, rewritten in place as bytes arrive.

A console service holds its device node for its whole life, so nobody else may read the
node meanwhile (two readers of a tty split its bytes between them). The serial bridge
(``serial_bridge.py``) therefore keeps, beside its work, a record of how many bytes the
device printed, when it last did, and how often the node hung up or went away; the
exporter's power operation reads that record to tell whether a board went silent while its
power was off and printed again after it came back, without taking a byte from the person
at the console. The record is one fixed-width line with a checksum, so a reader never takes
a half-written one for a real one.
"""
from __future__ import annotations

import hashlib
import os
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

RECORD_BYTES = 96
FOLDER = "console"  # under the exporter's state folder


def record_path(state_dir: Path, identifier: str) -> Path:
    """Where the console service of the resource ``identifier`` keeps its record."""
    return Path(state_dir) / FOLDER / (hashlib.sha256(identifier.encode()).hexdigest()[:24] + ".activity")


@dataclass(frozen=True)
class Activity:
    """A console service's record: ``pid`` of its writer, bytes the device printed since the
    service began, when it last printed (``time.monotonic_ns``: the same clock in every
    process of the host), how often its node hung up or vanished, whether it is open now."""

    pid: int
    bytes: int
    last_ns: int
    hangups: int
    open: bool


class ActivityWriter:
    """The writing side, for a console server: ``printed(n)`` as bytes arrive, ``hung_up()``
    when the node fails or vanishes, ``opened()`` when it is open again; ``close()`` removes
    the record (a service that stopped has nothing to say)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        self._bytes = self._last_ns = self._hangups = 0
        self._open = False
        self._write()

    def printed(self, count: int) -> None:
        self._bytes += count
        self._last_ns = time.monotonic_ns()
        self._write()

    def hung_up(self) -> None:
        if self._open:
            self._hangups += 1
        self._open = False
        self._write()

    def opened(self) -> None:
        self._open = True
        self._write()

    def close(self) -> None:
        if self._fd >= 0:
            ours = os.fstat(self._fd)
            os.close(self._fd)
            self._fd = -1
            try:
                now = os.stat(self.path)
            except FileNotFoundError:
                return
            if (now.st_dev, now.st_ino) == (ours.st_dev, ours.st_ino):  # not a record a later service began
                self.path.unlink(missing_ok=True)

    def _write(self) -> None:
        if self._fd < 0:
            return
        body = f"{os.getpid()} {self._bytes} {self._last_ns} {self._hangups} {int(self._open)}"
        line = f"{body} {zlib.crc32(body.encode()):08x}".ljust(RECORD_BYTES - 1) + "\n"
        os.pwrite(self._fd, line.encode(), 0)


def read_activity(path: Path) -> Activity | None:
    """The record at ``path``, or None when there is none (no console service), or its writer
    is gone (a service killed with the exporter)."""
    for _ in range(5):  # a read that met a write half-done is read again
        try:
            with open(path, "rb") as f:
                line = f.read(RECORD_BYTES).decode("ascii", "replace").strip()
        except OSError:
            return None
        fields = line.split()
        if len(fields) == 6 and f"{zlib.crc32(' '.join(fields[:5]).encode()):08x}" == fields[5]:
            try:
                pid, count, last_ns, hangups, is_open = (int(f) for f in fields[:5])
            except ValueError:
                continue
            if not _alive(pid):
                return None
            return Activity(pid, count, last_ns, hangups, bool(is_open))
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
