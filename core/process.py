"""Process supervision shared by every plugin and by ``device-loop up``.

Every process is recorded in ``STATE_DIR/processes/PID.json`` with its kernel start
time, so that after a crash (kill -9 of the exporter) the next start finds what the
last one left running and stops it: nothing started for a lease outlives it unseen.
A process is started before it can be recorded (its pid comes from starting it), so each
also carries its registry's name in its environment: a crash between the two leaves a
process the next start finds in /proc instead.
"""
from __future__ import annotations

import ctypes
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import AbstractSet, Callable

from .files import write_atomically
from .holders import listening_ports
from .ports import unix_listening

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1  # linux/prctl.h
PR_SET_DUMPABLE = 4
SPAWNED_BY = "DEVICE_LOOP_SPAWNED_BY"  # in a spawned process's environment: the registry that started it
DEFAULT_START_TIMEOUT_S = 30.0  # how long a started program gets to listen (the exporter's service_start_timeout_s)


def start_ticks(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), None if gone or a zombie.

    Together with the pid it names one process, even after the pid is reused.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def term_when_parent_dies(parent: int) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets SIGTERM when ``parent`` (the forking thread's process) dies."""
    def arrange() -> None:  # runs in the child, between fork and exec
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before we asked
            os._exit(1)
    return arrange


def keep_private() -> None:
    """Make this process unreadable by other processes of its account, its children
    included: no ``/proc/PID/environ``, ``mem`` or ptrace (the kernel's "non-dumpable"; no core
    dumps either). A worker holds a token and leases its jobs' commands must not read."""
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


class Lifeline:
    """A pipe whose write end only this process holds: a child given the read end sees it
    end (readable, end of file) the moment this process is gone, however it went (kill -9
    too), since the kernel closes a dead process's files. Nothing is ever written to it.

    Both ends are non-inheritable (PEP 446) and ``subprocess`` closes every file it is not
    told to pass, so no other child (ser2net, adb, a flash tool) holds the write end, which
    would keep the end from coming. Not ``PR_SET_PDEATHSIG``: the kernel ties that to the
    thread that spawned, and services start in worker threads.
    """

    def __init__(self) -> None:
        self.fd, self._write_fd = os.pipe()

    def close(self) -> None:
        """Close both ends: the children holding the read end see the end, as if this
        process had died. Once only: a closed fd's number may be another file's by now."""
        if self.fd >= 0:
            os.close(self._write_fd)
            os.close(self.fd)
            self.fd = self._write_fd = -1


class Proc:
    """One supervised process: ours (a child) or one recorded by an earlier run."""

    def __init__(self, registry: "ProcessRegistry", record: dict, popen: subprocess.Popen | None = None):
        self.registry = registry
        self.record = record
        self.popen = popen

    @property
    def pid(self) -> int:
        return self.record["pid"]

    @property
    def name(self) -> str:
        return self.record["name"]

    @property
    def log_path(self) -> Path:
        return Path(self.record["log"])

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        ticks = start_ticks(self.pid)
        return ticks is not None and ticks == self.record["start_ticks"]

    def _group_exists(self) -> bool:
        """Whether anything is left in the process group the process leads."""
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def output(self) -> str:
        """What this process wrote so far (stdout and stderr; not earlier runs' lines in
        the same log)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self.record.get("log_offset", 0))
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        """Signal the process and everything it forked (its process group).

        A recorded process of an earlier run is signalled only while its start time
        still matches, so a reused pid is never hit.
        """
        if self.popen is None and not self.alive():
            return
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> bool:
        """Wait until the process and its group are gone (reaped, if it is our child)."""
        deadline = time.monotonic() + timeout
        if self.popen is not None:
            try:
                self.popen.wait(timeout)  # a child of ours: the kernel tells us when it exits
            except subprocess.TimeoutExpired:
                return False
        pause = 0.001
        while self.alive() or (self.popen is not None and self._group_exists()):
            if time.monotonic() > deadline:
                return False
            time.sleep(pause)
            pause = min(2 * pause, 0.02)
        return True

    def wait_listening(self, ports: set[int], timeout: float | None = None, failure_signs: tuple[str, ...] = (),
                       paths: AbstractSet[str] = frozenset()) -> str | None:
        """Wait until the process listens on every one of ``ports`` (and unix sockets at ``paths``).

        For programs that take a port number (or a path) rather than an inherited socket.
        Returns None once they listen, else why not: it exited, its output shows one of
        ``failure_signs``, or ``timeout`` ran out (its last line of output, if any). The
        timeout is the registry's ``start_timeout_s`` unless given: a setting, since a
        program's start on a loaded host takes many times what it takes on an idle one.
        """
        timeout = self.registry.start_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while not (ports <= listening_ports(self.pid) and paths <= unix_listening(set(paths))):
            output = self.output()
            if not self.alive() or any(sign in output for sign in failure_signs) or time.monotonic() > deadline:
                lines = output.strip().splitlines()
                return lines[-1] if lines else f"no answer within {timeout:g}s"
            time.sleep(0.002)
        return None

    def stop(self, grace: float = 3.0) -> None:
        """SIGTERM the group, wait ``grace`` seconds, then SIGKILL; return once all is reaped."""
        self.signal(signal.SIGTERM)
        if not self.wait(grace):
            log.warning("%s (pid %d) ignored SIGTERM; sending SIGKILL", self.name, self.pid)
            self.signal(signal.SIGKILL)
            if not self.wait(10.0):
                raise RuntimeError(f"{self.name} (pid {self.pid}) survived SIGKILL")
        self.registry.forget(self)


class ProcessRegistry:
    """Starts processes and remembers them on disk until they are stopped; ``start_timeout_s``
    is how long one gets to listen (``Proc.wait_listening``)."""

    def __init__(self, state_dir: str | os.PathLike, start_timeout_s: float = DEFAULT_START_TIMEOUT_S):
        self.start_timeout_s = start_timeout_s
        self.dir = Path(state_dir) / "processes"
        self.logs = Path(state_dir) / "logs"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self._lifeline: Lifeline | None = None
        self._lifeline_lock = threading.Lock()
        self._spawner: ThreadPoolExecutor | None = None

    def lifeline(self) -> Lifeline:
        """This run's lifeline (made at the first call): what its children check to know
        whether the process that started them is still there."""
        with self._lifeline_lock:
            if self._lifeline is None:
                self._lifeline = Lifeline()
            return self._lifeline

    def end_lifeline(self) -> None:
        """End this run's lifeline, if it has one: the children given it see the end at
        once, as if this process had died."""
        with self._lifeline_lock:
            if self._lifeline is not None:
                self._lifeline.close()
                self._lifeline = None

    def spawn(self, argv: list[str], *, name: str, lease: str | None = None, pass_fds: tuple[int, ...] = (),
              env: dict | None = None, die_with_parent: bool = False, job: bool = False) -> Proc:
        """Start ``argv`` in its own session, output to ``logs/NAME.log``, and record it.

        A ``job`` runs to its end for whoever started it (a flash tool), not for a lease:
        only a later start finds it as a leftover.

        ``die_with_parent`` sends it SIGTERM when this process dies, however it dies (kill -9
        too), from any thread: the kernel ties that signal to the *thread* that forked, so such
        a process is forked by the registry's own thread, which lives as long as the process.
        """
        log_path = self.logs / f"{name}.log"
        env = {**(os.environ if env is None else env), SPAWNED_BY: str(self.dir)}
        with open(log_path, "ab") as out:
            offset = out.tell()
            start = functools.partial(
                subprocess.Popen, argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                pass_fds=pass_fds, env=env, start_new_session=True,
                preexec_fn=term_when_parent_dies(os.getpid()) if die_with_parent else None)
            popen = self._spawning_thread().submit(start).result() if die_with_parent else start()
        record = {"pid": popen.pid, "start_ticks": start_ticks(popen.pid), "name": name,
                  "lease": lease, "argv": argv, "log": str(log_path), "log_offset": offset, "job": job}
        write_atomically(self.dir / f"{popen.pid}.json", json.dumps(record))
        return Proc(self, record, popen)

    def _spawning_thread(self) -> ThreadPoolExecutor:
        """One thread that forks every process that must die with this one: a worker thread
        that started a service ends long before the process (a pool's), and with it would go
        its children's parent-death signal."""
        with self._lifeline_lock:
            if self._spawner is None:
                self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spawner")
            return self._spawner

    def forget(self, proc: Proc) -> None:
        (self.dir / f"{proc.pid}.json").unlink(missing_ok=True)

    def recorded(self) -> list[Proc]:
        """Processes recorded by any run (including this one) that are still alive."""
        procs = []
        for path in sorted(self.dir.glob("*.json")):
            try:
                proc = Proc(self, json.loads(path.read_text()))
            except (OSError, ValueError):
                path.unlink(missing_ok=True)
                continue
            if proc.alive():
                procs.append(proc)
            else:
                self.forget(proc)
        return procs

    def stop_leftovers(self) -> list[dict]:
        """Stop everything an earlier run left behind, newest first; return what was stopped."""
        stopped = []
        for proc in sorted(self.recorded() + self._unrecorded(), key=lambda p: p.record["start_ticks"], reverse=True):
            log.warning("stopping %s (pid %d) left by an earlier run", proc.name, proc.pid)
            proc.stop()
            stopped.append(proc.record)
        return stopped

    def _unrecorded(self) -> list[Proc]:
        """Processes this registry started that were never recorded (their starter died in
        between): session leaders whose environment names this registry."""
        mark = f"{SPAWNED_BY}={self.dir}".encode()
        recorded = {p.pid for p in self.recorded()}
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in recorded | {os.getpid()}:
                continue
            pid = int(entry.name)
            try:
                if os.getsid(pid) != pid or mark not in (entry / "environ").read_bytes().split(b"\0"):
                    continue
                name = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            except OSError:  # gone, or another account's
                continue
            ticks = start_ticks(pid)
            if ticks is not None:
                found.append(Proc(self, {"pid": pid, "start_ticks": ticks, "name": f"unrecorded {name}",
                                         "lease": None, "argv": [], "log": "", "job": False}))
        return found


#: Folders where Debian puts daemons and admin tools (ser2net, uhubctl, ipmitool), which a
#: service's or a user's PATH may lack.
SBIN_PATH = ("/usr/local/sbin", "/usr/sbin", "/sbin")


def find_program(name: str) -> str | None:
    """The path of program ``name`` (on ``PATH``, else in an sbin folder), or None. A name
    with a ``/`` is that file, if it may be run."""
    if os.sep in name:
        return name if os.access(name, os.X_OK) else None
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", os.defpath), *SBIN_PATH]))


def last_lines(text: str, count: int = 3, limit: int = 500) -> str:
    """The last ``count`` lines of a program's output that are not blank, on one line (`` / ``
    between them), the end of it cut to ``limit`` characters: what an error quotes of it."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " / ".join(lines[-count:])[-limit:]


def python_module(module: str) -> list[str]:
    """The argv that runs ``module`` (``python -m``) in this Python, without the current
    folder on its import path: a ``mcp.py`` or ``cv2.py`` lying where the lab was started
    must not stand in for the real one (``-P``, Python 3.11+)."""
    return [sys.executable, "-P", "-m", module]


def run(argv: list[str], timeout: float = 10.0, env: dict | None = None) -> tuple[int, str]:
    """Run a short command to completion: (exit code, output). For tools asked one thing
    (``adb --help``, ``adb kill-server``), never for services."""
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        return -1, f"{argv[0]} did not finish within {timeout:g}s: {(exc.output or b'').decode(errors='replace')}"
    except OSError as exc:
        return -1, str(exc)
    return done.returncode, done.stdout.decode(errors="replace")
