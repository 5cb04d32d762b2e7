"""The exporter's machine as a resource of a device: its thermal zones, for a cooldown step.

Config: a ``[[devices.resources]]`` entry with ``plugin = "host"``, and optionally ``zones``
(the zone types to read, as ``SYSFS/class/thermal/thermal_zone*/type`` names them:
``["x86_pkg_temp", "acpitz"]``; default every zone). A device whose heat is the host's (a
board in the host's case, a phone on its hub) lists it beside its other resources. The
resource serves no lease and runs no operation: it only answers ``devloop_thermal``, from
sysfs (millidegrees in each zone's ``temp``), reading nothing else and spawning nothing.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
import dataclasses
from pathlib import Path

from pydantic import Field

from device_loop.plugin import Health, HostContext, PluginConfig, Resource, hookimpl


class HostConfig(PluginConfig):
    """A host resource's entry."""

    zones: list[str] | None = Field(default=None, min_length=1,
                                    description="the thermal zone types to read (default: every zone)")


def zones(sysfs_root: Path, wanted: list[str] | None = None) -> dict[str, float]:
    """Each thermal zone of the machine (its type; ``type (thermal_zoneN)`` where two share
    one) -> °C; a zone whose temperature cannot be read (some say ENODATA) is left out."""
    found: dict[str, float] = {}
    folders = sorted((sysfs_root / "class" / "thermal").glob("thermal_zone*"), key=lambda p: (len(p.name), p.name))
    types = {}
    for folder in folders:
        try:
            types[folder] = (folder / "type").read_text().strip() or folder.name
        except OSError:
            types[folder] = folder.name
    for folder, kind in types.items():
        if wanted is not None and kind not in wanted:
            continue
        try:
            degrees = int((folder / "temp").read_text().strip()) / 1000
        except (OSError, ValueError):
            continue
        shared = list(types.values()).count(kind) > 1
        found[f"{kind} ({folder.name})" if shared else kind] = degrees
    return found


@hookimpl
def devloop_config_model() -> type[PluginConfig] | None:
    return HostConfig


@hookimpl
def devloop_available(host: HostContext) -> str | None:
    return None


@hookimpl
def devloop_discover(host: HostContext) -> Sequence[Resource] | None:
    return [dataclasses.replace(entry.resource("thermal", f"host-thermal:{host.name}:{entry.device}"),
                                serves_lease=False) for entry in host.entries]


@hookimpl
def devloop_health(host: HostContext, resource: Resource) -> Health | None:
    if zones(host.sysfs_root, resource.config.zones):
        return Health("ok")
    which = f"none of the zones {', '.join(resource.config.zones)}" if resource.config.zones else "no thermal zone"
    return Health("degraded", f"{which} under {host.sysfs_root / 'class' / 'thermal'} can be read")


@hookimpl
def devloop_thermal(host: HostContext, resource: Resource) -> Mapping[str, float] | None:
    return zones(host.sysfs_root, resource.config.zones) or None
