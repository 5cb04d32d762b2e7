"""Fake sysfs trees laid out the way the kernel lays them out (these machines have no
/sys/bus/usb), for discovery tests. Real kernel facts, not our own code, are faked."""
from __future__ import annotations

import os
from pathlib import Path

ADB = ("ff", "42", "01")
FASTBOOT = ("ff", "42", "03")
CDC_DATA = ("0a", "00", "00")
VENDOR_SPECIFIC = ("ff", "ff", "ff")


def _write(folder: Path, **attrs) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in attrs.items():
        (folder / name).write_text(f"{value}\n")


def usb_device(root: Path, port: str, *, vendor: str, product: str, serial: str | None,
               manufacturer="", product_name="", busnum=1, devnum=2, interfaces=(ADB,)) -> Path:
    """A device at USB port ``port`` (e.g. ``1-1.2``: bus 1, hub port 1, port 2) with interfaces
    0, 1, ... of these classes, nested below its root hub and hubs as the kernel nests them."""
    bus_number = port.split("-")[0]
    chain = [port.split(".")[0]] + [".".join(port.split(".")[:i]) for i in range(2, port.count(".") + 2)]
    root_hub = root / "devices" / "pci0000:00" / f"usb{bus_number}"
    bus = root / "bus" / "usb" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    if not root_hub.exists():  # root hubs have a serial too (the controller's address)
        _write(root_hub, idVendor="1d6b", idProduct="0002", serial="0000:00:14.0", busnum=bus_number, devnum=1)
        _write(root_hub / f"{bus_number}-0:1.0", bInterfaceNumber="00", bInterfaceClass="09",
               bInterfaceSubClass="00", bInterfaceProtocol="00")
        os.symlink(root_hub, bus / f"usb{bus_number}")
    real = root_hub.joinpath(*chain)
    attrs = {"idVendor": vendor, "idProduct": product, "busnum": busnum, "devnum": devnum,
             "manufacturer": manufacturer, "product": product_name}
    if serial is not None:
        attrs["serial"] = serial
    _write(real, **attrs)
    os.symlink(real, bus / port)
    for number, (cls, sub, proto) in enumerate(interfaces):
        interface = real / f"{port}:1.{number}"
        _write(interface, bInterfaceNumber=f"{number:02d}", bInterfaceClass=cls, bInterfaceSubClass=sub,
               bInterfaceProtocol=proto)
        os.symlink(interface, bus / interface.name)
    return real


def usb_tty(root: Path, tty: str, device: Path, interface: int = 0, driver="usb-serial") -> None:
    """``/sys/class/tty/TTY``: on the interface itself (cdc_acm) or one level below it (usb-serial)."""
    interface_dir = device / f"{device.name}:1.{interface}"
    target = interface_dir / tty if driver == "usb-serial" else interface_dir
    target.mkdir(parents=True, exist_ok=True)
    tty_dir = root / "class" / "tty" / tty
    tty_dir.mkdir(parents=True)
    os.symlink(target, tty_dir / "device")


def console_tty(root: Path, tty: str = "ttyS0") -> None:
    """A tty that is no USB device at all (a UART on the board's own bus)."""
    platform = root / "devices" / "platform" / "serial8250" / tty
    platform.mkdir(parents=True)
    tty_dir = root / "class" / "tty" / tty
    tty_dir.mkdir(parents=True)
    os.symlink(platform, tty_dir / "device")


UVC = ("0e", "01", "00")  # USB video class, video control interface


def v4l2_node(root: Path, node: str, device: Path, interface: int = 0, index: int = 0, name: str = "USB Camera") -> None:
    """``/sys/class/video4linux/NODE`` of a USB camera: ``index`` 0 is its picture, 1 its metadata."""
    real = device / f"{device.name}:1.{interface}" / "video4linux" / node
    _write(real, index=index, name=name)
    os.symlink(real.parent.parent, real / "device")
    links = root / "class" / "video4linux"
    links.mkdir(parents=True, exist_ok=True)
    os.symlink(real, links / node)
