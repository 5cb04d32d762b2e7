"""What only admins do: retire devices, drain hosts, adopt network candidates, forget
devices and hosts that will not come back."""
from __future__ import annotations

from typing import Any

from device_loop.core import POWER_KIND
from device_loop.core.durations import format_duration, iso
from device_loop.core.scopes import (CALL_OPERATIONS, DATA_PLANE_OPERATIONS, POWER_OPERATIONS, TokenScope,
                                     data_plane_operation)
from device_loop.core.vocabulary import Band, FaultKind, LeaseState, OperationState
from pydantic import ValidationError

from device_loop.core.answers import DeviceAnswer, HostAnswer
from device_loop.core.errors import ErrorCode
from . import kinds
from .devices import Devices
from .errors import APIError, conflict, not_found
from .identity import check_token_scope, scope_text, stored_scope
from .leases import Leases
from .lifecycle import NO_FAULT, Lifecycle, fault, switched_off
from .notify import BOARD_KEY, host_key, op_key
from .operations import kinds_of
from .rows import DeviceFacts, TokenRow
from .scheduler import Scheduler
from .store import Store, UniqueViolation
from .store.devices import DeviceQueries
from .store.hosts import HostQueries
from .store.leases import LeaseQueries
from .store.operations import OperationQueries
from .store.tokens import TokenQueries


class Admin:
    """What only admins do; each action in the audit log."""

    def __init__(self, life: Lifecycle, devices: Devices, leases: Leases, scheduler: Scheduler, *,
                 hosts_sql: HostQueries, devices_sql: DeviceQueries, leases_sql: LeaseQueries,
                 operations_sql: OperationQueries, tokens_sql: TokenQueries):
        self.life, self.devices, self.leases, self.scheduler = life, devices, leases, scheduler
        self.store: Store = life.store
        self.hosts_sql = hosts_sql
        self.devices_sql = devices_sql
        self.leases_sql = leases_sql
        self.operations_sql = operations_sql
        self.tokens_sql = tokens_sql

    async def retire(self, name: str, admin: str, retired: bool = True, force: bool = False) -> DeviceAnswer:
        """Take a device out of the lab (a live lease is revoked only with ``force``), or bring it back."""
        async with self.store.tx():
            await self.leases_sql.lock_host_of_device(name)
            device = await self.devices_sql.device(name)
            if device is None:
                raise not_found("device", name)
            lease_id = device["lease_id"]
            if retired and lease_id and not force:
                raise conflict(ErrorCode.LEASED, f"{name} is leased by {device['holder']}; retiring it with --force "
                                                 "revokes that lease")
            if retired and lease_id:
                lease = await self.leases_sql.lease(lease_id)
                assert lease is not None  # the device's live lease, read in this same transaction
                device = await self.leases.end(lease, LeaseState.REVOKED, f"device retired by admin {admin}",
                                               admin) or device
            await self.life.change(device, f"{'retired' if retired else 'returned'} by admin {admin}", admin,
                               {"retired": retired})
            await self.life.audit(admin, "retire" if retired else "unretire", name, lease_id, {})
            if not retired:
                await self.scheduler.grant_free([name])
            else:
                await self.scheduler.end_none_can_serve(device, admin)
        return await self.devices.device_info(name)

    async def clear_fault(self, name: str, admin: str) -> DeviceAnswer:
        """Clear the fault a failed step between leases left (docs/architecture.md, "Steps
        between leases"), a permanent health failure or an admin left ("Health that heals"),
        or the one an unverified power on left once an admin saw the board run, or two lab failures
        in a row left ("Lab failures"): the device is
        idle again, and goes to the first ticket waiting for it. A board switched off stays
        faulty until a power on is verified (docs/architecture.md, "Power")."""
        async with self.store.tx():
            await self.leases_sql.lock_host_of_device(name)
            device = await self.devices_sql.device(name)
            if device is None:
                raise not_found("device", name)
            if not device["fault"]:
                why = f": {device['health_reason']}" if device["health_reason"] else ""
                raise conflict(ErrorCode.NO_FAULT, f"{name} has no fault to clear (it is {device['state']}{why})")
            if switched_off(device["fault"], device["fault_kind"]):
                raise conflict(ErrorCode.SWITCHED_OFF, f"{name} was switched off ({device['fault']}); only a power on "
                                                       f"that is verified clears that: device-loop power on {name}")
            # its lab failures in a row start again from none (docs/architecture.md, "Lab failures")
            await self.life.change(device, f"fault cleared by admin {admin} (was: {device['fault']})", admin,
                                   {**NO_FAULT, "lab_failures": 0})
            await self.life.audit(admin, "clear_fault", name, None, {"fault": device["fault"]})
            await self.scheduler.grant_free([name])
        return await self.devices.device_info(name)

    async def mark_faulty(self, name: str, reason: str, admin: str) -> DeviceAnswer:
        """Mark a device faulty by hand, with why (docs/architecture.md, "Health that heals"):
        the fault stays until an admin clears it, whatever its health says meanwhile. A device
        that has a fault keeps it (409: clear it first), so no fault's kind is lost."""
        async with self.store.tx():
            await self.leases_sql.lock_host_of_device(name)
            device = await self.devices_sql.device(name)
            if device is None:
                raise not_found("device", name)
            if device["fault"]:
                raise conflict(ErrorCode.HAS_FAULT, f"{name} already has a fault ({device['fault']}); an admin "
                                                     f"clears it first: device-loop admin clear-fault {name}")
            words = f"marked faulty by admin {admin}: {reason}"
            await self.life.change(device, words, admin, fault(FaultKind.MARKED_FAULTY, words))
            await self.life.audit(admin, "mark_faulty", name, None, {"reason": reason})
        return await self.devices.device_info(name)

    async def drain(self, host_name: str, admin: str, draining: bool = True) -> HostAnswer:
        """No new leases on a host's devices (live ones run out), or lift that."""
        async with self.store.tx():
            if await self.hosts_sql.host(host_name) is None:
                raise not_found("host", host_name)
            await self.hosts_sql.set_host_draining(host_name, draining)
            await self.life.audit(admin, "drain" if draining else "undrain", None, None, {"host": host_name})
            if not draining:
                await self.scheduler.grant_free([d["name"] for d in await self.devices_sql.devices_of_host(host_name)])
        return (await self.devices.hosts(only=host_name))[0]

    async def adopt(self, identifier: str, name: str, device_class: str, tags: list[str], admin: str) -> dict[str, Any]:
        """Make a network candidate a device of the host that found it, named ``name``."""
        async with self.store.tx():
            candidate = await self.hosts_sql.candidate(identifier)
            if candidate is None:
                raise not_found("candidate", identifier)
            if await self.devices_sql.device(name) is not None:
                raise conflict(ErrorCode.NAME_TAKEN, f"a device named {name!r} exists already")
            try:
                await self.hosts_sql.insert_adoption({"identifier": identifier, "name": name, "class": device_class,
                                                      "tags": tags, "host": candidate["host"], "adopted_by": admin,
                                                      "at": self.life.clock()})
            except UniqueViolation:
                raise conflict(ErrorCode.ADOPTED, f"{identifier} is adopted already, or {name!r} is taken") from None
            await self.life.audit(admin, "adopt", name, None, {"identifier": identifier, "host": candidate["host"]})
            self.life.notify(host_key(candidate["host"]))
        return {"identifier": identifier, "name": name, "host": candidate["host"],
                "note": f"{name} appears once exporter {candidate['host']} reports it (at its next heartbeat)"}

    async def forget(self, name: str, kind: str | None, admin: str) -> dict[str, Any]:
        """Delete a device, or a host with its devices, for good: only while offline and
        unleased (a host: all its devices). Leases, flashes and the audit log keep their
        history; a device or host that reports again later is registered anew."""
        async with self.store.tx():
            kind = kind or await self._device_or_host(name)
            devices = await (self._host_devices_to_forget(name) if kind == "host" else self._device_to_forget(name))
            for device in devices:
                self._refuse_to_forget(device)
            for device in devices:
                await self._forget_operation(device, admin)
                running = {"operation": device["op_id"]} if device["op_id"] else {}
                await self.life.audit(admin, "forget", device["name"], None, {"host": device["host"], **running})
            names = [d["name"] for d in devices]
            if names:
                await self.devices_sql.forget_devices(names)
            if kind == "host":
                await self.devices_sql.drop_claims(name)
                await self.hosts_sql.forget_host(name)
                await self.life.audit(admin, "forget_host", None, None, {"host": name, "devices": names})
            self.life.notify(BOARD_KEY)
        return {"forgotten": kind, "name": name, "devices": names}

    async def _host_devices_to_forget(self, name: str) -> list[DeviceFacts]:
        host = await self.hosts_sql.host(name, for_update=True)  # its heartbeats wait for this transaction
        if host is None:
            raise not_found("host", name)
        if host["online"]:
            raise conflict(ErrorCode.ONLINE, f"host {name} is online (it reported at {iso(host['last_seen'])}): "
                                             "stop its exporter, then forget it")
        owned = [d for d in await self.devices_sql.devices_of_host(name) if d["host"] == name]  # (not its claims)
        return sorted(owned, key=lambda d: d["name"])

    async def _device_to_forget(self, name: str) -> list[DeviceFacts]:
        device = await self.devices_sql.device(name)
        if device is not None and device["host"] is not None:
            await self.hosts_sql.host(device["host"], for_update=True)
            device = await self.devices_sql.device(name)  # as it is now that no heartbeat can change it
        if device is None:
            raise not_found("device", name)
        return [device]

    async def _device_or_host(self, name: str) -> str:
        device, host = await self.devices_sql.device(name), await self.hosts_sql.host(name)
        if device is not None and host is not None:
            raise conflict(ErrorCode.AMBIGUOUS, f"a device and a host are both named {name!r}: say which one "
                                                "(--device or --host)")
        if device is None and host is None:
            raise APIError(404, ErrorCode.UNKNOWN_NAME, f"no device or host is named {name!r}")
        return "device" if device is not None else "host"

    @staticmethod
    def _refuse_to_forget(device: DeviceFacts) -> None:
        name = device["name"]
        if device["host_online"] and device["present"]:
            raise conflict(ErrorCode.ONLINE, f"{name} is not offline: host {device['host']} still reports it. Take it "
                                             f"out of that exporter's config (or unplug it) first; 'admin retire' "
                                             "keeps it out of use meanwhile")
        if device["lease_id"]:
            raise conflict(ErrorCode.LEASED, f"{name} is leased by {device['holder']} until "
                                             f"{iso(device['expires_at'])}: take that lease back first (device-loop "
                                             f"admin release {name} --force)")
        if device["op_id"] and device["host_online"]:
            raise conflict(kinds.of(device["op_kind"]).busy_code,
                           f"{name} has an operation running on host {device['host']} ({device['op_id']}, "
                           f"{device['op_kind']}): forget it once that has ended")

    async def _forget_operation(self, device: DeviceFacts, admin: str) -> None:
        """An operation left on a device of an offline host would wait for that host for ever:
        it fails with its device."""
        if device["op_id"]:
            await self.operations_sql.update_operation(device["op_id"], {
                         "state": OperationState.FAILED, "ended_at": self.life.clock(),
                         "message": f"its device was forgotten by admin {admin}"})
            self.life.notify(op_key(device["op_id"]))

    async def tokens(self) -> list[TokenRow]:
        """Every token (its hash among the rest: the caller shows ``identity.token_view``)."""
        return await self.tokens_sql.tokens()

    async def revoke_token(self, token_id: str, admin: str) -> dict[str, Any]:
        async with self.store.tx():
            token = await self.tokens_sql.token(token_id)
            if token is None:
                raise not_found("token", token_id)
            if token["revoked_at"] is not None:
                raise conflict(ErrorCode.ALREADY_REVOKED,
                               f"token {token_id} was revoked already, at {iso(token['revoked_at'])}")
            await self.tokens_sql.revoke_token(token_id, self.life.clock())
            await self.life.audit(admin, "token_revoke", None, None, {"id": token_id})
        return {"id": token_id, "revoked": True}

    async def judge_scope(self, scope: TokenScope | None) -> None:
        """Refuse (422, the field named) what in ``scope`` only the lab can judge
        (docs/architecture.md, "Shares of one lab"): a class no device has, an operation
        nothing runs (not a call's, not a power action, not a kind some device's resources
        run, not the data plane: its words, or a resource kind some device has), a longest
        lease beyond the lab's longest lease."""
        if scope is None:
            return
        max_ttl_s = self.life.settings.max_ttl_s
        if scope.max_lease_s is not None and scope.max_lease_s > max_ttl_s:
            raise APIError(422, ErrorCode.INVALID, f"scope.max_lease_s: {format_duration(scope.max_lease_s)} is "
                                                   f"longer than this lab's longest lease, "
                                                   f"{format_duration(max_ttl_s)}")
        if scope.classes:
            known = await self.devices_sql.device_classes()
            unknown = [name for name in scope.classes if name not in known]
            if unknown:
                raise APIError(422, ErrorCode.INVALID, f"scope.classes: no device has class {_named(unknown)} "
                                                       f"(classes: {_named(known) or 'none yet'})")
        if scope.operations:
            runnable = {*CALL_OPERATIONS, *POWER_OPERATIONS, *DATA_PLANE_OPERATIONS}
            if not set(scope.operations) <= runnable:
                devices = await self.devices_sql.devices()
                runnable |= {kind for device in devices for kind in kinds_of(device)}
                runnable |= {data_plane_operation(r["kind"]) for device in devices for r in device["resources"]
                             if r.get("service", True)}
                runnable.discard(POWER_KIND)  # (a power action is named: power.cycle)
            unknown = [name for name in scope.operations if name not in runnable]
            if unknown:
                raise APIError(422, ErrorCode.INVALID, f"scope.operations: nothing here runs {_named(unknown)} "
                                                       f"(name {', '.join(CALL_OPERATIONS)}, "
                                                       f"{', '.join(POWER_OPERATIONS)}, the endpoints' "
                                                       f"{', '.join(DATA_PLANE_OPERATIONS)}, or a kind device_info "
                                                       f"lists)")

    async def set_token(self, token_id: str, scope: TokenScope | None, band: Band | None, unscoped: bool,
                        admin: str) -> TokenRow:
        """Change a token's scope (the fields ``scope`` was given replace the token's; ``unscoped``
        takes it away) or band in place: its next call is held to them, no new token."""
        if unscoped and scope is not None:
            raise APIError(422, ErrorCode.INVALID, "unscoped: a token is unscoped or given a scope, not both")
        async with self.store.tx():  # (read, merged and written under its row's lock: two admins' changes both hold)
            token = await self.tokens_sql.token(token_id, for_update=True)
            if token is None:
                raise not_found("token", token_id)
            if token["revoked_at"] is not None:
                raise conflict(ErrorCode.ALREADY_REVOKED, f"token {token_id} was revoked at {iso(token['revoked_at'])}")
            stored = stored_scope(token["scope"])  # (as stored: one that no longer holds is set again here)
            if scope is not None:
                given = scope.model_dump(include=scope.model_fields_set)
                try:
                    scope = TokenScope.model_validate({**(stored or {}), **given})
                except ValidationError as exc:  # (each field was valid; only together, or with what it kept, not)
                    error = exc.errors()[0]
                    field = ".".join(str(part) for part in error["loc"])
                    raise APIError(422, ErrorCode.INVALID, f"scope{'.' + field if field else ''}: "
                                                           f"{error['msg']}") from None
            text = None if unscoped else scope_text(scope) if scope is not None else token["scope"]
            new_band = Band(band or token["band"])
            # (a scope kept as it is: any scope is one, for what takes none)
            check_token_scope(bool(token["admin"]), token["host"], None if text is None else scope or TokenScope(),
                              new_band)
            await self.judge_scope(scope)
            await self.tokens_sql.set_scope(token_id, text, new_band)
            await self.life.audit(admin, "token_set", None, None, {
                "id": token_id, "band": new_band, "scope": stored_scope(text)})
        updated = await self.tokens_sql.token(token_id)
        assert updated is not None  # (tokens are revoked, never deleted)
        return updated

    async def record(self, actor: str, action: str, detail: dict[str, Any]) -> None:
        """An admin action that is not about a device or lease (tokens), for the audit log."""
        async with self.store.tx():
            await self.life.audit(actor, action, None, None, detail)


def _named(names: list[str]) -> str:
    """Names in a refusal, bounded (a scope may list 64, a lab have hundreds of classes)."""
    shown = ", ".join(repr(name) for name in names[:8])
    return shown + (f" and {len(names) - 8} more" if len(names) > 8 else "")
