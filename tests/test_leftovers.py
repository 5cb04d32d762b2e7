"""Nothing a test run starts outlives it (tests/leftovers.py): a process a test leaves running
fails the run, named, and is stopped; a run ended by SIGTERM tears its tests down first; what a
run killed outright left is stopped by the next run's start. Each case is a pytest run of its
own (the process boundary is the point), with only this plugin."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import wait_for

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]

TESTS = Path(__file__).resolve().parent

LEAVES_A_SLEEP = """
import os, subprocess, time
from pathlib import Path

def test_starts_a_sleep(tmp_path):
    sleep = subprocess.Popen(["sleep", "600"])
    Path({pidfile!r}).with_name("run-tmp").write_text(os.environ["DEVICE_LOOP_TEST_TMP"])
    Path({pidfile!r}).write_text(str(sleep.pid))
    {then}
"""


def run(folder: Path, *args: str) -> subprocess.Popen:
    """pytest on ``folder`` in a process of its own, with only leftovers.py as a plugin."""
    env = {k: v for k, v in os.environ.items() if k != "DEVICE_LOOP_TEST_RUN"} | {"PYTHONPATH": str(TESTS)}
    return subprocess.Popen([sys.executable, "-m", "pytest", "-p", "leftovers", "-p", "no:cacheprovider",
                             "-p", "no:xdist", "-q", "--rootdir", str(folder), str(folder), *args],
                            cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


def a_run(tmp_path: Path, name: str, then: str) -> tuple[Path, Path]:
    folder = tmp_path / name
    folder.mkdir()
    pidfile = folder / "sleep.pid"
    (folder / "test_probe.py").write_text(LEAVES_A_SLEEP.format(pidfile=str(pidfile), then=then))
    return folder, pidfile


def test_a_process_a_test_leaves_running_fails_the_run_named_and_is_stopped(tmp_path):
    folder, pidfile = a_run(tmp_path, "leaves", "pass")
    out, _ = run(folder).communicate(timeout=90)
    pid = int(pidfile.read_text())
    assert "1 passed" in out and "the test run left these running" in out and f"pid {pid}: sleep 600" in out, out
    assert not running(pid)
    clean, _ = a_run(tmp_path, "clean", "sleep.kill(); sleep.wait()")
    process = run(clean)
    assert process.wait(90) == 0, process.communicate()[0]


def test_a_run_ended_by_sigterm_tears_its_tests_down_first(tmp_path):
    folder = tmp_path / "terminated"
    folder.mkdir()
    pidfile = folder / "sleep.pid"
    (folder / "test_probe.py").write_text(f"""
import subprocess, time
from pathlib import Path
import pytest

@pytest.fixture
def sleep():
    process = subprocess.Popen(["sleep", "600"])
    yield process
    process.terminate()
    process.wait()

def test_waits(sleep):
    Path({str(pidfile)!r}).write_text(str(sleep.pid))
    time.sleep(600)  # (until the run is ended)
""")
    process = run(folder)
    wait_for(pidfile.exists, what="the test's sleep")
    pid = int(pidfile.read_text())
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=90)
    assert process.returncode != 0 and "the test run left" not in out, out
    assert not running(pid), "the fixture's teardown did not run"


def test_what_a_run_killed_outright_left_the_next_run_stops(tmp_path):
    folder, pidfile = a_run(tmp_path, "killed", "time.sleep(600)")
    killed = run(folder)
    wait_for(pidfile.exists, what="the test's sleep")
    pid = int(pidfile.read_text())
    killed.kill()
    killed.communicate(timeout=30)
    assert running(pid), "the sleep should outlive a run killed outright (its parent gone)"
    left = Path((folder / "run-tmp").read_text())
    assert left.is_dir(), "the killed run's temporary folder is left"
    nothing, _ = a_run(tmp_path, "next", "sleep.kill(); sleep.wait()")
    out, _ = run(nothing).communicate(timeout=90)
    assert "stopping what an earlier test run left running" in out and f"pid {pid}: sleep 600" in out, out
    wait_for(lambda: not running(pid), what="the earlier run's sleep stopped")
    assert not left.exists(), "the next run removed the killed run's temporary folder"
    assert not Path((nothing / "run-tmp").read_text()).exists(), "a run removes its own at its end"


def test_a_test_s_own_environment_carries_the_run_s_mark(tmp_path):
    """A process a test starts from ``own_environment`` (which drops the caller's DEVICE_LOOP_
    settings) still carries the run's mark: a coordinator started the usual way (not forked
    from a zygote, whose children show the zygote's environment) outlived a run unseen."""
    from conftest import own_environment
    from leftovers import MARK

    assert os.environ[MARK] and own_environment(tmp_path)[MARK] == os.environ[MARK]
