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
