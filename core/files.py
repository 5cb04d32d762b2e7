"""Files: small ones the exporter keeps across crashes, and the digest of big ones."""
from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    """The sha256 of a file, read through one buffer (an image of gigabytes too)."""
    digest = hashlib.sha256()
    buffer = bytearray(chunk)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as data:
        while n := data.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


def write_atomically(path: Path, text: str) -> None:
    """Write ``path`` so that a crash leaves the old content or the new, never half of it
    (several threads may write the same path at once)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    partial.write_text(text)
    partial.replace(path)
