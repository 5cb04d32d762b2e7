"""Writing an image onto a block device or a file, and reading it back to check."""
from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from device_loop.plugin import OperationError

CHUNK = 4 << 20  # bytes per read and write: one buffer, reused (memory stays flat whatever the image's size)


def write_and_verify(target: Path, image, progress) -> dict[str, Any]:
    """Stream ``image`` onto ``target``, sync it, then hash what the target holds: the result
    says it was ``verified``, with the digest read back (``sha256``), which a reserve's
    ``--image`` reads (docs/architecture.md, "Leases that live as long as their client").

    A regular file becomes the image (truncated to its size); a block device is written
    from its start. The read-back asks the kernel to drop the target's cached pages first,
    so it reads what reached the disk, not what is still in memory.
    """
    try:
        block = stat.S_ISBLK(os.stat(target).st_mode)
        if block and _device_size(target) < image.size:
            raise OperationError(f"{target} holds {_device_size(target)} bytes, less than the image's {image.size}",
                             changed=False)
        out = os.open(target, os.O_WRONLY | (0 if block else os.O_TRUNC))
    except OSError as exc:
        raise OperationError(f"cannot open the flash target {target}: {exc.strerror}", changed=False) from None
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    done = 0
    try:
        with open(image.path, "rb", buffering=0) as source:
            while n := source.readinto(buffer):
                written = 0
                while written < n:
                    written += os.write(out, view[written:n])
                done += n
                progress("writing", done)
        os.fsync(out)
    finally:
        os.close(out)
    if done != image.size:
        raise OperationError(f"the cached image had {done} bytes, not {image.size}")
    got = _read_back(target, image.size, buffer, progress)
    if got != image.sha256:
        raise OperationError(f"read-back of {target} hashes to {got}, not to the image's {image.sha256}: the target "
                         "did not keep what was written")
    return {"message": f"written to {target} and verified by read-back (sha256 {image.sha256[:12]}...)",
            "verified": True, "sha256": got}


def _read_back(target: Path, size: int, buffer: bytearray, progress) -> str:
    digest, view, done = hashlib.sha256(), memoryview(buffer), 0
    fd = os.open(target, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        while done < size and (n := os.readv(fd, [view[:min(len(buffer), size - done)]])):
            digest.update(view[:n])
            done += n
            progress("verifying", done)
    finally:
        os.close(fd)
    return digest.hexdigest()


def _device_size(target: Path) -> int:
    fd = os.open(target, os.O_RDONLY)
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)
