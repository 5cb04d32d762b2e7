"""Who holds a device node open, read from /proc (spawns nothing, opens nothing)."""
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import AbstractSet


#: Unix98 pty slaves (majors 136-143): each devpts mount numbers its own from 0, so a device
#: number names a pty only together with the mount it is on (its inode is matched instead).
PTY_SLAVE_MAJORS = range(136, 144)


#: Where the kernel puts the nodes of its devices (``/dev``, and any bind mount of it).
MOUNTINFO = "/proc/self/mountinfo"
KERNEL_NODES_FS = "devtmpfs"


@dataclass(frozen=True)
class _Target:
    """A node asked about, as what an fd may show of it: its path, its inode, and its device
    number where that names it (a process in a container sees the node by another name: a
    bind mount, or a node of its own /dev)."""
    node: str
    inode: tuple[int, int]               # (st_dev, st_ino): the same file, under any name
    device: tuple[int, int] | None       # (file type, st_rdev) of the kernel's own node; None for any other


def kernel_node_filesystems(mountinfo: str = MOUNTINFO) -> set[int]:
    """The ``st_dev`` of each devtmpfs mounted here: a node on one is the kernel's own node
    of its device (made by the kernel, or by root on the host), so its device number names
    that device wherever another node of it is opened. Empty when it cannot be read."""
    found: set[int] = set()
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return found
    for line in lines:  # ID PARENT MAJOR:MINOR ROOT POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE ...
        mount, _, filesystem = line.partition(" - ")
        fields = mount.split()
        if len(fields) > 2 and filesystem.split()[:1] == [KERNEL_NODES_FS]:
            major, _, minor = fields[2].partition(":")
            if major.isdigit() and minor.isdigit():
                found.add(os.makedev(int(major), int(minor)))
    return found


def _target(node: str, kernel_filesystems: set[int]) -> _Target | None:
    try:
        info = os.stat(node)
    except OSError:
        return None
    device = None
    if (stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)) and os.major(info.st_rdev) not in PTY_SLAVE_MAJORS \
            and info.st_dev in kernel_filesystems:
        device = (stat.S_IFMT(info.st_mode), info.st_rdev)
    return _Target(node, (info.st_dev, info.st_ino), device)


def holders(nodes: set[str], skip: AbstractSet[int] = frozenset(),
            among: AbstractSet[int] | None = None) -> dict[str, set[int]]:
    """For each of ``nodes``, the pids of processes that have it open (those whose fds we
    may read, but for ``skip``; only ``among`` when given), in one pass over /proc however
    many nodes are asked about.

    An fd holds a node when its link is the node's real path; or, for an fd whose link is a
    path under /dev (a container's view: a bind mount, or a node of its own /dev), when it is
    the node's inode, or — the node being the kernel's own (on devtmpfs) — a character/block
    node of the same device number: every such node opens that device. A node elsewhere (a
    copy made by mknod, a test's fake tree) is only itself: its number is a claim, and may be
    another device's (docs/architecture.md, "Lifecycle"). Only such fds are stat()ed."""
    targets: dict[str, _Target] = {}
    kernel_filesystems: set[int] | None = None
    for node in nodes:
        try:
            real = os.path.realpath(node)
        except OSError:
            continue
        if kernel_filesystems is None:
            kernel_filesystems = kernel_node_filesystems()
        target = _target(real, kernel_filesystems)
        if target is not None:
            targets[real] = _Target(node, target.inode, target.device)
    found: dict[str, set[int]] = {node: set() for node in nodes}
    if not targets:
        return found
    by_inode = {t.inode: t.node for t in targets.values()}
    by_device = {t.device: t.node for t in targets.values() if t.device is not None}
    pids = [int(p.name) for p in os.scandir("/proc") if p.name.isdigit()] if among is None else among
    for pid in pids:
        if pid in skip:
            continue
        try:
            fds = os.scandir(f"/proc/{pid}/fd")
        except OSError:
            continue
        with fds:
            for fd in fds:
                try:
                    link = os.readlink(fd.path)
                except OSError:
                    continue
                held = targets.get(link)
                if held is not None:
                    found[held.node].add(pid)
                elif link.startswith("/dev/"):
                    other = _held_under_another_name(fd.path, by_inode, by_device)
                    if other is not None:
                        found[other].add(pid)
    return found


def _held_under_another_name(fd: str, by_inode: dict[tuple[int, int], str],
                             by_device: dict[tuple[int, int], str]) -> str | None:
    try:
        info = os.stat(fd)
    except OSError:
        return None
    node = by_inode.get((info.st_dev, info.st_ino))
    if node is None and (stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)):
        node = by_device.get((stat.S_IFMT(info.st_mode), info.st_rdev))
    return node


def cgroup_of(pid: int) -> str:
    """The cgroup ``pid`` runs in (the unified hierarchy's line of /proc/PID/cgroup, else the
    first named one): a container's names its container; "" when it cannot be read."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return ""
    paths: dict[str, str] = {}
    for line in lines:
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        paths.setdefault(controllers, path)
    unified = paths.get("")
    if unified and unified != "/":
        return unified
    return next((path for path in paths.values() if path and path != "/"), unified or "")


def start_time_of(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot, /proc/PID/stat): with the pid, names one
    process even after the pid is used again. None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
        return int(fields[19])  # the 22nd field; the first two (pid, comm) are before ")"
    except (OSError, IndexError, ValueError):
        return None


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def listening_ports(pid: int) -> set[int]:
    """TCP ports ``pid`` listens on (its sockets matched against /proc/net/tcp*)."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        return set()
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports
