"""Nothing the suite starts outlives it (docs/architecture.md, "Testing"): every process a test
starts carries this run's mark in its environment (inherited: the mark is set before any test
runs), and at the end of the run the suite looks for a live process with it (a coordinator,
an exporter, a gate, a QEMU, a worker, a socat...), names each, kills it, and fails.

A run ended by SIGTERM tears down as one interrupted by Ctrl-C does (its tests' teardowns
stop their processes, then this looks). A run that was killed outright (SIGKILL) cannot look: the next run's start
finds what such a run left, by the mark of a run whose controller is no longer alive, and
stops it before any test starts, saying so.
"""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path

import pytest

MARK = "DEVICE_LOOP_TEST_RUN"  # "<controller pid>:<start ticks>:<random>"
GRACE_S = 10.0  # what a process gets to end after SIGTERM, before SIGKILL
# The run's temporary folder, the TMPDIR of the processes tests start (conftest.own_environment):
# what one killed outright leaves there (an exporter's socket folders) goes with the run. Short:
# a unix socket's path inside it has 107 bytes at most.
RUN_TMP = "DEVICE_LOOP_TEST_TMP"
RUN_TMP_PREFIX = "dlr-"


def _start_ticks(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2:].split()[19]


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie has ended: only its parent's wait is left)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


def _marked() -> dict[int, str]:
    """Every live process of this machine that carries a run's mark: pid -> the mark."""
    found = {}
    prefix = f"{MARK}=".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, a zombie, or another account's we may not read
            continue
        for item in environ.split(b"\0"):
            if item.startswith(prefix):
                found[int(entry.name)] = item[len(prefix):].decode(errors="replace")
                break
    return found


def _alive(mark: str) -> bool:
    """Whether the run that made ``mark`` still runs (its controller, the same process)."""
    pid, _, rest = mark.partition(":")
    ticks = rest.partition(":")[0]
    return pid.isdigit() and _start_ticks(int(pid)) == ticks


def _command(pid: int) -> str:
    """What process ``pid`` runs: its command line, and its name where that differs (a process
    forked from a zygote, tests/zygote.py, has its zygote's command line and a name of its own)."""
    try:
        line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"
    return line if name in line else f"{name}: {line}"


def _stop(pids: list[int]) -> None:
    """SIGTERM each, then SIGKILL what is still there after ``GRACE_S``."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(_running(pid) for pid in pids):
        time.sleep(0.05)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    # a run ended by SIGTERM (`timeout`, a CI job cancelled) tears its tests down as Ctrl-C does,
    # their processes stopped with them, where Python's default would exit on the spot
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupted)
    if hasattr(config, "workerinput"):  # (a worker: its controller's mark came with its environment)
        return
    os.environ[MARK] = f"{os.getpid()}:{_start_ticks(os.getpid())}:{uuid.uuid4().hex[:8]}"
    folder = Path(tempfile.mkdtemp(prefix=RUN_TMP_PREFIX))
    (folder / "run").write_text(os.environ[MARK])
    os.environ[RUN_TMP] = str(folder)


def _remove_run_tmp(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def pytest_sessionstart(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):
        return
    for folder in Path(tempfile.gettempdir()).glob(f"{RUN_TMP_PREFIX}*"):  # what runs killed outright left
        try:
            mark = (folder / "run").read_text()
        except OSError:
            continue
        if not _alive(mark):
            _remove_run_tmp(folder)
    left = {pid: mark for pid, mark in _marked().items() if not _alive(mark) and _running(pid)}
    if left:
        print("\nstopping what an earlier test run left running (it was killed before it could):\n  "
              + "\n  ".join(f"pid {pid}: {_command(pid)}" for pid in sorted(left)))
        _stop(sorted(left))


@pytest.hookimpl(trylast=True)  # (after xdist has shut its workers down)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return
    mine = os.environ.get(MARK)
    deadline = time.monotonic() + GRACE_S  # (a worker's last teardown may still be ending its processes)
    while True:
        left = sorted(pid for pid, mark in _marked().items()
                      if mark == mine and pid != os.getpid() and _running(pid))
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    _remove_run_tmp(Path(os.environ[RUN_TMP]))  # (after the wait: what ended meanwhile wrote there last)
    if left:
        named = [f"pid {pid}: {_command(pid)}" for pid in left]
        _stop(left)
        print("\nthe test run left these running (stopped now; the test that started each one must stop it):\n  "
              + "\n  ".join(named))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
