"""A card's health from what sysfs says of it now, in words: is it still on the bus, bound
to a driver and enabled, does its link run as fast and as wide as it can, and what its AER
counters say. Read-only: a few small files a card, nothing opened but those."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from device_loop.plugin import Health, HealthKind

from .cards import BUS, PciCard, link_speed, link_width
from .sysfs import TABLE_LIMIT, Folder, parse_hex

#: Drivers that enable a card only while a user has it open (a VM's passthrough).
ENABLED_WHEN_OPEN = ("vfio-pci", "pci-stub")
#: The AER counter files, and the line of each that is the total.
AER_FATAL = ("aer_dev_fatal", "TOTAL_ERR_FATAL")
AER_NONFATAL = ("aer_dev_nonfatal", "TOTAL_ERR_NONFATAL")
AER_CORRECTABLE = ("aer_dev_correctable", "TOTAL_ERR_COR")


def aer_total(folder: Folder, counters: tuple[str, str]) -> int | None:
    """The total of an AER counters file (its ``TOTAL_ERR_*`` line; None where the kernel has none)."""
    name, total = counters
    for line in folder.text(name, TABLE_LIMIT).splitlines():
        if line.startswith(total):
            value = line[len(total):].strip()
            return int(value) if value.isdigit() and len(value) < 19 else None
    return None


def _speed(speed: float) -> str:
    return f"{speed:g} GT/s"


@dataclass(frozen=True)
class Findings:
    """What one look at a card found: its health, and its correctable AER count (which only
    matters as it grows, so the next look compares)."""

    health: Health
    correctable: int | None = None


def check(sysfs_root: Path, card: PciCard, check_link_speed: bool = True,
          correctable_before: int | None = None) -> Findings:
    """The health of ``card`` (as discovery last saw it) now. A card gone from the bus is
    ``failed`` (transient: it may be put back), and so is one no driver is bound to; AER
    fatal errors are ``failed`` and permanent; anything else that is wrong, ``degraded``."""
    try:
        folder = Folder(f"{sysfs_root}/{BUS}/{card.address}")
    except OSError:
        return Findings(Health("failed", f"{card.address} is gone from the PCI bus"))
    with folder:
        return _check(folder, card, check_link_speed, correctable_before)


def _check(folder: Folder, card: PciCard, check_link_speed: bool, correctable_before: int | None) -> Findings:
    vendor, device = parse_hex(folder.text("vendor")), parse_hex(folder.text("device"))
    if vendor is None or device is None:
        return Findings(Health("failed", f"{card.address} is gone from the PCI bus"))
    if (vendor, device) != (card.vendor, card.device):
        return Findings(Health("failed", f"another card ({vendor}:{device}) is at {card.address} now"))
    fatal = aer_total(folder, AER_FATAL)
    if fatal:
        return Findings(Health("failed", f"AER fatal errors: {fatal}", HealthKind.PERMANENT))
    failures, problems = [], []
    driver = folder.link("driver")
    if driver is None:
        failures.append("no driver is bound to it")
    elif driver not in ENABLED_WHEN_OPEN and folder.text("enable") == "0":
        problems.append(f"not enabled by its driver {driver}")
    speed = link_speed(folder.text("current_link_speed"))
    width = link_width(folder.text("current_link_width"))
    if check_link_speed and speed is not None and card.max_speed is not None and speed < card.max_speed:
        problems.append(f"link at {_speed(speed)} of {_speed(card.max_speed)}")
    if width is not None and card.max_width is not None and width < card.max_width:
        problems.append(f"link x{width} of x{card.max_width}")
    nonfatal = aer_total(folder, AER_NONFATAL)
    if nonfatal:
        problems.append(f"AER non-fatal errors: {nonfatal}")
    correctable = aer_total(folder, AER_CORRECTABLE)
    if correctable is not None and correctable_before is not None and correctable > correctable_before:
        problems.append(f"AER correctable errors: {correctable} ({correctable - correctable_before} more since "
                        "the last check)")
    if failures:
        return Findings(Health("failed", "; ".join(failures + problems)), correctable)
    return Findings(Health("degraded", "; ".join(problems)) if problems else Health("ok"), correctable)
