"""What a disk image is, read from its own bytes, and whether it names a file of the host
(docs/architecture.md, "Virtual devices": "An image never opens a host path").

A disk is either a qcow2 (its first four bytes say so) or raw: the format is stated to QEMU
and never probed, so a raw image whose bytes look like another format (a VMDK descriptor
naming extents, a QED with a backing file) is read as the bytes it is. A qcow2 can name other
files in its header: a backing file, an external data file. QEMU opens those on the host
when it opens the image, as whatever account runs it, so a user's qcow2 that names
``/etc/device-loop/exporter.token`` as its data file shows that file to the guest. Such an
image is refused here, before any tool opens it (``qemu-img info`` itself opens a data file).

The header is read by this module, not by QEMU: each field that can name a file is refused,
and so is what it cannot vouch for (a version, an encryption or an incompatible feature it
does not know), since QEMU may read such an image in a way this check never saw.
"""
from __future__ import annotations

import struct
from enum import StrEnum
from pathlib import Path
from typing import BinaryIO

QCOW2_MAGIC = b"QFI\xfb"
_V2_HEADER = struct.Struct(">4sIQIIQIIQQIIQ")  # magic .. snapshots_offset: 72 bytes
# version 3: incompatible, compatible and autoclear features, refcount_order, header_length
_V3_MORE = struct.Struct(">QQQII")
_EXTENSION = struct.Struct(">II")  # type, length
# the largest cluster (cluster_bits 21): the header and its extensions fit in the first one
MAX_HEADER_BYTES = 1 << 21

# header extensions (QEMU's docs/interop/qcow2.txt)
END, BACKING_FORMAT, FEATURE_NAMES, BITMAPS, ENCRYPTION, DATA_FILE = (
    0x00000000, 0xE2792ACA, 0x6803F857, 0x23852875, 0x0537BE77, 0x44415441)
# incompatible feature bits
DIRTY, CORRUPT, EXTERNAL_DATA, COMPRESSION_TYPE, EXTENDED_L2 = 0, 1, 2, 3, 4
KNOWN_INCOMPATIBLE = (1 << DIRTY) | (1 << CORRUPT) | (1 << EXTERNAL_DATA) | (1 << COMPRESSION_TYPE) | (1 << EXTENDED_L2)
RAW_EXTERNAL = 1  # autoclear bit: the external data file is a raw image


class DiskFormat(StrEnum):
    """The formats a disk is handed to QEMU in: stated, never probed."""
    QCOW2 = "qcow2"
    RAW = "raw"


def disk_format(path: str | Path) -> DiskFormat:
    """``qcow2`` if the file's first bytes say so, else ``raw``."""
    with open(path, "rb") as image:
        return DiskFormat.QCOW2 if image.read(4) == QCOW2_MAGIC else DiskFormat.RAW


def disk_problem(path: str | Path) -> str | None:
    """Why the image at ``path`` may not be given to QEMU (a sentence naming what it names or
    what cannot be vouched for), or None: a raw image, or a qcow2 that names no other file.
    ``OSError`` when it cannot be read."""
    with open(path, "rb") as image:
        return image_problem(image)


def image_problem(image: BinaryIO) -> str | None:
    """``disk_problem`` of an open file (read from its start)."""
    image.seek(0)
    head = image.read(_V2_HEADER.size)
    if head[:4] != QCOW2_MAGIC:
        return None
    if len(head) < _V2_HEADER.size:
        return "it is a qcow2 cut short within its header"
    (_, version, backing_offset, backing_size, cluster_bits, _, crypt_method, _, _, _, _, _,
     _) = _V2_HEADER.unpack(head)
    if version not in (2, 3):
        return f"it is a qcow2 of version {version}, which this check does not read (2 and 3 only)"
    if not 9 <= cluster_bits <= 21:
        return f"its qcow2 header says clusters of 2^{cluster_bits} bytes, which no qcow2 has"
    if backing_offset or backing_size:
        name = _read_at(image, backing_offset, min(backing_size, 1023)) if backing_offset else b""
        return (f"it is a qcow2 over a backing file ({_shown(name)}): QEMU would open that file of the host; give a "
                f"whole image (qemu-img convert -O qcow2 IN whole.qcow2)")
    if crypt_method:
        return "it is an encrypted qcow2: it needs a secret to be read, and none is given to a lab's VMs"
    extensions_at = _V2_HEADER.size
    if version == 3:
        more = image.read(_V3_MORE.size)
        if len(more) < _V3_MORE.size:
            return "it is a qcow2 cut short within its header"
        incompatible, _, autoclear, _, header_length = _V3_MORE.unpack(more)
        if incompatible & (1 << EXTERNAL_DATA) or autoclear & RAW_EXTERNAL:
            return _extension_problem(image, header_length, 1 << cluster_bits) or _data_file(b"")
        if incompatible & ~KNOWN_INCOMPATIBLE:
            return (f"its qcow2 header asks for features this check does not know (incompatible bits "
                    f"{incompatible & ~KNOWN_INCOMPATIBLE:#x})")
        if not _V2_HEADER.size + _V3_MORE.size <= header_length <= 1 << cluster_bits:
            return f"its qcow2 header says it is {header_length} bytes long, which cannot be"
        extensions_at = header_length
    return _extension_problem(image, extensions_at, 1 << cluster_bits)


def _extension_problem(image: BinaryIO, at: int, cluster: int) -> str | None:
    """The header extensions from ``at`` to the end of the first cluster: one that names a
    file, or that cannot be read to its end, is a problem."""
    while True:
        if at + _EXTENSION.size > min(cluster, MAX_HEADER_BYTES):
            return "its qcow2 header extensions run past the header's cluster"
        raw = _read_at(image, at, _EXTENSION.size)
        if len(raw) < _EXTENSION.size:
            return "it is a qcow2 cut short within its header extensions"
        kind, length = _EXTENSION.unpack(raw)
        if kind == END:
            return None
        if kind == DATA_FILE:
            return _data_file(_read_at(image, at + _EXTENSION.size, min(length, 1023)))
        at += _EXTENSION.size + (length + 7) // 8 * 8


def _data_file(name: bytes) -> str:
    named = f" ({_shown(name)})" if name else ""
    return (f"it is a qcow2 whose data lives in an external data file{named}: QEMU would open that file of the "
            f"host; give a whole image (qemu-img convert -O qcow2 IN whole.qcow2)")


def _read_at(image: BinaryIO, offset: int, size: int) -> bytes:
    image.seek(offset)
    return image.read(size)


def _shown(name: bytes) -> str:
    """A name from an image's header as a message may quote it: printable, and short."""
    text = name.decode(errors="replace")
    text = "".join(c if c.isprintable() else "?" for c in text)
    return repr(text[:120] + ("..." if len(text) > 120 else ""))
