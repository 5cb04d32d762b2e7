"""The image registry's files: one per image, named by its sha256, in one folder.

An upload streams to a temporary file in the same folder while it is hashed (never
whole in memory; the hashing, writing and syncing in a worker thread, so that other
requests are not held up). What happens to it next is the registry's to decide
(``images.py``): it is put in place under its digest (``place``) or dropped
(``discard``). A file in place is never removed here on an upload's behalf: several
uploads (in several coordinator processes) may share it, and only the database knows
whether a row uses it (``Images.sweep_files``).

A temporary file is locked (``flock``) while its upload lives, so that a start-up, or
any process sharing the folder, can tell the files that a killed upload left behind. A
file is created before it can be locked: one younger than ``PARTIAL_GRACE_S`` is never
swept, whoever holds it, or another process's sweep could take a live upload's file in
that instant.
"""
from __future__ import annotations

import asyncio
import errno
import fcntl
import hashlib
import logging
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator

from starlette.requests import ClientDisconnect

from device_loop.core.errors import ErrorCode

from .errors import APIError

log = logging.getLogger(__name__)
BATCH = 4 << 20  # bytes of an upload kept in memory before they go to disk
PARTIAL_PREFIX = ".upload-"
PARTIAL_GRACE_S = 60.0  # between an upload's mkstemp and its flock, its file is unlocked
DIGEST_NAME = re.compile(r"^[0-9a-f]{64}$")
# the disk, the account's quota or the process's file size limit is full
FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


@dataclass
class Received:
    """An upload on disk, not yet in place."""
    sha256: str
    size: int
    partial: Path
    fd: int  # open, and locked, until placed or discarded


class ImageFiles:
    def __init__(self, folder: str | Path | None):
        self.folder = Path(folder) if folder else None

    def _need_folder(self) -> Path:
        if self.folder is None:
            raise APIError(503, ErrorCode.NO_IMAGE_FOLDER, "this coordinator keeps no images: start it with "
                                                           "--image-dir")
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        return self.folder

    def path(self, sha256: str) -> Path:
        return self._need_folder() / sha256

    async def receive(self, chunks: AsyncIterator[bytes], limit: int, too_large: APIError,
                      declared_sha256: str | None = None, declared_size: int | None = None) -> Received:
        """Stream an upload to a temporary file of the folder, checked against ``limit``
        (past it: ``too_large``) and what the uploader declared. Nothing is left on disk
        when it is refused, cut off, or the disk is full."""
        folder = self._need_folder()
        digest, size = hashlib.sha256(), 0
        batch, filled = bytearray(BATCH), 0  # one buffer, reused: memory stays flat whatever the size

        def store(data: memoryview, last: bool = False) -> None:
            digest.update(data)
            out.write(data)
            if last:
                out.flush()
                os.fsync(out.fileno())

        fd, name = tempfile.mkstemp(dir=folder, prefix=PARTIAL_PREFIX)
        partial = Path(name)
        fcntl.flock(fd, fcntl.LOCK_EX)
        keep = False
        try:
            out = os.fdopen(os.dup(fd), "wb")
            with out, memoryview(batch) as view:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > limit:
                        raise too_large
                    while chunk:  # hashing and writing, off the event loop, a batch at a time
                        taken = min(len(chunk), BATCH - filled)
                        view[filled:filled + taken] = chunk[:taken]
                        filled, chunk = filled + taken, chunk[taken:]
                        if filled == BATCH:
                            await asyncio.to_thread(store, view)
                            filled = 0
                await asyncio.to_thread(store, view[:filled], True)
            sha256 = digest.hexdigest()
            if declared_size is not None and declared_size != size:
                raise APIError(422, ErrorCode.SIZE_MISMATCH, f"declared {declared_size} bytes, received {size}: "
                                                             f"nothing kept")
            if declared_sha256 is not None and declared_sha256.lower() != sha256:
                raise APIError(422, ErrorCode.CHECKSUM_MISMATCH,
                               f"declared sha256 {declared_sha256}, received {sha256}: nothing kept")
            keep = True
            return Received(sha256, size, partial, fd)
        except ClientDisconnect:
            log.warning("an upload was cut off by its client after %d bytes: nothing kept", size)
            raise APIError(400, ErrorCode.UPLOAD_CUT, f"the upload was cut off after {size} bytes: nothing "
                                                      f"kept") from None
        except OSError as exc:
            if exc.errno in FULL:
                raise APIError(507, ErrorCode.REGISTRY_FULL, f"the image registry's disk is full ({exc.strerror}) "
                                                             f"after {size} bytes: nothing kept; an admin frees space "
                                                             "(device-loop images gc)") from None
            raise
        finally:
            if not keep:
                partial.unlink(missing_ok=True)
                os.close(fd)

    def place(self, received: Received) -> None:
        """Put a received file in place under its digest (the same bytes may be there already)."""
        try:
            os.replace(received.partial, self.path(received.sha256))
        finally:
            os.close(received.fd)

    def discard(self, received: Received) -> None:
        received.partial.unlink(missing_ok=True)
        os.close(received.fd)

    def remove(self, sha256: str) -> None:
        self.path(sha256).unlink(missing_ok=True)

    def digests(self) -> set[str]:
        """The digests whose files are in the folder."""
        if self.folder is None or not self.folder.is_dir():
            return set()
        return {p.name for p in self.folder.iterdir() if DIGEST_NAME.match(p.name)}

    def sweep_partials(self, now: float | None = None) -> list[str]:
        """Remove the temporary files of uploads that no longer run (their process was
        killed): those nobody holds locked, older than ``PARTIAL_GRACE_S``. Their names."""
        if self.folder is None or not self.folder.is_dir():
            return []
        removed = []
        for partial in self.folder.glob(PARTIAL_PREFIX + "*"):
            try:
                fd = os.open(partial, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                opened = os.fstat(fd)
                if (time.time() if now is None else now) - opened.st_mtime < PARTIAL_GRACE_S:
                    continue  # perhaps created and not yet locked by its upload
                if os.stat(partial).st_ino != opened.st_ino:
                    continue  # placed (renamed away) while we opened it, and the name taken again
            except (BlockingIOError, FileNotFoundError):
                continue  # a live upload's, or placed meanwhile
            else:
                partial.unlink(missing_ok=True)
                removed.append(partial.name)
            finally:
                os.close(fd)
        return removed
