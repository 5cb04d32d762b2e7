"""PCI cards as sysfs shows them (``SYSFS/bus/pci/devices/ADDRESS``), read-only: which are
accelerators, who each is (never an index), and what its link can do.

A card's identity is its address and vendor, device and subsystem ids on its host, or,
where its driver exposes a serial (amdgpu's ``serial_number``, the nvidia driver's GPU
UUID), those ids and the serial, which hold wherever the card is plugged.
"""
from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

from . import nvidia
from .sysfs import ADDRESS, link_name, names_in, read_hex, read_text

#: Classes that are accelerators whoever made them (``class`` is 0xCCSSPP: class, subclass, interface).
DISPLAY = 0x03        # VGA, 3D, display controllers: a GPU
PROCESSING_ACCELERATOR = 0x1200
CO_PROCESSOR = 0x0b40
SIGNAL_PROCESSING = 0x1180
MAX_CARDS = 1024  # devices of a bus looked at: a big server has some hundreds
#: What a card of a class is, where its entry does not say: a display controller is a GPU.
GPU_CLASS = "gpu"
ACCELERATOR_CLASS = "accelerator"
#: Vendor ids a tag names in words (others are tagged with their id).
VENDORS = {"10de": "nvidia", "1002": "amd", "8086": "intel", "1ae0": "google", "1d0f": "amazon",
           "1e52": "tenstorrent", "1da3": "habana", "1cb8": "furiosa", "1e0f": "graphcore", "1af4": "virtio",
           "1234": "qemu", "15ad": "vmware", "1414": "microsoft", "13b5": "arm", "5143": "qualcomm"}
_SPEED = re.compile(r"(\d{1,3}(?:\.\d{1,3})?) ?GT/s")
_SERIAL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def is_accelerator(class_code: int) -> bool:
    """Whether a card of this class is served unasked: display, processing accelerator,
    co-processor, signal processing."""
    return class_code >> 16 == DISPLAY or class_code >> 8 in (PROCESSING_ACCELERATOR, CO_PROCESSOR, SIGNAL_PROCESSING)


def link_speed(text: str) -> float | None:
    """GT/s in ``8.0 GT/s PCIe`` (None for ``Unknown``, garbage)."""
    match = _SPEED.match(text)
    speed = float(match.group(1)) if match else 0.0
    return speed if 0 < speed <= 1000 else None


def link_width(text: str) -> int | None:
    """Lanes in ``16`` (None for 0, which is unknown, and garbage)."""
    return int(text) if text.isdigit() and 0 < int(text) <= 64 else None


def _least(*values):
    known = [v for v in values if v is not None]
    return min(known) if known else None


def _serial(text: str) -> str | None:
    """A serial a driver wrote, if it tells cards apart (not empty, not all zeros)."""
    text = text.strip()
    if not _SERIAL.fullmatch(text) or not text.strip("0xX-").strip("0"):
        return None
    return text


@dataclass(frozen=True)
class PciCard:
    """One PCI device as discovery saw it."""

    address: str
    vendor: str
    device: str
    subsystem_vendor: str
    subsystem_device: str
    class_code: int
    driver: str | None
    serial: str | None
    max_speed: float | None  # GT/s the link can run at: the lesser of the card's and its port's
    max_width: int | None

    def identifier(self, host: str) -> str:
        """Unique in the lab and stable across reboots: the ids and serial, or the ids at
        this address of this host."""
        ids = f"{self.vendor}:{self.device}:{self.subsystem_vendor}:{self.subsystem_device}"
        return f"pci:{ids}:sn:{self.serial}" if self.serial else f"pci:{host}:{self.address}:{ids}"

    def automatic_name(self, host: str) -> str:
        """The device name of a card that no entry names: ``pci-SERIAL``, else
        ``HOST-pci-BUS-DEVICE.FUNCTION`` (the domain too when it is not 0)."""
        if self.serial:
            return f"pci-{self.serial}"[:64]
        where = self.address[5:] if self.address.startswith("0000:") else self.address
        suffix = f"-pci-{where.replace(':', '-')}"
        if len(host) + len(suffix) > 64:  # (a name is 64 characters: the host's cut, its digest kept)
            digest = hashlib.sha256(host.encode()).hexdigest()[:6]
            host = f"{host[:64 - len(suffix) - 7]}-{digest}"
        return f"{host}{suffix}"

    @property
    def device_class(self) -> str:
        """``gpu`` for a display card, else ``accelerator``."""
        return GPU_CLASS if self.class_code >> 16 == DISPLAY else ACCELERATOR_CLASS

    @property
    def tags(self) -> tuple[str, ...]:
        """``vendor-NAME`` (or its id) and, when one is bound, ``driver-NAME``."""
        vendor = f"vendor-{VENDORS.get(self.vendor, self.vendor)}"
        return (vendor, f"driver-{self.driver}") if self.driver else (vendor,)


#: Where the bus's devices are, in the sysfs root.
BUS = "bus/pci/devices"


def devices_folder(sysfs_root: Path) -> Path:
    """The folder of the PCI bus's devices under ``sysfs_root``."""
    return Path(sysfs_root) / BUS


def _serial_of(path: Path, proc_root: Path, address: str, driver: str | None) -> str | None:
    if driver == nvidia.DRIVER:
        uuid = nvidia.gpu_information(proc_root, address).uuid
        if uuid:
            return uuid
    return _serial(read_text(path / "serial_number"))


def read_card(sysfs_root: Path, address: str, wanted: bool = False) -> PciCard | None:
    """The card at ``address``, if it is an accelerator or ``wanted`` (an entry names it);
    None when it is neither, or its ids cannot be read."""
    path = devices_folder(sysfs_root) / address
    class_text = read_text(path / "class").lower()
    class_code = int(class_text, 16) if re.fullmatch(r"0x[0-9a-f]{6}", class_text) else None
    if not wanted and (class_code is None or not is_accelerator(class_code)):
        return None
    ids = [read_hex(path / name) for name in ("vendor", "device", "subsystem_vendor", "subsystem_device")]
    vendor, device = ids[0], ids[1]
    if vendor is None or device is None:
        return None
    driver = link_name(path / "driver")
    port = Path(os.path.realpath(path)).parent  # the bridge above it (a root complex is no address)
    port_speed = link_speed(read_text(port / "max_link_speed")) if ADDRESS.fullmatch(port.name) else None
    port_width = link_width(read_text(port / "max_link_width")) if ADDRESS.fullmatch(port.name) else None
    return PciCard(address=address, vendor=vendor, device=device, subsystem_vendor=ids[2] or "0000",
                   subsystem_device=ids[3] or "0000", class_code=class_code or 0, driver=driver,
                   serial=_serial_of(path, Path(sysfs_root).parent / "proc", address, driver),
                   max_speed=_least(link_speed(read_text(path / "max_link_speed")), port_speed),
                   max_width=_least(link_width(read_text(path / "max_link_width")), port_width))


def addresses(sysfs_root: Path) -> list[str]:
    """The addresses of the PCI bus's devices (``MAX_CARDS`` at most)."""
    return names_in(devices_folder(sysfs_root), ADDRESS, limit=MAX_CARDS)


def scan(sysfs_root: Path, wanted: AbstractSet[str] = frozenset(),
         wanted_ids: AbstractSet[str] = frozenset()) -> list[PciCard]:
    """Every accelerator of the bus, and every card at a ``wanted`` address or with
    ``wanted_ids`` (``vendor:device``), by address."""
    cards = []
    for address in addresses(sysfs_root):
        ids = ""
        if wanted_ids:
            vendor, device = (read_hex(devices_folder(sysfs_root) / address / n) for n in ("vendor", "device"))
            ids = f"{vendor}:{device}"
        card = read_card(sysfs_root, address, wanted=address in wanted or ids in wanted_ids)
        if card is not None:
            cards.append(card)
    return cards
