"""This machine's own /sys/bus/pci/devices, read by the pci plugin (read-only, spawning
nothing, opening no node): the cards it reports are exactly those whose class file says
accelerator, and every device named by its address is reported with the ids and driver
its files say, and a health."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from device_loop.core.host import HostContext
from device_loop.core.model import ConfiguredResource, Health
from device_loop.plugins.pci import PciPlugin
from device_loop.plugins.pci.config import PciConfig

SYS = Path("/sys")
BUS = SYS / "bus" / "pci" / "devices"
ACCELERATOR_CLASSES = ("0x03", "0x1200", "0x0b40", "0x1180")  # display, processing accelerator, co-processor, DSP
SPAWNS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.fork", "os.forkpty", "os.spawn")
_seen: list[tuple] = []
_watching: list[bool] = []


def _audit(event, args):
    if _watching and (event in SPAWNS or event == "open" and isinstance(args[0], str) and args[0].startswith("/dev/")):
        _seen.append((event, args[0] if args else None))


sys.addaudithook(_audit)

pytestmark = pytest.mark.skipif(not BUS.is_dir(), reason="this machine has no /sys/bus/pci (a container without it)")


def _file(address: str, name: str) -> str:
    return (BUS / address / name).read_text().strip()


def test_the_real_bus_read_only():
    addresses = sorted(os.listdir(BUS))
    assert addresses, "a PCI bus without a device"
    expected = {a for a in addresses if _file(a, "class").startswith(ACCELERATOR_CLASSES)}
    entries = [ConfiguredResource(device=f"dev-{n}", device_class="generic", tags=(), plugin="pci",
                                  config=PciConfig(address=a)) for n, a in enumerate(addresses[:32])]
    unnamed, named = PciPlugin(), PciPlugin()
    for plugin in (unnamed, named):
        plugin.smi.program = staticmethod(lambda: None)  # (nvidia-smi is health's, once a period: not looked at here)
    host = HostContext(name="this-host", state_dir=Path("/nonexistent"), sysfs_root=SYS)
    named_host = HostContext(name="this-host", state_dir=Path("/nonexistent"), sysfs_root=SYS, entries=entries)
    _seen.clear()
    _watching.append(True)
    try:
        found = unnamed.devloop_discover(host=host)
        each = {r.device: r for r in named.devloop_discover(host=named_host)}
        healths = {name: named.devloop_health(host=named_host, resource=r) for name, r in each.items()}
    finally:
        _watching.pop()
    assert _seen == [], f"reading /sys started a process or opened a node: {_seen}"
    assert {unnamed.cards[r.identifier].address for r in found} == expected
    assert sorted(each) == sorted(e.device for e in entries)
    for entry in entries:
        resource, address = each[entry.device], entry.config.address
        ids = ":".join(_file(address, n)[2:] for n in ("vendor", "device", "subsystem_vendor", "subsystem_device"))
        assert resource.identifier == f"pci:this-host:{address}:{ids}" or \
            resource.identifier.startswith(f"pci:{ids}:sn:"), resource.identifier
        link = BUS / address / "driver"
        driver = os.path.basename(os.readlink(link)) if link.is_symlink() else None
        assert (f"driver-{driver}" in resource.tags) == (driver is not None), (resource.tags, driver)
        assert isinstance(healths[entry.device], Health) and healths[entry.device].status in ("ok", "degraded",
                                                                                              "failed")
        if driver is None:  # (what the files say, in the plugin's words)
            assert healths[entry.device].status == "failed"
