"""A PCI tree that says anything (garbage, huge files, FIFOs and nodes where attributes
should be, links that loop, files missing) never crashes the pci plugin's scan, health or
container environment, never blocks it and never makes it open a node."""
from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from device_loop.core.host import HostContext
from device_loop.core.model import ConfiguredResource, Health
from device_loop.plugins.pci import PciPlugin
from device_loop.plugins.pci.config import PciConfig
from device_loop.plugins.pci.sysfs import ATTR_LIMIT, read_text
from fake_pci import nvidia_information, pci_card

pytestmark = pytest.mark.timeout(60)  # (a FIFO opened would block: the timeout says so)

GPU = "0000:01:00.0"
ATTRIBUTES = ("class", "vendor", "device", "subsystem_vendor", "subsystem_device", "enable", "current_link_speed",
              "max_link_speed", "current_link_width", "max_link_width", "aer_dev_fatal", "aer_dev_nonfatal",
              "aer_dev_correctable", "serial_number")
_opened: list[str] = []
_watching: list[str] = []


def _audit(event, args):
    if _watching and event == "open" and isinstance(args[0], str) and args[0].startswith(_watching[-1]):
        _opened.append(args[0])


sys.addaudithook(_audit)


def everything(plugin: PciPlugin, host: HostContext) -> list[Health]:
    """Discovery, then each resource's health, thermal and environment: what a scan and a lease ask."""
    healths = []
    for resource in plugin.devloop_discover(host=host):
        health = plugin.devloop_health(host=host, resource=resource)
        assert isinstance(health, Health)
        healths.append(health)
        plugin.devloop_thermal(host=host, resource=resource)
        plugin.devloop_environment(host=host, resource=resource, service=None)
    for entry in host.entries:
        assert isinstance(plugin.devloop_check_config(host=host, entry=entry), str)
    return healths


def named(address: str) -> ConfiguredResource:
    return ConfiguredResource(device="named", device_class="generic", tags=(), plugin="pci",
                              config=PciConfig(address=address))


def test_garbage_in_every_file(tmp_path):
    root = tmp_path / "sys"
    real = pci_card(root, GPU, drm=("renderD128",))
    for name in ATTRIBUTES:
        (real / name).write_bytes(b"\x00\xff0x03\n\n" * 3)
    pci_card(root, "0000:02:00.0", aer=None)
    (root.parent / "sys" / "bus" / "pci" / "devices" / "0000:02:00.0" / "current_link_speed").write_text(
        "99999999 GT/s PCIe\n")
    for name, text in (("aer_dev_fatal", "TOTAL_ERR_FATAL 99999999999999999999999999\n"),
                       ("aer_dev_nonfatal", "TOTAL_ERR_NONFATAL -1\n")):
        ((root / "bus" / "pci" / "devices" / "0000:02:00.0").resolve() / name).write_text(text)
    plugin = PciPlugin()
    host = HostContext(name="h", state_dir=tmp_path / "state", sysfs_root=root, entries=[named(GPU)])
    assert [h.status for h in everything(plugin, host)] == ["ok"]  # (the garbage card is no card at all)


def test_huge_files_are_read_to_their_bound(tmp_path):
    root = tmp_path / "sys"
    real = pci_card(root, GPU)
    with open(real / "class", "w") as out:
        out.write("0x030000")
        out.truncate(256 << 20)  # 256 MiB (sparse): a read of it all would take seconds and the memory
    with open(real / "aer_dev_fatal", "w") as out:
        out.truncate(256 << 20)
    assert len(read_text(real / "class")) <= ATTR_LIMIT
    plugin = PciPlugin()
    host = HostContext(name="h", state_dir=tmp_path / "state", sysfs_root=root)
    assert everything(plugin, host) == []  # (its class is not "0x030000" then 256 MiB of zeros)
    host.entries = [named(GPU)]
    assert [h.status for h in everything(plugin, host)] == ["ok"]


def test_fifos_and_nodes_where_attributes_should_be_are_never_opened(tmp_path):
    root = tmp_path / "sys"
    real = pci_card(root, GPU, drm=("renderD128",))
    os.unlink(real / "current_link_speed")
    os.mkfifo(real / "current_link_speed")  # an open of it would block until a writer came
    os.unlink(real / "enable")
    os.mknod(real / "enable", 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    os.unlink(real / "aer_dev_fatal")
    os.symlink("/dev/zero", real / "aer_dev_fatal")
    nvidia_information(root, GPU, "not a uuid", minor=7)
    plugin = PciPlugin()
    host = HostContext(name="h", state_dir=tmp_path / "state", sysfs_root=root)
    _opened.clear()
    _watching.append(str(tmp_path))
    try:
        healths = everything(plugin, host)
    finally:
        _watching.pop()
    assert [h.status for h in healths] == ["ok"]
    assert not [p for p in _opened if p.endswith(("current_link_speed", "enable", "aer_dev_fatal"))]


def test_links_that_loop_names_that_are_not_addresses_and_missing_files(tmp_path):
    root = tmp_path / "sys"
    bus = root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    os.symlink("0000:07:00.0", bus / "0000:07:00.0")  # itself
    os.symlink("../../../etc", bus / "..x")
    (bus / "0000:01:00.0x").mkdir()
    (bus / "0000:08:00.0").mkdir()  # nothing in it
    real = pci_card(root, GPU)
    os.unlink(real / "driver")
    os.symlink("../../../bus/pci/drivers/a driver with spaces", real / "driver")
    for name in ("current_link_speed", "current_link_width", "aer_dev_nonfatal"):
        os.unlink(real / name)
    plugin = PciPlugin()
    host = HostContext(name="h", state_dir=tmp_path / "state", sysfs_root=root,
                       entries=[named("0000:07:00.0"), named("0000:08:00.0")])
    healths = everything(plugin, host)
    assert [(h.status, h.reason) for h in healths] == [("failed", "no driver is bound to it")]
    assert plugin.devloop_check_config(host=host, entry=host.entries[1]) == \
        "the ids of the PCI device at 0000:08:00.0 cannot be read"


def test_a_bus_of_thousands_is_looked_at_to_a_bound(tmp_path):
    root = tmp_path / "sys"
    pci_card(root, GPU)
    bus = root / "bus" / "pci" / "devices"
    for n in range(6000):
        os.symlink("nowhere", bus / f"0001:{n // 256:02x}:{(n // 8) % 32:02x}.{n % 8}")
    plugin = PciPlugin()
    host = HostContext(name="h", state_dir=tmp_path / "state", sysfs_root=root)
    everything(plugin, host)  # (finds what it finds within its bound; what matters is that it ends)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(ATTRIBUTES), st.binary(max_size=300) | st.sampled_from([
    b"0x030000\n", b"0x120000\n", b"16.0 GT/s PCIe\n", b"2.5 GT/s\n", b"Unknown\n", b"16\n", b"0\n", b"1\n",
    b"TOTAL_ERR_FATAL 3\n", b"TOTAL_ERR_COR 5\n", b"0x10de\n"])), st.booleans())
def test_any_attribute_contents(contents, driver):
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "sys"
        real = pci_card(root, GPU, driver="nvidia" if driver else None, drm=("renderD128",))
        for name, data in contents.items():
            (real / name).write_bytes(data)
        plugin = PciPlugin()
        plugin.smi.program = staticmethod(lambda: None)  # (this test is about sysfs: no nvidia-smi)
        for host in (HostContext(name="h", state_dir=Path(folder) / "state", sysfs_root=root),
                     HostContext(name="h", state_dir=Path(folder) / "state", sysfs_root=root, entries=[named(GPU)])):
            everything(plugin, host)
