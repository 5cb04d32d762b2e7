"""The simulated boards' switch files, watched by one thread for all of them.

A thread per board waking every 50 ms made an exporter of 200 boards wake 4,000 times a
second to find nothing changed. Here one thread sleeps on inotify (through libc, as no
standard module speaks it) on the folders of the switch files, and hands a change to the
board whose file it is; every ``CHECK_S`` it also looks at each file itself, so a change
inotify cannot see (a folder made after the board, a system without inotify) still comes,
only later.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import select
import struct
import threading
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)
CHECK_S = 1.0  # each switch is also looked at this often, whatever inotify said
# IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE
_EVENTS = 0x002 | 0x004 | 0x008 | 0x080 | 0x100 | 0x200
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event)


class SwitchWatcher:
    """``watch(path, changed)`` calls ``changed()`` soon after the file at ``path`` changes
    (and at least every ``CHECK_S``: ``changed`` compares for itself); ``unwatch(path)``."""

    def __init__(self):
        self._lock = threading.Lock()
        self._callbacks: dict[Path, Callable[[], None]] = {}
        self._folders: dict[int, Path] = {}  # inotify watch descriptor -> folder
        self._libc = _libc()
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC) if self._libc else -1
        self._thread: threading.Thread | None = None

    def watch(self, path: Path, changed: Callable[[], None]) -> None:
        path = Path(os.path.abspath(path))
        with self._lock:
            self._callbacks[path] = changed
            if self._fd >= 0 and path.parent not in self._folders.values():
                wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path.parent), _EVENTS)
                if wd >= 0:
                    self._folders[wd] = path.parent
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sim-switches", daemon=True)
                self._thread.start()

    def unwatch(self, path: Path) -> None:
        with self._lock:
            self._callbacks.pop(Path(os.path.abspath(path)), None)

    def _run(self) -> None:
        waits = [self._fd] if self._fd >= 0 else []
        while True:
            ready, _, _ = select.select(waits, [], [], CHECK_S)
            with self._lock:
                if ready:
                    names = self._changed_paths()
                    due = [cb for path, cb in self._callbacks.items() if path in names]
                else:  # (the periodic look: each file, once a CHECK_S)
                    due = list(self._callbacks.values())
            for changed in due:
                try:
                    changed()
                except Exception:  # a board's trouble is its own
                    log.exception("sim: a switch's change failed")

    def _changed_paths(self) -> set[Path]:
        """The files the pending inotify events name (the lock held)."""
        paths: set[Path] = set()
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return paths
        offset = 0
        while offset + _HEADER.size <= len(data):
            wd, _mask, _cookie, length = _HEADER.unpack_from(data, offset)
            name = data[offset + _HEADER.size:offset + _HEADER.size + length].split(b"\0", 1)[0]
            offset += _HEADER.size + length
            if wd in self._folders and name:
                paths.add(self._folders[wd] / os.fsdecode(name))
        return paths


def _libc():
    """libc, with inotify's three calls, or None where there is none (then only the periodic look)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        return libc
    except (OSError, AttributeError):
        return None


#: The one watcher of this process (the boards of every exporter in it share it).
WATCHER = SwitchWatcher()
