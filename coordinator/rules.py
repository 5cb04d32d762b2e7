"""Every rule of the lab, in one place: leases, the device lifecycle, heartbeats.

Routes call these methods and nothing else; SQL lives in ``store.py``. Each method that
writes runs in one transaction and ends by telling the long-polls what changed.
"""
from __future__ import annotations

import hashlib
import json
import secrets
import time
from dataclasses import dataclass

from device_loop.core import PROTOCOL_VERSION
from device_loop.core.durations import format_duration, iso

from .errors import APIError, conflict, not_found
from .notify import Notifier, host_key, lease_key
from .schemas import HeartbeatIn
from .store import LIVE, Store, UniqueViolation

LOG_KEEP = 20


@dataclass
class Settings:
    allocating_timeout_s: float = 30.0
    default_ttl_s: float = 1800.0
    max_ttl_s: float = 7 * 86400.0
    offline_after_periods: float = 3.0
    offline_after_min_s: float = 10.0
    reaper_interval_s: float = 1.0
    max_leases_per_user: int = 10  # 0: no limit
    gated: bool = True  # endpoints ask for the lease's secret (off in the single-user trust mode)


def device_state(device: dict, host_online: bool, lease_state: str | None) -> str:
    """The lifecycle state (DESIGN §8) that follows from a device's facts."""
    if device["retired"]:
        return "retired"
    if device["conflict_host"]:
        return "conflict"
    if not host_online or not device["present"]:
        return "offline"
    if lease_state == "pending":
        return "allocating"
    if lease_state == "active":
        return "in_use"
    if device["reclaim_lease"]:
        return "reclaiming"
    if device["health"] == "failed":
        return "faulty"
    return "idle"


def _worst_health(resources) -> tuple[str, str]:
    order = {"ok": 0, "degraded": 1, "failed": 2}
    worst = max(resources, key=lambda r: order[r.health])
    reasons = "; ".join(f"{r.kind}: {r.reason}" for r in resources if r.health != "ok" and r.reason)
    return worst.health, reasons


class Rules:
    def __init__(self, store: Store, settings: Settings | None = None, clock=time.time):
        self.store = store
        self.settings = settings or Settings()
        self.clock = clock
        self.notifier = Notifier()

    # ---- views -------------------------------------------------------------------

    @staticmethod
    def _device_json(row: dict, resources: list[dict]) -> dict:
        return {
            "name": row["name"],
            "class": row["class"],
            "tags": row["tags"],
            "state": row["state"],
            "host": row["host"],
            "holder": row.get("holder"),
            "expires_at": iso(row.get("expires_at")),
            "health": row["health"],
            "health_reason": row["health_reason"],
            "conflict_hosts": [row["host"], row["conflict_host"]] if row["conflict_host"] else [],
            "busy_by": row["busy_by"],
            "resources": [{"kind": r["kind"], "plugin": r["plugin"], "identifier": r["identifier"],
                           "health": r["health"], "reason": r["reason"]} for r in resources],
        }

    async def list_devices(self) -> list[dict]:
        resources: dict[str, list] = {}
        for r in await self.store.resources():
            resources.setdefault(r["device"], []).append(r)
        return [self._device_json(d, resources.get(d["name"], [])) for d in await self.store.devices()]

    async def device_info(self, name: str) -> dict:
        for device in await self.list_devices():
            if device["name"] == name:
                return device
        raise not_found("device", name)

    async def device_log(self, name: str) -> list[dict]:
        if await self.store.device(name) is None:
            raise not_found("device", name)
        return [{"at": iso(e["at"]), "from": e["from_state"], "to": e["to_state"],
                 "cause": e["cause"], "actor": e["actor"]} for e in await self.store.device_log(name)]

    async def hosts(self) -> list[dict]:
        now = self.clock()
        out = []
        for h in await self.store.hosts():
            out.append({
                "name": h["name"], "online": h["online"], "protocol": h["protocol"],
                "version": h["version"], "boot_id": h["boot_id"], "generation": h["generation"],
                "heartbeat_s": h["heartbeat_s"], "heartbeat_age_s": round(now - h["last_seen"], 1),
                "draining": h["draining"],
                "last_seen": iso(h["last_seen"]), "plugins": h["plugins"],
                "devices": [d["name"] for d in await self.store.devices_of_host(h["name"])],
            })
        return out

    async def _own_lease(self, lease_id: str, caller: str, admin: bool = False) -> dict:
        """The lease, if ``caller`` holds it (or is an admin); anyone else is told it does not exist."""
        lease = await self.store.lease(lease_id)
        if lease is None or (lease["holder"] != caller and not admin):
            raise not_found("lease", lease_id)
        return lease

    async def lease_status(self, lease_id: str, caller: str, admin: bool = False) -> dict:
        return await self._lease_json(await self._own_lease(lease_id, caller, admin))

    async def my_leases(self, caller: str) -> list[dict]:
        return [await self._lease_json(l) for l in await self.store.live_leases_of_holder(caller)]

    async def _lease_json(self, lease: dict) -> dict:
        device = await self.store.device(lease["device"])
        host = await self.store.host(device["host"]) if device["host"] else None
        services = [s for s in (host["services"] if host and host["online"] else []) if s["lease"] == lease["id"]]
        endpoints = [e for s in services for e in s["endpoints"]] if lease["state"] in LIVE else []
        up = {s["identifier"] for s in services if s["endpoints"] and not s.get("error")}
        resources = {r["identifier"] for r in await self.store.resources_of(lease["device"])}
        ready = lease["state"] == "active" and device["state"] == "in_use" and bool(resources) and resources <= up
        return {
            "id": lease["id"],
            "device": lease["device"],
            "holder": lease["holder"],
            "state": lease["state"],
            "created_at": iso(lease["created_at"]),
            "expires_at": iso(lease["expires_at"]),
            "ended_at": iso(lease["ended_at"]),
            "end_reason": lease["end_reason"],
            "device_state": device["state"],
            "host": device["host"],
            "endpoints": endpoints,
            "ready": ready,
            "reason": "ready" if ready else self._lease_reason(lease, device, host, services),
            # the gate's password: only the holder (and admins) ever see a lease
            "secret": lease["secret"] if lease["state"] in LIVE else None,
        }

    def _lease_reason(self, lease: dict, device: dict, host: dict | None, services: list[dict]) -> str:
        if lease["state"] not in LIVE:
            return lease["end_reason"] or lease["state"]
        if device["state"] == "offline":
            where = f"host {device['host']}" if host and not host["online"] else "the device"
            return f"{where} is offline; the lease is kept and endpoints come back with it"
        errors = [s["error"] for s in services if s.get("error")]
        if errors:
            return "service failed to start: " + "; ".join(errors)
        if lease["state"] == "pending":
            return f"waiting for exporter {device['host']} to start the services"
        return f"exporter {device['host']} is restarting the services; endpoints come back shortly"

    # ---- leases --------------------------------------------------------------------

    async def reserve(self, device_name: str, ttl_s: float | None, caller: str, admin: bool = False) -> dict:
        ttl = self._check_ttl(ttl_s if ttl_s is not None else self.settings.default_ttl_s)
        now = self.clock()
        async with self.store.tx():
            device = await self.store.device(device_name)
            if device is None:
                raise await self._unknown_device(device_name)
            await self._refuse_unless_free(device, caller)
            await self._refuse_hoarding(caller, admin)
            lease = {"id": "lease-" + secrets.token_hex(8), "device": device_name, "holder": caller,
                     "state": "pending", "created_at": now, "expires_at": now + ttl,
                     "ended_at": None, "end_reason": None,
                     "secret": secrets.token_urlsafe(24) if self.settings.gated else None}
            try:
                await self.store.insert_lease(lease)
            except UniqueViolation:
                raise conflict("busy", f"{device_name} was just reserved by someone else") from None
            await self._refresh(device_name, f"reserved ({format_duration(ttl)})", caller)
            await self._audit(caller, "reserve", device_name, lease["id"], {"ttl_s": ttl})
            view = await self._lease_json(lease)
        self.notifier.changed(host_key(device["host"] or ""))
        return view

    def _check_ttl(self, ttl_s: float) -> float:
        if not ttl_s >= 1 or ttl_s == float("inf"):  # REST's schema says so too; MCP comes here directly
            raise APIError(422, "invalid", f"ttl_s must be at least 1 second, not {ttl_s!r}")
        if ttl_s > self.settings.max_ttl_s:
            raise APIError(422, "ttl_too_long",
                           f"ttl {format_duration(ttl_s)} is over this lab's maximum of "
                           f"{format_duration(self.settings.max_ttl_s)}")
        return ttl_s

    async def _unknown_device(self, name: str) -> APIError:
        names = [d["name"] for d in await self.store.devices()]
        hint = f"; known devices: {', '.join(names[:10])}" if names else "; no device is registered yet"
        return APIError(404, "unknown_device", f"unknown device {name!r}{hint}")

    async def _refuse_unless_free(self, device: dict, caller: str) -> None:
        state, name = device["state"], device["name"]
        host = await self.store.host(device["host"]) if device["host"] else None
        if state == "idle" and host and host["draining"]:
            raise conflict("draining", f"{name}'s host {device['host']} is being drained by an admin: "
                                       "no new leases there")
        if state == "idle":
            return
        lease = await self.store.live_lease_of(name)
        if lease is not None and lease["holder"] == caller:
            raise conflict("already_yours", f"you hold {name} already: {lease['id']}, until {iso(lease['expires_at'])}")
        if lease is not None:
            message = f"{name} is held by {lease['holder']} until {iso(lease['expires_at'])}"
        elif state == "reclaiming":
            message = f"{name} is being reclaimed after its last lease; try again in a few seconds"
        elif state == "offline":
            message = f"{name} is offline (host {device['host']} not heartbeating or the device is unplugged)"
        elif state == "faulty":
            message = f"{name} is faulty: {device['health_reason'] or 'health check failed'}"
        elif state == "conflict":
            message = f"{name} is claimed by two hosts ({device['host']}, {device['conflict_host']}); an admin must fix the exporter configs"
        else:
            message = f"{name} is {state}"
        alternative = await self._idle_alternative(device)
        if alternative:
            message += f"; try {alternative}"
        raise conflict("busy" if lease or state == "reclaiming" else state, message)

    async def _refuse_hoarding(self, caller: str, admin: bool) -> None:
        limit = self.settings.max_leases_per_user
        held = await self.store.live_leases_of_holder(caller)
        if limit and not admin and len(held) >= limit:
            devices = ", ".join(l["device"] for l in held)
            raise conflict("too_many_leases", f"you hold {len(held)} leases ({devices}), this lab's limit per "
                                              f"person; release one first")

    async def _idle_alternative(self, device: dict) -> str | None:
        for other in await self.store.devices():
            if other["name"] != device["name"] and other["class"] == device["class"] and other["state"] == "idle":
                return other["name"]
        return None

    async def renew(self, lease_id: str, ttl_s: float, caller: str, admin: bool = False) -> dict:
        ttl = self._check_ttl(ttl_s)
        async with self.store.tx():
            lease = await self._own_lease(lease_id, caller, admin)
            if lease["state"] not in LIVE:
                raise conflict("lease_ended", f"{lease_id} is {lease['state']}; reserve the device again")
            await self.store.set_lease_expiry(lease_id, self.clock() + ttl)
            await self._audit(caller, "renew", lease["device"], lease_id, {"ttl_s": ttl})
            view = await self._lease_json(await self.store.lease(lease_id))
        self.notifier.changed(lease_key(lease_id))
        return view

    async def release(self, lease_id: str, caller: str, admin: bool = False) -> dict:
        async with self.store.tx():
            lease = await self._own_lease(lease_id, caller, admin)
            changed = await self._end_lease(lease, "released", f"released by {caller}", caller)
            if changed:
                await self._audit(caller, "release", lease["device"], lease_id, {})
            view = await self._lease_json(await self.store.lease(lease_id))
        self.notifier.changed(*changed)
        return view

    # ---- admin -----------------------------------------------------------------------

    async def revoke(self, lease_id: str, admin: str) -> dict:
        """An admin takes a lease back (``admin release --force``)."""
        async with self.store.tx():
            lease = await self.store.lease(lease_id)
            if lease is None:
                raise not_found("lease", lease_id)
            changed = await self._end_lease(lease, "revoked", f"revoked by admin {admin}", admin)
            if changed:
                await self._audit(admin, "revoke", lease["device"], lease_id, {"holder": lease["holder"]})
            view = await self._lease_json(await self.store.lease(lease_id))
        self.notifier.changed(*changed)
        return view

    async def retire(self, name: str, admin: str, retired: bool = True, force: bool = False) -> dict:
        """Take a device out of the lab (a live lease is revoked only with ``force``), or bring it back."""
        changed: list[str] = []
        async with self.store.tx():
            device = await self.store.device(name)
            if device is None:
                raise not_found("device", name)
            lease = await self.store.live_lease_of(name)
            if retired and lease and not force:
                raise conflict("leased", f"{name} is leased by {lease['holder']}; retiring it with --force "
                                         "revokes that lease")
            if retired and lease:
                changed = await self._end_lease(lease, "revoked", f"device retired by admin {admin}", admin)
            await self.store.update_device(name, retired=retired)
            await self._refresh(name, f"{'retired' if retired else 'returned'} by admin {admin}", admin)
            await self._audit(admin, "retire" if retired else "unretire", name, lease["id"] if lease else None, {})
        self.notifier.changed(*changed)
        return await self.device_info(name)

    async def drain(self, host_name: str, admin: str, draining: bool = True) -> dict:
        """No new leases on a host's devices (live ones run out), or lift that."""
        async with self.store.tx():
            if await self.store.host(host_name) is None:
                raise not_found("host", host_name)
            await self.store.set_host_draining(host_name, draining)
            await self._audit(admin, "drain" if draining else "undrain", None, None, {"host": host_name})
        return next(h for h in await self.hosts() if h["name"] == host_name)

    async def candidates(self) -> list[dict]:
        """What exporters found on the network and nobody adopted yet (and what they did)."""
        return [{"identifier": c["identifier"], "host": c["host"], "kind": c["kind"], "plugin": c["plugin"],
                 "label": c["label"], "last_seen": iso(c["last_seen"]), "adopted_as": c["adopted_as"]}
                for c in await self.store.candidates()]

    async def adopt(self, identifier: str, name: str, device_class: str, tags: list[str], admin: str) -> dict:
        """Make a network candidate a device of the host that found it, named ``name``."""
        async with self.store.tx():
            candidate = await self.store.candidate(identifier)
            if candidate is None:
                raise not_found("candidate", identifier)
            if await self.store.device(name) is not None:
                raise conflict("name_taken", f"a device named {name!r} exists already")
            try:
                await self.store.insert_adoption({"identifier": identifier, "name": name, "class": device_class,
                                                  "tags": tags, "host": candidate["host"], "adopted_by": admin,
                                                  "at": self.clock()})
            except UniqueViolation:
                raise conflict("adopted", f"{identifier} is adopted already, or {name!r} is taken") from None
            await self._audit(admin, "adopt", name, None, {"identifier": identifier, "host": candidate["host"]})
        self.notifier.changed(host_key(candidate["host"]))
        return {"identifier": identifier, "name": name, "host": candidate["host"],
                "note": f"{name} appears once exporter {candidate['host']} reports it (at its next heartbeat)"}

    async def record(self, actor: str, action: str, detail: dict) -> None:
        """An admin action that is not about a device or lease (tokens), for the audit log."""
        async with self.store.tx():
            await self._audit(actor, action, None, None, detail)

    async def audit(self, limit: int = 100) -> list[dict]:
        return [{"at": iso(a["at"]), "actor": a["actor"], "action": a["action"], "device": a["device"],
                 "lease": a["lease_id"], "detail": a["detail"]} for a in await self.store.audit(limit)]

    async def _end_lease(self, lease: dict, state: str, reason: str, actor: str) -> list[str]:
        """End a live lease and start reclaiming its device.

        Returns the notifier keys to wake once the transaction commits (none if the lease
        had ended already).
        """
        if not await self.store.end_lease(lease["id"], state, reason, self.clock()):
            return []
        await self.store.update_device(lease["device"], reclaim_lease=lease["id"])
        await self._refresh(lease["device"], f"lease {state}: {reason}", actor)
        device = await self.store.device(lease["device"])
        return [lease_key(lease["id"]), host_key(device["host"] or "")]

    # ---- the device lifecycle -------------------------------------------------------

    async def _refresh(self, name: str, cause: str, actor: str) -> None:
        """Recompute a device's state from its facts; log the change, if any."""
        device = await self.store.device(name)
        host = await self.store.host(device["host"]) if device["host"] else None
        lease = await self.store.live_lease_of(name)
        new = device_state(device, bool(host and host["online"]), lease["state"] if lease else None)
        if new == device["state"]:
            return
        now = self.clock()
        await self.store.update_device(name, state=new, updated_at=now)
        await self.store.add_device_log({"device": name, "at": now, "from_state": device["state"],
                                         "to_state": new, "cause": cause, "actor": actor}, LOG_KEEP)

    async def _audit(self, actor: str, action: str, device: str | None, lease_id: str | None, detail: dict) -> None:
        await self.store.add_audit({"at": self.clock(), "actor": actor, "action": action,
                                    "device": device, "lease_id": lease_id, "detail": detail})

    # ---- exporters -----------------------------------------------------------------

    async def heartbeat(self, host_name: str, report: HeartbeatIn, actor: str) -> dict:
        """Replace this host's snapshot (DESIGN §4) and answer with its desired state."""
        if report.protocol != PROTOCOL_VERSION:
            raise APIError(400, "protocol_mismatch",
                           f"exporter {host_name} speaks protocol {report.protocol}, this coordinator "
                           f"speaks {PROTOCOL_VERSION}: run the same device-loop version on both")
        try:
            async with self.store.tx():
                previous = await self.store.host(host_name)
                self._refuse_stale(host_name, previous, report)
                same_boot = previous is not None and previous["boot_id"] == report.boot_id
                if not (same_boot and report.generation == previous["generation"]):
                    changed_leases = await self._apply_snapshot(host_name, report, actor)
                else:
                    changed_leases = []
        except UniqueViolation:  # another coordinator process wrote the same row first
            raise conflict("concurrent_update", "another report changed these devices at the same time; "
                                                "the next heartbeat will go through") from None
        self.notifier.changed(host_key(host_name), *map(lease_key, changed_leases))
        return await self.desired(host_name)

    @staticmethod
    def _refuse_stale(host_name: str, previous: dict | None, report: HeartbeatIn) -> None:
        """An older generation of this boot, or a boot that a newer start replaced: 409."""
        if previous is None:
            return
        if report.boot_id in previous["superseded_boots"]:
            raise conflict("superseded_boot",
                           f"boot {report.boot_id} of exporter {host_name} was replaced by a newer start; "
                           f"if two exporters run with the name {host_name!r}, give each its own [exporter] name")
        if previous["boot_id"] == report.boot_id and report.generation < previous["generation"]:
            raise conflict("stale_heartbeat", f"generation {report.generation} is older than "
                                              f"{previous['generation']} for boot {report.boot_id}")

    async def _apply_snapshot(self, host_name: str, report: HeartbeatIn, actor: str) -> list[str]:
        now = self.clock()
        previous = await self.store.host(host_name)
        superseded = previous["superseded_boots"] if previous else []
        if previous and previous["boot_id"] != report.boot_id:
            superseded = (superseded + [previous["boot_id"]])[-8:]
        await self.store.save_host({
            "name": host_name, "boot_id": report.boot_id, "generation": report.generation,
            "protocol": report.protocol, "version": report.version, "heartbeat_s": report.heartbeat_s,
            "plugins": report.plugins.model_dump(),
            "services": [s.model_dump(exclude_none=True) for s in report.services],
            "superseded_boots": superseded, "last_seen": now, "online": not report.stopping,
        })
        if report.stopping:
            cause = f"exporter {host_name} stopped"
        elif previous and not previous["online"]:
            cause = "host is heartbeating again"
        else:
            cause = "exporter report"
        reported, claimed = set(), set()
        touched: set[str] = set()
        causes: dict[str, str] = {}
        for device in report.devices:
            owner = await self._owner_by_identifier(device, host_name)
            if owner is not None:
                claimed.add(owner)
                touched |= await self._claim(owner, host_name)
                continue
            row = await self.store.device(device.name)
            if row is not None and row["host"] not in (None, host_name):
                if row["present"] and await self._host_online(row["host"]):
                    claimed.add(device.name)
                    touched |= await self._claim(device.name, host_name)
                    continue
                await self._move(row, host_name, actor)
            if row is not None and not row["present"]:
                causes[device.name] = f"host {host_name} reports it again"
            if await self._store_device(host_name, device, row, report, now):
                causes[device.name] = "exporter confirmed: services stopped, no orphan holds it"
            reported.add(device.name)
            touched.add(device.name)
        for row in await self.store.devices_of_host(host_name):
            if row["name"] not in reported and row["present"]:
                await self.store.update_device(row["name"], present=False, updated_at=now)
                causes[row["name"]] = f"host {host_name} no longer reports it (unplugged?)"
                touched.add(row["name"])
        for row in await self.store.devices_claimed_by(host_name):
            if row["name"] not in claimed:
                await self.store.update_device(row["name"], conflict_host=None)
                touched.add(row["name"])
        for candidate in report.candidates:
            await self.store.save_candidate({**candidate.model_dump(), "host": host_name, "last_seen": now})
        activated = await self._activate_leases(host_name, report)
        causes |= dict.fromkeys(activated, "services up, endpoints published")
        for name in sorted(touched | {d["name"] for d in await self.store.devices_of_host(host_name)}):
            await self._refresh(name, causes.get(name, cause), actor)
        return list(activated.values())

    async def _owner_by_identifier(self, device, host_name: str) -> str | None:
        """The device that holds one of these identifiers on another live host, if any.

        On this host (a renamed device, a camera moved to another device in the config)
        or on a host that lost it, the identifier simply changes hands.
        """
        for resource in device.resources:
            row = await self.store.resource(resource.identifier)
            if row is None or row["device"] == device.name:
                continue
            owner = await self.store.device(row["device"])
            if owner["host"] != host_name and owner["present"] and await self._host_online(owner["host"]):
                return owner["name"]
        return None

    async def _host_online(self, name: str | None) -> bool:
        host = await self.store.host(name) if name else None
        return bool(host and host["online"])

    async def _claim(self, name: str, host_name: str) -> set[str]:
        """A second host reports a device another host owns: the first keeps it (conflict)."""
        row = await self.store.device(name)
        if row["conflict_host"] != host_name:
            await self.store.update_device(name, conflict_host=host_name)
        return {name}

    async def _move(self, row: dict, host_name: str, actor: str) -> None:
        """The owner lost the device (offline or unplugged) and another host has it now."""
        await self.store.update_device(row["name"], host=host_name, conflict_host=None)
        await self.store.add_device_log({"device": row["name"], "at": self.clock(), "from_state": row["state"],
                                         "to_state": row["state"], "actor": actor,
                                         "cause": f"moved from host {row['host']} to {host_name}"}, LOG_KEEP)

    async def _store_device(self, host_name: str, device, row: dict | None, report: HeartbeatIn, now: float) -> bool:
        """Record a device as its owner reports it; True if this report completes its reclaim."""
        health, reason = _worst_health(device.resources)
        fields = {"class": device.device_class, "tags": device.tags, "host": host_name, "present": True,
                  "health": health, "health_reason": reason,
                  "busy_by": [h.model_dump() for h in device.busy_by], "updated_at": now}
        reclaimed = bool(row and row["reclaim_lease"] and self._reclaimed(device, row["reclaim_lease"], report))
        if row is None:
            await self.store.insert_device({"name": device.name, "state": "unregistered", "reclaim_lease": None,
                                            "retired": False, "conflict_host": None, "created_at": now, **fields})
        else:
            if reclaimed:
                fields["reclaim_lease"] = None
            await self.store.update_device(device.name, **fields)
        await self.store.replace_resources(device.name, [
            {"identifier": r.identifier, "kind": r.kind, "plugin": r.plugin, "health": r.health, "reason": r.reason}
            for r in device.resources])
        return reclaimed

    @staticmethod
    def _reclaimed(device, lease_id: str, report: HeartbeatIn) -> bool:
        """The exporter has seen the lease end, runs nothing for the device, and no orphan holds it."""
        return (lease_id not in report.applied
                and not any(s.device == device.name for s in report.services)
                and not device.busy_by)

    async def _activate_leases(self, host_name: str, report: HeartbeatIn) -> dict[str, str]:
        """Pending leases whose every resource now has a running service: device -> lease id."""
        up = {(s.lease, s.identifier) for s in report.services if s.endpoints and not s.error}
        activated = {}
        for lease in await self.store.live_leases_on_host(host_name):
            if lease["state"] != "pending":
                continue
            resources = await self.store.resources_of(lease["device"])
            if resources and all((lease["id"], r["identifier"]) in up for r in resources):
                await self.store.activate_lease(lease["id"])
                activated[lease["device"]] = lease["id"]
        return activated

    async def desired(self, host_name: str) -> dict:
        """The services ``host_name`` should run, from the live leases on its devices."""
        services = []
        for lease in await self.store.live_leases_on_host(host_name):
            for r in await self.store.resources_of(lease["device"]):
                services.append({"lease": lease["id"], "holder": lease["holder"], "device": lease["device"],
                                 "identifier": r["identifier"], "kind": r["kind"], "plugin": r["plugin"],
                                 "secret": lease["secret"]})
        adopted = [{"identifier": a["identifier"], "name": a["name"], "class": a["class"], "tags": a["tags"]}
                   for a in await self.store.adoptions_on_host(host_name)]
        etag = hashlib.sha256(json.dumps([services, adopted], sort_keys=True).encode()).hexdigest()[:16]
        return {"services": services, "adopted": adopted, "etag": etag}

    async def _long_poll(self, key: str, read, done, wait_s: float, gone) -> dict:
        """``read()`` again at each change of ``key`` until ``done(value)``, ``wait_s`` runs
        out, or the caller has ``gone()`` away."""
        deadline = time.monotonic() + wait_s
        while True:
            event = self.notifier.watch(key)
            value = await read()
            remaining = deadline - time.monotonic()
            if done(value) or remaining <= 0 or await gone():
                return value
            await self.notifier.wait(event, remaining)

    async def wait_desired(self, host_name: str, etag: str | None, wait_s: float, gone) -> dict:
        """Long-poll: the desired state as soon as its etag differs from ``etag``."""
        return await self._long_poll(host_key(host_name), lambda: self.desired(host_name),
                                     lambda desired: desired["etag"] != etag, wait_s, gone)

    async def wait_lease(self, lease_id: str, caller: str, unless_state: str | None, wait_s: float, gone,
                         admin: bool = False) -> dict:
        """Long-poll: the lease as soon as its state is not ``unless_state``."""
        return await self._long_poll(lease_key(lease_id), lambda: self.lease_status(lease_id, caller, admin),
                                     lambda view: view["state"] != unless_state, wait_s, gone)

    # ---- time ------------------------------------------------------------------------

    async def reap(self) -> None:
        """Expire leases, fail allocations that took too long, mark silent hosts offline."""
        now, actor = self.clock(), "coordinator"
        changed: list[str] = []
        async with self.store.tx():
            for lease in await self.store.leases_past("expires_at", LIVE, now):
                changed += await self._end_lease(lease, "expired", "its ttl ran out", actor)
                await self._audit(actor, "expire", lease["device"], lease["id"], {})
            timeout = self.settings.allocating_timeout_s
            for lease in await self.store.leases_past("created_at", ("pending",), now - timeout):
                view = await self._lease_json(lease)
                reason = f"services did not come up within {format_duration(timeout)}"
                if view["reason"].startswith("service failed"):
                    reason += f" ({view['reason']})"
                changed += await self._end_lease(lease, "failed", reason, actor)
                await self._audit(actor, "fail", lease["device"], lease["id"], {"reason": reason})
            silent = await self.store.hosts_silent_since(
                now, self.settings.offline_after_periods, self.settings.offline_after_min_s)
            for host_name in silent:
                await self.store.set_host_offline(host_name)
                cause = f"host {host_name} stopped heartbeating"
                for device in await self.store.devices_claimed_by(host_name):
                    await self.store.update_device(device["name"], conflict_host=None)
                    await self._refresh(device["name"], cause + " (it claimed this device too)", actor)
                for device in await self.store.devices_of_host(host_name):
                    await self._refresh(device["name"], cause, actor)
            await self.store.drop_idempotency_keys_before(now - 86400)
        self.notifier.changed(*changed)
