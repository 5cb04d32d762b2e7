"""What the lab looks like to its users: devices, hosts, leases, logs. Reads only."""
from __future__ import annotations

from device_loop.core import FLASH_KIND
from device_loop.core.durations import iso
from device_loop.core.usage import commands

from .errors import not_found
from .holders import holder_json
from .lifecycle import Lifecycle
from .notify import lease_key
from .store import LIVE


def device_json(row: dict, admin: bool = False) -> dict:
    """A device as anyone sees it (``admin``: with the command lines of who else holds its nodes)."""
    return {
        "name": row["name"],
        "class": row["class"],
        "tags": row["tags"],
        "state": row["state"],
        "state_since": iso(row["state_since"]),  # when it entered that state
        "host": row["host"],
        "holder": row["holder"],
        "expires_at": iso(row["expires_at"]),
        "health": row["health"],
        "health_reason": row["health_reason"],
        # its owner first, then a host that claims it too (the owner keeps serving it)
        "conflict_hosts": [row["host"], row["conflict_host"]] if row["conflict_host"] else [],
        "busy_by": [holder_json(h, admin) for h in row["busy_by"]],  # public: program and pid only
        "resources": row["resources"],
        # a failed flash left it half-written: no lease until a known-good image is back on it
        "needs_recovery": row["needs_recovery"] is not None,
        "recovery_reason": row["needs_recovery"],
        "flashing": row["flash_op"],
    }


def lease_json(view: dict) -> dict:
    """A lease as its holder sees it, from ``Store.lease_view``'s row: with its endpoints
    once its services are up, and why not while they are not."""
    live = view["state"] in LIVE
    reachable = view["host_online"] and not view["host_link_lost"]
    services = [s for s in (view["host_services"] or []) if s["lease"] == view["id"]] if reachable else []
    up = {s["identifier"] for s in services if s["endpoints"] and not s.get("error")}
    resources = {r["identifier"] for r in view["resources"] if r["kind"] != FLASH_KIND}
    ready = view["state"] == "active" and view["device_state"] == "in_use" and bool(resources) and resources <= up
    answer = {
        "id": view["id"],
        "device": view["device"],
        "holder": view["holder"],
        "state": view["state"],
        "created_at": iso(view["created_at"]),
        "expires_at": iso(view["expires_at"]),
        "ended_at": iso(view["ended_at"]),
        "end_reason": view["end_reason"],
        "device_state": view["device_state"],
        "host": view["device_host"],
        "endpoints": [e for s in services for e in s["endpoints"]] if live else [],
        "ready": ready,
        "reason": "ready" if ready else _lease_reason(view, services),
        # the gate's password: only the holder (and admins) ever see a lease
        "secret": view["secret"] if live else None,
        "needs_recovery": view["needs_recovery"],  # why (a failed flash), or None
        "flashing": view["flashing"],  # the flash operation running on the device, if any
    }
    return answer | {"commands": commands(answer) if ready else []}  # how to use it, as its plugins said


def _lease_reason(view: dict, services: list[dict]) -> str:
    if view["state"] not in LIVE:
        return view["end_reason"] or view["state"]
    host = view["device_host"]
    if view["device_state"] == "offline":
        where = f"host {host}" if not view["host_online"] else "the device"
        return f"{where} is offline; the lease is kept and endpoints come back with it"
    if view["host_link_lost"]:
        return (f"the exporter on {host} lost its connection (did it die?); endpoints come back with its next "
                "heartbeat")
    errors = [s["error"] for s in services if s.get("error")]
    if errors:
        return "service failed to start: " + "; ".join(errors)
    if view["state"] == "pending":
        return f"waiting for exporter {host} to start the services"
    return f"exporter {host} is restarting the services; endpoints come back shortly"


class Views(Lifecycle):
    async def list_devices(self) -> list[dict]:
        return [device_json(d) for d in await self.store.devices()]

    async def device_info(self, name: str, admin: bool = False) -> dict:
        """A device as the board shows it; an admin also gets its live lease's id (to act on it)
        and the command lines of who else holds its nodes."""
        row = await self.store.device(name)
        if row is None:
            raise not_found("device", name)
        return device_json(row, admin) | ({"lease": row["lease_id"]} if admin else {})

    async def device_log(self, name: str) -> list[dict]:
        if await self.store.device(name) is None:
            raise not_found("device", name)
        return [{"at": iso(e["at"]), "from": e["from_state"], "to": e["to_state"],
                 "cause": e["cause"], "actor": e["actor"]} for e in await self.store.device_log(name)]

    async def hosts(self, only: str | None = None) -> list[dict]:
        now = self.clock()
        devices: dict[str, list[str]] = {}
        claims: dict[str, list[str]] = {}
        for row in await self.store.device_hosts():
            devices.setdefault(row["host"], []).append(row["name"])
            if row["conflict_host"]:
                claims.setdefault(row["conflict_host"], []).append(row["name"])
        return [{
            "name": h["name"], "online": h["online"], "protocol": h["protocol"],
            "version": h["version"], "boot_id": h["boot_id"], "generation": h["generation"],
            "heartbeat_s": h["heartbeat_s"], "heartbeat_age_s": round(now - h["last_seen"], 1),
            "draining": h["draining"], "last_seen": iso(h["last_seen"]), "plugins": h["plugins"],
            "link_lost": h["link_lost"],  # its long-poll was cut: up again at its next heartbeat
            "address": h["address"],  # its own, as its exporter reports it: where its endpoints are
            "devices": devices.get(h["name"], []),
            "claims": claims.get(h["name"], []),  # devices it reports that another host owns
        } for h in await self.store.hosts() if only in (None, h["name"])]

    async def host_address(self, name: str) -> str | None:
        """The address host ``name``'s exporter reported as its own (None: it did not say)."""
        host = await self.store.host(name)
        return host.get("address") if host else None

    async def _own_lease_view(self, lease_id: str, caller: str, admin: bool = False) -> dict:
        """The lease, if ``caller`` holds it (or is an admin); anyone else is told it does not exist."""
        view = await self.store.lease_view(lease_id)
        if view is None or (view["holder"] != caller and not admin):
            raise not_found("lease", lease_id)
        return view

    async def lease_status(self, lease_id: str, caller: str, admin: bool = False) -> dict:
        return lease_json(await self._own_lease_view(lease_id, caller, admin))

    async def my_leases(self, caller: str, device: str | None = None) -> list[dict]:
        """The caller's live leases; on one ``device``, their lease there, live or the last that ended."""
        if device is not None:
            view = await self.store.last_lease_view(caller, device)
            return [lease_json(view)] if view else []
        return [lease_json(v) for v in await self.store.live_lease_views_of_holder(caller)]

    async def wait_lease(self, lease_id: str, caller: str, unless_state: str | None, wait_s: float, gone,
                         admin: bool = False) -> dict:
        """Long-poll: the lease as soon as its state is not ``unless_state``."""
        return await self.notifier.long_poll(lease_key(lease_id), lambda: self.lease_status(lease_id, caller, admin),
                                             lambda view: view["state"] != unless_state, wait_s, gone)

    async def candidates(self) -> list[dict]:
        """What exporters found on the network and nobody adopted yet (and what they did)."""
        return [{"identifier": c["identifier"], "host": c["host"], "kind": c["kind"], "plugin": c["plugin"],
                 "label": c["label"], "last_seen": iso(c["last_seen"]), "adopted_as": c["adopted_as"]}
                for c in await self.store.candidates()]

    async def audit(self, limit: int = 100) -> list[dict]:
        return [{"at": iso(a["at"]), "actor": a["actor"], "action": a["action"], "device": a["device"],
                 "lease": a["lease_id"], "detail": a["detail"]} for a in await self.store.audit(limit)]
