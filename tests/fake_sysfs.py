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
    """A device at USB port ``port`` (e.g. ``1-1.2``) with interfaces 0, 1, ... of these classes."""
    real = root / "devices" / "pci0000:00" / "usb1" / port
    attrs = {"idVendor": vendor, "idProduct": product, "busnum": busnum, "devnum": devnum,
             "manufacturer": manufacturer, "product": product_name}
    if serial is not None:
        attrs["serial"] = serial
    _write(real, **attrs)
    bus = root / "bus" / "usb" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
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
