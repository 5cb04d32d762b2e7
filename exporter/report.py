"""The host's snapshot (docs/architecture.md, "Reconcile, not push"): what its plugins
discover, how healthy it is, who else holds the device nodes, and the services that run.

Scanning (discovery, a pass over /proc for node holders) happens once a heartbeat period or
on a hot-plug wake-up; each resource's health is checked on its own schedule
(``health_schedule.py``), at a scan or between scans, only when it is due. A report sent
between scans, because a service came up or went away, is still a full snapshot: the
devices as last scanned (those whose services just stopped looked at again for orphans)
and the services as they are now.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
import re
from collections.abc import Mapping
from typing import AbstractSet, Callable, Sequence, get_args

from pydantic import ValidationError

from device_loop.core import POWER_KIND, PROTOCOL_VERSION, __version__
from device_loop.core.host import HostContext
from device_loop.core.model import Health, OperationKind, Resource, StepKind
from device_loop.core.plugins import PluginSet
from device_loop.core.protocol import (MAX_FACTS, MAX_HOLDERS, MAX_NAME_CHARS,
                                       MAX_OPERATION_KINDS, MAX_PLUGIN_METRICS, MAX_PLUGINS, MAX_REASON_CHARS,
                                       Adoption, CandidateReport, DeviceReport, FactKey, FactValue, Heartbeat, Holder,
                                       MetricName, OperationKindReport, OperationReport, PluginsReport, ServiceReport)
from device_loop.core.vocabulary import Fidelity

from .config import StepConfig
from .health_schedule import HealthRules, HealthSchedule
from .hook_deadlines import DEFAULT_TIMEOUT_S, HookDeadlines, HookTimedOut
from .lease_watch import LeaseWatch
from .orphans import OrphanWatch
from .power import POWER
from .steps import plan, plugin_steps, step_kinds

log = logging.getLogger("device_loop.exporter")
FACT_KEY = re.compile(get_args(FactKey)[1].pattern)  # (the protocol's rules, not a copy of them)
MAX_FACT_CHARS: int = get_args(FactValue)[1].max_length
METRIC_NAME = re.compile(get_args(MetricName)[1].pattern)


class Reporter:
    def __init__(self, host: HostContext, plugins: PluginSet, orphans: OrphanWatch, heartbeat_s: float,
                 boot_id: str, hook_timeout_s: float = DEFAULT_TIMEOUT_S,
                 steps_of: Callable[[str, str], list[StepConfig]] = lambda device, device_class: [],
                 auto_recovery: dict[str, str] | None = None, health_rules: HealthRules | None = None):
        self.host, self.plugins, self.orphans = host, plugins, orphans
        self.deadlines = HookDeadlines(hook_timeout_s)  # discovery and health: a hung hook stops no report
        self.heartbeat_s, self.boot_id = heartbeat_s, boot_id
        self.generation = 0
        self.loaded: list[str] = []
        self.skipped: list[dict] = []
        self.adoptions: dict[str, Adoption] = {}  # candidate identifier -> the device an admin made of it
        self.resources: list[Resource] = []
        self.kinds: dict[str, list[OperationKindReport]] = {}  # identifier -> the operations its plugin runs on it
        self.steps_of = steps_of  # (device, class) -> the steps its config lists between two leases
        self.auto_recovery = auto_recovery or {}  # device -> what may be done when its health fails
        self.step_kinds: dict[str, list[StepKind]] = {}  # identifier -> the steps its plugin offers on it
        self.facts: dict[str, dict[str, str]] = {}  # identifier -> what its plugin adds to the fingerprint
        self.metrics: list[dict] = []  # what each plugin measures of itself (devloop_metrics), as last scanned
        self.offered: dict[str, list[StepKind]] = {}  # plugin -> every step it may offer (asked at the start)
        self.candidates: list[Resource] = []
        self._last_found: dict[str, list[Resource]] = {}
        self.failing: dict[str, str] = {}  # plugin -> why its last discovery failed
        self.schedule = HealthSchedule(health_rules)  # each resource's checks and reported health
        self.leases = LeaseWatch()  # whose failures they are: a lease's holder's, or the lab's
        self._busy: dict[str, list[Holder]] = {}
        self._devices: list[DeviceReport] | None = None  # as last scanned, until the next scan

    def discover(self) -> list[Resource]:
        """Every resource of every loaded plugin (read-only; no process is spawned).

        A plugin whose discovery fails or times out keeps its last good result: a failure
        to look is not evidence that the devices are gone (their leases would be torn down).
        """
        outcomes = self.deadlines.run({("devloop_discover", name): functools.partial(
            self.plugins.call, name, "devloop_discover", host=self.host) for name in self.loaded})
        resources = []
        for name in self.loaded:
            try:
                found = outcomes[("devloop_discover", name)].result() or []
                self._last_found[name] = [dataclasses.replace(r, plugin=name) for r in found]
                self.failing.pop(name, None)
            except HookTimedOut as exc:
                self.failing[name] = f"discovery {exc}; serving what it found before"
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
        return self.healths([resource])[resource.identifier]

    def healths(self, resources: list[Resource]) -> dict[str, Health]:
        """The health of each resource (by identifier), each check within the hook deadline:
        one that times out makes its resource ``degraded``."""
        def key(r: Resource) -> tuple:
            return "devloop_health", r.plugin, r.identifier
        outcomes = self.deadlines.run({key(r): functools.partial(
            self.plugins.call, r.plugin, "devloop_health", host=self.host, resource=r) for r in resources})
        healths = {}
        for r in resources:
            try:
                answer = outcomes[key(r)].result() or Health()
                healths[r.identifier] = answer if isinstance(answer, Health) else Health(
                    "failed", f"health check answered {answer!r:.100}, not a Health")
            except HookTimedOut as exc:
                healths[r.identifier] = Health("degraded", f"health check {exc}")
            except Exception as exc:
                healths[r.identifier] = Health("failed", f"health check crashed: {exc!r}")
        return healths

    def check_health(self) -> bool:
        """Check the resources (as last scanned) whose check is due on their schedule; True
        if what is reported of any of them changed (docs/architecture.md, "Health that heals")."""
        self.schedule.sync(r.identifier for r in self.resources)
        due = set(self.schedule.due())
        results = self.healths([r for r in self.resources if r.identifier in due])
        changed = False
        for identifier, health in results.items():
            changed |= self.schedule.record(identifier, health)
        if changed:
            self._devices = None
        return changed

    def operation_kinds(self, resources: list[Resource]) -> dict[str, list[OperationKindReport]]:
        """The operations each resource's plugin runs on it (``devloop_operations``, each call
        within the hook deadline), as a report carries them. A plugin whose call fails, or
        whose answer cannot be reported, keeps what it declared before and is listed as failing."""
        def key(r: Resource) -> tuple:
            return "devloop_operations", r.plugin, r.identifier
        asked = [r for r in resources if self.plugins.implements(r.plugin, "devloop_operations")]
        outcomes = self.deadlines.run({key(r): functools.partial(
            self.plugins.call, r.plugin, "devloop_operations", host=self.host, resource=r) for r in asked})
        # a power switch's operation is the exporter's (power.py), run through its backend's devloop_power
        kinds = {r.identifier: _kind_reports([POWER]) for r in resources
                 if r.kind == POWER_KIND and self.plugins.implements(r.plugin, "devloop_power")}
        for r in asked:
            try:
                kinds[r.identifier] = kinds.get(r.identifier, []) + _kind_reports(outcomes[key(r)].result())
            except Exception as exc:  # raised, timed out, or answered what no report can carry
                log.error("devloop_operations of plugin %s for %s: %s", r.plugin, r.identifier, exc)
                kinds[r.identifier] = self.kinds.get(r.identifier, [])
                self.failing.setdefault(r.plugin, f"devloop_operations for {r.identifier}: {exc}; offering what "
                                                  "it declared before")
        return kinds

    def offered_steps(self, resources: list[Resource]) -> dict[str, list[StepKind]]:
        """The steps each resource's plugin offers on it (``devloop_steps``, each call within
        the hook deadline). A plugin whose call fails, or whose answer cannot be used, keeps
        what it offered before and is listed as failing."""
        def key(r: Resource) -> tuple:
            return "devloop_steps", r.plugin, r.identifier
        asked = [r for r in resources if self.plugins.implements(r.plugin, "devloop_steps")]
        outcomes = self.deadlines.run({key(r): functools.partial(
            self.plugins.call, r.plugin, "devloop_steps", host=self.host, resource=r) for r in asked})
        offered = {}
        for r in asked:
            try:
                offered[r.identifier] = step_kinds(outcomes[key(r)].result())
            except Exception as exc:  # raised, timed out, or answered what cannot be used
                log.error("devloop_steps of plugin %s for %s: %s", r.plugin, r.identifier, exc)
                offered[r.identifier] = self.step_kinds.get(r.identifier, [])
                self.failing.setdefault(r.plugin, f"devloop_steps for {r.identifier}: {exc}; offering what it "
                                                  "offered before")
        return offered

    def fingerprint_facts(self, resources: list[Resource]) -> dict[str, dict[str, str]]:
        """What each resource's plugin adds to its device's fingerprint (``devloop_fingerprint``,
        each call within the hook deadline), cut to what a report carries. A plugin whose call
        fails keeps what it said before and is listed as failing."""
        def key(r: Resource) -> tuple:
            return "devloop_fingerprint", r.plugin, r.identifier
        asked = [r for r in resources if self.plugins.implements(r.plugin, "devloop_fingerprint")]
        outcomes = self.deadlines.run({key(r): functools.partial(
            self.plugins.call, r.plugin, "devloop_fingerprint", host=self.host, resource=r) for r in asked})
        facts = {}
        for r in asked:
            try:
                facts[r.identifier] = _facts(outcomes[key(r)].result())
            except Exception as exc:  # raised, timed out, or answered something else than a dict
                log.error("devloop_fingerprint of plugin %s for %s: %s", r.plugin, r.identifier, exc)
                facts[r.identifier] = self.facts.get(r.identifier, {})
                self.failing.setdefault(r.plugin, f"devloop_fingerprint for {r.identifier}: {exc}; reporting what "
                                                  "it said before")
        return facts

    def plugin_metrics(self) -> list[dict]:
        """What each loaded plugin measures of itself (``devloop_metrics``, each call within
        the hook deadline), cut to the rule its docstring states: what a plugin answered
        besides, or a call that failed, is said in its entry's ``dropped`` (and logged when it
        changes), never raised."""
        asked = [plugin for plugin in self.loaded if self.plugins.implements(plugin, "devloop_metrics")]
        outcomes = self.deadlines.run({("devloop_metrics", plugin): functools.partial(
            self.plugins.call, plugin, "devloop_metrics", host=self.host) for plugin in asked})
        before = {entry["plugin"]: entry["dropped"] for entry in self.metrics}
        metrics = []
        for plugin in asked:
            try:
                values, dropped = plugin_metric_values(outcomes[("devloop_metrics", plugin)].result())
            except Exception as exc:  # raised or timed out: nothing of it this time
                values, dropped = {}, f"devloop_metrics failed: {exc!r:.300}"
            if dropped and dropped != before.get(plugin):
                log.warning("metrics of plugin %s left out: %s", plugin, dropped)
            if values or dropped:
                metrics.append({"plugin": plugin, "values": values, "dropped": dropped[:MAX_REASON_CHARS]})
        return metrics

    def scan(self, ours: set[int]) -> list[Resource]:
        """Discover, check health and look for orphans: the devices of the next reports."""
        self.resources = self.discover()
        self.check_health()
        self.kinds = self.operation_kinds(self.resources)
        self.step_kinds = self.offered_steps(self.resources)
        self.facts = self.fingerprint_facts(self.resources)
        self.metrics = self.plugin_metrics()
        self._busy = self.orphans.orphans(self.resources, ours)
        self._devices = None
        return self.resources

    def build(self, services: list[ServiceReport], applied: set[str], ours: set[int],
              recheck: AbstractSet[str] = frozenset(), unserved: Sequence[dict] = (), stopping: bool = False,
              operations: Sequence[OperationReport] = ()) -> Heartbeat:
        """The next snapshot: devices as last scanned (``recheck``: devices to look at
        again for orphans), with ``services`` as they run now."""
        if recheck:
            again = [r for r in self.resources if r.device in recheck]
            for resource in again:
                self._busy.pop(resource.identifier, None)
            self._busy |= self.orphans.orphans(again, ours)
            self._devices = None
        if self._whose_failures(services, operations):
            self._devices = None
        if self._devices is None:
            self._devices = self._device_reports()
        self.generation += 1
        return Heartbeat(
            protocol=PROTOCOL_VERSION, version=__version__, boot_id=self.boot_id, generation=self.generation,
            heartbeat_s=self.heartbeat_s, stopping=stopping, address=self.host.advertise_address,
            plugins=PluginsReport.model_validate({
                "loaded": self.loaded, "skipped": [_clipped(s) for s in self.skipped],
                "unserved": [_clipped(u) for u in unserved],
                "failing": [{"name": n, "reason": r[:MAX_REASON_CHARS]} for n, r in sorted(self.failing.items())],
                "steps": self._plugin_steps(), "metrics": self.metrics}),
            devices=self._devices, services=services,
            applied=sorted(applied), operations=list(operations),
            candidates=[CandidateReport(identifier=c.identifier, kind=c.kind, plugin=c.plugin, label=c.device)
                        for c in self.candidates])

    def _whose_failures(self, services: Sequence[ServiceReport], operations: Sequence[OperationReport]) -> bool:
        """Tell the health schedule which resources leases hold, and those whose steps after a
        lease are over (docs/architecture.md, "Health that heals"); True if a quarantine began."""
        leased, done = self.leases.follow(services, operations, self._step_kinds_of)
        self.schedule.held(r.identifier for r in self.resources if r.device in leased)
        return self.schedule.steps_done(r.identifier for r in self.resources if r.device in done)

    def _step_kinds_of(self, device: str) -> list[str]:
        """``device``'s steps between leases here, as the kinds of the operations they are asked for as."""
        mine = [r for r in self.resources if r.device == device]
        if not mine:
            return []
        return [step.operation_kind for step in plan(self.steps_of(device, mine[0].device_class), mine,
                                                     self.step_kinds)]

    def _plugin_steps(self) -> list[dict]:
        """Every step this exporter can run: its own, then those its plugins offer (asked at
        the start, and on each resource as last scanned), each once."""
        offered: dict[str, list[StepKind]] = {plugin: list(kinds) for plugin, kinds in self.offered.items()
                                              if plugin in self.loaded}
        for r in self.resources:
            offered.setdefault(r.plugin, []).extend(self.step_kinds.get(r.identifier, []))
        return [step.model_dump() for step in plugin_steps(offered)][:MAX_PLUGINS]

    def _device_reports(self) -> list[DeviceReport]:
        devices: dict[str, dict] = {}
        mine: dict[str, list[Resource]] = {}
        for r in self.resources:
            health = self.schedule.reported(r.identifier)
            entry = devices.setdefault(r.device, {"name": r.device, "class": r.device_class, "tags": list(r.tags),
                                                  "resources": [], "busy_by": [], "facts": {}})
            for fact, value in self.facts.get(r.identifier, {}).items():  # the first resource's word stands
                if len(entry["facts"]) < MAX_FACTS:
                    entry["facts"].setdefault(fact, value)
            entry["resources"].append({"kind": r.kind, "plugin": r.plugin, "identifier": r.identifier,
                                       "health": health.status, "reason": health.reason,
                                       "health_kind": health.kind, "service": r.serves_lease,
                                       "operations": self.kinds.get(r.identifier, [])})
            entry["busy_by"] += self._busy.get(r.identifier, [])
            quarantine = self.schedule.quarantine(r.identifier)
            if quarantine is not None and "quarantine" not in entry:  # (the first resource in one)
                entry["quarantine"] = quarantine
            if r.fidelity != Fidelity.HARDWARE:  # (the first resource that is not a board says what the device is)
                entry.setdefault("fidelity", r.fidelity)
            mine.setdefault(r.device, []).append(r)
        for name, entry in devices.items():  # what runs between two leases, and where
            configured = self.steps_of(name, entry["class"])
            if name in self.auto_recovery:
                entry["auto_recover"] = self.auto_recovery[name]
            entry["steps"] = [step.report() for step in plan(configured, mine[name], self.step_kinds)]
        for entry in devices.values():  # the report's bounds (each holder's fields: orphans.py cuts them)
            entry["busy_by"] = entry["busy_by"][:MAX_HOLDERS]
        return [DeviceReport.model_validate(d) for d in devices.values()]


def _kind_reports(declared) -> list[OperationKindReport]:
    """What ``devloop_operations`` answered, as a report carries it; ValueError says why it cannot be."""
    declared = list(declared or [])
    if len(declared) > MAX_OPERATION_KINDS:
        raise ValueError(f"it declares {len(declared)} kinds; a resource may have {MAX_OPERATION_KINDS} at most")
    if not all(isinstance(kind, OperationKind) for kind in declared):
        raise ValueError(f"it answered {declared!r:.200}, not a list of OperationKind")
    try:
        reports = [OperationKindReport.model_validate(kind.to_report()) for kind in declared]
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"a kind it declares cannot be reported ({'.'.join(map(str, first['loc']))}: "
                         f"{first['msg']})") from None
    if len({r.kind for r in reports}) < len(reports):
        raise ValueError(f"it declares a kind twice ({', '.join(r.kind for r in reports)})")
    return reports


def _facts(said) -> dict[str, str]:
    """What ``devloop_fingerprint`` answered, as a report carries it: keys that are fact words,
    values as strings cut to their bound, ``MAX_FACTS`` at most; ValueError for what is not a dict."""
    if said is None:
        return {}
    if not isinstance(said, dict):
        raise ValueError(f"it answered {said!r:.200}, not a dict of facts")
    facts = {}
    for key, value in said.items():
        if isinstance(key, str) and FACT_KEY.match(key) and isinstance(value, (str, int, float, bool)):
            facts[key] = str(value)[:MAX_FACT_CHARS]
        else:
            log.warning("a fingerprint fact was dropped: %.80r (a key is a lowercase word, a value a string)", key)
        if len(facts) == MAX_FACTS:
            break
    return facts


def plugin_metric_values(said) -> tuple[dict[str, float], str]:
    """What ``devloop_metrics`` answered, as a report carries it (the rule in its docstring):
    (name -> number, what was left out and why). A name or value that breaks the rule is left
    out alone; an answer of more than ``MAX_PLUGIN_METRICS`` names, or not a dict, whole."""
    if said is None:
        return {}, ""
    if not isinstance(said, Mapping):
        return {}, f"it answered {type(said).__name__}, not a dict of name -> number"
    if len(said) > MAX_PLUGIN_METRICS:
        return {}, f"it answered {len(said)} metrics; a plugin reports {MAX_PLUGIN_METRICS} at most"
    values: dict[str, float] = {}
    refused = []
    for name, value in said.items():
        number = _finite(value)
        if not isinstance(name, str) or not METRIC_NAME.fullmatch(name):
            refused.append(f"{name!r:.70}: a name is [a-z][a-z0-9_]*, at most 64 characters")
        elif number is None:
            refused.append(f"{name}: {value!r:.40} is not a finite number")
        else:
            values[name] = number
    return values, "; ".join(refused)[:MAX_REASON_CHARS]


def _finite(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past a float's range
        return None
    return number if math.isfinite(number) else None


def _clipped(entry: dict) -> dict:
    """A skipped plugin or unserved device cut to the report's bounds (a misspelt plugin
    name in the config may be as long as its author typed it)."""
    return {key: value[:MAX_REASON_CHARS if key == "reason" else MAX_NAME_CHARS] for key, value in entry.items()}
