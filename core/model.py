"""Plain data passed between plugins, the exporter and the coordinator."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

HEALTH_STATES = ("ok", "degraded", "failed")


class ServiceError(Exception):
    """A plugin could not start a service; the message says why, for the lease holder."""


class FlashError(Exception):
    """A flash backend failed; the message says why, for the one who asked for the flash.

    ``changed=False`` says the target was not touched (it could not even be opened): the
    device then does not need recovery. Leave it True whenever in doubt.
    """

    def __init__(self, message: str, changed: bool = True):
        super().__init__(message)
        self.changed = changed


@dataclass(frozen=True)
class Resource:
    """One thing of a device that a plugin serves: its UART, its ADB, its camera...

    ``identifier`` is stable and unique in the whole lab (a USB serial, a MAC); never
    an IP or a ``/dev/ttyUSBn`` name. A ``candidate`` (network discovery) becomes a device
    only when an admin adopts it, under the name the admin gives. ``node`` is the device node the service opens,
    if any: the exporter watches who holds it (DESIGN §8, orphans). ``config`` holds
    the plugin's own keys from the exporter config.
    """

    device: str
    kind: str
    identifier: str
    device_class: str = "generic"
    tags: tuple[str, ...] = ()
    node: str | None = None
    config: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    plugin: str = ""
    candidate: bool = False  # found on the network: an admin adopts it before anyone can book it

    def to_report(self) -> dict[str, Any]:
        return {"kind": self.kind, "plugin": self.plugin, "identifier": self.identifier}


@dataclass(frozen=True)
class Health:
    status: str = "ok"
    reason: str = ""

    def __post_init__(self):
        if self.status not in HEALTH_STATES:
            raise ValueError(f"health status must be one of {HEALTH_STATES}, not {self.status!r}")


@dataclass(frozen=True)
class Endpoint:
    """Where a client connects: ``kind`` is the resource kind (``uart``, ``adb``...).

    ``command`` and ``env`` tell a client how to use it, so that a new kind needs no change
    outside its plugin: a ready-to-run command and environment exports, as templates
    filled with ``{host}``, ``{port}``, ``{url}``, ``{lease}`` and the keys of ``params``
    (``adb -H {host} -P {port} -s {serial} shell``). ``device-loop status``, ``device-loop
    env`` and the MCP ``lease_status`` show them.
    """

    kind: str
    host: str
    port: int
    url: str | None = None
    protocol: str | None = None
    params: dict[str, str | int] | None = None  # what a client needs to speak it: baud, serial...
    command: str | None = None
    env: dict[str, str] | None = None

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
    """An image to write, as a flash backend gets it: a local file whose ``sha256`` the
    exporter checked (``name`` is the registry's, for messages)."""

    path: Path
    sha256: str
    size: int
    name: str


@dataclass(frozen=True)
class ConfiguredResource:
    """One ``[[devices.resources]]`` entry of the exporter config, for its plugin."""

    device: str
    device_class: str
    tags: tuple[str, ...]
    settings: dict[str, Any] = field(hash=False, compare=False)

    def problem(self, known, parse: Callable[[dict], Any]) -> str | None:
        """Why this entry cannot be used, or None: a key not among ``known`` (a misspelt one),
        or the ``ValueError`` that ``parse(settings)`` raises. For discovery (skip the entry)
        and ``devloop_check_config`` (say why) alike."""
        unknown = sorted(set(self.settings) - set(known) - {"plugin"})
        if unknown:
            return f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} (the keys: " \
                   f"{', '.join(sorted(known))})"
        try:
            parse(self.settings)
        except ValueError as exc:
            return str(exc)
        return None

    def resource(self, kind: str, identifier: str, node: str | None = None) -> Resource:
        """The discovered resource for this entry."""
        return Resource(device=self.device, kind=kind, identifier=identifier,
                        device_class=self.device_class, tags=self.tags, node=node,
                        config=self.settings)
