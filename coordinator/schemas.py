"""What clients and exporters may send. Unknown fields are refused (422): a report can
not smuggle in a field the coordinator owns (``mediated``, ``owner``, a lease binding)."""
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


TTL = {"ge": 1, "le": 10 * 365 * 86400}  # the lab's own --max-ttl is checked by the rules


class ReserveIn(Strict):
    device: str = Field(min_length=1, max_length=64)
    ttl_s: float | None = Field(default=None, **TTL)


class RenewIn(Strict):
    ttl_s: float = Field(**TTL)


class EndpointIn(Strict):
    kind: str = Field(min_length=1, max_length=32)
    host: str = Field(min_length=1, max_length=255)
    port: int = Field(ge=1, le=65535)
    url: str | None = Field(default=None, max_length=2048)
    protocol: str | None = Field(default=None, max_length=32)
    params: dict[str, str | int] | None = Field(default=None, max_length=16)


class ResourceIn(Strict):
    kind: str = Field(min_length=1, max_length=32)
    plugin: str = Field(min_length=1, max_length=64)
    identifier: str = Field(min_length=1, max_length=255)
    health: Literal["ok", "degraded", "failed"] = "ok"
    reason: str = Field(default="", max_length=1000)


class HolderIn(Strict):
    pid: int = Field(ge=0, le=2**31)
    command: str = Field(max_length=1000)


class DeviceIn(Strict):
    name: str = Field(pattern=NAME)
    device_class: str = Field(alias="class", min_length=1, max_length=64)
    tags: list[str] = Field(default_factory=list, max_length=64)
    resources: list[ResourceIn] = Field(min_length=1, max_length=32)
    busy_by: list[HolderIn] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _not_a_lease_id(cls, name: str) -> str:
        if name.startswith("lease-"):
            raise ValueError("device names must not start with 'lease-' (that prefix names leases)")
        return name


class ServiceIn(Strict):
    lease: str = Field(min_length=1, max_length=64)
    device: str = Field(min_length=1, max_length=64)
    identifier: str = Field(min_length=1, max_length=255)
    kind: str = Field(min_length=1, max_length=32)
    endpoints: list[EndpointIn] = Field(default_factory=list)
    error: str | None = Field(default=None, max_length=2000)


class CandidateIn(Strict):
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


class PluginsIn(Strict):
    loaded: list[str] = Field(default_factory=list)
    skipped: list[SkippedPlugin] = Field(default_factory=list)
    unserved: list[UnservedDevice] = Field(default_factory=list, description="configured, but no plugin serves it")


class HeartbeatIn(Strict):
    protocol: int
    version: str = Field(max_length=64)
    boot_id: str = Field(min_length=1, max_length=64)
    generation: int = Field(ge=0, le=2**63 - 1)
    heartbeat_s: float = Field(gt=0, le=3600)
    plugins: PluginsIn = Field(default_factory=PluginsIn)
    devices: list[DeviceIn] = Field(default_factory=list, max_length=1000)
    services: list[ServiceIn] = Field(default_factory=list, max_length=4000)
    applied: list[str] = Field(default_factory=list, description="lease ids of the desired state last converged to")
    stopping: bool = Field(default=False, description="the exporter's last report: it is going away")
    candidates: list[CandidateIn] = Field(default_factory=list, max_length=1000)

    @model_validator(mode="after")
    def _each_thing_once(self):
        names = [d.name for d in self.devices]
        identifiers = [r.identifier for d in self.devices for r in d.resources]
        for what, values in (("device name", names), ("resource identifier", identifiers)):
            repeated = sorted({v for v in values if values.count(v) > 1})
            if repeated:
                raise ValueError(f"each {what} may appear once in a report: {', '.join(repeated)}")
        return self


class TokenIn(Strict):
    user: str | None = Field(default=None, max_length=64)
    admin: bool = False
    exporter_host: str | None = Field(default=None, max_length=64)
    expires_s: float | None = Field(default=None, ge=60, le=10 * 365 * 86400)


class RetireIn(Strict):
    retired: bool = True
    force: bool = False


class DrainIn(Strict):
    draining: bool = True


class AdoptIn(Strict):
    name: str = Field(pattern=NAME)
    device_class: str = Field(default="generic", alias="class", min_length=1, max_length=64)
    tags: list[str] = Field(default_factory=list, max_length=64)

    @field_validator("name")
    @classmethod
    def _not_a_lease_id(cls, name: str) -> str:
        return DeviceIn._not_a_lease_id(name)
