"""cgroup v2 folders: what a job's commands run in, so that all they started can be found
and killed, a ``setsid`` child or a double fork included (docs/architecture.md, "Jobs and
evidence").

A process group is left with one ``setsid``; a cgroup is not: a process cannot leave the
cgroup it was put in without write access to another cgroup's ``cgroup.procs``, which the
account a shared worker runs a person's commands as does not have (root has, and so has an
account a cgroup was delegated to: a worker of its own user's jobs keeps only what stays).
No controller is needed: ``cgroup.procs``, ``cgroup.events`` and ``cgroup.kill`` exist in
every cgroup.
"""
from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
KILL_ROUNDS = 200    # of killing every pid, where the kernel has no cgroup.kill (before 5.14)
READY = b"ready\n"  # what a keeper says once it watches (``keep``)


def mount_point(mountinfo: Path = MOUNTINFO) -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup``, or
    ``/sys/fs/cgroup/unified`` in the hybrid layout), None where it is not."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        before, _, after = line.partition(" - ")
        fields = before.split()
        if after.split()[:1] == ["cgroup2"] and len(fields) > 4:
            return Path(fields[4].replace("\\040", " "))
    return None


def own_path(pid: int | str = "self") -> str | None:
    """The cgroup v2 path of a process (``/user.slice/…``), from ``/proc/PID/cgroup``."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return line[3:]
    return None


def own_cgroup() -> "Cgroup | None":
    """This process's cgroup v2, None where there is none."""
    mount, path = mount_point(), own_path()
    if mount is None or path is None:
        return None
    return Cgroup(mount / path.lstrip("/").removesuffix(" (deleted)"))


class Cgroup:
    """One cgroup v2 folder."""

    def __init__(self, path: Path):
        self.path = path

    def __repr__(self) -> str:
        return f"Cgroup({str(self.path)!r})"

    def child(self, name: str) -> Cgroup:
        """Make a cgroup inside this one (``OSError`` where it may not be made)."""
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"not a cgroup name: {name!r}")
        path = self.path / name
        path.mkdir(mode=0o755)
        return Cgroup(path)

    def children(self) -> list[Cgroup]:
        try:
            return [Cgroup(p) for p in self.path.iterdir() if p.is_dir()]
        except OSError:
            return []

    def add(self, pid: int) -> None:
        """Move process ``pid`` in (``OSError`` where it may not be moved)."""
        (self.path / "cgroup.procs").write_text(f"{pid}\n")

    def pids(self) -> list[int]:
        """The processes in this cgroup (not its children's)."""
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def populated(self) -> bool:
        """Whether a process is in this cgroup or one below it."""
        try:
            events = (self.path / "cgroup.events").read_text().split()
        except FileNotFoundError:
            return False
        except OSError:
            return bool(self.pids())
        return events[events.index("populated") + 1] != "0" if "populated" in events else bool(self.pids())

    def kill(self, use_kill_file: bool = True) -> None:
        """SIGKILL every process in this cgroup and those below it, in one step where the
        kernel has ``cgroup.kill``; else frozen (where it can be), pid by pid, until none is
        left (a fork meanwhile is caught by the next round)."""
        kill_file = self.path / "cgroup.kill"
        if use_kill_file and kill_file.exists():
            with contextlib.suppress(FileNotFoundError):
                kill_file.write_text("1\n")
            return
        self._freeze(True)
        try:
            for _ in range(KILL_ROUNDS):
                pids = [pid for cgroup in self.tree() for pid in cgroup.pids()]
                if not pids:
                    return
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.005)
        finally:
            self._freeze(False)

    def tree(self) -> list[Cgroup]:
        """This cgroup and every one below it, the deepest first."""
        found: list[Cgroup] = []
        for child in self.children():
            found.extend(child.tree())
        return [*found, self]

    def wait_empty(self, timeout_s: float) -> bool:
        """Wait until no process is left in it (killed ones take a moment to exit)."""
        deadline = time.monotonic() + timeout_s
        pause = 0.001
        while self.populated():
            if time.monotonic() > deadline:
                return False
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
        return True

    def remove(self, timeout_s: float = 5.0, use_kill_file: bool = True) -> bool:
        """Kill everything in it and remove it with the cgroups below it; whether it is gone
        (a process stuck in the kernel keeps it until it exits)."""
        if not self.path.exists():
            return True
        self.kill(use_kill_file)
        if not self.wait_empty(timeout_s):
            return False
        for cgroup in self.tree():
            with contextlib.suppress(FileNotFoundError):
                try:
                    cgroup.path.rmdir()
                except OSError:
                    return False
        return True

    def _freeze(self, frozen: bool) -> None:
        with contextlib.suppress(OSError):
            (self.path / "cgroup.freeze").write_text("1\n" if frozen else "0\n")


def keep(folder: Path) -> None:
    """A worker's keeper (``python -m device_loop.core.cgroups FOLDER``, its standard input
    the worker's lifeline): once that ends, however the worker ended, kill and remove
    ``FOLDER``. It ignores the signals a terminal or a service manager sends the worker's
    group: it ends when its work is done."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    os.write(1, READY)
    os.close(1)
    while True:
        try:
            if not os.read(0, 4096):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    Cgroup(folder).remove(timeout_s=30)


if __name__ == "__main__":
    import sys

    keep(Path(sys.argv[1]))
