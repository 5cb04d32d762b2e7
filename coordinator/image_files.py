"""The image registry's files: one per image, named by its sha256, in one folder.

An upload streams to a temporary file in the same folder while it is hashed (never
whole in memory), and is renamed into place only once its size and digest are known
and agree with what the uploader declared; a refused upload leaves nothing behind.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import AsyncIterator

from .errors import APIError


class ImageFiles:
    def __init__(self, folder: Path | None):
        self.folder = Path(folder) if folder else None

    def _need_folder(self) -> Path:
        if self.folder is None:
            raise APIError(503, "no_image_folder", "this coordinator keeps no images: start it with --image-dir")
        self.folder.mkdir(parents=True, exist_ok=True)
        return self.folder

    def path(self, sha256: str) -> Path:
        return self._need_folder() / sha256

    async def receive(self, chunks: AsyncIterator[bytes], limit: int, declared_sha256: str | None = None,
                      declared_size: int | None = None) -> tuple[str, int, bool]:
        """Store an upload: ``(sha256, size, new)``; ``new`` is False when the same bytes were
        there already (the upload is then dropped)."""
        folder = self._need_folder()
        digest, size = hashlib.sha256(), 0
        fd, partial = tempfile.mkstemp(dir=folder, prefix=".upload-")
        try:
            with os.fdopen(fd, "wb") as out:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > limit:
                        raise APIError(413, "too_large", f"the image is over this lab's limit of {limit} bytes")
                    digest.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
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
