"""exec over adb: Debian's adb client against the lease's adb server, which is the stand-in for
platform-tools 35 (tests/fake_adb35.py: its server speaks the host protocol and adbd's shell
protocol v2, so the exit status and stderr come apart), started by a real exporter for a
phone on fake sysfs, behind the lease gate of a lab with tokens."""
import json
import os
import stat
import sys

import pytest

from conftest import SRC, Coordinator, Exporter, lab_tokens, wait_for
from device_loop.client.lab import Lab
from device_loop.core.device_exec import ExecError, exec_on_lease
from device_loop.core.ports import free_port
from fake_sysfs import ADB, VENDOR_SPECIFIC, usb_device
from helpers import processes_with, run_cli, wait_state
from test_exec_console import environment

pytestmark = [pytest.mark.service, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def adb_lab(tmp_path_factory):
    """(alice's Lab, her environment, the coordinator, the lease of phone ``pixel``): the exporter
    finds the stand-in first on its PATH; this process runs the real adb, with a home of its own."""
    tmp_path = tmp_path_factory.mktemp("adb-lab")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "adb"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {SRC / 'tests' / 'fake_adb35.py'} \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    sysfs = tmp_path / "sys"
    usb_device(sysfs, "2-1", vendor="18d1", product="4ee7", serial="8AAY0GCXH", interfaces=(VENDOR_SPECIFIC, ADB))
    home = tmp_path / "adb-home"
    home.mkdir()
    env = {**environment(tmp_path), "ANDROID_ADB_SERVER_PORT": str(free_port())}
    coordinator = Coordinator(tmp_path, env, extra=())
    tokens, token_file = lab_tokens(env, coordinator, tmp_path, "alice")
    exporter_env = {**env, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_ADB_LOG": str(tmp_path / "adb.jsonl")}
    exporter = Exporter(tmp_path, exporter_env, coordinator.url, [{"name": "pixel", "plugin": "adb",
                                                                   "serial": "8AAY0GCXH"}],
                        token_file=str(token_file), sysfs_root=str(sysfs))
    lab = Lab(coordinator.url, token=tokens["alice"])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(home))  # adb keeps its keys there
        patch.setenv("ANDROID_ADB_SERVER_PORT", env["ANDROID_ADB_SERVER_PORT"])  # never a real global server
        try:
            wait_state(coordinator, "pixel", "idle")
            lease = lab.reserve("pixel").wait_ready()
            yield lab, {**env, "HOME": str(home), "DEVICE_LOOP_TOKEN": tokens["alice"]}, coordinator, lease
        finally:
            lab.api.close()
            exporter.stop()
            coordinator.stop()


def test_exec_over_adb_gives_stdout_stderr_and_status(adb_lab):
    lab, alice, coordinator, lease = adb_lab
    (endpoint,) = lease.endpoints
    assert endpoint["role"] == "adb" and endpoint["secret"], "through the gate, as a phone of a lab with tokens"
    said = lease.exec("echo out; echo err >&2; exit 3")
    assert (said.stdout, said.stderr, said.status, said.channel) == ("out\n", "err\n", 3, "adb")
    assert lease.exec("frobnicate").status == 127
    assert lease.exec("kill -9 $$").status == 137, "a signal's status, as adbd gives it"
    cut = lease.exec("head -c 50000 /dev/zero | tr '\\0' y", max_output=100)
    assert cut.truncated and cut.stdout == "y" * 100 and "stdout cut at 100 bytes" in cut.stderr

    with pytest.raises(ExecError) as timed_out:
        lease.exec("sleep 31.5", timeout_s=1)
    assert timed_out.value.code == "timeout"
    wait_for(lambda: not processes_with("sleep 31.5"), what="the phone's shell hung up on with its client")


def test_the_cli_over_adb(adb_lab):
    lab, alice, coordinator, lease = adb_lab
    done = run_cli(alice, coordinator.url, "exec", "pixel", "--", "echo out; echo err >&2; exit 7", check=False)
    assert (done.returncode, done.stdout, done.stderr) == (7, "out\n", "err\n")
    answer = json.loads(run_cli(alice, coordinator.url, "exec", lease.id, "--json", "--", "true").stdout)
    assert (answer["status"], answer["channel"]) == (0, "adb")


def test_an_adb_server_that_is_gone_is_unreachable_and_none_is_started():
    port = free_port()
    lease = {"device": "pixel", "ready": True,
             "endpoints": [{"role": "adb", "host": "127.0.0.1", "port": port, "params": {"serial": "X"}}]}
    with pytest.raises(ExecError) as refused:
        exec_on_lease(lease, "true")
    assert refused.value.code == "unreachable" and f"127.0.0.1:{port}" in refused.value.message
    assert not processes_with(f"-P {port}"), "adb was not left to start a server of its own there"
