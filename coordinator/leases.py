"""Leases (DESIGN §2): reserve, renew, release, and their end by time.

Each is one short transaction of a fixed number of statements, with the clock read
inside it. Exclusivity is the database's: a partial UNIQUE index allows one live lease a
device, so two coordinator processes on one PostgreSQL stay correct.
"""
from __future__ import annotations

import secrets

from device_loop.core import LEASE_PREFIX
from device_loop.core.durations import format_duration, iso

from .errors import APIError, conflict, not_found
from .notify import BOARD_KEY, host_key, lease_key
from .store import LIVE, UniqueViolation
from .views import Views, lease_json



def _view(lease: dict, device: dict, device_state: str) -> dict:
    """What ``lease_json`` reads, for a lease just begun or ended (no service runs for it)."""
    return {**lease, "device_state": device_state, "device_host": device["host"], "resources": device["resources"],
            "host_online": device["host_online"], "host_link_lost": False, "host_services": [],
            "needs_recovery": device["needs_recovery"], "flashing": device["flash_op"]}

class Leases(Views):
    async def reserve(self, device_name: str, ttl_s: float | None, caller: str, admin: bool = False) -> dict:
        ttl = self._check_ttl(ttl_s if ttl_s is not None else self.settings.default_ttl_s)
        async with self.store.tx():
            device = await self.store.device(device_name)
            if device is None:
                raise await self._unknown_device(device_name)
            await self._refuse_unless_free(device, caller)
            # counted by the database in one statement: concurrent reserves in several
            # processes cannot all see room for one more (admins are counted, not limited)
            limit = None if admin else self.settings.max_leases_per_user or None
            if not await self.store.count_lease(caller, limit):
                await self._refuse_hoarding(caller)
            now = self.clock()
            lease = {"id": LEASE_PREFIX + secrets.token_hex(8), "device": device_name, "holder": caller,
                     "state": "pending", "created_at": now, "expires_at": now + ttl,
                     "ended_at": None, "end_reason": None,
                     "secret": secrets.token_urlsafe(24) if self.settings.gated else None}
            try:
                await self.store.insert_lease(lease)
            except UniqueViolation:
                raise conflict("busy", f"{device_name} was just reserved by someone else") from None
            state = await self._change({**device, "lease_state": "pending"},
                                       f"reserved ({format_duration(ttl)})", caller)
            await self._audit(caller, "reserve", device_name, lease["id"], {"ttl_s": ttl})
            self._notify(host_key(device["host"] or ""))
            self.store.after_commit(self.metrics.leases_granted.inc)
        return lease_json(_view(lease, device, state))

    def _check_ttl(self, ttl_s: float) -> float:
        if not ttl_s >= 1 or ttl_s == float("inf"):  # REST's schema says so too; MCP comes here directly
            raise APIError(422, "invalid", f"ttl_s must be at least 1 second, not {ttl_s!r}")
        if ttl_s > self.settings.max_ttl_s:
            asked = f"of {format_duration(ttl_s)}" if ttl_s < 100 * 365 * 86400 else "of over a century"
            raise APIError(422, "ttl_too_long", f"a ttl {asked} is over this lab's maximum of "
                                                f"{format_duration(self.settings.max_ttl_s)}")
        return ttl_s

    async def _unknown_device(self, name: str) -> APIError:
        names = await self.store.device_names(10)
        hint = f"; known devices: {', '.join(names)}" if names else "; no device is registered yet"
        return APIError(404, "unknown_device", f"unknown device {name!r}{hint} (a configured device that no "
                                               "plugin serves is listed by 'device-loop hosts')")

    async def _refuse_unless_free(self, device: dict, caller: str) -> None:
        state, name = device["state"], device["name"]
        if state == "idle" and device["host_draining"]:
            raise conflict("draining", f"{name}'s host {device['host']} is being drained by an admin: "
                                       "no new leases there")
        if state == "idle" and not (device["needs_recovery"] or device["flash_op"]):
            return
        if device["lease_id"] is not None and device["holder"] == caller:
            raise conflict("already_yours", f"you hold {name} already: {device['lease_id']}, "
                                            f"until {iso(device['expires_at'])}")
        if device["lease_id"] is not None:
            message = f"{name} is held by {device['holder']} until {iso(device['expires_at'])}"
        elif device["flash_op"]:
            message = f"{name} is being flashed ({device['flash_op']}); it is free again when that ends"
        elif device["needs_recovery"]:
            message = (f"{name} needs recovery ({device['needs_recovery']}): no lease is granted until a "
                       f"known-good image is written back; an admin runs: device-loop recover {name}")
        elif state == "reclaiming":
            message = f"{name} is being reclaimed after its last lease; try again in a few seconds"
        elif state == "offline":
            message = f"{name} is offline (host {device['host']} not heartbeating or the device is unplugged)"
        elif state == "faulty":
            message = f"{name} is faulty: {device['health_reason'] or 'health check failed'}"
        else:
            message = f"{name} is {state}"
        alternative = await self.store.idle_device_of_class(device["class"], other_than=name)
        if alternative:
            message += f"; try {alternative}"
        code = ("busy" if device["lease_id"] or state == "reclaiming" or device["flash_op"] else
                "needs_recovery" if device["needs_recovery"] else state)
        raise conflict(code, message)

    async def _refuse_hoarding(self, caller: str) -> None:
        held = await self.store.live_leases_of_holder(caller)
        devices = ", ".join(lease["device"] for lease in held)
        raise conflict("too_many_leases", f"you hold {len(held)} leases ({devices}), this lab's limit per "
                                          f"person; release one first")

    async def renew(self, lease_id: str, ttl_s: float, caller: str, admin: bool = False) -> dict:
        ttl = self._check_ttl(ttl_s)
        async with self.store.tx():
            view = await self._own_lease_view(lease_id, caller, admin)
            if view["state"] not in LIVE:
                raise conflict("lease_ended", f"{lease_id} is {view['state']}; reserve the device again")
            view["expires_at"] = self.clock() + ttl
            if not await self.store.set_lease_expiry(lease_id, view["expires_at"]):
                raise conflict("lease_ended", f"{lease_id} ended just now; reserve the device again")
            await self._audit(caller, "renew", view["device"], lease_id, {"ttl_s": ttl})
            self._notify(lease_key(lease_id), BOARD_KEY)
        return lease_json(view)

    async def release(self, lease_id: str, caller: str, admin: bool = False) -> dict:
        async with self.store.tx():
            lease = await self.store.lease(lease_id)
            if lease is None or (lease["holder"] != caller and not admin):
                raise not_found("lease", lease_id)
            return await self._end_and_show(lease, "released", f"released by {caller}", caller, "release", {})

    async def revoke(self, lease_id: str, admin: str) -> dict:
        """An admin takes a lease back (``admin release --force``)."""
        async with self.store.tx():
            lease = await self.store.lease(lease_id)
            if lease is None:
                raise not_found("lease", lease_id)
            return await self._end_and_show(lease, "revoked", f"revoked by admin {admin}", admin, "revoke",
                                            {"holder": lease["holder"]})

    async def _end_and_show(self, lease: dict, state: str, reason: str, actor: str, action: str,
                            detail: dict) -> dict:
        """End ``lease`` (if still live; audited as ``action``) and show it as it is now."""
        device = await self._end_lease(lease, state, reason, actor)
        if device is None:  # it had ended already
            view = await self.store.lease_view(lease["id"])
            if view is None:  # and an admin has forgotten its device since
                raise conflict("lease_ended", f"{lease['id']} is {lease['state']} ({lease['end_reason']}), and its "
                                              f"device {lease['device']} is no longer in the lab")
            return lease_json(view)
        await self._audit(actor, action, lease["device"], lease["id"], detail)
        now_ended = {**lease, "state": state, "end_reason": reason, "ended_at": self.clock()}
        return lease_json(_view(now_ended, device, device["state"]))

    async def _end_lease(self, lease: dict, state: str, reason: str, actor: str, **still) -> dict | None:
        """End a live lease and start reclaiming its device; the device as it is now, or
        None if the lease had ended already (here or in another coordinator process), or
        is no longer what ``still`` says (``Store.end_lease``)."""
        if not await self.store.end_lease(lease["id"], state, reason, self.clock(), **still):
            return None
        device = await self.store.device(lease["device"])
        device["state"] = await self._change(device, f"lease {state}: {reason}", actor,
                                             {"reclaim_lease": lease["id"]})
        self._notify(lease_key(lease["id"]), host_key(device["host"] or ""))
        self.store.after_commit(self.metrics.leases_ended.labels(reason=state).inc)
        return device

    async def _end_overdue_leases(self, now: float, actor: str) -> None:
        """Expire leases past their ttl; fail those whose services never came up."""
        for lease in await self.store.leases_past("expires_at", LIVE, now):
            if await self._end_lease(lease, "expired", "its ttl ran out", actor, overdue=True):
                await self._audit(actor, "expire", lease["device"], lease["id"], {})
        timeout = self.settings.allocating_timeout_s
        for lease in await self.store.leases_past("created_at", ("pending",), now - timeout):
            view = lease_json(await self.store.lease_view(lease["id"]))
            reason = f"services did not come up within {format_duration(timeout)}"
            if view["reason"].startswith("service failed"):
                reason += f" ({view['reason']})"
            if await self._end_lease(lease, "failed", reason, actor, pending=True):
                await self._audit(actor, "fail", lease["device"], lease["id"], {"reason": reason})
