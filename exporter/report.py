"""The host's snapshot (DESIGN §4): what its plugins discover, how healthy it is, who else
holds the device nodes, and the services that run.

Scanning (discovery, health, a pass over /proc for node holders) happens once a heartbeat
period or on a hot-plug wake-up. A report sent between scans, because a service came up
or went away, is still a full snapshot: the devices as last scanned (those whose services
just stopped looked at again for orphans) and the services as they are now.
"""
from __future__ import annotations

import dataclasses
import logging

from device_loop.core import PROTOCOL_VERSION, __version__
from device_loop.core.host import HostContext
from device_loop.core.model import Health, Resource
from device_loop.core.plugins import PluginSet
from device_loop.core.protocol import (MAX_COMMAND_CHARS, MAX_HOLDERS, MAX_NAME_CHARS, MAX_REASON_CHARS, Adoption,
                                       CandidateReport, DeviceReport, FlashReport, Heartbeat, PluginsReport,
                                       ServiceReport)

from .orphans import OrphanWatch

log = logging.getLogger("device_loop.exporter")


class Reporter:
    def __init__(self, host: HostContext, plugins: PluginSet, orphans: OrphanWatch, heartbeat_s: float,
                 boot_id: str):
        self.host, self.plugins, self.orphans = host, plugins, orphans
        self.heartbeat_s, self.boot_id = heartbeat_s, boot_id
        self.generation = 0
        self.loaded: list[str] = []
        self.skipped: list[dict] = []
        self.adoptions: dict[str, Adoption] = {}  # candidate identifier -> the device an admin made of it
        self.resources: list[Resource] = []
        self.candidates: list[Resource] = []
        self._last_found: dict[str, list[Resource]] = {}
        self.failing: dict[str, str] = {}  # plugin -> why its last discovery failed
        self._health: dict[str, Health] = {}
        self._busy: dict[str, list[dict]] = {}
        self._devices: list[DeviceReport] | None = None  # as last scanned, until the next scan

    def discover(self) -> list[Resource]:
        """Every resource of every loaded plugin (read-only; no process is spawned).

        A plugin whose discovery fails keeps its last good result: a failure to look is
        not evidence that the devices are gone (their leases would be torn down).
        """
        resources = []
        for name in self.loaded:
            try:
                found = self.plugins.call(name, "devloop_discover", host=self.host) or []
                self._last_found[name] = [dataclasses.replace(r, plugin=name) for r in found]
                self.failing.pop(name, None)
            except Exception as exc:
                log.exception("discovery of plugin %s failed; keeping what it found before", name)
                self.failing[name] = f"discovery failed ({exc!r}); serving what it found before"
            resources += self._last_found.get(name, [])
        self.candidates = [r for r in resources if r.candidate and r.identifier not in self.adoptions]
        return [self._adopted(r) for r in resources if not r.candidate or r.identifier in self.adoptions]

    def _adopted(self, resource: Resource) -> Resource:
        """A candidate an admin adopted: the device it now belongs to."""
        adoption = self.adoptions.get(resource.identifier) if resource.candidate else None
        if adoption is None:
            return resource
        return dataclasses.replace(resource, device=adoption.name, device_class=adoption.device_class,
                                   tags=tuple(adoption.tags), candidate=False)

    def health(self, resource: Resource) -> Health:
        try:
            return self.plugins.call(resource.plugin, "devloop_health", host=self.host, resource=resource) or Health()
        except Exception as exc:
            return Health("failed", f"health check crashed: {exc!r}")

    def scan(self, ours: set[int]) -> list[Resource]:
        """Discover, check health and look for orphans: the devices of the next reports."""
        self.resources = self.discover()
        self._health = {r.identifier: self.health(r) for r in self.resources}
        self._busy = self.orphans.orphans(self.resources, ours)
        self._devices = None
        return self.resources

    def build(self, services: list[ServiceReport], applied: set[str], ours: set[int],
              recheck: set[str] = frozenset(), unserved: list[dict] = (), stopping: bool = False,
              flashes: list[FlashReport] = ()) -> Heartbeat:
        """The next snapshot: devices as last scanned (``recheck``: devices to look at
        again for orphans), with ``services`` as they run now."""
        if recheck:
            again = [r for r in self.resources if r.device in recheck]
            for resource in again:
                self._busy.pop(resource.identifier, None)
            self._busy |= self.orphans.orphans(again, ours)
            self._devices = None
        if self._devices is None:
            self._devices = self._device_reports()
        self.generation += 1
        return Heartbeat(
            protocol=PROTOCOL_VERSION, version=__version__, boot_id=self.boot_id, generation=self.generation,
            heartbeat_s=self.heartbeat_s, stopping=stopping, address=self.host.advertise_address,
            plugins=PluginsReport(loaded=self.loaded, skipped=[_clipped(s) for s in self.skipped],
                                  unserved=[_clipped(u) for u in unserved],
                                  failing=[{"name": n, "reason": r[:MAX_REASON_CHARS]}
                                           for n, r in sorted(self.failing.items())]),
            devices=self._devices, services=services,
            applied=sorted(applied), flashes=list(flashes),
            candidates=[CandidateReport(identifier=c.identifier, kind=c.kind, plugin=c.plugin, label=c.device)
                        for c in self.candidates])

    def _device_reports(self) -> list[DeviceReport]:
        devices: dict[str, dict] = {}
        for r in self.resources:
            health = self._health.get(r.identifier) or Health()
            entry = devices.setdefault(r.device, {"name": r.device, "class": r.device_class, "tags": list(r.tags),
                                                  "resources": [], "busy_by": []})
            entry["resources"].append({"kind": r.kind, "plugin": r.plugin, "identifier": r.identifier,
                                       "health": health.status, "reason": health.reason})
            entry["busy_by"] += self._busy.get(r.identifier, [])
        for entry in devices.values():  # the report's bounds: a java command line is long
            entry["busy_by"] = [{**h, "command": h["command"][:MAX_COMMAND_CHARS]}
                                for h in entry["busy_by"][:MAX_HOLDERS]]
        return [DeviceReport.model_validate(d) for d in devices.values()]


def _clipped(entry: dict) -> dict:
    """A skipped plugin or unserved device cut to the report's bounds (a misspelt plugin
    name in the config may be as long as its author typed it)."""
    return {key: value[:MAX_REASON_CHARS if key == "reason" else MAX_NAME_CHARS] for key, value in entry.items()}
