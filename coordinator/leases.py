"""Leases (docs/architecture.md, "Leases"): reserve, renew, release, their end by time,
and what a lease's holder sees of it.

Each is one short transaction of a fixed number of statements, with the clock read
inside it. Exclusivity is the database's: a partial UNIQUE index allows one live lease a
device, so two coordinator processes on one PostgreSQL stay correct.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from device_loop.core import FLASH_KIND, LEASE_PREFIX
from device_loop.core.durations import format_duration, iso
from device_loop.core.gate import gate_secret
from device_loop.core.needs import ANY_DEVICE, Need
from device_loop.core.scopes import TokenScope, allows, data_plane_operation
from device_loop.core.usage import commands
from device_loop.core.vocabulary import LIVE_LEASE_STATES, DeviceState, LeaseState

from device_loop.core.answers import CdiAnswer, LeaseAnswer
from device_loop.core.cdi_spec import CdiRefused, cdi_spec, spec_file_name
from device_loop.core.protocol import EnvironmentReport
from device_loop.core.errors import ErrorCode
from . import kinds, lease_scope
from .budgets import NO_HOLD, Budgets, Hold, Spender, used_of
from .devices import Devices, running_operation
from .errors import APIError, conflict, not_found
from .identity import parsed_scope
from .lifecycle import Lifecycle, held_off, switched_off
from .notify import BOARD_KEY, host_key, lease_key
from .rows import DeviceFacts, LeaseRow, LeaseView
from .store import Store
from .who import Who
from .store.devices import DeviceQueries
from .store.leases import LeaseQueries


def describe_want(device: str | None, device_class: str | None, tags: list[str], need: Need = ANY_DEVICE) -> str:
    """What a reserve or a ticket asks for, in words: ``of class riscv-sbc with tags rvv, 8gb``,
    and what it may run on (``(needs any, real-hw after 60s)``)."""
    needs = f" ({need.words()})" if need.needs is not None else ""
    if device is not None:
        return device + needs
    words = [f"of class {device_class}"] if device_class else []
    if tags:
        words.append(f"with tag{'s' if len(tags) > 1 else ''} {', '.join(tags)}")
    return (" ".join(words) or "of any class") + needs


def lapse(now: float, ttl: float, keepalive_s: float | None) -> float:
    """When a lease granted or renewed at ``now`` for ``ttl`` expires: its end, or for a
    keepalive lease ``keepalive_s`` from now if that comes first (docs/architecture.md,
    "Leases that live as long as their client")."""
    return now + ttl if keepalive_s is None else min(now + keepalive_s, now + ttl)


def expiry_reason(lease: LeaseRow) -> str:
    """Why ``lease``, past its ``expires_at``, ended: its ttl ran out, or (a keepalive lease that
    lapsed before its end) its client stopped renewing."""
    keepalive, ends_at = lease["keepalive_s"], lease["ends_at"]
    if keepalive is not None and (ends_at is None or lease["expires_at"] < ends_at):
        return f"its client stopped renewing (keepalive {format_duration(keepalive)})"
    if lease.get("budget_capped"):  # (docs/architecture.md, "Shares of one lab": granted only to the budget's end)
        return "its token's budget ran out (it was granted only to the budget's end)"
    return "its ttl ran out"


@dataclass(frozen=True)
class Sight:
    """Which parts of a lease's data plane an answer shows (docs/architecture.md, "Shares of
    one lab"): those that each of ``scopes`` allows (``core.scopes.data_plane_operation``) —
    its reader's token's and the one it was reserved with (a job's lease: its submitter's).
    ``EVERY_PART``: the coordinator's own reach (a relayed exchange, exec, a fingerprint),
    which a call's own scope check allowed first."""
    scopes: tuple[TokenScope | None, ...]

    def shows(self, operation: str) -> bool:
        return all(allows(scope, operation) for scope in self.scopes)


EVERY_PART = Sight(())
#: A scope that no longer holds as stored shows no part of the data plane.
_NONE_OF_IT = TokenScope(operations=())


def seen_by(who: Who, view: LeaseView) -> Sight:
    """What ``who`` is shown of ``view``'s data plane."""
    text = view.get("token_scope")
    reserved_with = None if text is None else (parsed_scope(text) or _NONE_OF_IT)
    return Sight((who.scope, reserved_with))


def lease_json(view: LeaseView, sight: Sight) -> LeaseAnswer:
    """A lease as its holder sees it, from ``Store.lease_view``'s row: with its endpoints
    once its services are up, and why not while they are not. An endpoint shows only where
    ``sight`` allows its part of the data plane, with its gate's secret (``gate_secret``):
    a part withheld is neither listed nor opened by another part's secret."""
    live = view["state"] in LIVE_LEASE_STATES
    reachable = view["host_online"] and not view["host_link_lost"]
    services = [s for s in (view["host_services"] or []) if s["lease"] == view["id"]] if reachable else []
    up = {s["identifier"] for s in services if (s["endpoints"] or s.get("environment")) and not s.get("error")}
    resources = {r["identifier"] for r in view["resources"] if r.get("service", True)}
    ready = (view["state"] == LeaseState.ACTIVE and view["device_state"] == DeviceState.IN_USE and bool(resources)
             and resources <= up)
    answer: LeaseAnswer = {
        "id": view["id"],
        "device": view["device"],
        "holder": view["holder"],
        "state": view["state"],
        "created_at": iso(view["created_at"]),
        "expires_at": iso(view["expires_at"]),
        "keepalive_s": view["keepalive_s"],
        "ends_at": iso(view["ends_at"] if view["ends_at"] is not None else view["expires_at"]),
        "budget_capped": bool(view["budget_capped"]),
        "ended_at": iso(view["ended_at"]),
        "end_reason": view["end_reason"],
        "device_state": view["device_state"],
        "host": view["device_host"],
        "endpoints": _shown_endpoints(services, view["secret"], sight) if live else [],
        "withheld": sorted({part for s in services if not sight.shows(part := data_plane_operation(s["kind"]))})
        if live else [],
        "ready": ready,
        "reason": "ready" if ready else _lease_reason(view, services),
        "needs_recovery": view["needs_recovery"],  # why (a failed destructive operation), or None
        # by whom and when, while a person's power off holds
        "switched_off": switched_off(view["device_fault"], view["device_fault_kind"]),
        "operation": running_operation(view["op_id"], view["op_kind"]),  # the exclusive one running on it
        "flashing": view["op_id"] if view["op_kind"] == FLASH_KIND else None,
        "commands": [],
    }
    if ready:
        answer["commands"] = commands(answer)  # how to use it, as its plugins said
    return answer


def _shown_endpoints(services: list[dict[str, Any]], secret: str | None, sight: Sight) -> list[Any]:
    """The endpoints of ``services`` that ``sight`` shows, each with the scope operation it
    needs and its gate's secret (None in a lab without gates). Only the holder (and admins)
    ever see a lease."""
    shown = []
    for service in services:
        operation = data_plane_operation(service["kind"])
        if sight.shows(operation):
            part = gate_secret(secret, operation) if secret else None
            shown += [{**endpoint, "scope": operation, "secret": part} for endpoint in service["endpoints"]]
    return shown


def _lease_reason(view: LeaseView, services: list[dict[str, Any]]) -> str:
    if view["state"] not in LIVE_LEASE_STATES:
        return view["end_reason"] or view["state"]
    host = view["device_host"]
    if view["device_state"] == DeviceState.OFFLINE:
        where = f"host {host}" if not view["host_online"] else "the device"
        return f"{where} is offline; the lease is kept and endpoints come back with it"
    if view["host_link_lost"]:
        return (f"the exporter on {host} lost its connection (did it die?); endpoints come back with its next "
                "heartbeat")
    errors = [s["error"] for s in services if s.get("error")]
    if errors:
        return "service failed to start: " + "; ".join(errors)
    if view["state"] == LeaseState.PENDING:
        return f"waiting for exporter {host} to start the services"
    return f"exporter {host} is restarting the services; endpoints come back shortly"


def _view(lease: LeaseRow, device: DeviceFacts, device_state: DeviceState) -> LeaseView:
    """What ``lease_json`` reads, for a lease just begun or ended (no service runs for it)."""
    return {**lease, "device_state": device_state, "device_host": device["host"], "resources": device["resources"],
            "host_online": device["host_online"], "host_link_lost": False, "host_services": [],
            "needs_recovery": device["needs_recovery"], "device_fault": device["fault"],
            "device_fault_kind": device["fault_kind"], "op_id": device["op_id"],
            "op_kind": device["op_kind"], "token_scope": None}


class Leases:
    """Who holds which device, until when."""

    def __init__(self, life: Lifecycle, devices: Devices, budgets: Budgets, *,
                 leases_sql: LeaseQueries, devices_sql: DeviceQueries):
        self.life, self.devices, self.budgets = life, devices, budgets
        self.store: Store = life.store
        self.leases_sql = leases_sql
        self.devices_sql = devices_sql

    # ---- what a holder sees -----------------------------------------------------------------

    async def secret(self, lease_id: str) -> str | None:
        """The secret of ``lease_id`` while it lives (it dies with the lease), else None."""
        lease = await self.leases_sql.lease(lease_id)
        return lease["secret"] if lease else None

    async def own_view(self, lease_id: str, who: Who) -> LeaseView:
        """The lease, if ``who`` may act on it (docs/architecture.md, "Who may act on what");
        anyone else is told it does not exist."""
        view = await self.leases_sql.lease_view(lease_id)
        if view is None or not who.may_act_on(view["holder"]):
            raise not_found("lease", lease_id)
        return view

    async def live_view(self, lease_id: str, who: Who, doing: str) -> LeaseView:
        """``own_view`` of a lease that still lives (``doing`` what needs it, for the refusal)."""
        view = await self.own_view(lease_id, who)
        if view["state"] not in LIVE_LEASE_STATES:
            raise conflict(ErrorCode.LEASE_ENDED, f"{lease_id} is {view['state']}: reserve {view['device']} again to "
                                                  f"{doing}")
        return view

    async def status(self, lease_id: str, who: Who) -> LeaseAnswer:
        view = await self.own_view(lease_id, who)
        return lease_json(view, seen_by(who, view))

    async def reached(self, lease_id: str, who: Who) -> LeaseAnswer:
        """The lease as the coordinator itself reaches it for ``who`` (a relayed exchange, exec,
        a fingerprint): every endpoint, with its gate's secret. Never an answer: the call's
        scope check allowed what it does with it."""
        return lease_json(await self.own_view(lease_id, who), EVERY_PART)

    async def cdi(self, lease_id: str, who: Who) -> CdiAnswer:
        """The lease's CDI spec, made from the environments its exporter reported with its
        services as the exporter made the file (docs/architecture.md, "Containers and CDI")."""
        view = await self.live_view(lease_id, who, "use it in a container")
        reachable = view["host_online"] and not view["host_link_lost"]
        services = sorted((s for s in (view["host_services"] or []) if s["lease"] == lease_id and not s.get("error")),
                          key=lambda s: s["identifier"]) if reachable else []
        if not services:
            raise conflict(ErrorCode.NOT_READY, f"{lease_id} has no service up yet: "
                                                f"{lease_json(view, seen_by(who, view))['reason']}")
        device = await self.devices_sql.device(view["device"])
        if device is None:  # (forgotten meanwhile: an admin's forget refuses a leased device, but says it)
            raise not_found("device", view["device"])
        sight = seen_by(who, view)  # (a container's part of the data plane is its resources' too)
        environments = [EnvironmentReport.model_validate(s["environment"]) for s in services
                        if s.get("environment") and sight.shows(data_plane_operation(s["kind"]))]
        try:
            spec = cdi_spec(device["class"], view["device"], environments)
        except CdiRefused as exc:
            raise conflict(ErrorCode.NO_CDI_SPEC, f"{exc}; no CDI spec is written for it") from None
        if spec is None:
            kinds = ", ".join(sorted({s["kind"] for s in services}))
            raise conflict(ErrorCode.NO_CDI_SPEC, f"{view['device']} has nothing a container can use: its "
                                                  f"resources' plugins ({kinds}) state no container environment")
        host = view["device_host"]
        return {"lease": lease_id, "device": view["device"], "host": host, "device_name": spec.qualified,
                "cdi_version": spec.version, "file": spec_file_name(host or "", lease_id), "spec": spec.spec,
                "note": spec.note()}

    async def mine(self, who: Who, device: str | None = None) -> list[LeaseAnswer]:
        """The caller's live leases; on one ``device``, their lease there, live or the last that ended."""
        if device is not None:
            view = await self.leases_sql.last_lease_view(who.name, device)
            return [lease_json(view, seen_by(who, view))] if view else []
        return [lease_json(v, seen_by(who, v)) for v in await self.leases_sql.live_lease_views_of_holder(who.name)]

    async def wait(self, lease_id: str, who: Who, unless_state: str | None, wait_s: float,
                   gone: Callable[[], Awaitable[None]]) -> LeaseAnswer:
        """Long-poll: the lease as soon as its state is not ``unless_state``."""
        return await self.life.notifier.long_poll(lease_key(lease_id), lambda: self.status(lease_id, who),
                                                  lambda view: view["state"] != unless_state, wait_s, gone)

    # ---- reserve, renew, release ------------------------------------------------------------

    async def reserve(self, device_name: str, ttl_s: float | None, who: Who, need: Need = ANY_DEVICE,
                      keepalive_s: float | None = None) -> LeaseAnswer:
        """Reserve the device called ``device_name`` (or say why not, and what else is free),
        if it is what ``need`` takes (docs/architecture.md, "Who gets the next lease"); with
        ``keepalive_s``, a keepalive lease ("Leases that live as long as their client")."""
        ttl = self.lease_ttl(ttl_s, keepalive_s, who)
        async with self.store.tx():
            await self.leases_sql.lock_host_of_device(device_name)  # (docs/architecture.md, "Leases": the lock order)
            device = await self.devices_sql.device(device_name)
            if device is None:
                raise await self.devices.unknown(device_name)
            self._refuse_unless_needed(device, need)
            lease_scope.check_device(who.scope, device)
            await self._refuse_unless_free(device, who.name)
            answer = await self.grant(device, ttl, who.name, who.limited,
                                      f"reserved ({self._length(ttl, keepalive_s)})", keepalive_s=keepalive_s,
                                      spender=Spender.of(who))
            if answer is None:
                raise conflict(ErrorCode.BUSY, f"{device_name} was just reserved by someone else")
            return answer

    async def reserve_matching(self, device_class: str | None, tags: list[str], ttl_s: float | None,
                               who: Who, need: Need = ANY_DEVICE, keepalive_s: float | None = None,
                               image_sha256: str | None = None) -> LeaseAnswer:
        """Reserve a free device of ``device_class`` with all of ``tags`` that ``need`` takes: the
        one idle the longest, virtual ones first for ``needs = "any"`` (docs/architecture.md,
        "Who gets the next lease"), and before all those whose last flash wrote and read back
        image ``image_sha256`` ("Leases that live as long as their client"), or say why none
        is. A fallback to real hardware applies here only when it waits nothing: a wait is a
        ticket's (``queue``)."""
        ttl = self.lease_ttl(ttl_s, keepalive_s, who)
        device_class, tags = lease_scope.narrowed(who.scope, device_class, tags)
        classes, any_tags = lease_scope.pick_within(who.scope, device_class, tags)
        async with self.store.tx():
            picked = await self.devices_sql.free_devices(device_class, tags, self.PICKS,
                                                         need.fidelities(need.falls_back_at_once),
                                                         virtual_first=need.fallback is not None,
                                                         running=image_sha256, classes=classes, any_tags=any_tags)
            await self.leases_sql.lock_hosts([d["host"] for d in picked if d["host"]])  # all at once, in one order
            spender = Spender.of(who)
            for device in picked:
                answer = await self.grant(device, ttl, who.name, who.limited,
                                          f"reserved by class ({self._length(ttl, keepalive_s)})",
                                          keepalive_s=keepalive_s, spender=spender)
                if answer is not None:
                    return answer
            raise await self.none_free(device_class, tags, need)

    PICKS = 4  # free devices a reserve by class tries, in case others take some at the same moment

    async def none_free(self, device_class: str | None, tags: list[str], need: Need = ANY_DEVICE) -> APIError:
        """The refusal of a reserve by class and tags that found no free device: 404 if none
        in the lab matches at all (its fallback's real devices counted: a ticket may wait for
        them), else 409 with how the matching ones stand."""
        wanted = describe_want(None, device_class, tags, need)
        states = await self.devices_sql.matching_device_states(device_class, tags, need.fidelities(fallen_back=True))
        retired = states.pop(DeviceState.RETIRED, 0)
        if not states and retired:  # (never queued: docs/architecture.md, "Shares of one lab")
            return conflict(ErrorCode.NONE_CAN_SERVE, f"no device can serve this: every device {wanted} ({retired}) is "
                                                      "retired; an admin brings one back with device-loop admin "
                                                      "retire DEVICE --undo")
        if not states:
            classes = ", ".join(await self.devices_sql.device_classes()) or "none yet"
            return APIError(404, ErrorCode.NO_SUCH_DEVICES, f"no device in the lab is {wanted} (classes: {classes})")
        standing = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
        return conflict(ErrorCode.NONE_FREE, f"no device {wanted} is free now ({standing}); add --queue (REST: "
                                             "\"queue\": true) for a ticket that is granted the first one that is")

    async def grant(self, device: DeviceFacts, ttl: float, holder: str, limited: bool, cause: str,
                    ticket_id: str | None = None, keepalive_s: float | None = None,
                    spender: Spender | None = None) -> LeaseAnswer | None:
        """A new lease of ``device`` for ``holder`` (in the caller's transaction), or None if
        the device has a live lease already (another process took it a moment ago). A lease
        granted from a ticket is counted against its holder's limit but never refused by it:
        the ticket was admitted under it (``Scheduler``). With ``keepalive_s`` it lapses
        that long after its grant unless kept alive, and ends ``ttl`` after it at the latest.
        A scoped token's (``spender``) holds its budget ahead, and is granted only to the
        budget's end if less is left (docs/architecture.md, "Shares of one lab")."""
        life = self.life
        now = life.clock()
        if spender is not None:  # (a ticket's token's scope may have been narrowed since it was made)
            lease_scope.check_device(spender.scope, device)
        # (403 budget_spent or out_of_scope: nothing of it left written)
        hold, counted = await self.budgets.take(spender, ttl, now, admitted=ticket_id is not None)
        if hold is not None:
            ttl = hold.seconds
        lease: LeaseRow = {"id": LEASE_PREFIX + secrets.token_hex(8), "device": device["name"], "holder": holder,
                           "state": LeaseState.PENDING, "created_at": now,
                           "expires_at": lapse(now, ttl, keepalive_s), "ends_at": now + ttl,
                           "keepalive_s": keepalive_s, "ended_at": None, "end_reason": None,
                           "secret": secrets.token_urlsafe(24) if life.settings.gated else None,
                           "token_id": None if spender is None else spender.token_id,
                           "token_counted": counted, **(NO_HOLD if hold is None else hold.columns(now))}  # type: ignore[typeddict-item]
        if not await self.leases_sql.insert_lease_if_free(lease):
            await self.budgets.give_back(spender, hold, counted)  # (the device was taken meanwhile)
            return None
        # counted by the database in one statement: concurrent reserves in several
        # processes cannot all see room for one more (admins are counted, not limited)
        limit = (life.settings.max_leases_per_user or None) if limited and not ticket_id else None
        if not await self.leases_sql.count_lease(holder, limit):
            await self._refuse_hoarding(holder)
        state = await life.change({**device, "lease_state": LeaseState.PENDING}, cause, holder)
        detail: dict[str, Any] = {"ttl_s": ttl} | ({} if ticket_id is None else {"ticket": ticket_id}) | (
            {} if keepalive_s is None else {"keepalive_s": keepalive_s}) | (
            {} if hold is None else {"held_s": hold.seconds, "budget_capped": hold.capped})
        await life.audit(holder, "reserve", device["name"], lease["id"], detail)
        life.notify(host_key(device["host"] or ""))
        self.store.after_commit(life.metrics.leases_granted.inc)
        return lease_json(_view(lease, device, state), EVERY_PART)  # (just granted: no service, no endpoint yet)

    def lease_ttl(self, ttl_s: float | None, keepalive_s: float | None, who: Who | None = None) -> float:
        """The ttl a reserve asks for, checked: without one the lab's default, or for a
        keepalive lease the lab's maximum (the keepalive bounds it in practice: a CI job
        must not lose its board at the default; docs/architecture.md, "Leases that live as
        long as their client"); within ``who``'s scope's longest lease ("Shares of one lab")."""
        settings = self.life.settings
        asked = ttl_s
        if ttl_s is None:
            ttl_s = settings.default_ttl_s if keepalive_s is None else settings.max_ttl_s
        return lease_scope.bounded_ttl(None if who is None else who.scope, asked, self.check_ttl(ttl_s))

    @staticmethod
    def _length(ttl: float, keepalive_s: float | None) -> str:
        """A new lease's length in words, for the ring log: ``30m``, ``keepalive 30s, 7d at most``."""
        if keepalive_s is None:
            return format_duration(ttl)
        return f"keepalive {format_duration(keepalive_s)}, {format_duration(ttl)} at most"

    def check_ttl(self, ttl_s: float) -> float:
        max_ttl_s = self.life.settings.max_ttl_s
        if not ttl_s >= 1 or ttl_s == float("inf"):  # REST's schema says so too; MCP comes here directly
            raise APIError(422, ErrorCode.INVALID, f"ttl_s must be at least 1 second, not {ttl_s!r}")
        if ttl_s > max_ttl_s:
            asked = f"of {format_duration(ttl_s)}" if ttl_s < 100 * 365 * 86400 else "of over a century"
            raise APIError(422, ErrorCode.TTL_TOO_LONG, f"a ttl {asked} is over this lab's maximum of "
                                                        f"{format_duration(max_ttl_s)}")
        return ttl_s

    @staticmethod
    def _refuse_unless_needed(device: DeviceFacts, need: Need) -> None:
        """409 ``wrong_fidelity`` for a device by name that ``need`` does not take (its
        fallback counts only when it waits nothing: a device by name is not waited for
        to fall back to)."""
        takes = need.fidelities(need.falls_back_at_once)
        if takes is None or device["fidelity"] in takes:
            return
        wanted = " or ".join(takes)
        fallback = (f"; its fallback to real hardware applies after {format_duration(need.wait_s)} of waiting, "
                    "to a reserve by class or tags with --queue") if need.wait_s else ""
        raise conflict(ErrorCode.WRONG_FIDELITY, f"{device['name']} is {device['fidelity']}: {need.words()} takes "
                                                 f"{wanted} devices{fallback}")

    async def _refuse_unless_free(self, device: DeviceFacts, caller: str) -> None:
        state, name = device["state"], device["name"]
        if state == DeviceState.IDLE and device["host_draining"]:
            raise conflict(ErrorCode.DRAINING, f"{name}'s host {device['host']} is being drained by an admin: "
                                               "no new leases there")
        if state == DeviceState.IDLE and not (device["needs_recovery"] or device["op_id"]):
            return
        if device["lease_id"] is not None and device["holder"] == caller:
            raise conflict(ErrorCode.ALREADY_YOURS, f"you hold {name} already: {device['lease_id']}, "
                                                    f"until {iso(device['expires_at'])}")
        if device["lease_id"] is not None:
            message = f"{name} is held by {device['holder']} until {iso(device['expires_at'])}"
        elif device["op_id"]:
            message = (f"{name} is being {kinds.of(device['op_kind']).doing} ({device['op_id']}); it is free again "
                       "when that ends")
        elif device["needs_recovery"]:
            message = (f"{name} needs recovery ({device['needs_recovery']}): no lease is granted until a "
                       f"known-good image is written back; an admin runs: device-loop recover {name}")
        elif state == DeviceState.RECLAIMING:
            message = f"{name} is being reclaimed after its last lease; try again in a few seconds"
        elif state == DeviceState.OFFLINE:
            message = f"{name} is offline (host {device['host']} not heartbeating or the device is unplugged)"
        elif state == DeviceState.FAULTY:
            message = f"{name} is faulty: {device['fault'] or device['health_reason'] or 'health check failed'}"
            if device["fault"] and not held_off(device["fault_kind"]):  # (that one says how it is switched on)
                message += f" (an admin clears it: device-loop admin clear-fault {name})"
        else:
            message = f"{name} is {state}"
        alternative = await self.devices_sql.idle_device_of_class(device["class"], other_than=name)
        if alternative:
            message += f"; try {alternative}"
        code = (ErrorCode.BUSY if device["lease_id"] or state == DeviceState.RECLAIMING or device["op_id"] else
                ErrorCode.NEEDS_RECOVERY if device["needs_recovery"] else ErrorCode(str(state)))
        raise conflict(code, message)

    async def _refuse_hoarding(self, caller: str) -> None:
        held = await self.leases_sql.live_leases_of_holder(caller)
        devices = ", ".join(lease["device"] for lease in held)
        raise conflict(ErrorCode.TOO_MANY_LEASES, f"you hold {len(held)} leases ({devices}), this lab's limit per "
                                                  f"person; release one first")

    async def renew(self, lease_id: str, ttl_s: float | None, who: Who) -> LeaseAnswer:
        """Renew a live lease: with ``ttl_s`` it ends that long from now (a keepalive lease
        lapses no later); without, a keep-alive of a keepalive lease (docs/architecture.md,
        "Leases that live as long as their client"): it lapses ``keepalive_s`` from now, never
        past its end. A keep-alive is not audited: it changes nothing the reserve did not say,
        and a client sends one every few seconds."""
        ttl = None if ttl_s is None else self.check_ttl(ttl_s)
        async with self.store.tx():
            view = await self.own_view(lease_id, who)
            if view["state"] not in LIVE_LEASE_STATES:
                raise conflict(ErrorCode.LEASE_ENDED, f"{lease_id} is {view['state']} ({view['end_reason']}); reserve "
                                                      f"{view['device']} again")
            keepalive = view["keepalive_s"]
            if ttl is None and keepalive is None:
                raise APIError(422, ErrorCode.INVALID, f"{lease_id} has no keepalive: renew it with a ttl_s (e.g. "
                                                       "3600)")
            held = ttl is not None and view["token_id"] is not None  # (a keep-alive moves nothing the grant held)
            if held:
                view = await self._locked(view)
            now = self.life.clock()  # (after the lock: what the hold used is counted to the moment it is settled)
            ends_at = now + ttl if ttl is not None else (view["ends_at"] or view["expires_at"])
            hold: dict[str, Any] | None = None
            if held:
                ends_at, hold = await self._hold_renewal(view, who, ends_at, now)
            view["expires_at"], view["ends_at"] = lapse(now, ends_at - now, keepalive), ends_at
            if hold is not None:
                view = {**view, **hold}  # type: ignore[typeddict-item]  # (its answer says a new cap, or none)
            if not await self.leases_sql.set_lease_expiry(lease_id, view["expires_at"], ends_at, hold):
                raise conflict(ErrorCode.LEASE_ENDED, f"{lease_id} ended just now; reserve the device again")
            if ttl is not None:
                await self.life.audit(who.name, "renew", view["device"], lease_id, {"ttl_s": ttl} | (
                    {} if hold is None or hold["held_s"] is None else {"held_s": hold["held_s"]}))
            self.life.notify(lease_key(lease_id), BOARD_KEY)
        return lease_json(view, seen_by(who, view))

    async def _locked(self, view: LeaseView) -> LeaseView:
        """``view`` with its hold as it is under its row's lock, taken in the order a lease's end
        takes it (its host's, then the lease's; its token's budget after: docs/architecture.md,
        "Leases": one lock order), so two renewals, or a renewal and the lease's end, settle
        one hold once (409 ``lease_ended`` if it ended meanwhile)."""
        await self.leases_sql.lock_host_of_device(view["device"])
        lease = await self.leases_sql.lease(view["id"], for_update=True)
        if lease is None or lease["state"] not in LIVE_LEASE_STATES:
            raise conflict(ErrorCode.LEASE_ENDED, f"{view['id']} ended just now; reserve {view['device']} again")
        return {**view, **lease}

    async def _hold_renewal(self, lease: LeaseView, who: Who, ends_at: float,
                            now: float) -> tuple[float, dict[str, Any] | None]:
        """A renewal to ``ends_at`` within the lease's token's scope: its longest lease, and
        its budget held afresh from now (docs/architecture.md, "Shares of one lab"). The end
        the budget allows, and the lease's hold columns (None: it has none, nor needs one)."""
        token_id = lease["token_id"]
        assert token_id is not None  # (renew asks only for a token's lease)
        spender = Spender.of(who) if who.token_id == token_id else await self.budgets.spender_of_ticket(token_id)
        lease_scope.check_renewal(None if spender is None else spender.scope, lease["created_at"], ends_at)
        if lease["held_s"] is None and (spender is None or spender.scope.budget_s is None):
            return ends_at, None
        hold: Hold | None = await self.budgets.renewal(lease, spender, ends_at - now, now)
        if hold is None:
            return ends_at, dict(NO_HOLD)
        return now + hold.seconds, hold.columns(now)

    async def release(self, lease_id: str, who: Who) -> LeaseAnswer:
        async with self.store.tx():
            lease = await self.leases_sql.lease(lease_id)
            if lease is None or not who.may_act_on(lease["holder"]):
                raise not_found("lease", lease_id)
            return await self._end_and_show(lease, LeaseState.RELEASED, f"released by {who.name}", who.name, "release",
                                            {})

    async def revoke(self, lease_id: str, admin: str) -> LeaseAnswer:
        """An admin takes a lease back (``admin release --force``)."""
        async with self.store.tx():
            lease = await self.leases_sql.lease(lease_id)
            if lease is None:
                raise not_found("lease", lease_id)
            return await self._end_and_show(lease, LeaseState.REVOKED, f"revoked by admin {admin}", admin, "revoke",
                                            {"holder": lease["holder"]})

    async def _end_and_show(self, lease: LeaseRow, state: LeaseState, reason: str, actor: str, action: str,
                            detail: dict[str, Any]) -> LeaseAnswer:
        """End ``lease`` (if still live; audited as ``action``) and show it as it is now."""
        device = await self.end(lease, state, reason, actor)
        if device is None:  # it had ended already
            view = await self.leases_sql.lease_view(lease["id"])
            if view is None:  # and an admin has forgotten its device since
                raise conflict(ErrorCode.LEASE_ENDED, f"{lease['id']} is {lease['state']} ({lease['end_reason']}), and "
                                                      f"its device {lease['device']} is no longer in the lab")
            return lease_json(view, EVERY_PART)  # (ended: it shows no endpoint)
        await self.life.audit(actor, action, lease["device"], lease["id"], detail | self._used(lease))
        now_ended: LeaseRow = {**lease, "state": state, "end_reason": reason, "ended_at": self.life.clock()}
        return lease_json(_view(now_ended, device, device["state"]), EVERY_PART)  # (ended: no endpoint)

    async def end(self, lease: LeaseRow, state: LeaseState, reason: str, actor: str,
                  **still: bool) -> DeviceFacts | None:
        """End a live lease and start reclaiming its device; the device as it is now, or
        None if the lease had ended already (here or in another coordinator process), or
        is no longer what ``still`` says (``Store.end_lease``)."""
        life = self.life
        await self.leases_sql.lock_host_of_device(lease["device"])  # before the lease: a heartbeat's order
        now = life.clock()
        ended = await self.leases_sql.end_lease(lease["id"], state, reason, now, **still)
        if ended is None:
            return None
        await self.budgets.settle(ended, now)  # (docs/architecture.md, "Shares of one lab": then settled)
        device = await self.devices_sql.device(lease["device"])
        if device is None:  # forgotten by an admin meanwhile: nothing to reclaim
            return None
        device["state"] = await life.change(device, f"lease {state}: {reason}", actor, {"reclaim_lease": lease["id"]})
        life.notify(lease_key(lease["id"]), host_key(device["host"] or ""))
        self.store.after_commit(life.metrics.leases_ended.labels(reason=state).inc)
        return device

    def _used(self, lease: LeaseRow) -> dict[str, Any]:
        """What an ended lease used of its token's budget, for its audit entry (nothing: no budget)."""
        return {} if lease.get("held_s") is None else {"used_s": round(used_of(lease, self.life.clock()), 3)}

    async def end_overdue(self, now: float, actor: str) -> None:
        """Expire leases past their ttl; fail those whose services never came up."""
        for lease in await self.leases_sql.leases_past("expires_at", LIVE_LEASE_STATES, now):
            if await self.end(lease, LeaseState.EXPIRED, expiry_reason(lease), actor, overdue=True):
                await self.life.audit(actor, "expire", lease["device"], lease["id"], self._used(lease))
        timeout = self.life.settings.allocating_timeout_s
        for lease in await self.leases_sql.leases_past("created_at", (LeaseState.PENDING,), now - timeout):
            view = await self.leases_sql.lease_view(lease["id"])
            reason = f"services did not come up within {format_duration(timeout)}"
            shown = lease_json(view, EVERY_PART)["reason"] if view else ""
            if shown.startswith("service failed"):
                reason += f" ({shown})"
            if await self.end(lease, LeaseState.FAILED, reason, actor, pending=True):
                await self.life.audit(actor, "fail", lease["device"], lease["id"], {"reason": reason})
