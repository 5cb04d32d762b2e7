"""The exporter <-> coordinator protocol, written once: the coordinator validates what
exporters send with these models, exporters build their reports and read their desired
state with them, and the tests speak them too.

Unknown fields are refused (422): a report can not smuggle in a field the coordinator
owns (``mediated``, ``owner``, a lease binding).
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from . import LEASE_PREFIX, NAME_PATTERN

MAX_DEVICES_PER_REPORT = 1000
MAX_RESOURCES_PER_DEVICE = 32

HealthStatus = Literal["ok", "degraded", "failed"]
FlashPhase = Literal["fetching", "writing", "verifying"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


def check_device_name(name: str) -> str:
    """A validator for device names: ``lease-`` is the prefix of lease ids."""
    if name.startswith(LEASE_PREFIX):
        raise ValueError(f"device names must not start with {LEASE_PREFIX!r} (that prefix names leases)")
    return name


class EndpointReport(Strict):
    """Where a client connects; ``kind`` is the resource kind (``uart``, ``adb``...)."""
    kind: str = Field(min_length=1, max_length=32)
    host: str = Field(min_length=1, max_length=255)
    port: int = Field(ge=1, le=65535)
    url: str | None = Field(default=None, max_length=2048)
    protocol: str | None = Field(default=None, max_length=32)
    params: dict[str, str | int] | None = Field(default=None, max_length=16)
    command: str | None = Field(default=None, max_length=500, description="how to use it: a template")
    env: dict[str, str] | None = Field(default=None, max_length=16, description="exports that point tools at it")


class ResourceReport(Strict):
    kind: str = Field(min_length=1, max_length=32)
    plugin: str = Field(min_length=1, max_length=64)
    identifier: str = Field(min_length=1, max_length=255)
    health: HealthStatus = "ok"
    reason: str = Field(default="", max_length=1000)


class Holder(Strict):
    """A process holding a device node that did not hold it when the lease began."""
    pid: int = Field(ge=0, le=2**31)
    command: str = Field(max_length=1000)


class DeviceReport(Strict):
    name: str = Field(pattern=NAME_PATTERN)
    device_class: str = Field(alias="class", min_length=1, max_length=64)
    tags: list[str] = Field(default_factory=list, max_length=64)
    resources: list[ResourceReport] = Field(min_length=1, max_length=MAX_RESOURCES_PER_DEVICE)
    busy_by: list[Holder] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _not_a_lease_id(cls, name: str) -> str:
        return check_device_name(name)


class ServiceReport(Strict):
    """A service the exporter runs for a lease (or failed to start: ``error``)."""
    lease: str = Field(min_length=1, max_length=64)
    device: str = Field(min_length=1, max_length=64)
    identifier: str = Field(min_length=1, max_length=255)
    kind: str = Field(min_length=1, max_length=32)
    endpoints: list[EndpointReport] = Field(default_factory=list)
    error: str | None = Field(default=None, max_length=2000)


class FlashReport(Strict):
    """A flash the exporter runs, or finished and has not had acknowledged yet (a
    heartbeat that carried its result was answered)."""
    op: str = Field(min_length=1, max_length=64)
    device: str = Field(min_length=1, max_length=64)
    state: Literal["running", "done", "failed"]
    phase: FlashPhase
    done_bytes: int = Field(default=0, ge=0, le=2**63 - 1)
    message: str = Field(default="", max_length=2000)
    seconds: dict[FlashPhase, float] = Field(default_factory=dict, description="how long each phase took so far")
    changed: bool = Field(default=False, description="the target may have been changed (its backend began)")


class CandidateReport(Strict):
    """Something found on the network: an admin adopts it before anyone can book it."""
    identifier: str = Field(min_length=1, max_length=255)
    kind: str = Field(min_length=1, max_length=32)
    plugin: str = Field(min_length=1, max_length=64)
    label: str = Field(default="", max_length=200)


class SkippedPlugin(Strict):
    name: str
    reason: str


class UnservedDevice(Strict):
    device: str
    plugin: str
    reason: str


class PluginsReport(Strict):
    loaded: list[str] = Field(default_factory=list)
    skipped: list[SkippedPlugin] = Field(default_factory=list)
    failing: list[SkippedPlugin] = Field(default_factory=list, description="loaded, but its last discovery raised")
    unserved: list[UnservedDevice] = Field(default_factory=list, description="configured, but no plugin serves it")


class Heartbeat(Strict):
    """A full snapshot of one exporter's host (DESIGN §4): the coordinator replaces what
    it held for the host with it."""
    protocol: int
    version: str = Field(max_length=64)
    boot_id: str = Field(min_length=1, max_length=64)
    generation: int = Field(ge=0, le=2**63 - 1)
    heartbeat_s: float = Field(gt=0, le=3600)
    plugins: PluginsReport = Field(default_factory=PluginsReport)
    devices: list[DeviceReport] = Field(default_factory=list, max_length=MAX_DEVICES_PER_REPORT)
    services: list[ServiceReport] = Field(default_factory=list, max_length=4 * MAX_DEVICES_PER_REPORT)
    applied: list[str] = Field(default_factory=list, description="lease ids of the desired state last converged to")
    stopping: bool = Field(default=False, description="the exporter's last report: it is going away")
    candidates: list[CandidateReport] = Field(default_factory=list, max_length=MAX_DEVICES_PER_REPORT)
    flashes: list[FlashReport] = Field(default_factory=list, max_length=MAX_DEVICES_PER_REPORT)

    @model_validator(mode="after")
    def _each_thing_once(self):
        for what, values in (("device name", [d.name for d in self.devices]),
                             ("resource identifier", [r.identifier for d in self.devices for r in d.resources])):
            seen, repeated = set(), set()
            for value in values:
                (repeated if value in seen else seen).add(value)
            if repeated:
                raise ValueError(f"each {what} may appear once in a report: {', '.join(sorted(repeated))}")
        return self


class DesiredService(Strict):
    """One service the exporter should run: a resource of a leased device."""
    lease: str
    holder: str
    device: str
    identifier: str
    kind: str
    plugin: str
    secret: str | None = None


class Adoption(Strict):
    """A network candidate an admin adopted: the device it now is."""
    identifier: str
    name: str
    device_class: str = Field(alias="class")
    tags: list[str] = Field(default_factory=list)


class DesiredFlash(Strict):
    """A flash the exporter should run: write image ``sha256`` to a device's flash target."""
    op: str
    device: str
    identifier: str
    plugin: str
    sha256: str
    size: int
    image: str


class DesiredState(Strict):
    """The heartbeat's answer (and the long-poll's): what this host should run."""
    services: list[DesiredService] = Field(default_factory=list)
    flashes: list[DesiredFlash] = Field(default_factory=list)
    adopted: list[Adoption] = Field(default_factory=list)
    etag: str | None = None
    as_of: float = Field(default=0.0, description="coordinator time of the read: of two answers, the later wins")
