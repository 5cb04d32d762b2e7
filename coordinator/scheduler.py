"""Who gets the next lease (docs/architecture.md, "Who gets the next lease"): reserve by
name or by class and tags, and queue tickets for when nothing that matches is free.

The lease stays the only mutex: a ticket only decides who gets a device's next lease. A
ticket is granted in the transaction that makes a device free (``grant_free``, called by
every service that does), to the first waiting ticket that matches it: by band (its
requester's token's), then interactive ones (a person) before batch ones (an agent), a batch
ticket that waited longer than the lab's ``batch_max_wait_s`` among the interactive ones,
then by turn (fair across requesters: docs/architecture.md, "Shares of one lab"), then
first come first served.
A grant is a fixed number of statements whatever the queue's length. The reaper grants
what a grant on becoming free could not see (a ticket made in another process at that
moment) and takes back grants nobody claimed within the claim window.
"""
from __future__ import annotations

import secrets
from typing import Awaitable, Callable

from device_loop.core.durations import format_duration, iso, keepalive_problem
from device_loop.core.needs import ANY_DEVICE, Need
from device_loop.core.vocabulary import LIVE_LEASE_STATES, OPEN_TICKET_STATES, LeaseState, TicketKind, TicketState

from device_loop.core.answers import LeaseAnswer, QueueEntry, TicketAnswer, TicketEstimate
from device_loop.core.errors import ErrorCode
from .errors import APIError, conflict, not_found
from .images import Images
from . import lease_scope
from .leases import Leases, describe_want, lease_json, seen_by
from .lifecycle import Lifecycle
from .notify import BOARD_KEY, ticket_key
from .estimates import Cache, Estimates
from .rows import DeviceFacts, LeaseRow, TicketRow
from .store import Store
from .who import COORDINATOR, Who
from .store.devices import DeviceQueries
from .store.leases import LeaseQueries
from .store.tickets import TicketQueries, Want, want_of

TICKET_PREFIX = "tk-"
#: The refusals of a reserve by name that a ticket waits out (a held, reclaimed, faulty,
#: offline, drained or unrecovered device); any other (unknown, retired, yours already, too
#: many leases, a bad ttl) is answered as it is.
QUEUEABLE = frozenset({ErrorCode.BUSY, ErrorCode.FAULTY, ErrorCode.OFFLINE, ErrorCode.DRAINING,
                       ErrorCode.NEEDS_RECOVERY, ErrorCode.ALLOCATING, ErrorCode.IN_USE, ErrorCode.RECLAIMING,
                       ErrorCode.NONE_FREE, ErrorCode.UNREGISTERED})
MAX_LISTED = 200  # tickets a listing shows
MAX_ENDED = 200  # tickets one statement ends together (a token's refused, or none can serve)
MAX_REFUSED_TOKENS = 8  # tokens refused a device whose tickets one grant ends before it leaves the rest to the reaper


def need_of(row: TicketRow) -> Need:
    """What a ticket may run on, as it was asked (its wait: from its creation to ``fallback_at``)."""
    after = None if row["fallback_at"] is None else round(row["fallback_at"] - row["created_at"], 3)  # (float sums)
    return Need(row["needs"], row["fallback"], after)


def ticket_json(row: TicketRow, position: int | None, lease: LeaseAnswer | None, claim_window_s: float,
                estimate: TicketEstimate | None = None) -> TicketAnswer:
    need = need_of(row)
    return {
        "ticket": row["id"], "state": row["state"], "kind": row["kind"], "band": row["band"],
        "requester": row["requester"],
        "wants": describe_want(row["device"], row["device_class"], row["tags"], need), "device": row["device"],
        "device_class": row["device_class"], "tags": row["tags"], "needs": row["needs"], "fallback": row["fallback"],
        "fallback_at": iso(row["fallback_at"]), "ttl_s": row["ttl_s"], "keepalive_s": row["keepalive_s"],
        "position": position, "estimate": estimate,
        "created_at": iso(row["created_at"]), "granted_at": iso(row["granted_at"]),
        "claim_by": iso(row["granted_at"] + claim_window_s) if row["state"] == TicketState.GRANTED
        and row["granted_at"] is not None else None,
        "ended_at": iso(row["ended_at"]), "lease": lease, "reason": row["reason"],
    }


class Scheduler:
    """Reserve by name or by class and tags; queue tickets and their grants."""

    def __init__(self, life: Lifecycle, leases: Leases, images: Images, *,
                 tickets_sql: TicketQueries, leases_sql: LeaseQueries, devices_sql: DeviceQueries):
        self.life, self.leases, self.images = life, leases, images
        self.store: Store = life.store
        self.tickets_sql = tickets_sql
        self.leases_sql = leases_sql
        self.devices_sql = devices_sql
        self.estimates = Estimates(tickets_sql, lambda: life.clock())  # (the clock a test may swap later)

    # ---- reserve --------------------------------------------------------------------------

    async def reserve(self, device: str | None, device_class: str | None, tags: list[str], ttl_s: float | None,
                      queue: bool, who: Who, kind: TicketKind, need: Need = ANY_DEVICE,
                      keepalive_s: float | None = None, image: str | None = None) -> LeaseAnswer | TicketAnswer:
        """A lease of the named device, or of a free one of ``device_class`` with all of
        ``tags`` (or, with ``need``'s needs, neither: any device it takes), that ``need``
        takes, one already running ``image`` first; when there is none and ``queue``, a
        ticket (its ``kind`` is the caller's, never the request's). With ``keepalive_s`` the
        lease, or the ticket and then its lease, lives only as long as its client asks
        (docs/architecture.md, "Leases that live as long as their client"). Never waits."""
        tags = sorted(set(tags))
        if device is not None and (device_class is not None or tags):
            raise APIError(422, ErrorCode.INVALID, "name a device, or give a class and/or tags, not both")
        if device is None and device_class is None and not tags and need.needs is None:
            raise APIError(422, ErrorCode.INVALID, "name a device (device), or give a class (device_class) and/or "
                                                   "tags, or needs")
        if keepalive_s is not None and (problem := keepalive_problem(keepalive_s)):  # (MCP's checked by its model too)
            raise APIError(422, ErrorCode.INVALID, problem)
        ttl = self.leases.lease_ttl(ttl_s, keepalive_s, who)
        if device is None:  # (docs/architecture.md, "Shares of one lab": a ticket waits for what its token may take)
            device_class, tags = lease_scope.narrowed(who.scope, device_class, tags)
        async with self.store.tx():
            running = None
            if image is not None:  # refused before anything is reserved; the one for the device or class named
                targets = {f"device:{device}"} if device else {f"class:{device_class}"} if device_class else None
                running = (await self.images.image(image, targets))["sha256"]
            try:
                if device is not None:
                    return await self.leases.reserve(device, ttl, who, need, keepalive_s)
                return await self.leases.reserve_matching(device_class, tags, ttl, who, need, keepalive_s, running)
            except APIError as refusal:
                if not queue or refusal.code not in QUEUEABLE:
                    raise
            if device is None:
                lease_scope.check_queueable(who.scope, device_class, tags)
            return await self._enqueue(device, device_class, tags, ttl, who, kind, need, keepalive_s)

    async def _enqueue(self, device: str | None, device_class: str | None, tags: list[str], ttl: float, who: Who,
                       kind: TicketKind, need: Need, keepalive_s: float | None) -> TicketAnswer:
        life, caller = self.life, who.name
        limit = (life.settings.max_tickets_per_user or None) if who.limited else None
        if not await self.tickets_sql.count_ticket(caller, limit):
            raise conflict(ErrorCode.TOO_MANY_TICKETS, f"you have {limit} open tickets, this lab's limit per person; "
                                                       f"cancel one first (device-loop tickets, device-loop cancel "
                                                       "TICKET)")
        now = life.clock()
        row: TicketRow = {"id": TICKET_PREFIX + secrets.token_hex(8), "requester": caller, "kind": kind,
                          "device": device, "device_class": device_class, "tags": tags, "ttl_s": ttl,
                          "state": TicketState.WAITING, "created_at": now, "granted_at": None, "ended_at": None,
                          "lease_id": None, "granted_device": None, "reason": "", "needs": need.needs,
                          "fallback": need.fallback, "fallback_at": need.fallback_at(now),
                          "keepalive_s": keepalive_s, "lapses_at": None if keepalive_s is None else now + keepalive_s,
                          "band": who.band, "turn": 0,  # (the band is the token's: a request cannot name one)
                          "token_id": who.token_id if who.scope is not None else None}
        row["turn"] = await self.tickets_sql.next_turn(row)
        await self.tickets_sql.insert_ticket(row)
        await life.audit(caller, "queue", device, None, {"ticket": row["id"], "kind": kind, "band": who.band,
                                                         "turn": row["turn"], "wants": describe_want(
            device, device_class, tags, need), "ttl_s": ttl} | ({} if keepalive_s is None else
                                                                 {"keepalive_s": keepalive_s}))
        life.notify(BOARD_KEY)
        position = await self.tickets_sql.tickets_ahead(row, self._aged(now)) + 1
        return ticket_json(row, position, None, life.settings.claim_window_s,
                           await self.estimates.estimate(row, position - 1))

    def _aged(self, now: float) -> float:
        """Batch tickets made before this have waited long enough to be served as interactive ones."""
        return now - self.life.settings.batch_max_wait_s

    # ---- granting ---------------------------------------------------------------------------

    async def grant_free(self, names: list[str]) -> None:
        """Devices among ``names`` may have become free (in the caller's transaction, which
        made them so): each goes to the first waiting ticket that matches it. Costs one
        statement when nothing waits, and a fixed number a grant."""
        if not names or not await self.tickets_sql.any_waiting_ticket():
            return
        for device in await self.devices_sql.free_devices_named(names):
            await self._grant(device)

    async def grant_wanted(self, limit: int = 50) -> None:
        """The reaper's pass: free devices a waiting ticket matches (a ticket made in another
        process while the device became free there saw it busy, and that grant saw no ticket)."""
        async with self.store.tx():
            if not await self.tickets_sql.any_waiting_ticket():
                return
            wanted = await self.tickets_sql.free_devices_wanted(limit, self.life.clock())
            await self.leases_sql.lock_hosts([d["host"] for d in wanted if d["host"]])
            for device in wanted:
                await self._grant(device)

    async def _grant(self, device: DeviceFacts) -> bool:
        """Grant ``device`` to its first waiting ticket, if any: True if one was. A ticket whose
        token's budget is spent, or whose scope an admin narrowed since so that it no longer
        takes the device, ends saying so, with every waiting ticket of that token the device
        would serve (each would be refused alike), and the next is tried: for at most
        ``MAX_REFUSED_TOKENS`` such tokens, the rest left to the reaper's pass (``grant_wanted``).
        A fixed number of statements for each ticket handled."""
        for _ in range(MAX_REFUSED_TOKENS):
            granted = await self._grant_first(device)
            if granted is not None:
                return granted
        return False

    async def _grant_first(self, device: DeviceFacts) -> bool | None:
        """Grant ``device`` to its first waiting ticket: whether one was, or None if that
        ticket's token was refused it (its tickets ended: try the next)."""
        life = self.life
        now = life.clock()
        ticket = await self.tickets_sql.first_ticket_for(device, self._aged(now), now)
        if ticket is None:
            return False
        waited = format_duration(life.clock() - ticket["created_at"])
        try:
            answer = await self.leases.grant(device, ticket["ttl_s"], ticket["requester"], False,
                                             f"granted to {ticket['requester']} from the queue ({ticket['kind']}, "
                                             f"waited {waited})", ticket_id=ticket["id"],
                                             keepalive_s=ticket["keepalive_s"],
                                             spender=await self.leases.budgets.spender_of_ticket(ticket["token_id"]))
        except APIError as refusal:  # its token's budget is spent, or its scope no longer takes the device: the
            if refusal.code not in (ErrorCode.BUDGET_SPENT, ErrorCode.OUT_OF_SCOPE):  # tickets end saying so
                raise
            await self._end_refused(ticket, device, str(refusal), now)
            return None
        if answer is None:  # leased a moment ago in another process: not free after all
            return False
        now = life.clock()
        # a keepalive ticket's grant lapses with its lease, unless its requester reads it (claims it) first
        lapses_at = None if ticket["keepalive_s"] is None else now + ticket["keepalive_s"]
        if not await self.tickets_sql.grant_ticket(ticket["id"], answer["id"], device["name"], now, lapses_at):
            raise RuntimeError(f"ticket {ticket['id']} changed while locked")  # (locked by first_ticket_for)
        await self.tickets_sql.uncount_ticket(ticket["requester"])
        life.notify(ticket_key(ticket["id"]), BOARD_KEY)
        seconds = now - ticket["created_at"]
        self.store.after_commit(lambda: life.metrics.ticket_waits.labels(kind=ticket["kind"]).observe(seconds))
        return True

    async def _end_refused(self, ticket: TicketRow, device: DeviceFacts, reason: str, now: float) -> None:
        """``ticket``'s grant of ``device`` was refused its token (a spent budget, a narrowed
        scope): it ends cancelled with the refusal's words, and so do that token's other waiting
        tickets ``device`` would serve (``MAX_ENDED`` at most a statement)."""
        await self._end_waiting(ticket, reason, COORDINATOR, ticket["device"])
        assert ticket["token_id"] is not None  # (only a token's ticket is refused its grant)
        await self._ended(await self.tickets_sql.end_tickets_of_token(ticket["token_id"], device, reason, now,
                                                                      MAX_ENDED), reason, COORDINATOR)

    async def _end_waiting(self, ticket: TicketRow, reason: str, actor: str, device: str | None) -> bool:
        """A waiting ticket ends ``cancelled`` for ``reason``: whether it did (it was still
        waiting: not granted, cancelled or lapsed meanwhile, here or in another process)."""
        now = self.life.clock()
        if not await self.tickets_sql.end_ticket(ticket["id"], TicketState.CANCELLED, reason, now,
                                                 (TicketState.WAITING,)):
            return False
        await self.tickets_sql.uncount_ticket(ticket["requester"])
        await self.life.audit(actor, "ticket_cancel", device, None, {"ticket": ticket["id"], "reason": reason})
        self.life.notify(ticket_key(ticket["id"]), BOARD_KEY)
        return True

    async def _ended(self, ended: list[TicketRow], reason: str, actor: str, device: str | None = None) -> None:
        """Tickets just ended ``cancelled`` for ``reason`` together: uncounted (one statement
        a requester), audited (one entry each) and woken."""
        requesters: dict[str, int] = {}
        for ticket in ended:
            requesters[ticket["requester"]] = requesters.get(ticket["requester"], 0) + 1
            await self.life.audit(actor, "ticket_cancel", device or ticket["device"], None,
                                  {"ticket": ticket["id"], "reason": reason})
            self.life.notify(ticket_key(ticket["id"]))
        for requester, tickets in requesters.items():
            await self.tickets_sql.uncount_ticket(requester, tickets)
        if ended:
            self.life.notify(BOARD_KEY)

    async def end_none_can_serve(self, device: DeviceFacts, actor: str) -> None:
        """``device`` was just retired (in the caller's transaction): the waiting tickets no
        device left could ever serve end ``cancelled``, saying so, rather than wait for ever
        (docs/architecture.md, "Shares of one lab"): ``MAX_ENDED`` a statement, until none is left."""
        reason = f"no device can serve it: {device['name']}, the last that could, was retired"
        while True:
            ended = await self.tickets_sql.end_none_can_serve(device, reason, self.life.clock(), MAX_ENDED)
            await self._ended(ended, reason, actor, device["name"])
            if len(ended) < MAX_ENDED:
                return

    async def expire_unclaimed(self, now: float, actor: str) -> None:
        """Grants their requesters did not claim within the claim window: the lease ends, the
        ticket is ``expired``, and the device goes on (reclaimed, then to the next ticket)."""
        window = self.life.settings.claim_window_s
        for ticket in await self.tickets_sql.tickets_granted_before(now - window):
            reason = f"not claimed within {format_duration(window)} of its grant"
            if await self.tickets_sql.end_ticket(ticket["id"], TicketState.EXPIRED, reason, now,
                                                 (TicketState.GRANTED,)):
                await self._end_lease_of(ticket, LeaseState.EXPIRED, f"its ticket was {reason}", actor)
                await self.life.audit(actor, "ticket_expire", ticket["granted_device"], ticket["lease_id"],
                                      {"ticket": ticket["id"]})
                self.life.notify(ticket_key(ticket["id"]), BOARD_KEY)

    async def end_past_their_lease(self, now: float) -> None:
        """Granted tickets whose lease ended before they were claimed (revoked with its device's
        retirement, say) end ``cancelled``, saying so: no reader is told "held for you" of a
        lease that is gone, and a claim of one says why."""
        for row in await self.tickets_sql.granted_past_their_lease():
            await self._end_past_its_lease(row, await self.leases_sql.lease(row["lease_id"] or ""), now)

    async def _end_past_its_lease(self, row: TicketRow, lease: LeaseRow | None, now: float) -> None:
        reason = f"its lease {row['lease_id']} ended before it was claimed" + (
            f" ({lease['end_reason']})" if lease is not None and lease["end_reason"] else "")
        if await self.tickets_sql.end_ticket(row["id"], TicketState.CANCELLED, reason, now, (TicketState.GRANTED,)):
            self.life.notify(ticket_key(row["id"]), BOARD_KEY)

    async def expire_lapsed(self, now: float, actor: str) -> None:
        """Keepalive tickets their requesters stopped reading (docs/architecture.md, "Leases that
        live as long as their client"): ``expired``, a waiting one uncounted, a granted one's
        lease ended (its device goes on to the next ticket)."""
        for ticket in await self.tickets_sql.tickets_lapsed_before(now):
            reason = f"its client stopped asking (keepalive {format_duration(ticket['keepalive_s'] or 0)})"
            ended = await self.tickets_sql.end_ticket(ticket["id"], TicketState.EXPIRED, reason, now,
                                                      (ticket["state"],), lapsed=True)
            if ended is None:  # read, claimed or cancelled meanwhile (here or in another process)
                continue
            if ticket["state"] == TicketState.WAITING:
                await self.tickets_sql.uncount_ticket(ticket["requester"])
            else:
                await self._end_lease_of(ticket, LeaseState.EXPIRED, f"its ticket lapsed: {reason}", actor)
            await self.life.audit(actor, "ticket_expire", ticket["granted_device"] or ticket["device"],
                                  ticket["lease_id"], {"ticket": ticket["id"], "reason": reason})
            self.life.notify(ticket_key(ticket["id"]), BOARD_KEY)

    async def _end_lease_of(self, ticket: TicketRow, state: LeaseState, reason: str, actor: str) -> None:
        lease = await self.leases_sql.lease(ticket["lease_id"] or "")
        if lease is not None:
            await self.leases.end(lease, state, reason, actor)

    # ---- what a requester does with a ticket ------------------------------------------------

    async def _own(self, ticket_id: str, who: Who, for_update: bool = False) -> TicketRow:
        """The ticket, if ``who`` may act on it (docs/architecture.md, "Who may act on what")."""
        row = await self.tickets_sql.ticket(ticket_id, for_update)
        if row is None or not who.may_act_on(row["requester"]):
            raise not_found("ticket", ticket_id)
        return row

    async def status(self, ticket_id: str, who: Who) -> TicketAnswer:
        """A ticket as ``who`` sees it. Reading changes nothing (docs/architecture.md, "Reading
        is never acting"): a granted ticket stays unclaimed, a keepalive one is not kept."""
        return await self._json(await self._own(ticket_id, who), who)

    async def claim(self, ticket_id: str, who: Who) -> TicketAnswer:
        """The ticket followed: a granted one is claimed (its lease is its requester's), and, by
        its requester alone, a keepalive one is kept: a waiting one lapses ``keepalive_s`` from
        now, a claimed one's lease too (docs/architecture.md, "Leases that live as long as their
        client"). Whoever may act on it may claim it (docs/architecture.md, "Who may act on
        what"); an admin's claim keeps nothing alive."""
        row, caller = await self._own(ticket_id, who), who.name
        asking = row["requester"] == caller  # (an admin following it is not its client asking)
        if row["state"] == TicketState.WAITING and row["keepalive_s"] is not None and asking:
            async with self.store.tx():  # (no wake: the long-poll that reads it would wake itself)
                await self.tickets_sql.keep_waiting(ticket_id, self.life.clock())
        elif row["state"] == TicketState.GRANTED:
            async with self.store.tx():
                now = self.life.clock()
                lease = await self.leases_sql.lease(row["lease_id"] or "")
                if lease is None or lease["state"] not in LIVE_LEASE_STATES:
                    await self._end_past_its_lease(row, lease, now)
                elif await self.tickets_sql.claim_ticket(ticket_id, now):
                    if row["keepalive_s"] is not None and row["lease_id"] and asking:
                        await self.leases_sql.keep_alive(row["lease_id"], now)
                    await self.life.audit(caller, "ticket_claim", row["granted_device"], row["lease_id"],
                                          {"ticket": ticket_id})
                    self.life.notify(ticket_key(ticket_id))
            row = await self._own(ticket_id, who)
        return await self._json(row, who)

    async def _json(self, row: TicketRow, who: Who, cache: Cache | None = None) -> TicketAnswer:
        """``row`` as ``who`` sees it (its lease's data plane too: ``seen_by``)."""
        position = estimate = None
        if row["state"] == TicketState.WAITING:
            position = await self.tickets_sql.tickets_ahead(row, self._aged(self.life.clock())) + 1
            estimate = await self.estimates.estimate(row, position - 1, cache)
        lease = None
        if row["lease_id"]:
            view = await self.leases_sql.lease_view(row["lease_id"])
            lease = lease_json(view, seen_by(who, view)) if view else None
        return ticket_json(row, position, lease, self.life.settings.claim_window_s, estimate)

    async def wait(self, ticket_id: str, who: Who, wait_s: float,
                   gone: Callable[[], Awaitable[None]], claim: bool = False) -> TicketAnswer:
        """Long-poll: the ticket once its state changes (or ``wait_s`` passed); with ``claim``,
        each look is its requester's ``claim`` (a grant seen is claimed), else a ``status``."""
        def look() -> Awaitable[TicketAnswer]:
            return self.claim(ticket_id, who) if claim else self.status(ticket_id, who)

        first = await look()
        if not wait_s or first["state"] != TicketState.WAITING:
            return first
        return await self.life.notifier.long_poll(ticket_key(ticket_id), look,
                                                  lambda t: t["state"] != TicketState.WAITING, wait_s, gone)

    async def cancel(self, ticket_id: str, who: Who) -> TicketAnswer:
        """Cancel a waiting ticket, or a granted one nobody claimed yet (its lease ends)."""
        caller = who.name
        async with self.store.tx():
            row = await self._own(ticket_id, who, for_update=True)
            if row["state"] not in OPEN_TICKET_STATES:
                raise conflict(ErrorCode.TICKET_ENDED, f"{ticket_id} is {row['state']} already" + (
                    f": its lease {row['lease_id']} is yours; release it instead" if row["state"] ==
                    TicketState.CLAIMED else ""))
            reason = f"cancelled by {caller}"
            ended = await self.tickets_sql.end_ticket(ticket_id, TicketState.CANCELLED, reason, self.life.clock(),
                                                      OPEN_TICKET_STATES)
            if ended is None:
                raise conflict(ErrorCode.TICKET_CHANGED, f"{ticket_id} changed just now; look at it again")
            if row["state"] == TicketState.WAITING:  # (a granted one was uncounted at its grant)
                await self.tickets_sql.uncount_ticket(ended["requester"])
            else:
                await self._end_lease_of(ended, LeaseState.RELEASED, f"its ticket was {reason}", caller)
            await self.life.audit(caller, "ticket_cancel", ended["granted_device"] or ended["device"],
                                  ended["lease_id"], {"ticket": ticket_id})
            self.life.notify(ticket_key(ticket_id), BOARD_KEY)
            return await self._json(ended, who)

    async def tickets(self, who: Who, everyone: bool) -> list[TicketAnswer]:
        """The caller's tickets (an admin's ``everyone``: all), the open ones first. Listing
        claims nothing: a grant is claimed by its requester following that one ticket
        (``status``), so a ticket nobody follows any more passes on when its window ends."""
        rows = await self.tickets_sql.tickets_of(None if everyone else who.name, MAX_LISTED)
        cache = Cache()  # (what each distinct thing waited for is read once)
        return [await self._json(row, who, cache) for row in rows]

    async def queue(self, who: Who | None = None) -> list[QueueEntry]:
        """The waiting tickets in the order they are served (per thing they wait for), as the
        board shows them (to ``who``; None: to anyone): ids only to their requesters and to
        whoever may see all."""
        now = self.life.clock()
        rows = await self.tickets_sql.waiting_tickets(MAX_LISTED, self._aged(now))
        seen: dict[Want, int] = {}
        cache = Cache()
        entries: list[QueueEntry] = []
        for row in rows:
            want = want_of(row)
            seen[want] = seen.get(want, 0) + 1
            shown = who is not None and (who.may_see_all or who.may_act_on(row["requester"]))
            entries.append({"ticket": row["id"] if shown else None,
                            "requester": row["requester"], "kind": row["kind"], "band": row["band"],
                            "wants": describe_want(row["device"], row["device_class"], row["tags"], need_of(row)),
                            "device": row["device"], "device_class": row["device_class"], "tags": row["tags"],
                            "needs": row["needs"], "fallback": row["fallback"],
                            "waiting_s": round(now - row["created_at"], 1), "position": seen[want],
                            "estimate": await self.estimates.estimate(row, seen[want] - 1, cache)})
        return entries
