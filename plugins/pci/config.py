"""A ``pci`` config entry: which card (its address, or its vendor:device ids), and how
its link is judged."""
from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from device_loop.plugin import PluginConfig

from .sysfs import ADDRESS


class PciConfig(PluginConfig):
    """A PCI card's entry: ``address`` (``0000:01:00.0``, or ``01:00.0`` in domain 0) or
    ``pci_id`` (``10de:2330``, vendor:device, which exactly one card of the host must have)."""

    address: str | None = Field(default=None, description="its PCI address: 0000:01:00.0 (or 01:00.0)")
    pci_id: str | None = Field(default=None, description="its vendor:device ids, 10de:2330: one card of the host")
    check_link_speed: bool = Field(
        default=True, description="a link slower than it can run is degraded (false: only its width is checked, "
                                  "for cards that slow their link when idle)")

    @field_validator("address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is None:
            return None
        full = value.lower() if value.count(":") == 2 else f"0000:{value.lower()}"
        if not ADDRESS.fullmatch(full):
            raise ValueError(f"a PCI address is 0000:01:00.0 (domain:bus:device.function) or 01:00.0, not {value!r}")
        return full

    @field_validator("pci_id")
    @classmethod
    def _pci_id(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not re.fullmatch(r"[0-9A-Fa-f]{4}:[0-9A-Fa-f]{4}", value):
            raise ValueError(f"pci_id is vendor:device, four hex digits each (10de:2330), not {value!r}")
        return value.lower()

    @model_validator(mode="after")
    def _one_card(self) -> PciConfig:
        self.exactly_one("address", "pci_id")
        return self


#: How a card that no entry names is judged.
UNNAMED = PciConfig.model_construct(address=None, pci_id=None, check_link_speed=True)
