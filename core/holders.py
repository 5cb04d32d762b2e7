"""Who holds a device node open, read from /proc (spawns nothing, opens nothing)."""
import os
from pathlib import Path


def holders(node: str) -> set[int]:
    """Pids of processes with ``node`` open (those whose fds we may read)."""
    try:
        target = os.path.realpath(node)
    except OSError:
        return set()
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                try:
                    if os.readlink(fd) == target:
                        found.add(int(proc.name))
                        break
                except OSError:
                    continue
        except OSError:
            continue
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
