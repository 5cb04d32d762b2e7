"""The exporter (docs/architecture.md, "Reconcile, not push"): scan -> heartbeat -> converge,
on three threads.

- The report loop scans the host once a heartbeat period (or at a hot-plug wake-up) and
  sends a report then, and at once whenever a service came up or went away, or a health
  check due between scans (``health_schedule.py``) changed what is reported.
- The long-poll thread waits for the coordinator's desired state to change and hands it
  to the reconciler the moment it does: a new lease's services start within milliseconds.
- The reconciler starts and stops services in worker threads, concurrently.
- Operations (a flash, any kind a plugin declares) run in threads of their own
  (``operations.py``); a stop waits for them, a crash leaves them marked as interrupted.

Level-triggered throughout: each desired state is the whole of it, and the periodic
heartbeat stays the source of truth.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from pathlib import Path

from device_loop.core import ORPHANS_KIND
from device_loop.core.host import HostContext
from device_loop.core.hotplug import watch_hotplug
from device_loop.core.model import ConfiguredResource, Health, Resource
from device_loop.core.plugins import PluginSet
from device_loop.core.process import ProcessRegistry
from device_loop.core.protocol import EXPORTER_STEPS, DesiredState, Heartbeat

from .cdi import CdiFolder
from .config import Entry, ExporterConfig, check_steps, parse_entries
from .image_cache import ImageCache
from .link import SUPERSEDED, CoordinatorLink
from .operations import Operations
from .orphans import OrphanKill, OrphanWatch
from .power import PowerRunner
from .reconcile import Reconciler
from .report import Reporter
from .steps import StepRunner

log = logging.getLogger("device_loop.exporter")
LONG_POLL_S = 25.0
OPERATION_STOP_WAIT_S = 60.0  # a stop waits this long for running operations; later, they count as interrupted
# A report between scans goes at once, unless more starts and stops are in flight: then it
# waits for them this long at most, so that a burst is reported in a few snapshots, not one each.
REPORT_GAP_S = 0.01


class Exporter:
    def __init__(self, config: ExporterConfig):
        self.config = config
        section = config.exporter
        self.name = section.name
        self.heartbeat_s = section.heartbeat_s
        self.plugins = PluginSet(config.plugins.enable, config.plugins.disable)
        self.host = HostContext(
            name=self.name, state_dir=config.state_dir, sysfs_root=section.sysfs_root,
            bind_address=section.bind_address,
            advertise_address=section.advertise_address or section.bind_address,
            processes=ProcessRegistry(config.state_dir, start_timeout_s=section.service_start_timeout_s),
            port_range=section.ports,
        )
        # each config entry as written, with what its plugin's model made of it (setup parses them)
        self.entries: list[tuple[Entry, ConfiguredResource | None]] = [(entry, None) for entry in config.entries()]
        self.link = CoordinatorLink(section.coordinator, self.name, section.token_file)
        orphans = OrphanWatch(config.state_dir)
        self.reporter = Reporter(self.host, self.plugins, orphans, section.heartbeat_s, uuid.uuid4().hex,
                                 section.hook_timeout_s, steps_of=config.steps_of,
                                 auto_recovery=config.auto_recovery(), health_rules=section.health_rules())
        cdi = CdiFolder(section.cdi_dir, self.name, ledger=config.state_dir / "cdi-specs")
        self.reconciler = Reconciler(self.host, self.plugins, orphans, gated_only=self.link.authenticated,
                                     on_change=self._changed, cdi=cdi, hook_timeout_s=section.hook_timeout_s)
        cache = ImageCache(config.state_dir / "images", int(section.image_cache_gib * (1 << 30)))
        self.power = PowerRunner(self.host, self.plugins)
        self.step_runner = StepRunner(self.host, self.plugins, config.steps_of, section.hook_timeout_s,
                                      power=self.power)
        self.operations = Operations(self.host, self.plugins, cache, self.link.fetch_image, on_change=self._changed,
                                     steps=self.step_runner, power=self.power)
        self.operations.handlers[ORPHANS_KIND] = OrphanKill(orphans, self.reconciler.pids, self._rescan)
        self.wake = threading.Event()       # report now
        self.scan_due = threading.Event()   # ... after scanning the host again
        self.stopping = threading.Event()
        self._desired_lock = threading.Lock()
        self._desired_as_of = float("-inf")  # coordinator time of the desired state applied
        self.superseded = False  # a newer start took this exporter's name: it serves nothing
        self.etag: str | None = None

    # ---- what tests and the loops share -----------------------------------------------

    @property
    def loaded(self) -> list[str]:
        return self.reporter.loaded

    @property
    def skipped(self) -> list[dict]:
        return self.reporter.skipped

    @property
    def running(self):
        return self.reconciler.running

    @property
    def start_errors(self):
        return self.reconciler.start_errors

    def discover(self) -> list[Resource]:
        return self.reporter.discover()

    def health(self, resource: Resource) -> Health:
        return self.reporter.health(resource)

    def report(self, scan: bool = False, stopping: bool = False) -> Heartbeat:
        """A snapshot (after scanning the host again, if ``scan``)."""
        ours = self.reconciler.pids()
        if scan:
            self.reporter.scan(ours)
        return self.reporter.build(self.reconciler.services(), self.reconciler.applied, ours,
                                   self.reconciler.take_rechecks(), self.unserved(self.reporter.resources), stopping,
                                   self.operations.reports())

    def heartbeat(self, scan: bool = False) -> DesiredState | None:
        """Send a snapshot; the desired state to converge to, or None to leave all as is."""
        report = self.report(scan)
        desired = self.link.heartbeat(report)
        if self.link.accepted:
            self.operations.acknowledged(report.operations)
        return desired

    # ---- start and stop ---------------------------------------------------------------

    def setup(self) -> None:
        """Check the config entries against the plugins' models (``check_config``), stop
        what an earlier run left behind, pick the plugins this host can use."""
        self.check_config()
        self.reconciler.sync_cdi()  # nothing runs yet: an earlier run's specs go (their leases' come back)
        for record in self.host.processes.stop_leftovers():
            log.warning("stopped leftover %s of lease %s from an earlier run", record["name"], record["lease"])
        self.reconciler.sockets.remove_leftover()  # (its services' sockets: they are stopped)
        for skipped in self.plugins.skipped:
            self.skipped.append(skipped)
            log.warning("plugin %s skipped: %s", skipped["name"], skipped["reason"])
        for name in self.plugins.names():
            if name == EXPORTER_STEPS:  # operations of that plugin are the exporter's own steps
                reason = f"the name {EXPORTER_STEPS!r} is the exporter's own (it runs the built-in steps)"
            else:
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
        for record in self.reconciler.records.take_leftovers():
            if record["plugin"] in self.loaded:
                log.warning("cleaning up after %s of lease %s, left when this exporter died", record["identifier"],
                            record["lease"])
                self._try(record["plugin"], "clean-up", "devloop_cleanup", host=self.host, data=record["data"])
        for entry in self.unserved():
            log.warning("device %s will not be served: %s", entry["device"], entry["reason"])

    def check_config(self) -> None:
        """Parse each config entry with the model of its plugin, and hold the devices' steps
        to those the plugins offer, before anything is started or stopped: a ``ConfigError``
        names every entry that does not fit. The parsed entries are what the plugins' hooks
        find in ``host.entries``."""
        parsed = parse_entries(self.config, self.plugins.config_models())
        self.entries = list(zip(self.config.entries(), parsed))
        self.host.entries = [entry for entry in parsed if entry is not None]
        self.reporter.offered = self.step_runner.offered_at_start(self.plugins.names())
        check_steps(self.config, self.reporter.offered)

    def unserved(self, found: list[Resource] | None = None) -> list[dict]:
        """Configured resources that nothing serves now, and why: their plugin is not
        loaded, or it did not find them (unplugged, or a typo in the entry)."""
        skipped = {s["name"]: s["reason"] for s in self.skipped}
        seen = {(r.device, r.plugin) for r in found or ()}
        # an entry that is several devices (a VM slot's instances) is found by its parsed config
        made = {id(r.config) for r in found or ()}
        out = []
        for entry, parsed in self.entries:
            plugin = entry.plugin
            if plugin in skipped:
                reason = f"plugin {plugin!r} is skipped: {skipped[plugin]}"
            elif plugin not in self.loaded:
                reason = f"plugin {plugin!r} is not installed (or disabled in [plugins])"
            elif found is not None and (entry.device, plugin) not in seen and \
                    (parsed is None or id(parsed.config) not in made):
                problem = self._try(plugin, "config check", "devloop_check_config", host=self.host, entry=parsed)
                reason = (f"plugin {plugin!r}: {problem}" if problem else
                          f"plugin {plugin!r} does not find it (not plugged in, or a typo in its settings)")
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
        """Stop every service and let running operations finish, then tell the coordinator
        this host is going away, so that nobody is handed endpoints that no longer answer."""
        self.reconciler.stop_all()
        self.host.processes.end_lifeline()  # the gates' authority ends here, stopped or not
        self.power.stopping.set()  # a power operation that waits (the off-time, a first byte) ends, interrupted
        self.step_runner.stop()  # a step that waits is interrupted: its device's steps run again from the first
        for job in self.operations.running():
            log.warning("waiting for %s %s of %s to finish (at most %gs)", job.kind, job.op, job.device,
                        OPERATION_STOP_WAIT_S)
        self.operations.wait(OPERATION_STOP_WAIT_S)
        last = self.report(stopping=True)
        self.link.heartbeat(last)
        if self.link.accepted:
            self.operations.acknowledged(last.operations)
        for name in self.loaded:
            self._try(name, "shutdown", "devloop_shutdown", host=self.host)
        self.link.close()

    # ---- the loops ----------------------------------------------------------------------

    def _changed(self) -> None:
        self.wake.set()

    def _rescan(self) -> None:
        self.scan_due.set()
        self.wake.set()

    def _apply(self, desired: DesiredState | None, from_heartbeat: bool = False) -> bool:
        """Converge to ``desired`` unless a newer answer came meanwhile (the heartbeat's and
        the long-poll's answers may cross); True if a start or stop began."""
        if desired is None:
            return False
        with self._desired_lock:
            if from_heartbeat:  # only a heartbeat's answer says whether this boot still has the name
                self.superseded = desired is SUPERSEDED
            if self.superseded:
                self._desired_as_of, self.etag = float("-inf"), None
                return self.reconciler.converge([])
            if desired.as_of < self._desired_as_of:
                return False
            self._desired_as_of, self.etag = desired.as_of, desired.etag
            self.operations.converge(desired.operations, self.reporter.resources, self.reporter.kinds,
                                     self.reporter.step_kinds)
            adoptions = {a.identifier: a for a in desired.adopted}
            if adoptions != self.reporter.adoptions:  # report the adopted devices at once
                self.reporter.adoptions = adoptions
                self.scan_due.set()
                self.wake.set()
            return self.reconciler.converge(desired.services)

    def step(self, scan: bool) -> bool:
        """One report (after a scan of the host, if ``scan``); begin to converge to its
        answer. True if a start or stop began."""
        if scan:
            resources = self.reporter.scan(self.reconciler.pids())
            self.reconciler.converge(resources=resources, retry=True)
            self.reconciler.stop_strays()
            self.reconciler.sync_cdi()
        return self._apply(self.heartbeat(), from_heartbeat=True)

    def cycle(self) -> None:
        """One whole pass, for tests and tools that drive an exporter by hand: scan, report,
        converge and wait for it, and report once more if that changed anything."""
        for _ in range(2):
            self.scan_due.clear()
            began = self.step(scan=True)
            self.reconciler.wait_idle()
            if not began and not self.scan_due.is_set():
                return

    def _long_poll(self) -> None:
        client = self.link.long_poll_client(LONG_POLL_S)
        while not self.stopping.is_set():
            desired = self.link.wait_desired(client, self.etag, LONG_POLL_S, self.reporter.boot_id)
            if desired is None:
                # a cut long-poll makes the coordinator take this boot for dead until it
                # reports: report now, not a heartbeat period later
                self.wake.set()
                self.stopping.wait(self.heartbeat_s)
            elif desired.etag != self.etag:
                self._apply(desired)
        client.close()

    def run(self) -> None:
        """Run until ``stopping`` is set; then stop every service and return."""
        self.setup()
        if self.host.sysfs_root == Path("/sys"):  # a fake tree gets no udev events
            def hotplugged() -> None:
                self.scan_due.set()
                self.wake.set()
            why_not = watch_hotplug(hotplugged)
            log.info("hot-plug wake-ups %s", f"off ({why_not})" if why_not else "on (udev)")
        next_scan = 0.0
        long_poll = threading.Thread(target=self._long_poll, name="long-poll", daemon=True)
        try:
            woken = True
            while not self.stopping.is_set():
                self.reconciler.wait_idle(REPORT_GAP_S)
                # a change that woke it while it waited for idle (a stop's end, an operation's)
                # is reported now: cleared unseen, it would wait for the next heartbeat period
                if self.wake.is_set():
                    self.wake.clear()
                    woken = True
                scan = time.monotonic() >= next_scan or self.scan_due.is_set()
                if scan:
                    self.scan_due.clear()
                    next_scan = time.monotonic() + self.heartbeat_s
                try:
                    # woken by nothing but a health check's time: a report only if what it reports changed
                    if scan or woken or self.reporter.check_health():
                        self.step(scan)
                except Exception:
                    log.exception("exporter pass failed; trying again next period")
                if long_poll.ident is None:
                    # only after this boot's first report: until then the coordinator shows
                    # the last boot's services, and nothing may start beside them
                    long_poll.start()
                woken = self.wake.wait(max(0.0, self._next_wake(next_scan) - time.monotonic()))
        finally:
            self.shutdown()

    def _next_wake(self, next_scan: float) -> float:
        """The next scan, or a resource's health check due before it (docs/architecture.md,
        "Health that heals": a re-check comes every second or two, whatever the heartbeat)."""
        check = self.reporter.schedule.next_due()
        return next_scan if check is None else min(next_scan, check)

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()
