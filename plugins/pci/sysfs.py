"""Bounded, read-only reads of sysfs (and procfs) files, for a tree that may say anything.

Every read is of a regular file (a FIFO or a device node put where an attribute should be
is never opened: it could block, or reset what it is), at most ``limit`` bytes of it, and
a file that is missing, unreadable or not text reads as ``""``: a scan of a hostile tree
answers with what it could read and never raises.
"""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path

#: A PCI address as sysfs names a device: domain, bus, device, function.
ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]")
#: What an attribute read is cut to: sysfs attributes are a page at most, and ours a line.
ATTR_LIMIT = 256
#: What an AER counters file or a driver's information file is cut to.
TABLE_LIMIT = 4096
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def _read_at(name: str, dir_fd: int | None, limit: int) -> str:
    try:
        if not stat.S_ISREG(os.lstat(name, dir_fd=dir_fd).st_mode):
            return ""
        fd = os.open(name, _FLAGS, dir_fd=dir_fd)
    except (OSError, ValueError):
        return ""
    try:
        data = os.read(fd, limit)
    except OSError:
        return ""
    finally:
        os.close(fd)
    return data.decode("ascii", "replace").strip()


def read_text(path: Path | str, limit: int = ATTR_LIMIT) -> str:
    """The first ``limit`` bytes of the regular file ``path`` as text, stripped; ``""`` when
    it is missing, not a regular file, or cannot be read."""
    return _read_at(os.fspath(path), None, limit)


def parse_hex(text: str, digits: int = 4) -> str | None:
    """An id as sysfs writes it (``0x10de``): its ``digits`` hex digits, lowercase; None otherwise."""
    match = re.fullmatch(rf"0x([0-9a-f]{{{digits}}})", text.lower())
    return match.group(1) if match else None


def read_hex(path: Path | str, digits: int = 4) -> str | None:
    """The id in the file ``path`` (``parse_hex``)."""
    return parse_hex(read_text(path), digits)


class Folder:
    """A sysfs folder (a card's), opened once and its files read relative to it: a check of
    several files walks the path once. ``OSError`` when it is gone (or not a folder)."""

    def __init__(self, path: Path | str):
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))

    def text(self, name: str, limit: int = ATTR_LIMIT) -> str:
        """The file ``name`` of the folder, as ``read_text`` reads a file."""
        return _read_at(name, self.fd, limit)

    def link(self, name: str) -> str | None:
        """Where the link ``name`` of the folder points, as ``link_name`` says it."""
        try:
            return _link_word(os.readlink(name, dir_fd=self.fd))
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _link_word(target: str) -> str | None:
    name = os.path.basename(target.rstrip("/"))
    return name if re.fullmatch(r"[A-Za-z0-9_.+-]{1,64}", name) else None


def link_name(path: Path | str) -> str | None:
    """The last part of where the symbolic link ``path`` points (a ``driver`` link's driver,
    an ``iommu_group``'s number), if it is a word; None when there is no such link."""
    try:
        return _link_word(os.readlink(path))
    except (OSError, ValueError):
        return None


def names_in(folder: Path, pattern: re.Pattern[str], limit: int = 64) -> list[str]:
    """The names of ``folder``'s entries that match ``pattern``, sorted, ``limit`` at most
    looked at; none when it is not a folder."""
    found = []
    try:
        with os.scandir(folder) as entries:
            for count, entry in enumerate(entries):
                if count >= 4 * limit:
                    break
                if pattern.fullmatch(entry.name):
                    found.append(entry.name)
    except (OSError, ValueError):
        return []
    return sorted(found)[:limit]
