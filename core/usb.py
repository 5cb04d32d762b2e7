"""USB devices as sysfs shows them (read-only: files only, no process, no device opened).

``sysfs_root`` is ``/sys`` on a real host and a fake tree in tests. Layout relied on:
``bus/usb/devices/1-1.2`` (a device: ``idVendor``, ``idProduct``, ``serial``,
``manufacturer``, ``product``, ``busnum``, ``devnum``), ``bus/usb/devices/1-1.2:1.0``
(an interface: ``bInterfaceNumber``, ``bInterfaceClass``, ``bInterfaceSubClass``,
``bInterfaceProtocol``, two hex digits each), and ``class/tty/NAME/device`` leading
into an interface directory (directly for cdc_acm, one level down for usb-serial).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


def _attr(path: Path, name: str) -> str:
    try:
        return (path / name).read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class UsbInterface:
    number: str
    triple: tuple[str, str, str]  # class, subclass, protocol, as sysfs writes them ("ff", "42", "01")


@dataclass(frozen=True)
class UsbDevice:
    path: Path
    vendor: str
    product: str
    serial: str
    manufacturer: str
    product_name: str
    busnum: int
    devnum: int
    interfaces: tuple[UsbInterface, ...] = field(default=())

    @property
    def node(self) -> str:
        """The usbfs node (what adb and fastboot open)."""
        return f"/dev/bus/usb/{self.busnum:03d}/{self.devnum:03d}"


def read_device(path: Path) -> UsbDevice | None:
    """The USB device in sysfs directory ``path`` (None if it is not one)."""
    if not (path / "idVendor").exists():
        return None
    interfaces = []
    for child in sorted(path.parent.glob(f"{path.name}:*")) + sorted(path.glob(f"{path.name}:*")):
        if (child / "bInterfaceClass").exists():
            interfaces.append(UsbInterface(_attr(child, "bInterfaceNumber"), (
                _attr(child, "bInterfaceClass"), _attr(child, "bInterfaceSubClass"),
                _attr(child, "bInterfaceProtocol"))))
    return UsbDevice(path=path, vendor=_attr(path, "idVendor"), product=_attr(path, "idProduct"),
                     serial=_attr(path, "serial"), manufacturer=_attr(path, "manufacturer"),
                     product_name=_attr(path, "product"), busnum=int(_attr(path, "busnum") or 0),
                     devnum=int(_attr(path, "devnum") or 0), interfaces=tuple(dict.fromkeys(interfaces)))


def usb_devices(sysfs_root: Path) -> list[UsbDevice]:
    """Every USB device (not hub interfaces, not root hubs without a serial)."""
    devices = []
    for entry in sorted((Path(sysfs_root) / "bus" / "usb" / "devices").glob("*")):
        if ":" not in entry.name:
            device = read_device(entry)
            if device is not None:
                devices.append(device)
    return devices


@dataclass(frozen=True)
class UsbTty:
    name: str            # ttyUSB0
    device: UsbDevice
    interface: str       # "00", as sysfs writes bInterfaceNumber (hex)
    port: int = 0        # which of the interface's ttys (a few adapters put several on one)


def usb_ttys(sysfs_root: Path) -> list[UsbTty]:
    """Serial ports that sit on a USB interface, with the device they belong to."""
    found = []
    for tty in sorted((Path(sysfs_root) / "class" / "tty").glob("*")):
        link = tty / "device"
        if not link.exists():
            continue
        here = link.resolve()
        while here != here.parent and not (here / "bInterfaceNumber").exists():
            here = here.parent
        device = read_device(here.parent) if (here / "bInterfaceNumber").exists() else None
        if device is not None:
            found.append((here, tty.name, device, _attr(here, "bInterfaceNumber") or "00"))
    per_interface: dict[Path, int] = {}
    ttys = []
    for interface_dir, name, device, number in sorted(found, key=lambda f: (str(f[0]), len(f[1]), f[1])):
        port = per_interface[interface_dir] = per_interface.get(interface_dir, -1) + 1
        ttys.append(UsbTty(name, device, number, port))
    return ttys
