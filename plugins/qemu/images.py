"""A slot's base files (kernel, initramfs, disk): their sha256 as first seen, checked by health,
and their replacement by a flash (docs/architecture.md, "Virtual devices").

A file's digest is taken the first time the exporter sees it and kept in
``STATE_DIR/qemu/digests.json`` with its size and time; at every start the file is hashed
again, and health compares its size and time on each scan: a base that changed behind the
exporter's back is ``failed`` with both digests, until a flash (which records the new one)
or an admin who deletes the record. A flash writes next to the file and renames over it, so
running VMs keep the file they booted and a torn write never becomes a base.

No disk is booted that names a file of the host (a qcow2's backing or external data file:
``disk_problem``), the slot's own included: a slot whose base does is ``failed`` saying why,
and a flash of such an image fails before anything is replaced.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Callable

from device_loop.plugin import DiskFormat, disk_format, disk_problem, find_program, last_lines, run

CHUNK = 1 << 20


def sha256_of(path: Path, progress: Callable[[int], None] | None = None) -> str:
    digest, done = hashlib.sha256(), 0
    with open(path, "rb") as source:
        while chunk := source.read(CHUNK):
            digest.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done)
    return digest.hexdigest()


def _stat(path: Path) -> list[int]:
    info = path.stat()
    return [info.st_size, info.st_mtime_ns, info.st_ino]


class BaseImages:
    """The digests of every slot's files, on disk."""

    def __init__(self, record: Path):
        self.record = record
        self._lock = threading.Lock()
        try:
            self.known: dict[str, dict] = json.loads(record.read_text())
        except (OSError, ValueError):
            self.known = {}
        self.changed: dict[str, str] = {}  # path -> why it is not what was first seen
        self.refused: dict[str, str] = {}  # path -> why a slot's base disk may not be booted

    def _save(self) -> None:
        self.record.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.record.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.known, indent=1, sort_keys=True))
        os.replace(temporary, self.record)

    def first_sight(self, files: dict[str, str]) -> None:
        """Hash each of ``files`` (key -> path) that exists: a new one's digest is recorded, a
        known one's compared with its record."""
        with self._lock:
            for path in files.values():
                file = Path(path)
                if not file.is_file():
                    continue
                digest = sha256_of(file)
                known = self.known.get(path)
                if known is None:
                    self.known[path] = {"sha256": digest, "stat": _stat(file)}
                elif known["sha256"] != digest:
                    self.changed[path] = (f"{path} changed since it was first seen (sha256 {digest[:12]}, "
                                          f"recorded {known['sha256'][:12]})")
                else:
                    known["stat"] = _stat(file)
            self._save()

    def check_base(self, path: str) -> None:
        """Hold a slot's configured base disk to ``disk_problem``: one that names a file of the
        host makes its slot ``failed`` (``problem``), saying why."""
        if not Path(path).is_file():
            return
        problem = disk_problem_of(path)
        if problem is None:
            self.refused.pop(path, None)
        else:
            self.refused[path] = f"its disk {path} may not be booted: {problem}"

    def problem(self, files: dict[str, str]) -> str:
        """Why the slot's files cannot be booted ("" when they can): one is missing, or is not
        what was first seen. Cheap: a stat each."""
        for key, path in files.items():
            file = Path(path)
            if not file.is_file():
                return f"its {key} {path} is missing"
            if path in self.changed:
                return self.changed[path]
            if path in self.refused:
                return self.refused[path]
            known = self.known.get(path)
            if known is not None and known.get("stat") != _stat(file):
                return (f"its {key} {path} changed since it was hashed (sha256 {known['sha256'][:12]}): flash it, or "
                        f"delete {self.record} to take the file as it is")
        return ""

    def replace(self, target: Path, image: Path, sha256: str, is_disk: bool, progress: Callable[[int], None]) -> str:
        """Put ``image`` in the slot's file ``target``'s place (``install``). The new digest is
        recorded."""
        install(target, image, sha256, is_disk, progress)
        with self._lock:
            self.known[str(target)] = {"sha256": sha256, "stat": _stat(target)}
            self.changed.pop(str(target), None)
            self.refused.pop(str(target), None)
            self._save()
        return f"{target.name} replaced by the image (sha256 {sha256[:12]}), checked by read-back"


def install(target: Path, image: Path, sha256: str, is_disk: bool, progress: Callable[[int], None]) -> None:
    """Put ``image`` in ``target``'s place: copied beside it, checked by read-back (and, for a
    disk, held to ``disk_problem``), renamed over it. ``OSError`` saying why otherwise, with
    ``target`` as it was."""
    temporary = target.with_name(f".{target.name}.flash")
    try:
        with open(image, "rb") as source, open(temporary, "wb") as out:
            done = 0
            while chunk := source.read(CHUNK):
                out.write(chunk)
                done += len(chunk)
                progress(done)
            out.flush()
            os.fsync(out.fileno())
        written = sha256_of(temporary)
        if written != sha256:
            raise OSError(f"the copy reads back as sha256 {written[:12]}, not {sha256[:12]}")
        if is_disk:
            problem = disk_problem_of(str(temporary))
            if problem is not None:
                raise OSError(f"the image may not be booted: {problem}")
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def disk_problem_of(path: str) -> str | None:
    """Why the disk at ``path`` may not be booted, or None: ``disk_problem`` (the header, read
    here before any tool opens the file), then ``qemu-img info`` as a second opinion on a qcow2
    the first found clean (it opens no other file then: none is named)."""
    problem = disk_problem(path)
    if problem is not None or disk_format(path) != DiskFormat.QCOW2:
        return problem
    program = find_program("qemu-img")
    code, output = run([program or "qemu-img", "info", "--output=json", "-f", DiskFormat.QCOW2, path], timeout=30)
    if code != 0:
        return f"qemu-img cannot read it: {last_lines(output)}"
    info = json.loads(output)
    named = info.get("backing-filename") or info.get("format-specific", {}).get("data", {}).get("data-file")
    return f"qemu-img says it names {named!r}" if named else None
