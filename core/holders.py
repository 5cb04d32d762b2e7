"""Who holds a device node open, read from /proc (spawns nothing, opens nothing)."""
import os
from pathlib import Path
from typing import AbstractSet


def holders(nodes: set[str], skip: AbstractSet[int] = frozenset()) -> dict[str, set[int]]:
    """For each of ``nodes``, the pids of processes that have it open (those whose fds we
    may read, but for ``skip``), in one pass over /proc however many nodes are asked about."""
    targets: dict[str, str] = {}
    for node in nodes:
        try:
            targets[os.path.realpath(node)] = node
        except OSError:
            continue
    found: dict[str, set[int]] = {node: set() for node in nodes}
    if not targets:
        return found
    for proc in os.scandir("/proc"):
        if not proc.name.isdigit() or int(proc.name) in skip:
            continue
        try:
            fds = os.scandir(f"/proc/{proc.name}/fd")
        except OSError:
            continue
        with fds:
            for fd in fds:
                try:
                    held = targets.get(os.readlink(fd.path))
                except OSError:
                    continue
                if held is not None:
                    found[held].add(int(proc.name))
    return found


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
