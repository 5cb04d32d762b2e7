"""The exporter loop: discover -> health -> heartbeat -> reconcile (DESIGN §4).

Level-triggered: each heartbeat answer is the whole desired state of this host, and
the exporter stops what is extra and starts what is missing. A long-poll of the desired
state wakes the loop early, so a new lease's services start within milliseconds; the
periodic heartbeat stays the source of truth. Nothing a plugin does (raise, hang in a
stop, return junk) may take the exporter down with it.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx2

from device_loop.core import PROTOCOL_VERSION, __version__
from device_loop.core.gate import gate_service
from device_loop.core.host import HostContext
from device_loop.core.hotplug import watch_hotplug
from device_loop.core.model import Health, LeaseRef, Resource, Service
from device_loop.core.plugins import PluginSet
from device_loop.core.ports import wait_port_free
from device_loop.core.tokens import load_token

from .config import ExporterConfig
from .orphans import OrphanWatch

log = logging.getLogger("device_loop.exporter")
LONG_POLL_S = 25.0
NOTHING_DESIRED = {"services": [], "etag": None}


@dataclass
class Running:
    resource: Resource
    lease: LeaseRef
    service: Service


class Exporter:
    def __init__(self, config: ExporterConfig):
        self.config = config
        section = config.exporter
        self.name = section.name
        self.boot_id = uuid.uuid4().hex
        self.generation = 0
        self.plugins = PluginSet(config.plugins.enable, config.plugins.disable)
        self.host = HostContext(
            name=self.name, state_dir=config.state_dir, sysfs_root=section.sysfs_root,
            bind_address=section.bind_address,
            advertise_address=section.advertise_address or section.bind_address,
            configured_resources=config.configured_resources(),
        )
        self.orphans = OrphanWatch(config.state_dir)
        self.loaded: list[str] = []
        self.skipped: list[dict] = []
        self.running: dict[tuple[str, str], Running] = {}
        self.start_errors: dict[tuple[str, str], dict] = {}
        self.last_found: dict[str, list[Resource]] = {}
        self.adoptions: dict[str, dict] = {}  # candidate identifier -> the device an admin made of it
        self.candidates: list[Resource] = []
        self.applied: set[str] = set()
        self.etag: str | None = None
        self.last_beat = 0.0
        self.adopted_changed = False
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        token = load_token(section.token_file)
        self.auth = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx2.Client(base_url=section.coordinator, timeout=10.0, headers=self.auth)

    # ---- start and stop ---------------------------------------------------------------

    def setup(self) -> None:
        """Stop what an earlier run left behind, pick the plugins this host can use."""
        for record in self.host.processes.stop_leftovers():
            log.warning("stopped leftover %s of lease %s from an earlier run", record["name"], record["lease"])
        for name in self.plugins.names():
            reason = self._try(name, "availability check", "devloop_available", host=self.host)
            if not reason:
                reason = self._try(name, "startup", "devloop_startup", host=self.host, ok=None)
            if reason:
                self.skipped.append({"name": name, "reason": reason})
                self.plugins.unregister(name)
                log.info("plugin %s skipped: %s", name, reason)
            else:
                self.loaded.append(name)
        log.info("plugins loaded: %s", ", ".join(self.loaded) or "none")
        for entry in self.unserved():
            log.warning("device %s will not be served: %s", entry["device"], entry["reason"])

    def unserved(self, found: list[Resource] | None = None) -> list[dict]:
        """Configured resources that nothing serves now, and why: their plugin is not
        loaded, or it did not find them (unplugged, or a typo in the entry)."""
        skipped = {s["name"]: s["reason"] for s in self.skipped}
        seen = {(r.device, r.plugin) for r in found or ()}
        out = []
        for entry in self.host.configured_resources:
            plugin = entry.settings["plugin"]
            if plugin in skipped:
                reason = f"plugin {plugin!r} is skipped: {skipped[plugin]}"
            elif plugin not in self.loaded:
                reason = f"plugin {plugin!r} is not installed (or disabled in [plugins])"
            elif found is not None and (entry.device, plugin) not in seen:
                reason = f"plugin {plugin!r} does not find it (not plugged in, or a typo in its settings)"
            else:
                continue
            out.append({"device": entry.device, "plugin": plugin, "reason": reason})
        return out

    def _try(self, plugin: str, what: str, hook: str, ok=..., **kwargs):
        """Call a hook; a crash becomes a reason string (a broken plugin must not stop the host)."""
        try:
            result = self.plugins.call(plugin, hook, **kwargs)
            return result if ok is ... else ok
        except Exception as exc:
            log.exception("%s of plugin %s crashed", what, plugin)
            return f"{what} crashed: {exc!r}"

    def shutdown(self) -> None:
        """Stop every service, then tell the coordinator this host is going away, so that
        nobody is handed endpoints that no longer answer."""
        with self._lock:
            for key in list(self.running):
                self._stop(key)
            report = self.report(self.discover()) | {"stopping": True}
        try:
            self.http.post(f"/api/v1/hosts/{self.name}/heartbeat", json=report)
        except httpx2.HTTPError:
            pass  # the coordinator finds out when the heartbeats stop
        for name in self.loaded:
            self._try(name, "shutdown", "devloop_shutdown", host=self.host)
        self.http.close()

    # ---- one pass -------------------------------------------------------------------------

    def discover(self) -> list[Resource]:
        """Every resource of every loaded plugin (read-only; no process is spawned).

        A plugin whose discovery fails keeps its last good result: a failure to look is
        not evidence that the devices are gone (their leases would be torn down).
        """
        resources = []
        for name in self.loaded:
            try:
                found = self.plugins.call(name, "devloop_discover", host=self.host) or []
                self.last_found[name] = [dataclasses.replace(r, plugin=name) for r in found]
            except Exception:
                log.exception("discovery of plugin %s failed; keeping what it found before", name)
            resources += self.last_found.get(name, [])
        self.candidates = [r for r in resources if r.candidate and r.identifier not in self.adoptions]
        return [self._adopted(r) for r in resources if not r.candidate or r.identifier in self.adoptions]

    def _adopted(self, resource: Resource) -> Resource:
        """A candidate an admin adopted: the device it now belongs to."""
        adoption = self.adoptions.get(resource.identifier) if resource.candidate else None
        if adoption is None:
            return resource
        return dataclasses.replace(resource, device=adoption["name"], device_class=adoption["class"],
                                   tags=tuple(adoption["tags"]), candidate=False)

    def health(self, resource: Resource) -> Health:
        try:
            return self.plugins.call(resource.plugin, "devloop_health", host=self.host, resource=resource) or Health()
        except Exception as exc:
            return Health("failed", f"health check crashed: {exc!r}")

    def _our_pids(self) -> set[int]:
        return {pid for run in self.running.values() for pid in run.service.pids()}

    def report(self, resources: list[Resource]) -> dict:
        devices: dict[str, dict] = {}
        ours = self._our_pids()
        for r in resources:
            health = self.health(r)
            entry = devices.setdefault(r.device, {"name": r.device, "class": r.device_class,
                                                  "tags": list(r.tags), "resources": [], "busy_by": []})
            entry["resources"].append({**r.to_report(), "health": health.status, "reason": health.reason})
            entry["busy_by"] += self.orphans.orphans(r, ours)
        services = [{"lease": lease_id, "device": run.resource.device, "identifier": ident,
                     "kind": run.resource.kind, "endpoints": [e.to_json() for e in run.service.endpoints]}
                    for (lease_id, ident), run in self.running.items()]
        services += [{"lease": lease_id, "identifier": ident, **failure}
                     for (lease_id, ident), failure in self.start_errors.items()]
        self.generation += 1
        return {"protocol": PROTOCOL_VERSION, "version": __version__, "boot_id": self.boot_id,
                "generation": self.generation, "heartbeat_s": self.config.exporter.heartbeat_s,
                "plugins": {"loaded": self.loaded, "skipped": self.skipped, "unserved": self.unserved(resources)},
                "devices": list(devices.values()), "services": services, "applied": sorted(self.applied),
                "candidates": [{"identifier": c.identifier, "kind": c.kind, "plugin": c.plugin, "label": c.device}
                               for c in self.candidates]}

    def heartbeat(self, resources: list[Resource]) -> dict | None:
        """Send the snapshot; the desired state to converge to, or None to leave all as is.

        When the coordinator refuses the report, the exporter still converges: to the
        desired state it can read, or to nothing if a newer exporter took its name.
        """
        self.last_beat = time.monotonic()
        try:
            response = self.http.post(f"/api/v1/hosts/{self.name}/heartbeat", json=self.report(resources))
            answer = response.json()
        except (httpx2.HTTPError, ValueError) as exc:
            log.warning("coordinator unreachable (%s); services keep running as they are", exc)
            return None
        if response.status_code == 200:
            self.etag = answer["etag"]
            adoptions = {a["identifier"]: a for a in answer.get("adopted", [])}
            self.adopted_changed, self.adoptions = adoptions != self.adoptions, adoptions
            return answer
        log.error("heartbeat refused (%d): %s", response.status_code, answer.get("message", answer))
        if answer.get("error") == "superseded_boot":
            return NOTHING_DESIRED
        if 400 <= response.status_code < 500:
            try:
                return self.http.get(f"/api/v1/hosts/{self.name}/desired").json()
            except (httpx2.HTTPError, ValueError):
                return None
        return None

    def reconcile(self, desired: dict, resources: list[Resource]) -> bool:
        """Stop the extra, start the missing; True if anything changed."""
        wanted = {(s["lease"], s["identifier"]): s for s in desired["services"]}
        by_identifier = {r.identifier: r for r in resources}
        changed = False
        for key, run in list(self.running.items()):
            now = by_identifier.get(key[1])
            if key in wanted and not run.service.alive():
                log.warning("service for %s of %s died; restarting it", key[1], key[0])
            elif key in wanted and now is not None and now.node != run.resource.node:
                log.warning("%s moved from %s to %s (replugged); restarting its service", key[1],
                            run.resource.node, now.node)
            elif key in wanted:
                continue
            self._stop(key)
            changed = True
            self._keepalive(resources)
        self._stop_strays({lease for lease, _ in wanted})
        for key in [k for k in self.start_errors if k not in wanted]:
            del self.start_errors[key]
        for key, spec in wanted.items():
            if key in self.running:
                continue
            resource = by_identifier.get(spec["identifier"])
            if resource is None:
                self._failed(key, spec["device"], spec["kind"], f"{spec['identifier']} is not present on host {self.name}")
                continue
            self._start(key, resource, LeaseRef(spec["lease"], spec["holder"], spec.get("secret")))
            changed = True
            self._keepalive(resources)
        self.applied = {lease for lease, _ in wanted}
        return changed

    def _keepalive(self, resources: list[Resource]) -> None:
        """Starting many services (or a slow one) must not make this host look dead."""
        if time.monotonic() - self.last_beat >= self.config.exporter.heartbeat_s:
            self.heartbeat(resources)

    def _start(self, key: tuple[str, str], resource: Resource, lease: LeaseRef) -> None:
        if self.auth and not lease.secret:  # an authenticated lab gates every endpoint
            self._failed(key, resource.device, resource.kind, "the lease has no secret: this exporter serves "
                                                              "only gated endpoints (its coordinator has tokens)")
            return
        if not any(k[1] == resource.identifier for k in self.running):
            self.orphans.lease_begins(resource)
        # A gated lease's service listens on loopback only; its gates face the network.
        host = dataclasses.replace(self.host, bind_address="127.0.0.1", advertise_address="127.0.0.1") \
            if lease.secret else self.host
        try:
            service = self.plugins.call(resource.plugin, "devloop_start", host=host, resource=resource, lease=lease)
            if not isinstance(service, Service):
                raise TypeError(f"plugin {resource.plugin} returned {service!r}, not a Service")
            if lease.secret:
                gate_service(self.host, resource, lease, service)
        except Exception as exc:
            log.error("starting %s for %s failed: %s", resource.identifier, lease.id, exc)
            self._failed(key, resource.device, resource.kind, f"{resource.kind}: {exc}")
            self._stop_strays({k[0] for k in self.running}, also=lease.id)
            return
        self.start_errors.pop(key, None)
        self.running[key] = Running(resource, lease, service)
        log.info("started %s for %s: %s", resource.identifier, lease.id,
                 ", ".join(f"{e.host}:{e.port}" for e in service.endpoints))

    def _failed(self, key: tuple[str, str], device: str, kind: str, message: str) -> None:
        self.start_errors[key] = {"device": device, "kind": kind, "error": message}

    def _stop(self, key: tuple[str, str]) -> None:
        """Stop one service. If its plugin fails to, its processes stay recorded and
        ``_stop_strays`` tries again on the next pass."""
        run = self.running.pop(key)
        try:
            self.plugins.call(run.resource.plugin, "devloop_stop", host=self.host, service=run.service)
        except Exception:
            log.exception("stopping %s for %s failed; will retry", key[1], key[0])
            return
        for endpoint in run.service.endpoints:
            if not wait_port_free(self.host.bind_address, endpoint.port):
                log.error("port %d of %s is still taken after stop", endpoint.port, key[0])
        log.info("stopped %s for %s", key[1], key[0])

    def _stop_strays(self, live_leases: set[str], also: str | None = None) -> None:
        """Stop recorded processes that no running service owns and whose lease is over
        (or is ``also``, whose start just failed): orphans of ours."""
        ours = self._our_pids()
        for proc in self.host.processes.recorded():
            lease = proc.record.get("lease")
            if proc.pid not in ours and (lease not in live_leases or lease == also):
                log.warning("stopping stray %s (pid %d) of lease %s", proc.name, proc.pid, lease)
                try:
                    proc.stop()
                except RuntimeError:
                    log.exception("could not stop %s", proc.name)

    def cycle(self) -> None:
        """One pass; a second heartbeat follows at once when services changed."""
        with self._lock:
            for _ in range(2):
                resources = self.discover()
                desired = self.heartbeat(resources)
                if desired is None:
                    return
                if not self.reconcile(desired, resources) and not self.adopted_changed:
                    return  # (a new adoption is reported at once: one more pass)

    # ---- loops ----------------------------------------------------------------------------

    def _long_poll(self) -> None:
        client = httpx2.Client(base_url=self.config.exporter.coordinator, timeout=LONG_POLL_S + 10, headers=self.auth)
        seen = self.etag
        while not self.stopping.is_set():
            try:
                response = client.get(f"/api/v1/hosts/{self.name}/desired",
                                      params={"etag": seen or "", "wait": LONG_POLL_S})
                etag = response.json()["etag"] if response.status_code == 200 else None
            except (httpx2.HTTPError, ValueError, KeyError):
                etag = None
            if etag is None:
                self.stopping.wait(self.config.exporter.heartbeat_s)
            elif etag != seen:
                seen = etag
                self.wake.set()
        client.close()

    def run(self) -> None:
        """Run until ``stopping`` is set; then stop every service and return."""
        self.setup()
        poller = threading.Thread(target=self._long_poll, name="long-poll", daemon=True)
        poller.start()
        if self.host.sysfs_root == Path("/sys"):  # a fake tree gets no udev events
            why_not = watch_hotplug(self.wake.set)
            log.info("hot-plug wake-ups %s", f"off ({why_not})" if why_not else "on (udev)")
        try:
            while not self.stopping.is_set():
                self.wake.clear()
                started = time.monotonic()
                try:
                    self.cycle()
                except Exception:
                    log.exception("exporter pass failed; trying again next period")
                self.wake.wait(max(0.0, self.config.exporter.heartbeat_s - (time.monotonic() - started)))
        finally:
            self.shutdown()

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()
