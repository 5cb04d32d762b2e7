"""Fake PCI trees laid out as the kernel lays them out (this VM has no accelerator):
``devices/pci0000:00/BRIDGE/ADDRESS`` with its attributes, ``bus/pci/devices/ADDRESS``
links, a ``driver`` link, ``drm``/``accel`` children, the nvidia driver's procfs file, and
real character nodes under the ``dev`` folder beside the tree (the tests run as root)."""
from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

GEN = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe"}
DISPLAY_3D = "0x030200"
VGA = "0x030000"
PROCESSING_ACCELERATOR = "0x120000"
ETHERNET = "0x020000"
DRM_MAJOR = 226


def _write(folder: Path, **attrs) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in attrs.items():
        (folder / name).write_text(f"{value}\n")


def aer_text(total_name: str, total: int) -> str:
    """An AER counters file as the kernel writes it: a line a kind of error, then the total."""
    lines = ["Undefined 0", "DLP 0", "SDES 0", "TLP 0", "FCP 0", "CmpltTO 0", "MalfTLP 0", "ECRC 0", "UnsupReq 0"]
    return "\n".join(lines + [f"{total_name} {total}"]) + "\n"


def pci_card(root: Path, address: str, *, class_code: str = DISPLAY_3D, vendor: str = "10de", device: str = "2330",
             subsystem: tuple[str, str] = ("10de", "16c1"), driver: str | None = "nouveau", link: tuple[int, int] = (4, 16),
             max_link: tuple[int, int] = (4, 16), port_link: tuple[int, int] | None = (4, 16),
             aer: tuple[int, int, int] | None = (0, 0, 0), enable: int = 1, drm: tuple[str, ...] = (),
             accel: tuple[str, ...] = (), serial: str | None = None, bridge: str | None = None) -> Path:
    """A card at ``address`` below a bridge of its own (``bridge``: its address; its link's
    capability ``port_link``, generation and lanes), as sysfs shows it; its real folder."""
    top = root / "devices" / f"pci{address[:4]}:00"
    if port_link is not None:
        bridge = bridge or f"{address[:4]}:00:{int(address[5:7], 16):02x}.0"
        parent = top / bridge
        _write(parent, **{"class": "0x060400", "vendor": "0x8086", "device": "0x1901",
                          "max_link_speed": GEN[port_link[0]], "max_link_width": port_link[1]})
    else:
        parent = top
    real = parent / address
    attrs = {"class": class_code, "vendor": f"0x{vendor}", "device": f"0x{device}",
             "subsystem_vendor": f"0x{subsystem[0]}", "subsystem_device": f"0x{subsystem[1]}", "enable": enable,
             "current_link_speed": GEN[link[0]], "current_link_width": link[1],
             "max_link_speed": GEN[max_link[0]], "max_link_width": max_link[1]}
    if serial is not None:
        attrs["serial_number"] = serial
    _write(real, **attrs)
    if aer is not None:
        for name, total_name, total in zip(("aer_dev_fatal", "aer_dev_nonfatal", "aer_dev_correctable"),
                                           ("TOTAL_ERR_FATAL", "TOTAL_ERR_NONFATAL", "TOTAL_ERR_COR"), aer):
            (real / name).write_text(aer_text(total_name, total))
    if driver is not None:
        bind(root, address, driver, real)
    for name in drm:
        (real / "drm" / name).mkdir(parents=True)
    for name in accel:
        (real / "accel" / name).mkdir(parents=True)
    bus = root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(real, bus), bus / address)
    return real


def bind(root: Path, address: str, driver: str, real: Path | None = None) -> None:
    """Bind the card at ``address`` to ``driver`` (its ``driver`` link)."""
    real = real or (root / "bus" / "pci" / "devices" / address).resolve()
    drivers = root / "bus" / "pci" / "drivers" / driver
    drivers.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(drivers, real), real / "driver")


def set_attr(root: Path, address: str, **attrs) -> None:
    """Change attributes of the card at ``address`` (``current_link_speed=GEN[1]``)."""
    _write((root / "bus" / "pci" / "devices" / address).resolve(), **attrs)


def remove_card(root: Path, address: str) -> Path:
    """The card pulled out (hot-unplug): its folder and link gone. Returns where it was, for
    ``put_back``."""
    link = root / "bus" / "pci" / "devices" / address
    real = link.resolve()
    keep = root.parent / "unplugged" / address
    if keep.exists():  # (a card pulled out before: this one is kept now)
        shutil.rmtree(keep)
    shutil.copytree(real, keep, symlinks=True)
    shutil.rmtree(real)
    link.unlink()
    return keep


def put_back(root: Path, address: str, kept: Path, real: Path) -> None:
    """The card pulled out by ``remove_card`` back in its slot."""
    shutil.copytree(kept, real, symlinks=True)
    shutil.rmtree(kept)
    bus = root / "bus" / "pci" / "devices"
    os.symlink(os.path.relpath(real, bus), bus / address)


def dev_node(root: Path, path: str, major: int, minor: int, mode: int = 0o660) -> Path:
    """A real character node at ``path`` (``/dev/dri/renderD128``) under the ``dev`` folder
    beside the sysfs tree ``root``."""
    node = root.parent / "dev" / path.removeprefix("/dev/")
    node.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(node, mode | stat.S_IFCHR, os.makedev(major, minor))
    os.chmod(node, mode)
    return node


def nvidia_information(root: Path, address: str, uuid: str, minor: int) -> None:
    """What the nvidia driver writes of a GPU in ``/proc/driver/nvidia/gpus/ADDRESS/information``."""
    folder = root.parent / "proc" / "driver" / "nvidia" / "gpus" / address
    folder.mkdir(parents=True)
    (folder / "information").write_text(
        f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 140\nGPU UUID: \t {uuid}\nVideo BIOS: \t 96.00.30.00.01\n"
        f"Bus Type: \t PCIe\nDMA Size: \t 52 bits\nBus Location: \t {address}\nDevice Minor: \t {minor}\n"
        "GPU Excluded:\t No\n")
