"""Watching must not change what is watched: discovery and health spawn no process and
open no device node,
for every built-in plugin that has something to discover (sim boards, a USB serial
adapter, a static UART, a phone, a VM slot between leases, PCI accelerators)."""
import contextlib
import subprocess
import sys

import pytest

from device_loop.core.hookspecs import hookimpl
from device_loop.core.ports import free_port
from device_loop.exporter.config import parse_config
from device_loop.exporter.daemon import Exporter
from fake_pci import DRM_MAJOR, ETHERNET, dev_node, pci_card
from fake_sysfs import ADB, VENDOR_SPECIFIC, usb_device, usb_tty

pytestmark = [pytest.mark.service, pytest.mark.timeout(30)]

SPAWN_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.fork", "os.forkpty", "os.spawn")
_watching = []
_spawned = []


def _audit(event, args):
    if not _watching:
        return
    if event in SPAWN_EVENTS:
        _spawned.append((event, args))
    elif event == "open" and isinstance(args[0], str) and args[0] in _watching[-1]:
        _spawned.append((event, args))  # opening a UART toggles DTR: as bad as a spawn


sys.addaudithook(_audit)  # audit hooks cannot be removed: it only records while watching


@contextlib.contextmanager
def no_process_may_start(nodes=()):
    """Record every process started, and every open of one of ``nodes``, inside."""
    _spawned.clear()
    _watching.append(set(nodes))
    try:
        yield _spawned
    finally:
        _watching.pop()


def make_exporter(tmp_path, extra_plugin=None, state=None):
    sysfs = tmp_path / "sys"
    serial_adapter = usb_device(sysfs, "1-1.2", vendor="0403", product="6001", serial="A10K3XYZ",
                                interfaces=(VENDOR_SPECIFIC,))
    usb_tty(sysfs, "ttyUSB0", serial_adapter)
    usb_device(sysfs, "2-1", vendor="18d1", product="4ee7", serial="8AAY0GCXH", interfaces=(ADB,))
    pci_card(sysfs, "0000:01:00.0", driver="amdgpu", drm=("card0", "renderD128"))  # a GPU nobody named
    dev_node(sysfs, "/dev/dri/renderD128", DRM_MAJOR, 128)
    pci_card(sysfs, "0000:03:00.0", class_code=ETHERNET, vendor="15b3", device="a2dc", driver="mlx5_core")
    pty = tmp_path / "ttyA"
    pty.touch()
    state = state or tmp_path / "state"
    images = state / "qemu" / "images"
    images.mkdir(parents=True)
    (images / "vmlinuz").write_bytes(b"a kernel")
    config = parse_config({
        "exporter": {"name": "host-a", "state_dir": str(state), "cdi_dir": str(state / "cdi"), "sysfs_root": str(sysfs),
                     "coordinator": f"http://127.0.0.1:{free_port()}"},  # nobody listens: its goodbye goes nowhere
        "devices": [{"name": "sim-board-0", "plugin": "sim"}, {"name": "sim-board-1", "plugin": "sim"},
                    {"name": "jupiter", "plugin": "uart", "path": str(pty)},
                    {"name": "pixel", "plugin": "adb", "serial": "8AAY0GCXH"},
                    {"name": "vm", "plugin": "qemu", "kernel": "vmlinuz"},
                    {"name": "dpu", "plugin": "pci", "address": "0000:03:00.0"}],
    })
    exporter = Exporter(config)
    if extra_plugin is not None:
        exporter.plugins.pm.register(extra_plugin, name="spawner")
    exporter.setup()
    return exporter


def test_discovery_and_health_spawn_no_process(tmp_path, short_tmp):
    exporter = make_exporter(tmp_path, state=short_tmp / "state")
    try:
        nodes = {r.node for r in exporter.discover() if r.node}
        with no_process_may_start(nodes) as spawned:
            resources = exporter.discover()
            report = exporter.report(scan=True)
        assert {(r.device, r.plugin) for r in resources} == {
            ("sim-board-0", "sim"), ("sim-board-1", "sim"), ("jupiter", "uart"), ("uart-A10K3XYZ", "uart"),
            ("pixel", "adb"), ("vm", "qemu"), ("host-a-pci-01-00.0", "pci"), ("dpu", "pci")}
        assert str(tmp_path / "dev" / "dri" / "renderD128") in nodes  # (watched: never opened either)
        health = {d.name: d.resources[0].health for d in report.devices}
        assert {k: v for k, v in health.items() if k != "uart-A10K3XYZ"} == dict.fromkeys(
            ["sim-board-0", "sim-board-1", "jupiter", "pixel", "vm", "host-a-pci-01-00.0", "dpu"], "ok")
        # (no /dev/ttyUSB0 need exist here)
        assert spawned == []
    finally:
        exporter.shutdown()


def test_the_guard_catches_an_open_of_a_node(tmp_path):
    node = tmp_path / "ttyA"
    node.touch()
    with no_process_may_start({str(node)}) as seen:
        open(node).close()
    assert [event for event, _ in seen] == ["open"]


class SpawningPlugin:
    """What the guard exists to catch: a plugin that runs a tool to look."""

    @hookimpl
    def devloop_available(self, host):
        return None

    @hookimpl
    def devloop_discover(self, host):
        subprocess.run(["true"], check=True)
        return []


def test_the_guard_catches_a_plugin_that_spawns(tmp_path):
    exporter = make_exporter(tmp_path, SpawningPlugin())
    try:
        assert "spawner" in exporter.loaded
        with no_process_may_start() as spawned:
            exporter.discover()
        assert [event for event, _ in spawned] == ["subprocess.Popen"]
    finally:
        exporter.shutdown()
