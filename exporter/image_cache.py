"""The exporter's image cache: images fetched from the coordinator's registry, one file
each, named by sha256 (docs/architecture.md, "Operations").

A file enters the cache only once the bytes fetched hash to the sha256 asked for, and a
cached file is hashed again before its first use by each start of the exporter (a crash
or a power cut may have left it torn) and whenever it changed since (its size, time or
inode), so nothing unverified is ever written to a device. A cached image is not fetched
again: recovery is a local copy. The cache keeps under its size limit by dropping the
images used least recently.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import queue
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

from device_loop.core.files import file_sha256
from device_loop.core.model import OperationError

log = logging.getLogger("device_loop.exporter")
CHUNK = 1 << 20
GROUP_BYTES, GROUP_PIECES = 256 << 10, 64


def _pass_on(fd: int, pieces: list[bytes], hasher: "_Hasher") -> None:
    """Write ``pieces`` to ``fd`` (all of them) and hand them to ``hasher``."""
    if not pieces:
        return
    hasher.feed(pieces)
    written, total = os.writev(fd, pieces), sum(map(len, pieces))
    if written < total:  # a short write (a signal, a full disk): the rest, piece by piece
        rest = memoryview(b"".join(pieces))[written:]
        while rest:
            rest = rest[os.write(fd, rest):]


class _Hasher:
    """sha256 of groups of pieces handed over, in a thread of its own: hashing a GiB takes
    half a second here, and overlapped with receiving and writing it costs almost nothing
    (hashlib lets go of the GIL). At most ``QUEUED`` groups wait: memory stays bounded."""

    QUEUED = 16

    def __init__(self):
        self._digest = hashlib.sha256()
        self._pieces: queue.Queue = queue.Queue(self.QUEUED)
        self._thread = threading.Thread(target=self._run, name="image-hash", daemon=True)
        self._thread.start()
        self._hex: str | None = None

    def _run(self) -> None:
        while (pieces := self._pieces.get()) is not None:
            for piece in pieces:
                self._digest.update(piece)

    def feed(self, pieces: list[bytes]) -> None:
        self._pieces.put(pieces)

    def result(self) -> str:
        if self._hex is None:
            self._pieces.put(None)
            self._thread.join()
            self._hex = self._digest.hexdigest()
        return self._hex


def _signature(path: Path) -> tuple:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns, stat.st_ino


class ImageCache:
    def __init__(self, folder: Path, max_bytes: int):
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        self._verified: dict[str, tuple] = {}  # hashed by this start of the exporter: sha256 -> its file's stat
        self._in_use: dict[str, int] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def get(self, sha256: str, size: int, fetch: Callable[[], Iterator[bytes]],
            progress: Callable[[int], None]) -> Path:
        """The verified file of image ``sha256``: from the cache, else fetched with
        ``fetch()`` (its bytes, in pieces; ``progress(bytes so far)``). Call it inside ``use``."""
        with self._lock:
            lock = self._locks.setdefault(sha256, threading.Lock())
        with lock:  # two flashes of one image fetch it once
            path = self.folder / sha256
            if path.exists() and self._intact(path, sha256, size):
                os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns))  # used now (atime): dropped last
                progress(size)
                return path
            self._fetch(path, sha256, size, fetch, progress)
            # the kernel stamps a new file with its coarse clock (a tick behind): the fine one,
            # as for a re-use, or a file fetched just after a re-use would look used before it
            os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns))
            self._verified[sha256] = _signature(path)
            self._shrink(keep=sha256)
            return path

    @contextlib.contextmanager
    def use(self, sha256: str):
        """While in this context, image ``sha256`` is not dropped to make room."""
        with self._lock:
            self._in_use[sha256] = self._in_use.get(sha256, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._in_use[sha256] -= 1

    def _intact(self, path: Path, sha256: str, size: int) -> bool:
        seen = _signature(path)
        if self._verified.get(sha256) == seen:
            return True
        if path.stat().st_size == size and file_sha256(path) == sha256:
            self._verified[sha256] = seen
            return True
        log.warning("cached image %s is damaged; fetching it again", sha256)
        path.unlink(missing_ok=True)
        return False

    def _fetch(self, path: Path, sha256: str, size: int, fetch, progress) -> None:
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        got, held, pieces = 0, 0, []
        hasher = _Hasher()
        fd, partial = tempfile.mkstemp(dir=self.folder, prefix=".fetch-")
        try:
            try:
                for chunk in fetch():
                    got += len(chunk)
                    if got > size:
                        raise OperationError(
                            f"the coordinator sent more than the image's {size} bytes: nothing written")
                    pieces.append(chunk)
                    held += len(chunk)
                    # pieces go on in groups, to the file in one writev and to the hasher in one hand-over:
                    # a tenth of the fetch's time on two cores, against a call each (measured)
                    if held >= GROUP_BYTES or len(pieces) >= GROUP_PIECES:
                        _pass_on(fd, pieces, hasher)
                        pieces, held = [], 0
                        progress(got)
                _pass_on(fd, pieces, hasher)
            finally:
                os.close(fd)
            if got != size:
                raise OperationError(f"the coordinator sent {got} of the image's {size} bytes: nothing written")
            digest = hasher.result()
            if digest != sha256:
                raise OperationError(f"the image's bytes as fetched hash to {digest}, not to its sha256 "
                                 f"{sha256}: the registry's copy is damaged; nothing written")
            os.chmod(partial, 0o444)
            os.replace(partial, path)
        finally:
            hasher.result()  # (ends its thread, whatever happened)
            Path(partial).unlink(missing_ok=True)

    def _shrink(self, keep: str) -> None:
        """Drop the least recently used images until the cache fits its limit."""
        entries = []
        for path in self.folder.iterdir():
            if not path.name.startswith("."):
                stat = path.stat()
                entries.append((stat.st_atime_ns, stat.st_size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            with self._lock:
                if path.name == keep or self._in_use.get(path.name):
                    continue
                path.unlink(missing_ok=True)
                self._verified.pop(path.name, None)
            total -= size
            log.info("image cache: dropped %s to stay under %d bytes", path.name, self.max_bytes)
