"""Where a cooldown's temperatures come from: the simulated board's thermal model (stress heats
it, it cools toward its ambient with its time constant), the host plugin (the machine's
thermal zones in sysfs, faked as the kernel lays them out), and the adb plugin's reading of
a phone's zones through a server of that phone alone."""
import math
import os
import socket
import stat
import sys

import pytest
import serial

from device_loop.core.host import HostContext
from device_loop.core.ports import free_port
from device_loop.core.model import ConfiguredResource, Operation
from device_loop.plugins import host as host_plugin
from device_loop.plugins.adb import AdbConfig, AdbPlugin, parse_zones
from device_loop.plugins.sim.board import SimBoard
from device_loop.plugins.sim.thermal import (COMMAND_HEAT_C, DEFAULT_AMBIENT_C, DEFAULT_TAU_S, STRESS_RISE_C,
                                             STRESS_TAU_S, Thermal, relax)
from exporter_testkit import in_process_exporter
from fake_sysfs import ADB, usb_device
from conftest import wait_for

pytestmark = pytest.mark.timeout(30)


class Clock:
    """A clock a test moves by hand: the model is a function of the time it reads."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def thermal_zone(root, number: int, kind: str, millidegrees) -> None:
    """``/sys/class/thermal/thermal_zoneN`` as the kernel lays it out: ``type``, and ``temp`` in m°C."""
    zone = root / "devices" / "virtual" / "thermal" / f"thermal_zone{number}"
    zone.mkdir(parents=True)
    (zone / "type").write_text(f"{kind}\n")
    if millidegrees is not None:
        (zone / "temp").write_text(f"{millidegrees}\n")
    links = root / "class" / "thermal"
    links.mkdir(parents=True, exist_ok=True)
    os.symlink(zone, links / zone.name)


# ---- the simulated board's model -----------------------------------------------------------------

def test_stress_heats_the_board_and_it_cools_toward_ambient_with_tau():
    clock = Clock()
    thermal = Thermal(ambient_c=30.0, tau_s=10.0, clock=clock)
    assert thermal.read() == 30.0, "it starts at the ambient"
    thermal.stress(5)
    assert thermal.stressed()
    clock.now += 5
    hot = thermal.read()
    assert hot == pytest.approx(30 + STRESS_RISE_C * (1 - math.exp(-5 / STRESS_TAU_S)))
    assert 25 < hot - 30 < STRESS_RISE_C, "some 30 °C above the ambient after 5 s of stress"
    assert not thermal.stressed()
    clock.now += 10  # one time constant: the excess falls to 1/e
    assert thermal.read() - 30 == pytest.approx((hot - 30) / math.e)
    clock.now += 1000
    assert thermal.read() == pytest.approx(30.0), "back at the ambient, never below"


def test_a_stress_that_ends_between_two_readings_heats_only_while_it_runs():
    clock = Clock()
    thermal = Thermal(ambient_c=40.0, tau_s=17.0, clock=clock)
    thermal.stress(2)
    clock.now += 12  # 2 s of heating, then 10 s of cooling, in one step
    heated = relax(40.0, 40.0 + STRESS_RISE_C, 2, STRESS_TAU_S)
    assert thermal.read() == pytest.approx(relax(heated, 40.0, 10, 17.0))


def test_the_defaults_cool_a_stressed_board_below_ambient_plus_5_in_about_half_a_minute():
    clock = Clock()
    thermal = Thermal(clock=clock)
    assert (thermal.ambient_c, thermal.tau_s) == (DEFAULT_AMBIENT_C, DEFAULT_TAU_S)
    thermal.stress(5)
    clock.now += 5
    peak = thermal.read()
    seconds = DEFAULT_TAU_S * math.log((peak - DEFAULT_AMBIENT_C) / 5)
    assert 25 <= seconds <= 35, seconds
    clock.now += seconds + 0.01
    assert thermal.read() < DEFAULT_AMBIENT_C + 5


def test_each_console_command_warms_the_board_and_stress_is_a_command(tmp_path):
    clock = Clock()
    board = SimBoard("jupiter", tmp_path / "jupiter", Thermal(ambient_c=35.0, tau_s=5.0, clock=clock))
    try:
        said = board.answer("help")
        assert "stress [SECONDS]" in said and " temp " in said
        assert board.thermal.read() == 35.0 + COMMAND_HEAT_C, "help was a command too"
        assert "cpu: 36.0 °C" in board.answer("temp")
        said = board.answer("stress 3")
        assert said.startswith("stress: loading the cpu for 3 s") and board.thermal.stressed()
        assert "SECONDS is a number" in board.answer("stress lots")
        clock.now += 3
        assert board.thermal.read() > 60
    finally:
        board.power_off()


@pytest.mark.service
def test_stress_typed_on_the_console_heats_what_the_hook_reads(tmp_path):
    exporter = in_process_exporter(tmp_path, [{"name": "b0", "plugin": "sim", "ambient": "30C", "tau": "1s"}])
    try:
        (resource,) = [r for r in exporter.discover() if r.device == "b0"]
        read = lambda: exporter.plugins.call("sim", "devloop_thermal", host=exporter.host, resource=resource)
        assert read()["cpu"] == pytest.approx(30.0, abs=0.5)
        with serial.Serial(resource.node, 115200, timeout=0.1) as port:
            port.write(b"stress 1\r")
            hot = wait_for(lambda: (t := read()["cpu"]) > 40 and t, what="the board to heat up")
        assert hot < 30 + STRESS_RISE_C
        wait_for(lambda: read()["cpu"] < 32, what="the board to cool back toward 30 °C")
    finally:
        exporter.shutdown()


# ---- the host plugin -------------------------------------------------------------------------------

def host_resource(tmp_path, zones=None):
    config = host_plugin.HostConfig.model_validate({} if zones is None else {"zones": zones})
    host = HostContext("bench-3", tmp_path / "state", sysfs_root=tmp_path / "sys",
                       entries=[ConfiguredResource("b0", "board", (), "host", config)])
    (resource,) = host_plugin.devloop_discover(host)
    return host, resource


def test_the_host_plugin_reads_the_machine_s_thermal_zones_by_their_type(tmp_path):
    sysfs = tmp_path / "sys"
    thermal_zone(sysfs, 0, "acpitz", 27800)
    thermal_zone(sysfs, 1, "x86_pkg_temp", 51250)
    thermal_zone(sysfs, 2, "iwlwifi_1", None)  # a zone that reads nothing (ENODATA, on a real one)
    thermal_zone(sysfs, 10, "acpitz", 30000)
    host, resource = host_resource(tmp_path)
    assert (resource.kind, resource.identifier, resource.serves_lease) == ("thermal", "host-thermal:bench-3:b0", False)
    assert host_plugin.devloop_thermal(host, resource) == {"acpitz (thermal_zone0)": 27.8, "x86_pkg_temp": 51.25,
                                                           "acpitz (thermal_zone10)": 30.0}
    assert host_plugin.devloop_health(host, resource).status == "ok"
    host, only = host_resource(tmp_path, zones=["x86_pkg_temp"])
    assert host_plugin.devloop_thermal(host, only) == {"x86_pkg_temp": 51.25}


def test_a_host_without_thermal_zones_reads_none_and_is_degraded(tmp_path):
    host, resource = host_resource(tmp_path)
    assert host_plugin.devloop_thermal(host, resource) is None
    health = host_plugin.devloop_health(host, resource)
    assert health.status == "degraded" and "no thermal zone" in health.reason
    thermal_zone(tmp_path / "sys", 0, "acpitz", 27800)
    host, picky = host_resource(tmp_path, zones=["cpu"])
    assert host_plugin.devloop_thermal(host, picky) is None
    assert "none of the zones cpu" in host_plugin.devloop_health(host, picky).reason


@pytest.mark.service
def test_the_host_plugin_is_a_built_in_that_the_exporter_reports(tmp_path):
    sysfs = tmp_path / "sys"
    thermal_zone(sysfs, 0, "x86_pkg_temp", 48000)
    exporter = in_process_exporter(tmp_path, [{"name": "b0", "resources": [{"plugin": "sim"}, {"plugin": "host"}]}])
    exporter.host.sysfs_root = sysfs
    try:
        assert "host" in exporter.loaded
        (device,) = exporter.report(scan=True).devices
        assert sorted((r.kind, r.plugin, r.service, r.health) for r in device.resources) == [
            ("thermal", "host", False, "ok"), ("uart", "sim", True, "ok")]
        zones, problems = exporter.step_runner.readings(exporter.reporter.resources)
        assert problems == [] and zones == {"cpu": pytest.approx(40.0, abs=1), "x86_pkg_temp": 48.0}, \
            "a cooldown reads the union of the device's resources"
    finally:
        exporter.shutdown()


# ---- the adb plugin ---------------------------------------------------------------------------------

def test_a_phone_s_zones_are_parsed_from_what_the_shell_loop_prints():
    assert parse_zones("battery 31000\ncpu-0 45500\ncpu-0 47000\n 12\nbroken\n") == {
        "battery": 31.0, "cpu-0 (1)": 45.5, "cpu-0 (2)": 47.0, "zone": 0.012}
    assert parse_zones("/system/bin/sh: cat: No such file\n") is None


FAKE_ADB = '''#!{python}
"""adb as the plugin uses it for a phone's temperatures: a server that listens on -P, and a
client whose shell prints the zones (only through a server that is there)."""
import json, os, socket, sys, time
args = sys.argv[1:]
with open(os.environ["FAKE_ADB_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
port = int(args[args.index("-P") + 1]) if "-P" in args else 5037
if "nodaemon" in args:
    server = socket.create_server(("127.0.0.1", port))
    while True:
        server.accept()[0].close()
if "shell" in args:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        sys.exit("adb: cannot connect to daemon")
    print("battery 31000\\ncpu 45500")
    sys.exit(0)
sys.exit(1)
'''


@pytest.fixture
def fake_adb(tmp_path, monkeypatch):
    folder = tmp_path / "bin"
    folder.mkdir()
    adb = folder / "adb"
    adb.write_text(FAKE_ADB.format(python=sys.executable))
    adb.chmod(adb.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ADB_LOG", str(tmp_path / "adb.log"))
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(free_port()))  # no global server: never the default port
    return tmp_path / "adb.log"


def phone_host(tmp_path, *serials):
    sysfs = tmp_path / "sys"
    for n, serial_number in enumerate(serials, 1):
        usb_device(sysfs, f"1-{n}", vendor="18d1", product="4ee7", serial=serial_number, interfaces=(ADB,))
    return HostContext("host-a", tmp_path / "state", sysfs_root=sysfs, entries=[
        ConfiguredResource("pixel", "android", (), "adb", AdbConfig(serial=serials[0]))])


@pytest.mark.service
def test_a_phone_is_read_through_a_server_of_its_own_started_for_the_reading(tmp_path, fake_adb):
    host = phone_host(tmp_path, "8AAY0GCXH")
    plugin = AdbPlugin()
    plugin.one_device = True
    (resource,) = plugin.devloop_discover(host)
    assert plugin.devloop_thermal(host, resource) == {"battery": 31.0, "cpu": 45.5}
    calls = [line for line in fake_adb.read_text().splitlines()]
    server, shell = calls[0], calls[1]
    assert "nodaemon" in server and '"--one-device", "8AAY0GCXH"' in server, "a server of this one phone"
    assert '"-s", "8AAY0GCXH"' in shell and '"shell"' in shell
    assert host.processes.recorded() == [], "the server is stopped after the reading"
    assert not plugin.serving
    before = len(calls)
    plugin.devloop_thermal(host, resource)
    assert len(fake_adb.read_text().splitlines()) == before, "a fresh reading is answered again, not asked"


@pytest.mark.service
def test_a_phone_with_a_lease_is_read_through_the_lease_s_server(tmp_path, fake_adb):
    host = phone_host(tmp_path, "8AAY0GCXH")
    plugin = AdbPlugin()
    (resource,) = plugin.devloop_discover(host)
    with socket.create_server(("127.0.0.1", 0)) as lease_server:  # as the plugin's devloop_start noted it
        port = lease_server.getsockname()[1]
        plugin.servers["8AAY0GCXH"] = ["-P", str(port)]
        plugin.serving.add("8AAY0GCXH")
        assert plugin.devloop_thermal(host, resource) == {"battery": 31.0, "cpu": 45.5}
    (call,) = fake_adb.read_text().splitlines()
    assert f'"-P", "{port}"' in call and "nodaemon" not in call, "no server of its own: the lease's"


def test_without_one_device_a_phone_beside_others_is_not_read(tmp_path, fake_adb):
    host = phone_host(tmp_path, "8AAY0GCXH", "OTHERPHONE")
    plugin = AdbPlugin()  # Debian's adb 29: a private server would claim every phone here
    (resource, _) = plugin.devloop_discover(host)
    assert plugin.devloop_thermal(host, resource) is None
    assert not fake_adb.exists(), "no adb was run at all"


@pytest.mark.service
def test_the_adb_step_wait_boot_asks_the_phone_through_a_server_of_its_own(tmp_path, fake_adb):
    """(The same one-phone server as a reading: the step the adb plugin offers between two leases.)"""
    host = phone_host(tmp_path, "8AAY0GCXH")
    plugin = AdbPlugin()
    plugin.one_device = True
    (resource,) = plugin.devloop_discover(host)
    assert [k.name for k in plugin.devloop_steps(host, None)] == ["wait-boot"]
    op = Operation(id="op-1", kind="wait-boot", device="pixel", requester="coordinator", args={"timeout_s": 20.0})
    assert plugin.devloop_operate(host, resource, op) == "8AAY0GCXH has booted"
    shell = [line for line in fake_adb.read_text().splitlines() if '"shell"' in line]
    assert len(shell) == 1 and "wait-for-device" in shell[0] and "sys.boot_completed" in shell[0], shell
    assert host.processes.recorded() == [] and not plugin.serving
