"""What a console server saw of its device, for the power operation to watch
(docs/architecture.md, "Power"): a small record file, rewritten in place as bytes move.

A console service opens its device node only while a client is connected (with nobody
connected nobody holds the node, so a plugin's operation or the exporter's power watch may
read it). While it runs, the serial bridge (``serial_bridge.py``) keeps, beside its work, a
record of how many bytes the device printed and when it last did, how many bytes a client
typed to the device and when, how often the node hung up or went away while open, and
whether it holds the node open now; the exporter's power operation reads that record to tell
whether a board went silent while its power was off and printed again after it came back,
without taking a byte from the person at the console. The record is one fixed-width line
with a checksum, so a reader never takes a half-written one for a real one; each service
makes a new one (a new inode), and removes only its own.
"""
from __future__ import annotations

import hashlib
import os
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

RECORD_BYTES = 160  # (the fields, at their widest, fit with room to spare)
FOLDER = "console"  # under the exporter's state folder


def record_path(state_dir: Path, identifier: str) -> Path:
    """Where the console service of the resource ``identifier`` keeps its record."""
    return Path(state_dir) / FOLDER / (hashlib.sha256(identifier.encode()).hexdigest()[:24] + ".activity")


@dataclass(frozen=True)
class Activity:
    """A console service's record: ``pid`` of its writer; ``bytes`` the device printed since
    the service began and when it last printed (``last_ns``, ``time.monotonic_ns``: the same
    clock in every process of the host); ``hangups``, how often the open node hung up or
    vanished (a client leaving, which closes it, is none); ``open``, whether the service holds
    the node open now; ``typed``, the bytes clients sent to the device, and when the last were
    (``typed_ns``, the same clock); ``client``, whether a client is connected (then the service
    wants the node, also while it retries after a hang-up: nobody else may open it)."""

    pid: int
    bytes: int
    last_ns: int
    hangups: int
    open: bool
    typed: int
    typed_ns: int
    client: bool


FIELDS = 8  # and the checksum


class ActivityWriter:
    """The writing side, for a console server: ``printed(n)`` as the device's bytes arrive,
    ``typed(n)`` as a client's reach it, ``client(connected)`` as a client comes and goes,
    ``opened()`` when the node is open, ``hung_up()`` when it fails or vanishes while open,
    ``closed()`` when the server closes it (no client is left); ``close()`` removes the record
    (a service that stopped has nothing to say).

    The record is made anew (a temporary file renamed into place: a new inode), then written
    in place; ``close()`` removes it only while it is still this writer's (an old service
    stopping leaves the record of a newer one)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._bytes = self._last_ns = self._hangups = self._typed = self._typed_ns = 0
        self._open = self._client = False
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        self._fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            self._write()
            st = os.fstat(self._fd)
            self._identity = (st.st_dev, st.st_ino)
            os.replace(temporary, self.path)
        except BaseException:
            os.close(self._fd)
            self._fd = -1
            temporary.unlink(missing_ok=True)
            raise

    def printed(self, count: int) -> None:
        self._bytes += count
        self._last_ns = time.monotonic_ns()
        self._write()

    def typed(self, count: int) -> None:
        self._typed += count
        self._typed_ns = time.monotonic_ns()
        self._write()

    def hung_up(self) -> None:
        if self._open:
            self._hangups += 1
        self._open = False
        self._write()

    def opened(self) -> None:
        self._open = True
        self._write()

    def client(self, connected: bool) -> None:
        self._client = connected
        self._write()

    def closed(self) -> None:
        self._open = False
        self._write()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            try:
                now = os.stat(self.path)
            except FileNotFoundError:
                return
            if (now.st_dev, now.st_ino) == self._identity:  # not a record a later service began
                self.path.unlink(missing_ok=True)

    def _write(self) -> None:
        if self._fd < 0:
            return
        body = (f"{os.getpid()} {self._bytes} {self._last_ns} {self._hangups} {int(self._open)} "
                f"{self._typed} {self._typed_ns} {int(self._client)}")
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
        if len(fields) == FIELDS + 1 and f"{zlib.crc32(' '.join(fields[:FIELDS]).encode()):08x}" == fields[FIELDS]:
            try:
                pid, count, last_ns, hangups, is_open, typed, typed_ns, client = (int(f) for f in fields[:FIELDS])
            except ValueError:
                continue
            if not _alive(pid):
                return None
            return Activity(pid, count, last_ns, hangups, bool(is_open), typed, typed_ns, bool(client))
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
