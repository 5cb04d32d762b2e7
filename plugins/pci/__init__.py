"""PCI accelerators (GPUs, processing accelerators, co-processors, DSPs) as devices of the lab.

Discovery reads ``SYSFS/bus/pci/devices`` (``cards.py``), spawning nothing and opening no
device node: every card whose class is display (0x03xx), processing accelerator (0x1200),
co-processor (0x0b40) or signal processing (0x1180) is a device, ``pci-SERIAL`` or
``HOST-pci-BUS-DEVICE.FUNCTION`` unless an entry names it, of class ``gpu`` (display) or
``accelerator``, tagged with its vendor and driver. An entry (``config.py``) names a card
by ``address`` or ``pci_id`` (vendor:device), of any class, and gives its name, class and
tags. A card seen once and gone is still reported, ``failed``, until it is back: it may be
put back (hot-plug), and its device keeps its history.

Health (``health.py``) is what sysfs says now: on the bus, a driver bound and enabled, the
link's speed and width against what card and port can do, the AER counters; where the
driver is ``nvidia`` and ``nvidia-smi`` is installed, one query for all cards a period
(``nvidia.py``). A lease's container gets the nodes of the card's driver and its address
(``nodes.py``). A lease of a card starts nothing and has no endpoint: a container uses the
card through the lease's CDI spec.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping, Sequence

from device_loop.plugin import (ConfiguredResource, ContainerEnvironment, Health, HostContext, LeaseRef, PluginConfig,
                                Resource, Service, ServiceError, hookimpl)

from . import nodes
from .cards import PciCard, addresses, is_accelerator, scan
from .config import UNNAMED, PciConfig
from .health import check
from .nvidia import DRIVER as NVIDIA, NvidiaSmi
from .thermal import hwmon_temperatures

KIND = "pci"
#: Cards gone from the bus that are still reported (each until it is back, or the exporter restarts).
MAX_REMEMBERED = 256
#: How long correctable AER errors that grew keep a card degraded: longer than a re-check, so that
#: two results in a row agree on it and it is reported (docs/architecture.md, "Health that heals").
CORRECTABLE_HOLD_S = 60.0


def _ids(card: PciCard) -> str:
    return f"{card.vendor}:{card.device}"


def _entry_card(entry: ConfiguredResource, cards: list[PciCard], claimed: set[str]) -> PciCard | None:
    """The card an entry names: the one at its address, or the one card with its ids."""
    config = entry.config
    if config.address is not None:
        found = [c for c in cards if c.address == config.address]
    else:
        found = [c for c in cards if _ids(c) == config.pci_id]
    return found[0] if len(found) == 1 and found[0].address not in claimed else None


class PciPlugin:
    """The plugin's state on one exporter: each card as discovery last saw it (health and a
    container's environment read it), the cards seen before that are gone, the AER counts
    of the last check and the shared nvidia-smi query."""

    def __init__(self) -> None:
        self.cards: dict[str, PciCard] = {}
        self.remembered: dict[str, Resource] = {}
        self.correctable: dict[str, int] = {}
        self.grew: dict[str, float] = {}  # identifier -> when its correctable AER count last grew
        self.clock = time.monotonic
        self.smi = NvidiaSmi()
        self._lock = threading.Lock()

    @hookimpl
    def devloop_config_model(self) -> type[PluginConfig] | None:
        return PciConfig

    @hookimpl
    def devloop_available(self, host: HostContext) -> str | None:
        return None  # (a host without a PCI bus has no card to report)

    @hookimpl
    def devloop_discover(self, host: HostContext) -> Sequence[Resource] | None:
        entries = host.entries
        cards = scan(host.sysfs_root, wanted={e.config.address for e in entries if e.config.address},
                     wanted_ids={e.config.pci_id for e in entries if e.config.pci_id})
        found: list[tuple[Resource, PciCard]] = []
        claimed: set[str] = set()
        for entry in entries:
            card = _entry_card(entry, cards, claimed)
            if card is None:
                continue
            claimed.add(card.address)
            node = nodes.primary_node(host.sysfs_root, card)
            resource = entry.resource(KIND, card.identifier(host.name), node=node)
            found.append((dataclasses.replace(
                resource, tags=tuple(dict.fromkeys(entry.tags + card.tags)),
                device_class=card.device_class if entry.device_class == "generic" else entry.device_class), card))
        for card in cards:
            if card.address not in claimed and is_accelerator(card.class_code):
                found.append((Resource(device=card.automatic_name(host.name), kind=KIND,
                                       identifier=card.identifier(host.name), device_class=card.device_class,
                                       tags=card.tags, node=nodes.primary_node(host.sysfs_root, card),
                                       config=UNNAMED), card))
        return self._with_the_gone(found)

    def _with_the_gone(self, found: list[tuple[Resource, PciCard]]) -> list[Resource]:
        """``found``, and the cards seen before that are gone (unless their device's name is
        another card's now); remembers what was found."""
        with self._lock:
            resources = [resource for resource, _ in found]
            present = {r.identifier for r in resources}
            names = {r.device for r in resources}
            for identifier, r in reversed(self.remembered.items()):  # (the latest seen first: its name stands)
                if identifier not in present and r.device not in names:
                    resources.append(r)
                    names.add(r.device)
            for resource, card in found:
                self.cards[resource.identifier] = card
                self.remembered.pop(resource.identifier, None)
                self.remembered[resource.identifier] = resource  # (the latest seen last: the oldest go first)
            while len(self.remembered) > MAX_REMEMBERED:
                gone = next(iter(self.remembered))
                del self.remembered[gone]
                self.cards.pop(gone, None)
            return resources

    @hookimpl
    def devloop_check_config(self, host: HostContext, entry: ConfiguredResource) -> str | None:
        config = entry.config
        if config.address is not None:
            if config.address not in addresses(host.sysfs_root):
                return f"no PCI device at {config.address}"
            return f"the ids of the PCI device at {config.address} cannot be read"
        matching = [c.address for c in scan(host.sysfs_root, wanted_ids={config.pci_id}) if _ids(c) == config.pci_id]
        if not matching:
            return f"no PCI card has the ids {config.pci_id}"
        return (f"{len(matching)} PCI cards have the ids {config.pci_id} ({', '.join(matching[:8])}): "
                "name one by address")

    @hookimpl
    def devloop_health(self, host: HostContext, resource: Resource) -> Health | None:
        card = self.cards.get(resource.identifier)
        if card is None:
            return Health("failed", "not discovered on this host")
        before = self.correctable.get(resource.identifier)
        findings = check(host.sysfs_root, card, resource.config.check_link_speed, before)
        health = findings.health
        if findings.correctable is not None:
            self.correctable[resource.identifier] = findings.correctable
            health = self._correctable_held(resource.identifier, health, before, findings.correctable)
        if card.driver != NVIDIA or health.status == "failed":
            return health
        return _worst(health, self._smi_health(card))

    def _correctable_held(self, identifier: str, health: Health, before: int | None, count: int) -> Health:
        """``health``, still ``degraded`` for ``CORRECTABLE_HOLD_S`` after the correctable AER
        count grew: a re-check 1-2 s later finds it grown no more, and would never agree."""
        now = self.clock()
        if before is not None and count > before:
            self.grew[identifier] = now
            return health
        grew = self.grew.get(identifier)
        if grew is None or now - grew >= CORRECTABLE_HOLD_S:
            self.grew.pop(identifier, None)
            return health
        return _worst(health, Health("degraded", f"AER correctable errors: {count}, grown {now - grew:.0f} s ago"))

    def _smi_health(self, card: PciCard) -> Health:
        answer = self.smi.answer()
        if answer is None:  # (not installed: sysfs has said what can be said)
            return Health()
        if answer.problem:
            return Health("failed", answer.problem)
        row = answer.rows.get(card.address)
        if row is None:
            return Health("failed", "nvidia-smi does not list it")
        if lost := row.lost():
            return Health("failed", lost)
        ecc = row.number("ecc.errors.uncorrected.volatile.total")
        return Health("degraded", f"uncorrected ECC errors: {ecc}") if ecc else Health()

    @hookimpl
    def devloop_thermal(self, host: HostContext, resource: Resource) -> Mapping[str, float] | None:
        card = self.cards.get(resource.identifier)
        if card is None:
            return None
        zones = hwmon_temperatures(host.sysfs_root, card.address)
        if card.driver == NVIDIA and not zones:
            answer = self.smi.answer()
            row = answer.rows.get(card.address) if answer else None
            degrees = row.number("temperature.gpu") if row else None
            if degrees is not None:
                zones["gpu"] = float(degrees)
        return zones or None

    @hookimpl
    def devloop_start(self, host: HostContext, resource: Resource, lease: LeaseRef) -> Service | None:
        """A lease of a card runs nothing and has no endpoint: its container gets the card
        through the lease's CDI spec (``devloop_environment``). The card must be there."""
        card = self.cards.get(resource.identifier)
        if card is None:
            raise ServiceError("the card was not discovered on this host")
        health = check(host.sysfs_root, card, resource.config.check_link_speed).health
        if health.status == "failed":
            raise ServiceError(health.reason)
        return Service(endpoints=[])

    @hookimpl
    def devloop_environment(self, host: HostContext, resource: Resource,
                            service: Service | None) -> ContainerEnvironment | None:
        card = self.cards.get(resource.identifier)
        return nodes.environment(host.sysfs_root, card) if card is not None else None


def _worst(first: Health, second: Health) -> Health:
    """The worse of two answers; both reasons when both are wrong."""
    order = ("ok", "degraded", "failed")
    worse, other = sorted((first, second), key=lambda h: order.index(h.status), reverse=True)
    if other.status == "ok":
        return worse
    return Health(worse.status, f"{worse.reason}; {other.reason}", worse.kind)
