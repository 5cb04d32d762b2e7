"""The ADB plugin with the real adb binary (Debian's 29, no --one-device) on fake sysfs
phones, and a stand-in for platform-tools 35 for the --one-device path."""
import json
import os
import stat
import subprocess
import sys

import pytest

from conftest import SRC, Exporter, wait_for
from exporter_testkit import converge
from device_loop.core.ports import free_port, port_is_free
from device_loop.exporter.config import parse_config
from device_loop.exporter.daemon import Exporter as InProcessExporter
from fake_sysfs import ADB, VENDOR_SPECIFIC, usb_device
from helpers import pid_alive, processes_with, reserve, run_cli, wait_active, wait_state

pytestmark = [pytest.mark.service, pytest.mark.timeout(90)]


@pytest.fixture
def adb_env(tmp_path, monkeypatch):
    """adb's own home and a global-server port of our own, so no real server is touched."""
    home = tmp_path / "adb-home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(free_port()))
    return os.environ


def phones(tmp_path, *serials):
    sysfs = tmp_path / "sys"
    for n, serial in enumerate(serials):
        usb_device(sysfs, f"2-{n + 1}", vendor="18d1", product="4ee7", serial=serial, busnum=2, devnum=5 + n,
                   interfaces=(VENDOR_SPECIFIC, ADB))
    return sysfs


def exporter_for(tmp_path, sysfs):
    config = parse_config({"exporter": {"name": "host-a", "state_dir": str(tmp_path / "state"), "cdi_dir": str(tmp_path / "cdi"),
                                        "sysfs_root": str(sysfs), "coordinator": f"http://127.0.0.1:{free_port()}"},
                           "plugins": {"enable": ["adb"]}})
    exporter = InProcessExporter(config)
    exporter.setup()
    return exporter


def desired(*serials):
    return {"services": [{"lease": f"lease-{s}", "holder": "alice", "device": f"android-{s}",
                          "identifier": f"adb:{s}", "kind": "adb", "plugin": "adb"} for s in serials], "etag": "x"}


def adb_devices(port: int) -> subprocess.CompletedProcess:
    return subprocess.run(["adb", "-P", str(port), "devices"], capture_output=True, text=True, timeout=20)


def test_server_lifecycle_with_the_real_adb(tmp_path, adb_env):
    exporter = exporter_for(tmp_path, phones(tmp_path, "8AAY0GCXH"))
    try:
        assert exporter.loaded == ["adb"]
        resources = exporter.discover()
        assert exporter.health(resources[0]).status == "ok"
        converge(exporter, desired("8AAY0GCXH"))
        assert len(exporter.running) == 1, exporter.start_errors
        (run,) = exporter.running.values()
        (endpoint,) = run.service.endpoints
        assert endpoint.kind == "adb" and endpoint.params == {"serial": "8AAY0GCXH"}
        assert run.service.processes[0].record["argv"][:4] == ["adb", "-P", str(endpoint.port), "server"]
        answer = adb_devices(endpoint.port)
        assert answer.returncode == 0 and "List of devices attached" in answer.stdout
        pid = run.service.pids()[0]

        converge(exporter, {"services": [], "etag": "y"})
        assert port_is_free("127.0.0.1", endpoint.port)
        assert not pid_alive(pid) and processes_with(f"-P {endpoint.port} server") == []
    finally:
        exporter.shutdown()


def test_global_server_is_stopped_and_waited_for_first(tmp_path, adb_env):
    global_port = int(adb_env["ANDROID_ADB_SERVER_PORT"])
    global_server = subprocess.Popen(["adb", "-P", str(global_port), "server", "nodaemon"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    exporter = exporter_for(tmp_path, phones(tmp_path, "8AAY0GCXH"))
    try:
        assert adb_devices(global_port).returncode == 0  # it is up and would hold the phone
        converge(exporter, desired("8AAY0GCXH"))
        assert global_server.wait(10) is not None and port_is_free("127.0.0.1", global_port)
        assert len(exporter.running) == 1
    finally:
        exporter.shutdown()
        if global_server.poll() is None:
            global_server.kill()


def test_without_one_device_a_second_phone_is_refused_not_fought_over(tmp_path, adb_env):
    exporter = exporter_for(tmp_path, phones(tmp_path, "PHONE1"))
    try:
        converge(exporter, desired("PHONE1"))
        assert len(exporter.running) == 1
        usb_device(tmp_path / "sys", "2-9", vendor="18d1", product="4ee7", serial="PHONE2", interfaces=(ADB,))
        health = {r.identifier: exporter.health(r) for r in exporter.discover()}
        assert health["adb:PHONE1"].status == "ok"
        assert health["adb:PHONE2"].status == "failed"
        assert "lacks --one-device" in health["adb:PHONE2"].reason
        converge(exporter, desired("PHONE1", "PHONE2"))
        error = exporter.start_errors[("lease-PHONE2", "adb:PHONE2")]["error"]
        assert "2 phones are on this host" in error and "lacks --one-device" in error
    finally:
        exporter.shutdown()


@pytest.fixture
def adb35(tmp_path, monkeypatch):
    """Put the platform-tools 35 stand-in first on PATH; returns the log of its calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "adb"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {SRC / 'tests' / 'fake_adb35.py'} \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "adb-calls.jsonl"
    monkeypatch.setenv("FAKE_ADB_LOG", str(log))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return lambda: [json.loads(line) for line in log.read_text().splitlines()]  # [{args, global_port_free}]


def test_one_device_serves_each_phone_on_its_own_server(tmp_path, adb_env, adb35):
    global_port = int(adb_env["ANDROID_ADB_SERVER_PORT"])
    global_server = subprocess.Popen(["adb", "-P", str(global_port), "server", "nodaemon"])  # the stand-in
    exporter = exporter_for(tmp_path, phones(tmp_path, "PHONE1", "PHONE2"))
    try:
        wait_for(lambda: not port_is_free("127.0.0.1", global_port), what="the global server listening")
        resources = exporter.discover()
        assert {exporter.health(r).status for r in resources} == {"ok"}
        converge(exporter, desired("PHONE1", "PHONE2"))
        assert exporter.start_errors == {}
        servers = [call for call in adb35() if "--one-device" in call["args"]]
        assert sorted(call["args"][-1] for call in servers) == ["PHONE1", "PHONE2"]
        assert all(call["args"][-2] == "--one-device" for call in servers)
        assert all(call["global_port_free"] for call in servers), "started before the global server had let go"
        for run in exporter.running.values():
            assert not port_is_free("127.0.0.1", run.service.endpoints[0].port)
    finally:
        exporter.shutdown()
        global_server.wait(5)


def test_cli_adb_and_env_against_a_leased_phone(tmp_path, env, coordinator):
    env = {**env, "ANDROID_ADB_SERVER_PORT": str(free_port())}
    sysfs = phones(tmp_path, "8AAY0GCXH")
    exporter = Exporter(tmp_path, env, coordinator.url, [{"name": "pixel-7", "plugin": "adb", "serial": "8AAY0GCXH"}],
                        sysfs_root=str(sysfs))
    try:
        wait_state(coordinator, "pixel-7", "idle")
        assert coordinator.api("/devices/pixel-7").json()["class"] == "generic"
        lease = wait_active(coordinator, reserve(coordinator, "pixel-7")["id"])
        (endpoint,) = lease["endpoints"]
        exports = run_cli(env, coordinator.url, "env", lease["id"]).stdout.splitlines()
        assert exports == [f"export ANDROID_ADB_SERVER_ADDRESS={endpoint['host']}",
                           f"export ANDROID_ADB_SERVER_PORT={endpoint['port']}", "export ANDROID_SERIAL=8AAY0GCXH"]
        listed = run_cli(env, coordinator.url, "adb", "pixel-7", "--", "devices")
        assert "List of devices attached" in listed.stdout
    finally:
        exporter.stop()
