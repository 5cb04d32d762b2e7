"""UART and ADB discovery on fake sysfs trees: identity from USB facts, never tty numbers."""
import pytest

from device_loop.core.host import HostContext
from device_loop.core.model import ConfiguredResource
from device_loop.core.usb import usb_devices, usb_ttys
from device_loop.plugins import adb, uart
from fake_sysfs import ADB, CDC_DATA, FASTBOOT, VENDOR_SPECIFIC, console_tty, usb_device, usb_tty

pytestmark = pytest.mark.timeout(10)


def configured(device, plugin, **settings):
    """A config entry as the exporter hands it to its plugin: parsed by the plugin's model."""
    model = {"uart": uart.UartConfig, "adb": adb.AdbConfig}[plugin]
    return ConfiguredResource(device=device, device_class="riscv-sbc", tags=("rack-2",), plugin=plugin,
                              config=model(**settings))


@pytest.fixture
def sysfs(tmp_path):
    root = tmp_path / "sys"
    ftdi = usb_device(root, "1-1.2", vendor="0403", product="6001", serial="A10K3XYZ",
                      manufacturer="FTDI", product_name="FT232R USB UART", interfaces=(VENDOR_SPECIFIC,))
    usb_tty(root, "ttyUSB0", ftdi)
    acm = usb_device(root, "1-1.3", vendor="2e8a", product="000a", serial="E6614C311B", busnum=1, devnum=7,
                     manufacturer="Raspberry Pi", product_name="Pico", interfaces=(("02", "02", "00"), CDC_DATA))
    usb_tty(root, "ttyACM0", acm, driver="cdc_acm")
    cheap = usb_device(root, "1-1.4", vendor="1a86", product="7523", serial=None, interfaces=(VENDOR_SPECIFIC,))
    usb_tty(root, "ttyUSB1", cheap)
    usb_device(root, "2-1", vendor="18d1", product="4ee7", serial="8AAY0GCXH", busnum=2, devnum=5,
               interfaces=(VENDOR_SPECIFIC, ADB))
    usb_device(root, "2-2", vendor="18d1", product="4ee0", serial="FASTBOOT1", interfaces=(FASTBOOT,))
    console_tty(root)
    return root


def test_usb_facts_are_read_like_udev_does(sysfs):
    ttys = {t.name: t for t in usb_ttys(sysfs)}
    assert set(ttys) == {"ttyUSB0", "ttyUSB1", "ttyACM0"}, "ttyS0 is not on USB"
    assert (ttys["ttyUSB0"].device.manufacturer, ttys["ttyUSB0"].device.serial) == ("FTDI", "A10K3XYZ")
    assert ttys["ttyACM0"].device.serial == "E6614C311B" and ttys["ttyACM0"].interface == "00"
    phone = next(d for d in usb_devices(sysfs) if d.serial == "8AAY0GCXH")
    assert phone.node == "/dev/bus/usb/002/005" and ADB in [i.triple for i in phone.interfaces]


def test_uart_discovery_names_adapters_by_identity(tmp_path, sysfs):
    host = HostContext(name="bench-3", state_dir=tmp_path / "state", sysfs_root=sysfs,
                       entries=[configured("pico", plugin="uart", usb_serial="E6614C311B")])
    found = {r.device: r for r in uart.devloop_discover(host)}
    assert set(found) == {"pico", "uart-A10K3XYZ", "uart-port-1-1.4"}
    assert found["pico"].identifier == "usb-serial:2e8a:000a:E6614C311B:if00"
    assert found["pico"].node == "/dev/ttyACM0" and found["pico"].device_class == "riscv-sbc"
    assert found["uart-A10K3XYZ"].identifier == "usb-serial:0403:6001:A10K3XYZ:if00"
    assert found["uart-port-1-1.4"].identifier == "usb-port:1-1.4:if00", "no serial: the physical port"


def test_uart_static_path_maps_to_its_usb_identity(tmp_path, sysfs):
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "ttyUSB0").touch()  # the node the by-id link points at
    by_id = dev / "usb-FTDI_FT232R_USB_UART_A10K3XYZ-if00-port0"
    by_id.symlink_to(dev / "ttyUSB0")
    pty = tmp_path / "ttyA"
    pty.touch()
    host = HostContext(name="bench-3", state_dir=tmp_path / "state", sysfs_root=sysfs, entries=[
        configured("jupiter", plugin="uart", path=str(by_id)), configured("pty-board", plugin="uart", path=str(pty)),
        configured("unplugged", plugin="uart", path=str(tmp_path / "gone"))])
    found = {r.device: r for r in uart.devloop_discover(host)}
    assert found["jupiter"].identifier == "usb-serial:0403:6001:A10K3XYZ:if00"
    assert "uart-A10K3XYZ" not in found, "the named adapter is not also a device of its own"
    assert found["pty-board"].identifier == f"uart:bench-3:{pty}"
    assert "unplugged" not in found
    assert uart.devloop_health(found["pty-board"]).status == "ok"
    pty.unlink()
    assert uart.devloop_health(found["pty-board"]).status == "failed"


def test_adb_discovery_finds_phones_by_interface(tmp_path, sysfs):
    host = HostContext(name="bench-3", state_dir=tmp_path / "state", sysfs_root=sysfs, entries=[])
    (phone,) = adb.AdbPlugin().devloop_discover(host)
    assert (phone.device, phone.identifier, phone.device_class) == ("android-8AAY0GCXH", "adb:8AAY0GCXH", "android")
    assert phone.node == "/dev/bus/usb/002/005"
    named = HostContext(name="bench-3", state_dir=tmp_path / "state", sysfs_root=sysfs,
                        entries=[configured("pixel-7", plugin="adb", serial="8AAY0GCXH")])
    (phone,) = adb.AdbPlugin().devloop_discover(named)
    assert phone.device == "pixel-7" and phone.identifier == "adb:8AAY0GCXH"


def test_adapters_that_share_a_serial_are_told_apart_by_port(tmp_path):
    root = tmp_path / "sys"
    for port, tty in (("1-1.2", "ttyUSB0"), ("1-1.3", "ttyUSB1")):  # two CP2102s, both "0001"
        usb_tty(root, tty, usb_device(root, port, vendor="10c4", product="ea60", serial="0001",
                                      interfaces=(VENDOR_SPECIFIC,)))
    quad = usb_device(root, "1-1.4", vendor="0403", product="6011", serial="FT4Q",
                      interfaces=(VENDOR_SPECIFIC,) * 4)
    for number in range(4):
        usb_tty(root, f"ttyUSB{2 + number}", quad, interface=number)
    host = HostContext(name="h", state_dir=tmp_path / "state", sysfs_root=root, entries=[
        configured("quad-c", plugin="uart", usb_serial="FT4Q", usb_interface=2)])
    found = {r.device: r.identifier for r in uart.devloop_discover(host)}
    assert found == {
        "uart-port-1-1.2": "usb-port:1-1.2:if00", "uart-port-1-1.3": "usb-port:1-1.3:if00",
        "uart-FT4Q": "usb-serial:0403:6011:FT4Q:if00", "uart-FT4Q-if01": "usb-serial:0403:6011:FT4Q:if01",
        "quad-c": "usb-serial:0403:6011:FT4Q:if02", "uart-FT4Q-if03": "usb-serial:0403:6011:FT4Q:if03"}
    assert len(set(found.values())) == len(found)
