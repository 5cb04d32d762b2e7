"""Process supervision: stop means reaped, stubborn processes get SIGKILL, leftovers are found."""
import json
import subprocess
import sys
import time

import pytest

from device_loop.core.ports import listen_socket, port_is_free
from device_loop.core.process import ProcessRegistry
from helpers import pid_alive

pytestmark = [pytest.mark.service, pytest.mark.timeout(30)]

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
    grace_s = 0.5
    proc.stop(grace=grace_s)
    assert proc.popen.returncode == -9
    assert time.monotonic() - started < 10 * grace_s


CRASHING_RUN = """
import os, sys
from device_loop.core.process import ProcessRegistry
proc = ProcessRegistry(sys.argv[1]).spawn(sys.argv[2:], name="left-behind", lease="lease-9")
print(proc.pid, flush=True)
os._exit(0)  # like kill -9: nothing is stopped, the child is re-parented
"""


def test_leftovers_of_a_crashed_run_are_stopped(tmp_path):
    crashed = subprocess.run([sys.executable, "-c", CRASHING_RUN, str(tmp_path), *IGNORES_SIGTERM],
                             capture_output=True, text=True, timeout=10, check=True)
    pid = int(crashed.stdout)
    assert pid_alive(pid)
    # a new run knows the process only from its record; it is nobody's child here
    registry = ProcessRegistry(tmp_path)
    stopped = registry.stop_leftovers()
    assert [r["pid"] for r in stopped] == [pid] and stopped[0]["lease"] == "lease-9"
    assert not pid_alive(pid)
    assert registry.recorded() == []


def test_stop_takes_what_the_process_forked_with_it(tmp_path):
    registry = ProcessRegistry(tmp_path)
    forks = registry.spawn(["sh", "-c", "sleep 60 & echo $!; wait"], name="forker")
    wait_output(forks, "\n")
    grandchild = int(forks.output().split()[0])
    assert pid_alive(grandchild)
    forks.stop()
    assert not pid_alive(grandchild)


def test_a_process_gone_before_it_was_recorded_is_not_alive(tmp_path):
    registry = ProcessRegistry(tmp_path)
    proc = registry.spawn(["true"], name="quick")
    proc.popen.wait()
    record = dict(proc.record, start_ticks=None)
    (registry.dir / f"{proc.pid}.json").write_text(json.dumps(record))
    assert ProcessRegistry(tmp_path).recorded() == []


def test_a_reused_pid_is_not_mistaken_for_a_leftover(tmp_path):
    import json
    import subprocess
    registry = ProcessRegistry(tmp_path)
    innocent = subprocess.Popen(["sleep", "60"], start_new_session=True)  # someone else's, on a recorded pid
    (registry.dir / f"{innocent.pid}.json").write_text(json.dumps(
        {"pid": innocent.pid, "start_ticks": 1, "name": "ours, long gone", "lease": None, "argv": [], "log": ""}))
    assert ProcessRegistry(tmp_path).stop_leftovers() == []
    assert innocent.poll() is None
    innocent.kill()
    innocent.wait()


def test_inherited_listening_socket_is_freed_with_the_process(tmp_path):
    registry = ProcessRegistry(tmp_path)
    sock = listen_socket()
    port = sock.getsockname()[1]
    proc = registry.spawn(["sleep", "60"], name="holder", pass_fds=(sock.fileno(),))
    sock.close()
    assert not port_is_free("127.0.0.1", port)
    proc.stop()
    assert port_is_free("127.0.0.1", port)


def test_a_process_started_but_never_recorded_is_found_by_the_next_start(tmp_path):
    """The starter died between starting a process and recording it (kill -9 in between)."""
    import os
    import subprocess
    import sys
    from device_loop.core.process import SPAWNED_BY
    registry = ProcessRegistry(tmp_path / "ours")
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    lost = subprocess.Popen(sleeper, env={**os.environ, SPAWNED_BY: str(registry.dir)}, start_new_session=True)
    others = subprocess.Popen(sleeper, env={**os.environ, SPAWNED_BY: str(tmp_path / "theirs" / "processes")},
                              start_new_session=True)
    try:
        stopped = ProcessRegistry(tmp_path / "ours").stop_leftovers()
        assert [r["pid"] for r in stopped] == [lost.pid]
        assert lost.wait(5) is not None and others.poll() is None, "only this registry's processes"
    finally:
        for proc in (lost, others):
            proc.kill()
            proc.wait()


def test_how_long_a_program_gets_to_listen_is_the_exporter_s_setting(tmp_path):
    from device_loop.core.ports import free_port
    from device_loop.exporter.config import parse_config
    from device_loop.exporter.daemon import Exporter

    exporter = Exporter(parse_config({"exporter": {"name": "host-a", "state_dir": str(tmp_path / "state"),
                                                   "service_start_timeout_s": 0.3}}))
    registry = exporter.host.processes
    assert registry.start_timeout_s == 0.3
    proc = registry.spawn(["sleep", "60"], name="never-listens")
    try:
        began = time.monotonic()
        assert proc.wait_listening({free_port()}) == "no answer within 0.3s"
        assert time.monotonic() - began >= 0.3
    finally:
        proc.stop()


def test_endpoints_take_ports_of_the_exporter_s_range_and_a_full_range_is_refused_in_words(tmp_path):
    from device_loop.core.host import HostContext
    from device_loop.core.ports import PortsExhausted, free_port
    from device_loop.exporter.config import ConfigError, parse_config
    from device_loop.exporter.daemon import Exporter

    exporter = Exporter(parse_config({"exporter": {"name": "host-a", "state_dir": str(tmp_path / "state"),
                                                   "port_range": "40000-40999"}}))
    assert exporter.host.port_range == (40000, 40999)
    for wrong in ("9-1", "2000-1999", "1024-70000", "40000"):
        with pytest.raises(ConfigError, match="port_range"):
            parse_config({"exporter": {"name": "host-a", "state_dir": str(tmp_path / "state"), "port_range": wrong}})

    port = free_port()
    host = HostContext(name="host-a", state_dir=tmp_path / "one-port", port_range=(port, port))
    with host.listen() as taken:
        assert taken.getsockname()[1] == port
        for use in (host.listen, host.free_port):
            with pytest.raises(PortsExhausted, match=f"no free port in {port}-{port} on 127.0.0.1: all 1 are taken"):
                use()
    assert host.free_port() == port
