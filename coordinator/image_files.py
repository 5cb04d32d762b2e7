"""The image registry's files: one per image, named by its sha256, in one folder.

An upload streams to a temporary file in the same folder while it is hashed (never
whole in memory; the hashing, writing and syncing in a worker thread, so that other
requests are not held up), and is renamed into place only once its size and digest are known
and agree with what the uploader declared; a refused upload leaves nothing behind.
"""
from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from pathlib import Path
from typing import AsyncIterator

from .errors import APIError

BATCH = 4 << 20  # bytes of an upload kept in memory before they go to disk


class ImageFiles:
    def __init__(self, folder: Path | None):
        self.folder = Path(folder) if folder else None

    def _need_folder(self) -> Path:
        if self.folder is None:
            raise APIError(503, "no_image_folder", "this coordinator keeps no images: start it with --image-dir")
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        return self.folder

    def path(self, sha256: str) -> Path:
        return self._need_folder() / sha256

    async def receive(self, chunks: AsyncIterator[bytes], limit: int, declared_sha256: str | None = None,
                      declared_size: int | None = None) -> tuple[str, int, bool]:
        """Store an upload: ``(sha256, size, new)``; ``new`` is False when the same bytes were
        there already (the upload is then dropped)."""
        folder = self._need_folder()
        digest, size = hashlib.sha256(), 0
        batch, filled = bytearray(BATCH), 0  # one buffer, reused: memory stays flat whatever the size

        def store(out, data: memoryview, last: bool = False) -> None:
            digest.update(data)
            out.write(data)
            if last:
                out.flush()
                os.fsync(out.fileno())

        fd, partial = tempfile.mkstemp(dir=folder, prefix=".upload-")
        try:
            with os.fdopen(fd, "wb") as out, memoryview(batch) as view:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > limit:
                        raise APIError(413, "too_large", f"the image is over this lab's limit of {limit} bytes")
                    while chunk:  # hashing and writing, off the event loop, a batch at a time
                        taken = min(len(chunk), BATCH - filled)
                        view[filled:filled + taken] = chunk[:taken]
                        filled, chunk = filled + taken, chunk[taken:]
                        if filled == BATCH:
                            await asyncio.to_thread(store, out, view)
                            filled = 0
                await asyncio.to_thread(store, out, view[:filled], True)
            sha256 = digest.hexdigest()
            if declared_size is not None and declared_size != size:
                raise APIError(422, "size_mismatch", f"declared {declared_size} bytes, received {size}: nothing kept")
            if declared_sha256 is not None and declared_sha256.lower() != sha256:
                raise APIError(422, "checksum_mismatch",
                               f"declared sha256 {declared_sha256}, received {sha256}: nothing kept")
            final = folder / sha256
            if final.exists():
                return sha256, size, False
            os.replace(partial, final)
            return sha256, size, True
        finally:
            Path(partial).unlink(missing_ok=True)

    def remove(self, sha256: str) -> None:
        self.path(sha256).unlink(missing_ok=True)
