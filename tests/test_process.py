"""Process supervision: stop means reaped, stubborn processes get SIGKILL, leftovers are found."""
import sys
import time

import pytest

from device_loop.core.ports import listen_socket, port_is_free
from device_loop.core.process import ProcessRegistry, start_ticks
from helpers import pid_alive

pytestmark = pytest.mark.timeout(30)

IGNORES_SIGTERM = [sys.executable, "-c",
                   "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"]


def wait_output(proc, text, timeout=5):
    deadline = time.monotonic() + timeout
    while text not in proc.output():
        assert time.monotonic() < deadline, proc.output()
        time.sleep(0.02)


def test_stop_returns_once_reaped(tmp_path):
    registry = ProcessRegistry(tmp_path)
    proc = registry.spawn(["sleep", "60"], name="sleeper", lease="lease-1")
    assert proc.alive() and [p.pid for p in registry.recorded()] == [proc.pid]
    proc.stop()
    assert proc.popen.returncode is not None  # reaped: no zombie left
    assert not pid_alive(proc.pid)
    assert registry.recorded() == []


def test_sigterm_ignored_escalates_to_sigkill(tmp_path):
    registry = ProcessRegistry(tmp_path)
    proc = registry.spawn(IGNORES_SIGTERM, name="stubborn")
    wait_output(proc, "ready")
    started = time.monotonic()
    proc.stop(grace=0.5)
    assert proc.popen.returncode == -9
    assert time.monotonic() - started < 5


def test_leftovers_of_a_crashed_run_are_stopped(tmp_path):
    first = ProcessRegistry(tmp_path)
    proc = first.spawn(IGNORES_SIGTERM, name="left-behind", lease="lease-9")
    wait_output(proc, "ready")
    # a new run (after kill -9 of the old one) knows the process only from its record
    second = ProcessRegistry(tmp_path)
    stopped = second.stop_leftovers()
    assert [r["pid"] for r in stopped] == [proc.pid] and stopped[0]["lease"] == "lease-9"
    proc.popen.wait(5)  # our test process is still its parent: reap it here
    assert second.recorded() == []


def test_a_reused_pid_is_not_mistaken_for_a_leftover(tmp_path):
    registry = ProcessRegistry(tmp_path)
    proc = registry.spawn(["sleep", "60"], name="innocent")
    record = (registry.dir / f"{proc.pid}.json")
    record.write_text(record.read_text().replace(f'"start_ticks": {start_ticks(proc.pid)}', '"start_ticks": 1'))
    assert ProcessRegistry(tmp_path).stop_leftovers() == []
    assert proc.alive()
    proc.popen.kill()
    proc.popen.wait()


def test_inherited_listening_socket_is_freed_with_the_process(tmp_path):
    registry = ProcessRegistry(tmp_path)
    sock = listen_socket()
    port = sock.getsockname()[1]
    proc = registry.spawn(["sleep", "60"], name="holder", pass_fds=(sock.fileno(),))
    sock.close()
    assert not port_is_free("127.0.0.1", port)
    proc.stop()
    assert port_is_free("127.0.0.1", port)
