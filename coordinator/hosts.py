"""Hosts and their heartbeats (docs/architecture.md, "Reconcile, not push"):
each heartbeat replaces its host's snapshot, and is answered with what that host should
run (the services of live leases, the operations to begin).

The snapshot stays the source of truth; what changes is how it is applied. It is compared
with what the coordinator holds and only the difference is written, in batches: an
unchanged snapshot costs a fixed handful of statements whatever the host's size, a
changed one a fixed number more. What does not need the write lock (validation, digests,
encoding the changed devices' columns) is done before taking it, and other requests get
their turn in between: no reserve waits long behind a big report.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging

from typing import Any, Awaitable, Callable, Mapping

from pydantic import TypeAdapter, ValidationError

from device_loop.core import PROTOCOL_VERSION
from device_loop.core.protocol import MAX_TAGS, DesiredState, DeviceReport, Heartbeat, Tag
from device_loop.core.vocabulary import DeviceState, FaultKind, HealthKind, HealthStatus, LeaseState
from device_loop.core.errors import ErrorCode

from .errors import APIError, conflict
from .leases import Leases
from .lifecycle import Lifecycle, device_state, fault, logged_cause, ring_entry
from .notify import BOARD_KEY, CallerGone, host_key, lease_key
from .operations import Operations
from .power import Power
from .quarantine import decoded
from .quarantine import step as quarantine_step
from .rows import HostRow
from .scheduler import Scheduler
from .steps import Steps
from .store import Store, UniqueViolation
from .store.devices import DeviceQueries
from .store.hosts import HostQueries
from .store.leases import LeaseQueries
from .store.operations import OperationQueries

log = logging.getLogger(__name__)

SUPERSEDED_KEPT = 8  # boot ids of a host remembered as replaced
REPORT_CAUSE = "exporter report"  # a change with no more particular cause than the host's report
_HEALTH_ORDER = {status: n for n, status in enumerate(HealthStatus)}  # ok, degraded, failed: the worst wins


def _cause(row: dict, new_state: str, cause: str) -> str:
    """The cause a change of state is logged with: a device that turns faulty says why
    (``logged_cause``: its fault, else its failing resources' reasons), and one that recovers
    says that."""
    if new_state == DeviceState.FAULTY:
        return logged_cause(row, new_state, None if cause == REPORT_CAUSE else cause)
    if row["state"] == DeviceState.FAULTY and new_state == DeviceState.IDLE and cause == REPORT_CAUSE:
        return "health is ok again"
    return cause


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


_TAG = TypeAdapter(Tag)


def _tags(tags: list[str]) -> list[str]:
    """An adoption's tags as the protocol takes them: one stored before adoption checked them
    (an empty tag, a long one, too many) would fail every heartbeat of its host."""
    return [tag for tag in tags if _valid(_TAG, tag)][:MAX_TAGS]


def _valid(adapter: TypeAdapter, value: Any) -> bool:
    try:
        adapter.validate_python(value)
    except ValidationError:
        return False
    return True


def _columns(device: DeviceReport, digest: str) -> dict:
    """The columns of a device that its report gives (JSON ones as text)."""
    dumped = device.model_dump()
    worst = max(device.resources, key=lambda r: _HEALTH_ORDER[r.health])
    reasons = "; ".join(f"{r.kind}: {r.reason}" for r in device.resources if r.health != "ok" and r.reason)
    return {"class": device.device_class, "tags": json.dumps(dumped["tags"]), "present": True,
            "health": worst.health, "health_reason": reasons, "busy_by": json.dumps(dumped["busy_by"]),
            "resources": json.dumps(dumped["resources"]), "report_digest": digest, "steps": json.dumps(dumped["steps"]),
            "facts": json.dumps(dumped["facts"]), "fidelity": device.fidelity,
            "quarantine": device.quarantine.model_dump_json() if device.quarantine else None}


class _Changes:
    """The writes one snapshot leads to, collected so they go out in batches."""

    def __init__(self, now: float, actor: str, default_cause: str):
        self.now, self.actor, self.default_cause = now, actor, default_cause
        self.rows: dict[str, dict] = {}     # device -> its row (with facts) as it will be
        self.dirty: set[str] = set()        # devices whose columns changed
        self.causes: dict[str, str] = {}
        self.ring: list[dict] = []
        self.identities: dict[str, list[dict]] = {}
        self.wake_host = False              # the host's desired state may have changed
        self.became_idle: list[str] = []    # devices a waiting ticket may take now
        self.begin_steps: list[str] = []    # devices whose steps between leases begin now
        self.faults_set: dict[str, dict] = {}  # device -> the fault its report gave it (its health failed for good)
        self.quarantine_steps: dict[str, str] = {}  # device -> its quarantine's step, in words (its ring log's line)

    def touch(self, row: Mapping[str, Any], cause: str | None = None, **fields: Any) -> dict[str, Any]:
        """Take ``row`` into account (its state is recomputed), with ``fields`` changed."""
        current = self.rows.setdefault(row["name"], dict(row))
        if any(current.get(k) != v for k, v in fields.items()):
            current.update(fields)
            self.dirty.add(row["name"])
        if cause:
            self.causes[row["name"]] = cause
        return current

    def log(self, row: dict, to_state: str, cause: str) -> None:
        row["log_seq"] += 1
        self.ring.append(ring_entry(row, row["log_seq"], to_state, self.now, cause, self.actor))
        self.dirty.add(row["name"])

    def settle(self) -> list[dict]:
        """Recompute each touched device's state; the rows to write."""
        for name, row in self.rows.items():
            new = device_state(row)
            step = self.quarantine_steps.get(name)
            if new != row["state"]:
                self.log(row, new, step or _cause(row, new, self.causes.get(name, self.default_cause)))
                row["state"], row["state_since"] = new, self.now
                if new == DeviceState.IDLE:
                    self.became_idle.append(name)
            elif step:  # (docs/architecture.md, "Health that heals": every step of a quarantine is a line)
                self.log(row, new, step)
            if name in self.dirty:
                row["updated_at"] = self.now
        return [row for name, row in self.rows.items() if name in self.dirty]


class Hosts:
    """What exporters report, and what they are answered."""

    def __init__(self, life: Lifecycle, leases: Leases, operations: Operations, steps: Steps, scheduler: Scheduler,
                 power: Power, *,
                 hosts_sql: HostQueries, devices_sql: DeviceQueries, leases_sql: LeaseQueries,
                 operations_sql: OperationQueries):
        self.life, self.leases, self.operations = life, leases, operations
        self.steps, self.scheduler, self.power = steps, scheduler, power
        self.store: Store = life.store
        self.hosts_sql = hosts_sql
        self.devices_sql = devices_sql
        self.leases_sql = leases_sql
        self.operations_sql = operations_sql

    async def heartbeat(self, host_name: str, report: Heartbeat, actor: str) -> dict:
        """Replace this host's snapshot and answer with its desired state."""
        if report.protocol != PROTOCOL_VERSION:
            raise APIError(400, ErrorCode.PROTOCOL_MISMATCH,
                           f"exporter {host_name} speaks protocol {report.protocol}, this coordinator "
                           f"speaks {PROTOCOL_VERSION}: run the same device-loop version on both")
        digests = {d.name: _digest(d.model_dump_json()) for d in report.devices}
        # a new candidate or device, or one that changed, takes the full path below
        snapshot = _digest("".join(f"{n}={d};" for n, d in digests.items())
                           + "".join(c.model_dump_json() for c in report.candidates))
        columns = await self._prepare(host_name, report, digests, snapshot)
        await asyncio.sleep(0)  # requests that came meanwhile go first
        try:
            async with self.store.tx():
                previous = await self.hosts_sql.host(host_name, for_update=True)
                self._refuse_stale(host_name, previous, report)
                if previous is None or (previous["boot_id"], previous["generation"]) != (report.boot_id,
                                                                                       report.generation):
                    await self._apply(host_name, previous, report, digests, columns, snapshot, actor)
        except UniqueViolation:  # another coordinator process wrote the same row first
            raise conflict(ErrorCode.CONCURRENT_UPDATE, "another report changed these devices at the same time; "
                                                        "the next heartbeat will go through") from None
        return await self.desired(host_name)

    async def _prepare(self, host_name: str, report: Heartbeat, digests: dict[str, str],
                       snapshot: str) -> dict[str, dict]:
        """The columns of the devices whose report changed, as far as the committed state
        tells (only this host's heartbeats write them): encoded before the write lock."""
        previous = await self.hosts_sql.host(host_name)
        if previous is not None and previous["devices_digest"] == snapshot:
            return {}
        stored = await self.devices_sql.report_digests(host_name)
        return {d.name: _columns(d, digests[d.name]) for d in report.devices if stored.get(d.name) != digests[d.name]}

    @staticmethod
    def _refuse_stale(host_name: str, previous: HostRow | None, report: Heartbeat) -> None:
        """An older generation of this boot, or a boot that a newer start replaced: 409."""
        if previous is None:
            return
        # a replaced boot may take over again once its successor said goodbye or went silent
        if report.boot_id in previous["superseded_boots"] and previous["online"]:
            raise conflict(ErrorCode.SUPERSEDED_BOOT,
                           f"boot {report.boot_id} of exporter {host_name} was replaced by a newer start; "
                           f"if two exporters run with the name {host_name!r}, give each its own [exporter] name")
        if previous["boot_id"] == report.boot_id and report.generation < previous["generation"]:
            raise conflict(ErrorCode.STALE_HEARTBEAT, f"generation {report.generation} is older than "
                                                      f"{previous['generation']} for boot {report.boot_id}")

    async def _apply(self, host_name: str, previous: HostRow | None, report: Heartbeat, digests: dict[str, str],
                     columns: dict[str, dict], snapshot: str, actor: str) -> None:
        now, online = self.life.clock(), not report.stopping
        full = (previous is None or previous["boot_id"] != report.boot_id or previous["online"] != online
                or previous["devices_digest"] != snapshot)
        if previous is None or online and previous["online"]:
            cause = REPORT_CAUSE
        else:
            cause = f"exporter {host_name} stopped" if report.stopping else "host is heartbeating again"
        changes = _Changes(now, actor, cause)
        rows = await self.devices_sql.devices_of_host(host_name, in_transition_only=not full, decode_json=False)
        own = {r["name"]: {**r, "host_online": online} for r in rows if r["host"] == host_name}
        if full:
            claimed_before = {r["name"]: r for r in rows if r["conflict_host"] == host_name}
            await self._apply_devices(host_name, report, digests, columns, own, claimed_before, changes, online)
            for row in own.values():
                changes.touch(row)  # the host's online state may have changed: recompute all
            await self.hosts_sql.save_candidates([{**c.model_dump(), "host": host_name, "last_seen": now}
                                                  for c in report.candidates])
        activated = self._progress(report, own, changes)
        rows_to_write = changes.settle()
        await self.devices_sql.write_devices(rows_to_write)
        for name, fields in changes.faults_set.items():  # (the heartbeat's upsert does not write that column)
            await self.devices_sql.update_device(name, **fields)
        if changes.identities:
            await self.devices_sql.replace_identities(list(changes.identities),
                                                      [r for rs in changes.identities.values() for r in rs])
        await self.devices_sql.add_ring_entries(changes.ring)
        ready = await self.leases_sql.activate_leases(activated)
        if ready:
            self.store.after_commit(lambda: self.life.metrics.leases_ready([now - r["created_at"] for r in ready]))
        if rows_to_write:
            self.life.notify(BOARD_KEY)
        await self._save_host(host_name, previous, report, snapshot, now, online)
        if changes.begin_steps:
            await self.steps.begin(changes.begin_steps)
        if rows_to_write:
            await self.power.rearm(rows_to_write)
        ended = await self.operations.apply_reports(host_name, previous, report, actor)
        if ended:
            await self.power.ended(ended, actor)
        freed = await self.steps.after_operations(ended) if ended else []
        await self.power.recover(report)  # (docs/architecture.md, "Power"): once the steps have said their word
        # (docs/architecture.md, "Who gets the next lease": granted where it became free)
        await self.scheduler.grant_free(changes.became_idle + freed + [op["device"] for op in ended])
        if previous is not None and previous["link_lost"]:
            await self._wake_leases_of(host_name)  # ready again
        if changes.wake_host:
            self.life.notify(host_key(host_name))
        if activated:
            self.life.notify(*map(lease_key, activated))

    async def _apply_devices(self, host_name: str, report: Heartbeat, digests: dict[str, str],
                             columns: dict[str, dict], own: dict[str, dict], claimed_before: dict[str, dict],
                             changes: _Changes, online: bool) -> None:
        """The full comparison: new, changed, moved, claimed and vanished devices."""
        def identity_changed(device: DeviceReport) -> bool:  # (its identity is part of its digest)
            row = own.get(device.name)
            return row is None or (row["report_digest"] != digests[device.name] and {
                r["identifier"] for r in json.loads(row["resources"])} != {r.identifier for r in device.resources})

        new_identity = [d for d in report.devices if identity_changed(d)]
        new_names = {d.name for d in new_identity}
        owners = {o["identifier"]: o for o in await self.devices_sql.identifier_owners(
            [r.identifier for d in new_identity for r in d.resources])}
        elsewhere = {r["name"]: r for r in await self.devices_sql.devices_named(sorted(
            ({d.name for d in report.devices} | {o["device"] for o in owners.values()}) - own.keys()))}
        claimed: set[str] = set()
        for device in report.devices:
            owner = self._owner_elsewhere(device, host_name, owners)
            row = own.get(device.name) or elsewhere.get(device.name)
            if owner is None and row is not None and row["host"] not in (None, host_name):
                if row["present"] and row["host_online"]:
                    owner = device.name  # its host still has it: that host keeps it
                else:  # its host lost it (offline or unplugged) and this one has it now
                    row = changes.touch(row, host=host_name, host_online=online)
                    changes.log(row, row["state"], f"moved from host {elsewhere[device.name]['host']} to {host_name}")
                    changes.wake_host = True
            if owner is not None:
                claimed.add(owner)
                continue
            if row is not None and row["report_digest"] == digests[device.name] and row["present"] \
                    and device.name in own:
                continue  # as reported before
            fields = {**(columns.get(device.name) or _columns(device, digests[device.name])), "host": host_name}
            self._health_faults(device, row or {}, fields, changes)
            if row is None:
                row = {"name": device.name, "state": "unregistered", "reclaim_lease": None, "retired": False,
                       "conflict_host": None, "created_at": changes.now, "state_since": changes.now, "log_seq": 0,
                       "lease_id": None, "lease_state": None, "host_online": online, "present": False,
                       "reclaim_step": None, "fault": None, "fault_kind": None, **fields}
                changes.dirty.add(device.name)
                changes.causes[device.name] = f"registered: first reported by host {host_name}"
            elif not row["present"]:
                changes.causes[device.name] = f"host {host_name} reports it again"
            changes.wake_host |= not row["present"]
            own[device.name] = changes.touch(row, **fields)
            if device.name in new_names:
                changes.identities[device.name] = [{"identifier": r.identifier, "device": device.name, "kind": r.kind,
                                                    "plugin": r.plugin} for r in device.resources]
                changes.wake_host = True
        reported = {d.name for d in report.devices}
        for name, row in own.items():
            if name not in reported and row["present"]:
                changes.touch(row, f"host {host_name} no longer reports it (unplugged?)", present=False)
                changes.wake_host = True
        await self._record_claims(host_name, claimed, set(claimed_before))

    @staticmethod
    def _health_faults(device: DeviceReport, row: Mapping[str, Any], fields: dict, changes: _Changes) -> None:
        """What a device's reported health leaves (docs/architecture.md, "Health that heals"):
        a health that turned failed for good is a fault of its own, which only an admin clears
        (no fault is ever cleared here: a step's or a person's stays when health recovers);
        each step of its quarantine is a line of its ring log."""
        permanent = [r for r in device.resources
                     if r.health == HealthStatus.FAILED and r.health_kind == HealthKind.PERMANENT]
        before = row.get("resources") or "[]"
        before = before if isinstance(before, list) else json.loads(before)
        was_permanent = any(r.get("health") == HealthStatus.FAILED and r.get("health_kind") == HealthKind.PERMANENT
                            for r in before)
        if permanent and not was_permanent and not row.get("fault"):
            words = "health failed for good: " + "; ".join(f"{r.kind}: {r.reason or 'no reason given'}"
                                                            for r in permanent)
            changes.faults_set[device.name] = fault(FaultKind.HEALTH_PERMANENT, words)
            fields.update(changes.faults_set[device.name])
        step = quarantine_step(decoded(row.get("quarantine")), device.quarantine, bool(permanent))
        if step:
            changes.quarantine_steps[device.name] = step

    async def _record_claims(self, host_name: str, claimed: set[str], before: set[str]) -> None:
        """Note the devices ``host_name`` reports that another host owns: shown to admins,
        and nothing else (the owner keeps serving them). Only that column is written, so a
        claim never writes back what it read of another host's device."""
        if claimed - before:
            log.warning("host %s reports devices that another host owns, which keeps them: %s",
                        host_name, ", ".join(sorted(claimed - before)))
            await self.devices_sql.set_claims(host_name, sorted(claimed - before))
        if before - claimed:
            await self.devices_sql.drop_claims(host_name, sorted(before - claimed))
        if claimed != before:
            self.life.notify(BOARD_KEY)

    @staticmethod
    def _owner_elsewhere(device: DeviceReport, host_name: str, owners: dict[str, dict]) -> str | None:
        """The device that holds one of these identifiers on another live host, if any.

        On this host (a renamed device, a camera moved to another device in the config)
        or on a host that lost it, the identifier simply changes hands.
        """
        for resource in device.resources:
            row = owners.get(resource.identifier)
            if row is None or row["device"] == device.name:
                continue
            if row["host"] != host_name and row["present"] and row["host_online"]:
                return row["device"]
        return None

    @staticmethod
    def _progress(report: Heartbeat, own: dict[str, dict], changes: _Changes) -> list[str]:
        """Reclaims the report completes and pending leases it makes ready; the leases to activate."""
        reported = {d.name: d for d in report.devices}
        serving = {s.device for s in report.services}
        # up: its endpoints published, or (a card a container uses) its CDI environment stated
        up = {(s.lease, s.identifier) for s in report.services if (s.endpoints or s.environment) and not s.error}
        activated = []
        for name, row in own.items():
            device = reported.get(name)
            if device is None:
                continue
            if (row["reclaim_lease"] and row["reclaim_step"] is None and row["reclaim_lease"] not in report.applied
                    and name not in serving and not device.busy_by):
                if device.steps:  # (docs/architecture.md, "Steps between leases"): reclaiming until they are done
                    changes.begin_steps.append(name)
                else:
                    changes.touch(row, "exporter confirmed: services stopped, no orphan holds it", reclaim_lease=None)
            ready = all((row["lease_id"], r.identifier) in up for r in device.resources if r.service)
            if row["lease_state"] == LeaseState.PENDING and not row["retired"] and ready:
                activated.append(row["lease_id"])
                changes.touch(row, "services up, endpoints published")["lease_state"] = LeaseState.ACTIVE
        return activated

    async def _save_host(self, host_name: str, previous: HostRow | None, report: Heartbeat, snapshot: str,
                         now: float, online: bool) -> None:
        row = {"boot_id": report.boot_id, "generation": report.generation, "protocol": report.protocol,
               "version": report.version, "heartbeat_s": report.heartbeat_s, "plugins": report.plugins.model_dump(),
               "services": [s.model_dump(exclude_none=True) for s in report.services],
               "last_seen": now, "online": online, "devices_digest": snapshot, "link_lost": False,
               "address": report.address}  # its own: endpoints are there, and snapshots fetched only there
        if previous is None:
            await self.hosts_sql.save_host({"name": host_name, **row, "superseded_boots": []}, new=True)
            return
        if previous["boot_id"] != report.boot_id:
            earlier = [b for b in previous["superseded_boots"] if b != report.boot_id]
            row["superseded_boots"] = (earlier + [previous["boot_id"]])[-SUPERSEDED_KEPT:]
        changed = {k: v for k, v in row.items() if previous.get(k) != v or k in ("generation", "last_seen")}
        await self.hosts_sql.save_host({"name": host_name, **changed}, new=False)

    async def desired(self, host_name: str) -> dict[str, Any]:
        """What ``host_name`` should run: the services of the live leases on its devices (not
        of resources that serve no lease: a flash target is written through operations only),
        and the operations to begin."""
        as_of = self.life.clock()
        services = [{"lease": r["id"], "holder": r["holder"], "device": r["device"], "identifier": res["identifier"],
                     "kind": res["kind"], "plugin": res["plugin"], "secret": r["secret"]}
                    for r in await self.leases_sql.desired_services(host_name) for res in r["resources"]
                    if res.get("service", True)]
        adopted = [{"identifier": a["identifier"], "name": a["name"], "class": a["class"], "tags": _tags(a["tags"])}
                   for a in await self.hosts_sql.adoptions_on_host(host_name)]
        operations = [{"op": o["id"], "kind": o["kind"], "device": o["device"], "identifier": o["identifier"],
                       "plugin": o["plugin"], "requester": o["requester"], "args": o["args"],
                       "purpose": o["purpose"], "step": o["step"],
                       "image": {"sha256": o["image_sha256"], "size": o["image_size"], "name": o["image_name"]}
                       if o["image_sha256"] else None}
                      for o in await self.operations_sql.queued_operations(host_name)]
        etag = _digest(json.dumps([services, adopted, operations], sort_keys=True))
        return DesiredState.model_validate({"services": services, "adopted": adopted, "operations": operations,
                                            "etag": etag, "as_of": as_of}).model_dump(by_alias=True, mode="json")

    async def wait_desired(self, host_name: str, etag: str | None, wait_s: float, gone: Callable[[], Awaitable[object]],
                           boot_id: str | None = None) -> dict:
        """Long-poll: the desired state as soon as its etag differs from ``etag``.

        An exporter long-polls all the time, so one hung up before its answer most likely
        died (kill -9 closes its sockets): ``boot_id``'s leases are not ready until it
        heartbeats again, rather than showing endpoints nobody serves for the seconds it
        takes to count it silent."""
        try:
            return await self.life.notifier.long_poll(host_key(host_name), lambda: self.desired(host_name),
                                                 lambda desired: desired["etag"] != etag, wait_s, gone)
        except CallerGone:
            if boot_id:
                async with self.store.tx():
                    await self.hosts_sql.set_link_lost(host_name, boot_id)
                    await self._wake_leases_of(host_name)
            raise

    async def _wake_leases_of(self, host_name: str) -> None:
        self.life.notify(*[lease_key(r["id"]) for r in await self.leases_sql.desired_services(host_name)])

    async def mark_silent(self, now: float, actor: str) -> None:
        """Hosts that stopped heartbeating go offline, with their devices and claims."""
        settings = self.life.settings
        silent = await self.hosts_sql.hosts_silent_since(now, settings.offline_after_periods,
                                                         settings.offline_after_min_s, self.life.serving_since)
        for host_name in silent:
            await self.hosts_sql.set_host_offline(host_name)
            await self.devices_sql.drop_claims(host_name)
            self.life.notify(BOARD_KEY)
            for device in await self.devices_sql.devices_of_host(host_name):
                await self.life.change(device, f"host {host_name} stopped heartbeating", actor)
