"""Android phones over ADB: one adb server per leased phone, on a port of its own.

Discovery reads sysfs only: a USB device is an Android phone when one of its interfaces
is class/subclass/protocol ``ff/42/01``; its identity is its USB serial number (which is
also its adb serial). It never runs ``adb devices``: that starts the global server, which
grabs every phone and fights the per-phone servers. A phone nobody named in the config
becomes a device of its own, ``android-SERIAL``.

Config (``[[devices]]`` with ``plugin = "adb"``, or a ``[[devices.resources]]`` entry):
``serial``, the phone's USB serial number.

A container reaches the phone through the lease's server (``devloop_environment``):
``ADB_SERVER_SOCKET=tcp:HOST:PORT`` (the lease's endpoint) and ``ANDROID_SERIAL``, which adb
reads. In a lab with tokens that endpoint is the lease's gate, which a plain adb client does
not pass: there the container needs the gate opened for it (``device-loop forward``). An
exporter bound to loopback serves it there, which a container reaches only on the host's
network (``podman run --network host``). Behind a lease's gates the lease's server listens
on a unix socket (``adb -L localfilesystem:PATH``, ``host.private_socket``) that only the gate
reaches: the gated endpoint is the one way to the phone.

An adb that knows ``--one-device`` (platform-tools 35+) serves exactly one phone per
server. Debian's adb 29 does not: its private server would claim every phone on the
host, so the plugin then serves a phone only while it is the only one here, refuses
otherwise, and marks a phone plugged in later as failed instead of letting two servers
fight over it.

Between two leases (and for a ``settle`` inside one) the plugin reads the phone's thermal
zones (``devloop_thermal``) and runs its step ``wait-boot`` (until Android says it has
booted), both with ``adb shell``: a hook that spawns, which only this plugin's does. Each
goes through a server that serves this one phone: the lease's own while one runs, else one
started for the call the way a lease's is (and stopped after it), under the same rules
(never the global server, never a server that would claim other phones: without
``--one-device`` only while the phone is the only one here). A reading is kept
``THERMAL_EVERY_S``, so a cooldown's polling starts a server that often at most.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
import contextlib
import logging
import os
import shutil
import threading
import time
from typing import Any, Iterator

from pydantic import Field

from device_loop.plugin import (ContainerEnvironment, Endpoint, EndpointRole, Health, HostContext, LeaseRef, Operation,
                                OperationError, PluginConfig, Resource, Service, ServiceError, StepKind, UsbDevice,
                                hookimpl, port_is_free, run, usb_devices, wait_port_free)

log = logging.getLogger(__name__)
ADB_INTERFACE = ("ff", "42", "01")
NO_ONE_DEVICE = ("this adb lacks --one-device (platform-tools 35+ has it), so one adb server "
                 "would claim every phone on the host")
# each zone's type and its millidegrees, one zone a line (a zone that cannot be read prints nothing usable)
THERMAL_SCRIPT = ("for z in /sys/class/thermal/thermal_zone*; do "
                  "echo \"$(cat $z/type 2>/dev/null) $(cat $z/temp 2>/dev/null)\"; done")
THERMAL_TIMEOUT_S = 4.0  # (within the exporter's hook deadline, 5 s by default)
THERMAL_EVERY_S = 5.0    # a reading younger than this is answered again
BOOTED_SCRIPT = "while [ \"$(getprop sys.boot_completed)\" != 1 ]; do sleep 1; done"
WAIT_BOOT = StepKind("wait-boot", "wait until the phone is on adb and Android says it has booted "
                                  "(sys.boot_completed)", timeout_s=300.0)

class AdbConfig(PluginConfig):
    """A phone's entry: which phone the device is."""

    serial: str = Field(min_length=1, description="the phone's USB serial number (its adb serial)")


def _phones(host) -> list[UsbDevice]:
    return [d for d in usb_devices(host.sysfs_root) if ADB_INTERFACE in (i.triple for i in d.interfaces) and d.serial]


def global_server_port() -> int:
    """Where a global adb server listens (adb's own variable, default 5037)."""
    return int(os.environ.get("ANDROID_ADB_SERVER_PORT", 5037))


def _serial(resource: Resource) -> str:
    return resource.identifier.removeprefix("adb:")


def _stop_global_server() -> None:
    """A global adb server holds every phone: stop it, and wait until it is gone."""
    port = global_server_port()
    if port_is_free("127.0.0.1", port):
        return
    log.warning("adb: stopping the global adb server on port %d: it would hold the phones", port)
    run(["adb", "-P", str(port), "kill-server"], timeout=10)
    if not wait_port_free("127.0.0.1", port, timeout=10):
        raise ServiceError(f"the global adb server on port {port} did not stop")


class AdbPlugin:
    """The phones one exporter serves (a plugin object: each exporter has its own)."""

    def __init__(self):
        self.one_device = False            # does this host's adb know --one-device
        self.serving: set[str] = set()     # serials with a server of ours
        self.servers: dict[str, list[str]] = {}  # serial -> how an adb client reaches its lease's server
        self.starting = threading.Lock()   # starts run in parallel; the global server is stopped once
        self.readings: dict[str, tuple[float, dict[str, float] | None]] = {}  # serial -> (when, its zones)

    @hookimpl
    def devloop_config_model(self) -> type[PluginConfig] | None:
        return AdbConfig

    @hookimpl
    def devloop_available(self, host: HostContext) -> str | None:
        if not shutil.which("adb"):
            return "adb is not installed (Debian: apt-get install adb)"
        return None

    @hookimpl
    def devloop_startup(self, host: HostContext) -> None:
        code, output = run(["adb", "--help"])
        self.one_device = "--one-device" in output
        log.info("adb: %s", "one server per phone (--one-device)" if self.one_device else
                 NO_ONE_DEVICE + ": serving a phone only while it is the only one")

    @hookimpl
    def devloop_discover(self, host: HostContext) -> Sequence[Resource] | None:
        named = {e.config.serial: e for e in host.entries}
        resources = []
        for phone in _phones(host):
            identifier = f"adb:{phone.serial}"
            entry = named.get(phone.serial)
            if entry is not None:
                resources.append(entry.resource("adb", identifier, node=phone.node))
            else:
                resources.append(Resource(device=f"android-{phone.serial}"[:64], kind="adb", identifier=identifier,
                                          device_class="android", tags=("usb",), node=phone.node))
        return resources

    @hookimpl
    def devloop_health(self, host: HostContext, resource: Resource) -> Health | None:
        phones = _phones(host)
        if _serial(resource) not in {p.serial for p in phones}:
            return Health("failed", "the phone is gone from USB")
        if self.one_device or len(phones) == 1 or _serial(resource) in self.serving:
            return Health("ok")
        others = ("another phone is served here by a private adb server" if self.serving
                  else f"{len(phones)} phones are on this host")
        return Health("failed", f"{others}; {NO_ONE_DEVICE}")

    @hookimpl
    def devloop_start(self, host: HostContext, resource: Resource, lease: LeaseRef) -> Service | None:
        with self.starting:
            return self._start(host, resource, lease)

    def _start(self, host, resource, lease):
        serial = _serial(resource)
        if not self.one_device and len(_phones(host)) > 1:
            raise ServiceError(f"{len(_phones(host))} phones are on this host; {NO_ONE_DEVICE}")
        _stop_global_server()
        private = host.private_socket("adb")
        port = 0 if private else host.free_port()
        everywhere = [] if private or host.bind_address in ("127.0.0.1", "localhost") else ["-a"]
        reach = ["-L", f"localfilesystem:{private}"] if private else ["-P", str(port)]
        argv = (["adb", *everywhere, *reach, "server", "nodaemon"]
                + (["--one-device", serial] if self.one_device else []))
        proc = host.processes.spawn(argv, name=f"adb-{resource.device}-{lease.id}", lease=lease.id)
        problem = proc.wait_listening({port} - {0}, paths={private} if private else set())
        if problem is not None:
            proc.stop()
            raise ServiceError(f"adb server did not start: {problem}")
        self.serving.add(serial)
        self.servers[serial] = reach
        endpoint = Endpoint("adb", host.advertise_address, port, protocol="adb", role=EndpointRole.ADB,
                            params={"serial": serial},
                            command="adb -H {host} -P {port} -s {serial} shell",
                            env={"ANDROID_ADB_SERVER_ADDRESS": "{host}", "ANDROID_ADB_SERVER_PORT": "{port}",
                                 "ANDROID_SERIAL": "{serial}"}, path=private)
        return Service(endpoints=[endpoint], processes=[proc], data={"serial": serial})

    @hookimpl
    def devloop_environment(self, host: HostContext, resource: Resource,
                            service: Service | None) -> ContainerEnvironment | None:
        """The lease's adb server for a container's adb: ``ADB_SERVER_SOCKET`` (``tcp:HOST:PORT``,
        its endpoint as served) and ``ANDROID_SERIAL``; no device node (the server holds the phone)."""
        adb = next((e for e in service.endpoints if e.role == EndpointRole.ADB), None) if service else None
        if adb is None:
            return None
        where = f"[{adb.host}]" if ":" in adb.host else adb.host
        return ContainerEnvironment(env={"ADB_SERVER_SOCKET": f"tcp:{where}:{adb.port}",
                                         "ANDROID_SERIAL": _serial(resource)})

    @hookimpl
    def devloop_stop(self, host: HostContext, service: Service) -> object:
        self.serving.discard(service.data["serial"])
        self.servers.pop(service.data["serial"], None)
        return None  # lets the default stop the server process

    @contextlib.contextmanager
    def _server(self, host, resource) -> Iterator[list[str] | None]:
        """How an adb client reaches a server that serves this phone alone (``-P PORT`` or
        ``-L SOCKET``): its lease's, else one started for the while (and stopped after: it
        holds the phone, as an orphan would); None where none can be (another phone here and
        no --one-device). No lease of the phone starts meanwhile: the device is between two
        leases."""
        serial = _serial(resource)
        with self.starting:  # (starts stop the global server and count the phones: one at a time)
            reach = self.servers.get(serial)
            proc = None
            if reach is None:
                if serial in self.serving or not self.one_device and (len(_phones(host)) > 1 or self.serving):
                    yield None
                    return
                _stop_global_server()
                port = host.free_port()
                argv = ["adb", "-P", str(port), "server", "nodaemon"] + (["--one-device", serial] if self.one_device
                                                                          else [])
                proc = host.processes.spawn(argv, name=f"adb-{resource.device}-steps", job=True)
                problem = proc.wait_listening({port})
                if problem is not None:
                    proc.stop()
                    raise OperationError(f"adb server did not start: {problem}", changed=False)
                self.serving.add(serial)
                reach = ["-P", str(port)]
        try:
            yield reach
        finally:
            if proc is not None:
                proc.stop()
                self.serving.discard(serial)

    @hookimpl
    def devloop_thermal(self, host: HostContext, resource: Resource) -> Mapping[str, float] | None:
        """The phone's thermal zones, through a server of this one phone (spawns adb: see the module)."""
        serial = _serial(resource)
        when, zones = self.readings.get(serial, (float("-inf"), None))
        if time.monotonic() - when < THERMAL_EVERY_S:
            return zones
        with self._server(host, resource) as reach:
            if reach is None:
                return None
            code, output = run(["adb", *reach, "-s", serial, "wait-for-device", "shell", THERMAL_SCRIPT],
                               timeout=THERMAL_TIMEOUT_S)
        if code != 0:
            raise RuntimeError(f"adb shell on {serial} failed: {output.strip()[-200:]}")
        zones = parse_zones(output)
        self.readings[serial] = (time.monotonic(), zones)
        return zones

    @hookimpl
    def devloop_steps(self, host: HostContext, resource: Resource | None) -> Sequence[StepKind] | None:
        return [WAIT_BOOT] if resource is None or resource.kind == "adb" else None

    @hookimpl
    def devloop_operate(self, host: HostContext, resource: Resource, op: Operation) -> str | Mapping[str, Any] | None:
        if op.kind != WAIT_BOOT.name:
            raise OperationError(f"the adb plugin runs {WAIT_BOOT.name!r} alone, not {op.kind!r}", changed=False)
        serial = _serial(resource)
        timeout = float(op.args.get("timeout_s", WAIT_BOOT.timeout_s))
        began = time.monotonic()
        with self._server(host, resource) as reach:
            if reach is None:
                raise OperationError(f"no adb server can serve {serial} alone here ({NO_ONE_DEVICE})", changed=False)
            op.progress("waiting", detail=f"waiting for {serial} to boot")
            code, output = host.run_to_end(["adb", *reach, "-s", serial, "wait-for-device", "shell",
                                            BOOTED_SCRIPT], name=f"adb-{resource.device}-wait-boot",
                                           timeout=max(1.0, timeout - (time.monotonic() - began)))
        if code is None:
            raise OperationError(f"{serial} did not boot within {timeout:g}s")
        if code != 0:
            raise OperationError(f"adb on {serial} failed (exit status {code}): {output.strip()[-200:]}")
        return f"{serial} has booted"


def parse_zones(output: str) -> dict[str, float] | None:
    """``TYPE MILLIDEGREES`` lines (what ``THERMAL_SCRIPT`` prints) as zone -> °C; a zone whose
    type is shared is named with its number; None when no line reads."""
    pairs = []
    for line in output.splitlines():
        kind, _, value = line.strip().rpartition(" ")
        try:
            pairs.append((kind.strip() or "zone", int(value) / 1000))
        except ValueError:
            continue
    names = [kind for kind, _ in pairs]
    zones = {(kind if names.count(kind) == 1 else f"{kind} ({n})"): degrees for n, (kind, degrees) in enumerate(pairs)}
    return zones or None
