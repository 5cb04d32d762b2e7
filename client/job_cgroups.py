"""The cgroups a worker runs its jobs' commands in (docs/architecture.md, "Jobs and evidence").

A worker makes a folder of its own, ``device-loop-worker-PID-TICKS``, in the cgroup v2 it
was started in; each job gets a cgroup in it, and each command of the job one in that. A
command is moved into its cgroup before it runs anything (``client/local_run.py``), so
nothing it starts is outside. Each is killed whole:

- a command's cgroup at its deadline, when its job stops, and when it ends (what it left);
- a job's cgroup when the job ends;
- the folder when the worker stops, and, however the worker ends (kill -9 too), by its
  keeper: a small process of the worker's account, outside the folder, that waits for the
  worker's lifeline to end (``core/process.py``) and then kills and removes the folder. A
  job's account cannot signal it;
- and a starting worker removes the folders of workers that are gone, should their keeper
  have gone too.
"""
from __future__ import annotations

import contextlib
import errno
import itertools
import os
import select
import subprocess
import sys
import threading
from collections.abc import Callable

from device_loop.core.cgroups import READY, Cgroup, own_cgroup, own_path
from device_loop.core.process import Lifeline, start_ticks

FOLDER_PREFIX = "device-loop-worker-"
REMOVE_TIMEOUT_S = 10.0


class CgroupsUnavailable(Exception):
    """No cgroup v2 here that this worker may make cgroups in and move processes into."""


def folder_owner(name: str) -> tuple[int, int] | None:
    """The (pid, start ticks) of the worker a folder's name says made it."""
    if not name.startswith(FOLDER_PREFIX):
        return None
    pid, _, ticks = name.removeprefix(FOLDER_PREFIX).partition("-")
    return (int(pid), int(ticks)) if pid.isdigit() and ticks.isdigit() else None


def sweep(base: Cgroup, say: Callable[[str], None]) -> None:
    """Kill and remove the folders of workers that are gone."""
    for child in base.children():
        owner = folder_owner(child.path.name)
        if owner is None or start_ticks(owner[0]) == owner[1]:
            continue
        say(f"worker: removing the job cgroups left by worker {owner[0]} ({child.path})")
        if not child.remove(REMOVE_TIMEOUT_S):
            say(f"worker: {child.path} is still in use; it stays")


class JobCgroup:
    """The cgroup of one job: its commands' cgroups are made in it."""

    def __init__(self, cgroup: Cgroup, use_kill_file: bool):
        self.cgroup, self.use_kill_file = cgroup, use_kill_file
        self._numbers = itertools.count()

    def command(self) -> Cgroup:
        """A new cgroup for one command (cells run theirs on threads of their own)."""
        return self.cgroup.child(f"command-{next(self._numbers)}")

    def kill(self, cgroup: Cgroup) -> None:
        cgroup.kill(self.use_kill_file)

    def discard(self, cgroup: Cgroup) -> None:
        """Kill what is left in a command's cgroup and remove it."""
        cgroup.remove(REMOVE_TIMEOUT_S, self.use_kill_file)

    def close(self) -> None:
        """The job ended: kill all of it and remove its cgroups."""
        self.cgroup.remove(REMOVE_TIMEOUT_S, self.use_kill_file)


class JobCgroups:
    """A worker's folder of job cgroups, and its keeper. ``start`` it; ``close`` it when the
    worker stops."""

    def __init__(self, folder: Cgroup, keeper: subprocess.Popen, lifeline: Lifeline, use_kill_file: bool = True):
        self.folder, self.keeper, self.lifeline = folder, keeper, lifeline
        self.use_kill_file = use_kill_file
        self._numbers = itertools.count()
        self._lock = threading.Lock()

    @classmethod
    def start(cls, say: Callable[[str], None], base: Cgroup | None = None, use_kill_file: bool = True) -> JobCgroups:
        """Make this worker's folder in ``base`` (default: the cgroup it runs in), after
        removing what gone workers left there, and start its keeper; ``CgroupsUnavailable``
        saying why where it cannot (no cgroup v2, not allowed to make or move into one)."""
        base = base or own_cgroup()
        if base is None or not (base.path / "cgroup.procs").exists():
            raise CgroupsUnavailable("no cgroup v2 is mounted here")
        sweep(base, say)
        try:
            folder = base.child(f"{FOLDER_PREFIX}{os.getpid()}-{start_ticks(os.getpid())}")
        except OSError as exc:
            raise CgroupsUnavailable(f"cannot make a cgroup in {base.path}: {exc.strerror or exc}") from None
        try:
            _try_moving(folder)
        except OSError as exc:
            folder.remove(REMOVE_TIMEOUT_S, use_kill_file)
            raise CgroupsUnavailable(f"cannot move a process into a cgroup in {base.path}: {exc.strerror or exc}") \
                from None
        lifeline = Lifeline()
        # (its own environment, not the worker's: that may hold a token, and the keeper runs as
        # the worker's account, so what it holds a command of that account could read)
        keeper = subprocess.Popen([sys.executable, "-P", "-m", "device_loop.core.cgroups", str(folder.path)],
                                  stdin=lifeline.fd, stdout=subprocess.PIPE, start_new_session=True,
                                  env=_plain_environment())
        if not _said_ready(keeper):
            keeper.kill()
            keeper.wait()
            lifeline.close()
            folder.remove(REMOVE_TIMEOUT_S, use_kill_file)
            raise CgroupsUnavailable(f"its keeper ({sys.executable} -m device_loop.core.cgroups) did not start")
        return cls(folder, keeper, lifeline, use_kill_file)

    def job(self) -> JobCgroup:
        """A cgroup for a job that starts."""
        with self._lock:
            return JobCgroup(self.folder.child(f"job-{next(self._numbers)}"), self.use_kill_file)

    def close(self) -> None:
        """The worker stops: kill every job's commands, remove the folder, end the keeper."""
        self.folder.remove(REMOVE_TIMEOUT_S, self.use_kill_file)
        self.lifeline.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.keeper.wait(REMOVE_TIMEOUT_S)


KEEPER_START_S = 10.0  # for its interpreter to start and say so, on a loaded machine
_PLAIN = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "LC_CTYPE")


def _plain_environment() -> dict[str, str]:
    """What a process the worker starts for itself needs of its environment, and no more."""
    return {name: os.environ[name] for name in _PLAIN if name in os.environ}


def _said_ready(keeper: subprocess.Popen) -> bool:
    """Whether the keeper says it is ready (it watches the lifeline from then on)."""
    assert keeper.stdout is not None
    with keeper.stdout:
        ready, _, _ = select.select([keeper.stdout], [], [], KEEPER_START_S)
        return bool(ready) and keeper.stdout.readline() == READY


def _try_moving(folder: Cgroup) -> None:
    """Move a process into a cgroup in ``folder`` and kill it there: what every command will need."""
    probe = folder.child("probe")
    sleeper = subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL, env=_plain_environment())
    try:
        probe.add(sleeper.pid)
        where = own_path(sleeper.pid) or ""
        if not where.endswith(f"/{folder.path.name}/probe"):
            raise OSError(errno.EPERM, f"the process stayed in {where or 'its cgroup'}")
    finally:
        probe.kill()
        with contextlib.suppress(ProcessLookupError):
            sleeper.kill()
        sleeper.wait()
        probe.remove(REMOVE_TIMEOUT_S)
