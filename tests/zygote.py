"""Processes of device-loop's command line for the tests, without a Python start each
(docs/architecture.md, "Testing").

A test's coordinator, exporter, worker or CLI call is a real process of its own: its own pid,
session, environment, working folder, standard streams, signals and exit status, serving real
sockets. What it does not need is 0.3-0.5 CPU-seconds of imports every time (a suite starts
hundreds): so each pytest process keeps one zygote, a process that imported the command line,
the coordinator, the exporter and the built-in plugins once, and *forks* it for each start,
the child then running ``device_loop.cli.main`` with the test's arguments exactly as ``python
-m device_loop.cli ARGS`` would. The zygote is single-threaded when it forks (nothing but this
loop runs in it). What a test checks of the entry point itself (the installed ``device-loop``
script, ``python -m device_loop.cli``, what a command imports) starts it the usual way.

``Zygote.popen(argv, ...)`` is ``subprocess.Popen([sys.executable, "-m", "device_loop.cli",
*argv], ...)`` for the parts the tests use (``pid``, ``poll``, ``wait``, ``send_signal``,
``terminate``, ``kill``, ``returncode``); ``Zygote.run`` is ``subprocess.run`` with
``capture_output=True, text=True``. The zygote reaps its children and tells each one's caller
its exit status (a signal's as the negative number ``Popen`` gives).
"""
from __future__ import annotations

import array
import atexit
import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

#: What the zygote imports before it forks: every module a started process would import first.
PRELOAD = ("device_loop.cli.main", "device_loop.cli.commands", "device_loop.coordinator.serve",
           "device_loop.coordinator.app", "device_loop.exporter.daemon", "device_loop.exporter.run",
           "device_loop.client.lab", "device_loop.core.device_exec")
MAX_REQUEST = 1 << 20
#: How long the children of a zygote whose owner ended have, after SIGTERM, before SIGKILL.
END_S = 10.0
#: Set to 0 in the tests' environment: every process is started the usual way (a coverage
#: run's, say, where each process must start its own measurement).
ENABLED_ENV = "DEVICE_LOOP_TEST_ZYGOTE"


# ---- the zygote's side ---------------------------------------------------------------------------

def _preload() -> None:
    import importlib
    from importlib.metadata import entry_points

    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    for entry in entry_points(group="device_loop"):  # the built-in plugins every test exporter loads
        if entry.value.startswith("device_loop.plugins."):
            with contextlib.suppress(Exception):
                importlib.import_module(entry.value.split(":", 1)[0])


def _child(request: dict[str, Any], fds: list[int], keep: list[socket.socket]) -> None:
    """In the forked child: become the process ``python -m device_loop.cli ARGV`` would be."""
    for sock in keep:
        sock.close()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    with contextlib.suppress(ValueError):
        sys.path.remove(str(Path(__file__).resolve().parent))  # (the zygote's own, no module of a command's)
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # (found again from the new environment's TMPDIR, as a new interpreter does)
    import random
    random.seed()  # (a fork shares its parent's generator)
    _name(request["argv"])
    import importlib.util

    sys.argv = [importlib.util.find_spec("device_loop.cli.__main__").origin, *request["argv"]]
    from device_loop.cli.main import main

    try:
        main()
    except SystemExit:
        raise
    except BaseException:  # as an interpreter started for it would: the traceback, status 1
        import traceback
        traceback.print_exc()
        raise SystemExit(1) from None
    raise SystemExit(0)


def _name(argv: list[str]) -> None:
    """Name the process after its command (its /proc comm, which ``ps -o comm`` and
    tests/leftovers.py show): its command line is the zygote's."""
    import ctypes

    words = [a for a in argv if not a.startswith("-") and "://" not in a]
    name = f"dl {words[0] if words else 'cli'}"[:15].encode()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, ancillary, _, _ = conn.recvmsg(MAX_REQUEST, socket.CMSG_SPACE(3 * array.array("i").itemsize))
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    return json.loads(data), list(fds)


def serve(path: str) -> None:
    """The zygote's loop: a connection is one start; its answer is the child's pid, then, once
    the child has ended, its exit status. When its owner ends (its standard input closes:
    the owner's exit, killed outright included) it ends its children's process groups
    (``_end_children``) and exits."""
    _preload()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(64)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    waiting: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ)
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            if key.fileobj == sys.stdin.fileno():
                if not os.read(sys.stdin.fileno(), 4096):
                    _end_children(list(waiting))
                    return
            elif key.fileobj is listener:
                conn, _ = listener.accept()
                request, fds = _receive(conn)
                pid = os.fork()
                if pid == 0:
                    _child(request, fds, [listener, conn, *waiting.values()])
                for fd in fds:
                    os.close(fd)
                conn.sendall(b"%d\n" % pid)
                waiting[pid] = conn
            else:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_read, 4096)
        while waiting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = waiting.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(b"%d\n" % os.waitstatus_to_exitcode(status))
                conn.close()


def _end_children(pids: list[int]) -> None:
    """End each child's process group (its own children with it): SIGTERM, as a test's
    teardown would, then SIGKILL to what is left once ``END_S`` passed."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + END_S
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        for pid in list(alive):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            alive.discard(pid)
        time.sleep(0.05)  # (polling children that have no other way to say they ended)
    for pid in pids:  # (a group outlives its leader: its other members are killed too)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


# ---- the tests' side -----------------------------------------------------------------------------

class ZygoteProcess:
    """A started process, as much of ``subprocess.Popen`` as the tests use."""

    def __init__(self, conn: socket.socket, args: list[str]):
        self.args = args
        self._conn = conn
        self._lock = threading.Lock()
        self._buffer = b""
        line = self._line(None)
        if not line:
            raise OSError("the zygote did not start the process")
        self.pid = int(line)
        self.returncode: int | None = None

    def _line(self, timeout: float | None) -> bytes | None:
        """The zygote's next line (b"" once it hung up); None if none came within ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            self._conn.settimeout(None if deadline is None else max(0.0, deadline - time.monotonic()))
            try:
                chunk = self._conn.recv(64)
            except (TimeoutError, socket.timeout, BlockingIOError):
                return None
            if not chunk:
                return b""
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _ended(self, timeout: float | None) -> bool:
        with self._lock:
            if self.returncode is not None:
                return True
            line = self._line(timeout)
            if line is None:
                return False
            self.returncode = int(line) if line else -signal.SIGKILL  # (the zygote itself died)
            self._conn.close()
            return True

    def poll(self) -> int | None:
        self._ended(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # (never a pid that may be another process's by now)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """This pytest process's zygote, started at its first use and stopped at its exit."""

    _lock = threading.Lock()
    _mine: "Zygote | None" = None

    def __init__(self) -> None:
        from leftovers import RUN_TMP  # (in the run's folder: a run killed outright leaves none in /tmp)

        self.folder = Path(tempfile.mkdtemp(prefix="devloop-zygote-", dir=os.environ.get(RUN_TMP)))
        self.path = str(self.folder / "zygote.sock")
        here = str(Path(__file__).resolve().parent)
        self.process = subprocess.Popen(
            [sys.executable, "-P", "-c", f"import sys; sys.path.insert(0, {here!r}); import zygote; "
                                         f"zygote.serve({self.path!r})"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        self.python_environment = _interpreter_settings(os.environ)
        assert self.process.stdout is not None
        if self.process.stdout.readline() != b"ready\n":
            raise RuntimeError("the zygote did not start (its imports failed?)")
        atexit.register(self.stop)

    @classmethod
    def mine(cls) -> "Zygote":
        with cls._lock:
            if cls._mine is None or cls._mine.process.poll() is not None:
                cls._mine = Zygote()
            return cls._mine

    @classmethod
    def stop_mine(cls) -> None:
        """Stop this process's zygote, if it started one."""
        with cls._lock:
            if cls._mine is not None:
                cls._mine.stop()
                cls._mine = None

    def stop(self) -> None:
        """End the zygote, and with it any process it started that still runs."""
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(END_S + 10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            self.folder.rmdir()

    def popen(self, argv: list[str], env: dict[str, str], cwd: str | os.PathLike | None = None,
              stdin: int | None = None, stdout: int | None = None, stderr: int | None = None) -> ZygoteProcess:
        """``device-loop ARGV`` in a process of its own, its standard streams these file
        descriptors (``/dev/null`` where None)."""
        null = os.open(os.devnull, os.O_RDWR)
        try:
            fds = [null if fd is None else fd for fd in (stdin, stdout, stderr)]
            request = json.dumps({"argv": [str(a) for a in argv], "env": dict(env),
                                  "cwd": str(cwd or os.getcwd())}).encode()
            conn = socket.socket(socket.AF_UNIX)
            conn.connect(self.path)
            conn.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            return ZygoteProcess(conn, ["device-loop", *map(str, argv)])
        finally:
            os.close(null)

    def run(self, argv: list[str], env: dict[str, str], timeout: float, cwd: str | os.PathLike | None = None,
            input: str | None = None) -> subprocess.CompletedProcess:
        """``subprocess.run`` of ``device-loop ARGV``, its output captured as text."""
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        in_read, in_write = os.pipe()
        try:
            process = self.popen(argv, env, cwd, stdin=in_read, stdout=out_write, stderr=err_write)
        finally:
            for fd in (out_write, err_write, in_read):
                os.close(fd)
        with open(in_write, "w") as feed:
            if input:
                feed.write(input)
        outputs = {out_read: bytearray(), err_read: bytearray()}
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            for fd in outputs:
                selector.register(fd, selectors.EVENT_READ)
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    process.kill()
                    raise subprocess.TimeoutExpired(process.args, timeout)
                for key, _ in selector.select(left):
                    chunk = os.read(key.fd, 65536)
                    if chunk:
                        outputs[key.fd] += chunk
                    else:
                        selector.unregister(key.fd)
                        os.close(key.fd)
        code = process.wait(max(0.0, deadline - time.monotonic()) + 5)
        return subprocess.CompletedProcess(process.args, code, outputs[out_read].decode(errors="replace"),
                                           outputs[err_read].decode(errors="replace"))


def _interpreter_settings(environ) -> dict[str, str]:
    """What of an environment Python reads once, at its start (PYTHONPATH, PYTHONUNBUFFERED...):
    a fork of the zygote keeps the zygote's."""
    return {k: v for k, v in environ.items() if k.startswith("PYTHON")}


def _forks(env: dict[str, str]) -> Zygote | None:
    """The zygote to fork for a process of environment ``env``, or None where only a start of
    its own does what the test asked (the zygote disabled, or another interpreter setting)."""
    if os.environ.get(ENABLED_ENV, "1") == "0":
        return None
    zygote = Zygote.mine()
    return zygote if _interpreter_settings(env) == zygote.python_environment else None


def popen(argv: list[str], env: dict[str, str], cwd: str | os.PathLike | None = None,
          stdin: int | None = None, stdout: int | None = None, stderr: int | None = None):
    """``device-loop ARGV`` in a process (and session) of its own, its standard streams these
    file descriptors (``/dev/null`` where None): forked from this process's zygote, or started
    as ``python -m device_loop.cli`` where a fork would not be the same process. Popen-like."""
    zygote = _forks(env)
    if zygote is not None:
        return zygote.popen(argv, env, cwd, stdin, stdout, stderr)
    return subprocess.Popen([sys.executable, "-m", "device_loop.cli", *map(str, argv)], env=env, cwd=cwd,
                            stdin=subprocess.DEVNULL if stdin is None else stdin,
                            stdout=subprocess.DEVNULL if stdout is None else stdout,
                            stderr=subprocess.DEVNULL if stderr is None else stderr, start_new_session=True)


def run(argv: list[str], env: dict[str, str], timeout: float, cwd: str | os.PathLike | None = None,
        input: str | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run`` of ``device-loop ARGV`` (``capture_output=True, text=True``), forked
    from the zygote where ``popen`` would."""
    zygote = _forks(env)
    if zygote is not None:
        return zygote.run(argv, env, timeout, cwd, input)
    return subprocess.run([sys.executable, "-m", "device_loop.cli", *map(str, argv)], env=env, cwd=cwd, input=input,
                          capture_output=True, text=True, timeout=timeout)
