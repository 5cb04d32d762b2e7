"""Plain data passed between plugins, the exporter and the coordinator."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from .vocabulary import Fidelity, HealthKind, HealthStatus, Purpose

HEALTH_STATES = tuple(status.value for status in HealthStatus)


class ServiceError(Exception):
    """A plugin could not start a service; the message says why, for the lease holder."""


class OperationError(Exception):
    """An operation failed; the message says why, for the one who asked for it.

    ``changed=False`` says the device was not touched (the target could not even be
    opened): a destructive kind's failure then does not leave it needing recovery. Leave
    it True whenever in doubt.
    """

    def __init__(self, message: str, changed: bool = True):
        super().__init__(message)
        self.changed = changed


#: What a flash backend raised before flashes were operations like any other (API 1).
FlashError = OperationError


@dataclass(frozen=True)
class Resource:
    """One thing of a device that a plugin serves: its UART, its ADB, its camera...

    ``identifier`` is stable and unique in the whole lab (a USB serial, a MAC); never
    an IP or a ``/dev/ttyUSBn`` name. A ``candidate`` (network discovery) becomes a device
    only when an admin adopts it, under the name the admin gives. ``node`` is the device
    node the service opens, if any: the exporter watches who holds it
    (docs/architecture.md, "Lifecycle": orphans). ``config`` holds the plugin's own keys
    from the exporter config.
    """

    device: str
    kind: str
    identifier: str
    device_class: str = "generic"
    tags: tuple[str, ...] = ()
    node: str | None = None
    config: Any = field(default_factory=dict, compare=False, hash=False)  # its entry's PluginConfig, if any
    plugin: str = ""
    candidate: bool = False  # found on the network: an admin adopts it before anyone can book it
    serves_lease: bool = True  # False: no service for a lease; reached only through operations (a flash target)
    fidelity: Fidelity = Fidelity.HARDWARE  # what it is a part of: a board, a simulation, a VM, an emulator

    def to_report(self) -> dict[str, Any]:
        return {"kind": self.kind, "plugin": self.plugin, "identifier": self.identifier,
                "service": self.serves_lease}


@dataclass(frozen=True)
class Health:
    """One health check's answer: ``status`` (``ok``, ``degraded``, ``failed``), ``reason`` in
    words a person reads ("link at 2.5 GT/s of 16 GT/s"), and ``kind`` (a ``HealthKind``):
    whether a fault may pass by itself (``transient``, re-probed and re-admitted) or needs a
    person (``permanent``). ``kind`` means nothing when the status is ``ok``."""

    status: str = "ok"
    reason: str = ""
    kind: HealthKind = HealthKind.TRANSIENT

    def __post_init__(self) -> None:
        if self.status not in HEALTH_STATES:
            raise ValueError(f"health status must be one of {HEALTH_STATES}, not {self.status!r}")
        if self.kind not in tuple(HealthKind):
            raise ValueError(f"health kind must be one of {tuple(k.value for k in HealthKind)}, not {self.kind!r}")


@dataclass(frozen=True)
class Endpoint:
    """Where a client connects: ``kind`` is the resource kind (``uart``, ``adb``...), ``role``
    what a client does with it (an ``EndpointRole``: ``device-loop console`` takes the
    ``console`` endpoint whatever plugin serves it; a plugin of a new kind may name its own).

    ``command`` and ``env`` tell a client how to use it, so that a new kind needs no change
    outside its plugin: a ready-to-run command and environment exports, as templates
    filled with ``{host}``, ``{port}``, ``{url}``, ``{lease}`` and the keys of ``params``
    (``adb -H {host} -P {port} -s {serial} shell``). ``device-loop status``, ``device-loop
    env`` and the MCP ``lease_status`` show them.

    ``path``: where a service behind a lease's gate listens, a unix socket, instead of
    ``host:port`` (``HostContext.private_socket``); its gate's endpoint replaces it, so no
    client ever sees one.
    """

    kind: str
    host: str
    port: int
    url: str | None = None
    protocol: str | None = None
    role: str | None = None  # what a client does with it: an EndpointRole, or a plugin's own word
    params: dict[str, str | int] | None = None  # what a client needs to speak it: baud, serial...
    command: str | None = None
    env: dict[str, str] | None = None
    path: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class LeaseRef:
    """What a plugin is told about the lease it starts a service for. ``secret``: set in
    an authenticated lab, where the exporter gates the service's endpoints with it."""

    id: str
    holder: str
    secret: str | None = field(default=None, repr=False)


@dataclass
class Service:
    """A running service: its endpoints, and the processes the exporter supervises."""

    endpoints: list[Endpoint]
    processes: list = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def alive(self) -> bool:
        return all(p.alive() for p in self.processes)

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]


@dataclass(frozen=True)
class FlashImage:
    """An image an operation writes, as its plugin gets it: a local file whose ``sha256`` the
    exporter checked (``name`` is the registry's, for messages)."""

    path: Path
    sha256: str
    size: int
    name: str


@dataclass(frozen=True)
class OperationKind:
    """An operation a plugin runs on one of its resources (``devloop_operations``).

    ``args``: each argument it takes, with what it means (agents and ``--help`` read it).
    ``exclusive``: it needs the device alone: a device runs one such operation at a time (the
    database holds it to that). ``destructive``: a failure once it began leaves the device
    needing recovery (a half-written flash)."""

    kind: str
    description: str = ""
    args: dict[str, str] = field(default_factory=dict)
    exclusive: bool = True
    destructive: bool = False

    def to_report(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StepKind:
    """A step between two leases a plugin runs on one of its resources (``devloop_steps``):
    an admin names it in a device's ``[[devices.steps]]`` and the exporter runs it, after
    every lease, through the plugin's ``devloop_operate`` (``op.kind`` is ``name``).

    ``name``: a word (``[a-z][a-z0-9-]*``, 32 characters at most), not one of the exporter's
    own steps (cooldown, command, reboot, reflash). ``settings``: each key a step entry may
    give, with what it means (the exporter refuses any other at its start, and hands the
    entry's keys to ``devloop_operate`` as ``op.args``). ``timeout_s``: how long it may take
    unless the entry says ``timeout``; past it the step fails and the device is faulty."""

    name: str
    description: str = ""
    settings: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0


@dataclass
class Operation:
    """One operation, as ``devloop_operate`` gets it: its ``kind``, who asked (``requester``),
    its ``args`` (bounded scalars, unchecked: the plugin checks them, ``OperationError`` on
    a bad one), and ``image`` when it writes one of the registry (fetched and verified).
    ``purpose``: why it runs (``Purpose``), which the coordinator decides, never the requester:
    ``lease`` inside a lease, by its holder (what it writes is the lease's), ``step`` between
    two leases, ``recovery`` an admin's or the coordinator's on a device no lease holds.
    ``progress(phase, done, total, unit, detail)`` says how it goes."""

    id: str
    kind: str
    device: str
    requester: str
    args: dict[str, Any]
    image: FlashImage | None = None
    purpose: Purpose = Purpose.LEASE
    report_progress: Callable[[str, int | None, int | None, str, str], None] = field(
        default=lambda phase, done, total, unit, detail: None, repr=False)

    def progress(self, phase: str, done: int | None = None, total: int | None = None, unit: str = "",
                 detail: str = "") -> None:
        """The phase it is in (a word: ``writing``), how far (``done`` of ``total`` ``unit``),
        and where it stands in words (``detail``, 200 characters at most: "cooling down:
        51.2 °C (cpu), waiting for < 45 °C"), which the board shows."""
        self.report_progress(phase, done, total, unit, detail)


@dataclass(frozen=True)
class PowerReading:
    """What a power backend (``devloop_power``) says after it switched, or when asked.

    ``state``: the switch's state as the backend *read it back* (a BMC's chassis status,
    uhubctl's port line, a Redfish ``PowerState``), ``None`` when it has no way to read it
    (pdudaemon, a command with no ``status``): then only the device's console can show what
    happened. ``detail``: a short sentence of what it did or read ("outlet 3 of pdu01
    switched off"), for the operation's result. ``console_follows``: False when nothing runs
    now whose console could show the switch (a VM slot between leases): no first byte is
    then awaited after on, and the reading alone verifies it."""

    state: str | None = None  # a PowerState value, or None: not read back
    detail: str = ""
    console_follows: bool = True

    def __post_init__(self) -> None:
        if self.state is not None and self.state not in ("on", "off"):
            raise ValueError(f"a power reading's state is 'on', 'off' or None, not {self.state!r}")


@dataclass(frozen=True)
class ConfiguredResource:
    """One ``[[devices.resources]]`` entry of the exporter config, as its plugin finds it in
    ``host.entries``: ``config`` is the entry parsed by the plugin's model (its
    ``PluginConfig`` subclass, as ``Resource.config``: typed by the plugin, not here), which
    the exporter checked when it loaded its config."""

    device: str
    device_class: str
    tags: tuple[str, ...]
    plugin: str
    config: Any = field(hash=False, compare=False)

    def resource(self, kind: str, identifier: str, node: str | None = None,
                 fidelity: Fidelity = Fidelity.HARDWARE) -> Resource:
        """The discovered resource for this entry (its ``config`` is the entry's)."""
        return Resource(device=self.device, kind=kind, identifier=identifier,
                        device_class=self.device_class, tags=self.tags, node=node,
                        config=self.config, fidelity=fidelity)
