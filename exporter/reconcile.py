"""Converging the services this host runs to the desired state
(docs/architecture.md, "Reconcile, not push").

Level-triggered: given the whole desired state, stop what is extra and start what is
missing. Each start and stop runs in a worker thread of its own, so a slow start holds up
neither the others nor the heartbeats; when one finishes, the exporter is told at once
(``on_change``) and reports it. Nothing a plugin does (raise, hang in a stop, return junk)
may take the exporter down with it.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from pydantic import ValidationError

from device_loop.core.cdi_spec import CdiRefused, CdiSpec, cdi_spec
from device_loop.core.gate import gate_secret, gate_service
from device_loop.core.host import HostContext
from device_loop.core.model import LeaseRef, Resource, Service
from device_loop.core.plugins import PluginSet
from device_loop.core.ports import wait_port_free
from device_loop.core.protocol import DesiredService, EndpointReport, EnvironmentReport, ServiceReport
from device_loop.core.scopes import data_plane_operation

from .cdi import CdiFolder, ask_environment
from .hook_deadlines import DEFAULT_TIMEOUT_S, HookDeadlines
from .orphans import OrphanWatch
from .service_records import ServiceRecords
from .socket_folders import SocketFolders

log = logging.getLogger("device_loop.exporter")
WORKERS = 16
Key = tuple[str, str]  # (lease id, resource identifier)


@dataclass
class Running:
    resource: Resource
    lease: LeaseRef
    service: Service
    environment: EnvironmentReport | None = None  # what a container needs of it (its CDI spec's part)


class Reconciler:
    def __init__(self, host: HostContext, plugins: PluginSet, orphans: OrphanWatch, gated_only: bool,
                 on_change: Callable[[], None], cdi: CdiFolder | None = None,
                 hook_timeout_s: float = DEFAULT_TIMEOUT_S):
        self.host, self.plugins, self.orphans = host, plugins, orphans
        self.cdi = cdi
        self._environments = HookDeadlines(hook_timeout_s)
        self._refused: dict[str, str] = {}  # lease -> why it has no CDI spec (logged once)
        self.gated_only = gated_only  # an exporter with a token serves only gated leases
        self.on_change = on_change
        self.records = ServiceRecords(host.state_dir)
        self.sockets = SocketFolders(host.state_dir)
        self.running: dict[Key, Running] = {}
        self.stopping: dict[Key, Running] = {}  # still reported until really gone
        self.start_errors: dict[Key, dict] = {}
        self.applied: set[str] = set()  # leases of the desired state being converged to
        self.recheck: set[str] = set()  # devices whose services stopped: look for orphans again
        self._busy: dict[Key, object] = {}  # starts and stops in flight
        self._desired: dict[Key, DesiredService] = {}
        self._resources: dict[str, Resource] = {}
        self._closed = False  # the exporter is stopping: nothing starts any more
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="service")

    def converge(self, desired: list[DesiredService] | None = None, resources: list[Resource] | None = None,
                 retry: bool = False) -> bool:
        """Begin to stop what is extra and start what is missing; True if anything began.

        ``desired`` and ``resources`` replace the last ones given. Failed starts are tried
        again only with ``retry`` (once a heartbeat period), not at every change.
        """
        with self._lock:
            if desired is not None:
                self._desired = {} if self._closed else {(s.lease, s.identifier): s for s in desired}
                self.applied = {lease for lease, _ in self._desired}
            if resources is not None:
                self._resources = {r.identifier: r for r in resources}
            began = False
            for key, run in list(self.running.items()):
                if key not in self._busy and self._should_stop(key, run):
                    del self.running[key]
                    self.stopping[key] = run
                    self._begin(key, self._stop, key, run)
                    began = True
            for key in [k for k in self.start_errors if k not in self._desired or retry]:
                del self.start_errors[key]
            stopping = {identifier for _, identifier in self.stopping}
            for key, spec in self._desired.items():
                # a resource starts again only once its last service is gone (same device, same port)
                if key in self.running or key in self._busy or key in self.start_errors or key[1] in stopping:
                    continue
                resource = self._resources.get(spec.identifier)
                if resource is None:
                    self._failed(key, spec.device, spec.kind,
                                 f"{spec.identifier} is not present on host {self.host.name}")
                    continue
                if not resource.serves_lease:  # reached through operations alone (a flash target)
                    continue
                # (its gates' secret: its part of the data plane's, docs/architecture.md "The lease gate")
                secret = gate_secret(spec.secret, data_plane_operation(resource.kind)) if spec.secret else None
                self._begin(key, self._start, key, resource, LeaseRef(spec.lease, spec.holder, secret))
                began = True
            return began

    def _should_stop(self, key: Key, run: Running) -> bool:
        if key not in self._desired:
            return True
        if not run.service.alive():
            log.warning("service for %s of %s died; restarting it", key[1], key[0])
            return True
        now = self._resources.get(key[1])
        if now is not None and now.node != run.resource.node:
            log.warning("%s moved from %s to %s (replugged); restarting its service", key[1], run.resource.node,
                        now.node)
            return True
        return False

    def _begin(self, key: Key, job, *args) -> None:
        self._busy[key] = self._pool.submit(self._run_job, key, job, *args)

    def _run_job(self, key: Key, job, *args) -> None:
        try:
            job(*args)
        except Exception:
            log.exception("service job for %s of %s failed", key[1], key[0])
        finally:
            self.sync_cdi()  # before the job counts as done: whoever waits for idle finds the folder as it runs
            with self._lock:
                self._busy.pop(key, None)
                self.converge()  # a start may have waited for this stop
                self._idle.notify_all()
            self.on_change()

    def _start(self, key: Key, resource: Resource, lease: LeaseRef) -> None:
        if self.gated_only and not lease.secret:
            self._failed(key, resource.device, resource.kind, "the lease has no secret: this exporter serves "
                                                              "only gated endpoints (its coordinator has tokens)")
            return
        try:
            # A gated lease's service listens where only its gates reach it (its lease's folder of
            # unix sockets, else loopback); its gates face the network.
            host = dataclasses.replace(self.host, bind_address="127.0.0.1", advertise_address="127.0.0.1",
                                       private_dir=self.sockets.of_lease(lease.id)) if lease.secret else self.host
            service = self.plugins.call(resource.plugin, "devloop_start", host=host, resource=resource, lease=lease)
            if not isinstance(service, Service):
                raise TypeError(f"plugin {resource.plugin} returned {service!r}, not a Service")
            if lease.secret:
                gate_service(self.host, resource, lease, service)
        except Exception as exc:
            log.error("starting %s for %s failed: %s", resource.identifier, lease.id, exc)
            self._failed(key, resource.device, resource.kind, f"{resource.kind}: {exc}")
            self.stop_strays(also=lease.id)
            return
        problem = self._endpoint_problem(service)
        if problem:  # reported as it is, it would make the whole host's report invalid
            log.error("%s for %s: %s; stopping it", resource.identifier, lease.id, problem)
            self._stop(key, Running(resource, lease, service))
            self._failed(key, resource.device, resource.kind, f"{resource.kind}: {problem}")
            return
        if service.data:  # nothing noted, nothing to undo after a crash
            self.records.started(lease.id, resource.identifier, resource.plugin, service.data)
        with self._lock:
            self.start_errors.pop(key, None)
            self.running[key] = Running(resource, lease, service)
        self.on_change()  # report the endpoints now; the rest of this job is bookkeeping
        log.info("started %s for %s: %s", resource.identifier, lease.id,
                 ", ".join(f"{e.host}:{e.port}" for e in service.endpoints))
        # who held the node as the lease began (our own service excepted, so taking this
        # after the start is the same as before it, and keeps it off the way to ready)
        self.orphans.lease_begins(resource, self.pids())
        # (docs/architecture.md, "Containers and CDI"): asked once the service runs, off the way to ready
        environment = ask_environment(self.plugins, self._environments, host, resource, service)
        if environment is not None:
            with self._lock:
                run = self.running.get(key)
                if run is not None and run.service is service:
                    run.environment = environment

    def _endpoint_problem(self, service: Service) -> str | None:
        """Why the endpoints a plugin returned cannot be reported (a template with a format
        spec, a field out of bounds, a host other than this one's address), or None."""
        for endpoint in service.endpoints:
            try:
                EndpointReport.model_validate(endpoint.to_json())
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(map(str, first["loc"])) or "endpoint"
                return f"the plugin returned an endpoint that cannot be reported ({where}: {first['msg']})"
            if endpoint.host != self.host.advertise_address:
                return (f"the plugin returned an endpoint at {endpoint.host}, not at this host's address "
                        f"{self.host.advertise_address}")
        return None

    def _failed(self, key: Key, device: str, kind: str, message: str) -> None:
        with self._lock:
            self.start_errors[key] = {"device": device, "kind": kind, "error": message}

    def _stop(self, key: Key, run: Running) -> None:
        """Stop one service. If its plugin fails to, its recorded processes are stopped
        as strays (and again at every sweep, should that fail too)."""
        try:
            self.plugins.call(run.resource.plugin, "devloop_stop", host=self.host, service=run.service)
        except Exception:
            log.exception("stopping %s for %s failed; stopping its processes instead", key[1], key[0])
            with self._lock:
                self.stopping.pop(key, None)
            self.stop_strays()
        else:
            for endpoint in run.service.endpoints:
                if not wait_port_free(self.host.bind_address, endpoint.port):
                    log.error("port %d of %s is still taken after stop", endpoint.port, key[0])
            log.info("stopped %s for %s", key[1], key[0])
        finally:
            self.records.stopped(*key)
            with self._lock:
                self.stopping.pop(key, None)
                self.recheck.add(run.resource.device)
                served = {lease for lease, _ in [*self.running, *self.stopping, *self._desired]}
                if key[0] not in served:  # its last service is gone: its sockets with it
                    self.sockets.lease_ended(key[0])

    def stop_strays(self, also: str | None = None) -> None:
        """Stop recorded processes that no service owns and whose lease is not wanted (or
        is ``also``, whose start just failed): orphans of ours. Jobs (a flash's tool) are
        their starters' to stop."""
        with self._lock:
            ours = self.pids()
            wanted = {lease for lease, _ in self._desired}
        for proc in self.host.processes.recorded():
            lease = proc.record.get("lease")
            if proc.pid not in ours and not proc.record.get("job") and (lease not in wanted or lease == also):
                log.warning("stopping stray %s (pid %d) of lease %s", proc.name, proc.pid, lease)
                try:
                    proc.stop()
                except RuntimeError:
                    log.exception("could not stop %s", proc.name)

    def pids(self) -> set[int]:
        with self._lock:
            return {pid for run in [*self.running.values(), *self.stopping.values()] for pid in run.service.pids()}

    def services(self) -> list[ServiceReport]:
        """What runs (or is still being stopped), and what failed to start."""
        with self._lock:
            runs = [*self.running.items(), *self.stopping.items()]
            out = [ServiceReport.model_validate({"lease": lease_id, "device": run.resource.device,
                                                 "identifier": identifier, "kind": run.resource.kind,
                                                 "endpoints": [e.to_json() for e in run.service.endpoints],
                                                 "environment": run.environment})
                   for (lease_id, identifier), run in runs]
            out += [ServiceReport(lease=lease_id, identifier=identifier, **failure)
                    for (lease_id, identifier), failure in self.start_errors.items()]
            return out

    def cdi_specs(self) -> dict[str, CdiSpec]:
        """The CDI spec of each lease whose services run (lease -> spec), from the
        environments its resources' plugins stated; a lease whose device CDI cannot name has
        none (said in the log once)."""
        with self._lock:
            leases: dict[str, list[Running]] = {}
            for (lease_id, _), run in sorted(self.running.items()):
                leases.setdefault(lease_id, []).append(run)
        specs = {}
        for lease_id, runs in leases.items():
            first = runs[0].resource
            try:
                spec = cdi_spec(first.device_class, first.device, [r.environment for r in runs if r.environment])
            except CdiRefused as exc:
                if self._refused.get(lease_id) != str(exc):
                    log.warning("no CDI spec for %s: %s", lease_id, exc)
                    self._refused[lease_id] = str(exc)
                continue
            if spec is not None:
                specs[lease_id] = spec
        for lease_id in set(self._refused) - set(leases):
            self._refused.pop(lease_id, None)
        return specs

    def sync_cdi(self) -> None:
        """Make the CDI folder hold the specs of the leases served now, and no other of this host's."""
        if self.cdi is None:
            return
        try:
            self.cdi.sync(self.cdi_specs())
        except Exception:  # (never the services' bookkeeping: a start or stop must still count as done)
            log.exception("keeping the CDI folder %s failed", self.cdi.folder)

    def take_rechecks(self) -> set[str]:
        with self._lock:
            devices, self.recheck = self.recheck, set()
            return devices

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Block until no start or stop is in flight."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._busy, timeout)

    def stop_all(self) -> None:
        """Stop every service and wait until they are gone (the exporter is going away)."""
        with self._lock:
            self._closed = True
        self.converge(desired=[])
        self.wait_idle()
        self._pool.shutdown()
        self.sockets.close()
