"""The exporter's image cache: images fetched from the coordinator's registry, one file
each, named by sha256 (DESIGN §6).

A file enters the cache only once the bytes fetched hash to the sha256 asked for, and a
cached file is hashed again before its first use by each start of the exporter (a crash
or a power cut may have left it torn), so nothing unverified is ever written to a
device. A cached image is not fetched again: recovery is a local copy. The cache keeps
under its size limit by dropping the images used least recently.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Callable, Iterator

from device_loop.core.model import FlashError

log = logging.getLogger("device_loop.exporter")
CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as image:
        buffer = bytearray(CHUNK)
        view = memoryview(buffer)
        while n := image.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


class ImageCache:
    def __init__(self, folder: Path, max_bytes: int):
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        self._verified: set[str] = set()  # hashed by this start of the exporter
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
                os.utime(path)  # used now: the last to be dropped
                progress(size)
                return path
            self._fetch(path, sha256, size, fetch, progress)
            self._verified.add(sha256)
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
        if sha256 in self._verified:
            return True
        if path.stat().st_size == size and file_sha256(path) == sha256:
            self._verified.add(sha256)
            return True
        log.warning("cached image %s is damaged; fetching it again", sha256)
        path.unlink(missing_ok=True)
        return False

    def _fetch(self, path: Path, sha256: str, size: int, fetch, progress) -> None:
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        digest, got = hashlib.sha256(), 0
        fd, partial = tempfile.mkstemp(dir=self.folder, prefix=".fetch-")
        try:
            with os.fdopen(fd, "wb", buffering=0) as out:
                for chunk in fetch():
                    got += len(chunk)
                    if got > size:
                        raise FlashError(f"the coordinator sent more than the image's {size} bytes: nothing written")
                    digest.update(chunk)
                    out.write(chunk)
                    progress(got)
            if got != size:
                raise FlashError(f"the coordinator sent {got} of the image's {size} bytes: nothing written")
            if digest.hexdigest() != sha256:
                raise FlashError(f"the image's bytes as fetched hash to {digest.hexdigest()}, not to its sha256 "
                                 f"{sha256}: the registry's copy is damaged; nothing written")
            os.chmod(partial, 0o444)
            os.replace(partial, path)
        finally:
            Path(partial).unlink(missing_ok=True)

    def _shrink(self, keep: str) -> None:
        """Drop the least recently used images until the cache fits its limit."""
        entries = []
        for path in self.folder.iterdir():
            if not path.name.startswith("."):
                stat = path.stat()
                entries.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            with self._lock:
                if path.name == keep or self._in_use.get(path.name):
                    continue
                path.unlink(missing_ok=True)
                self._verified.discard(path.name)
            total -= size
            log.info("image cache: dropped %s to stay under %d bytes", path.name, self.max_bytes)
