"""The statements on the queue's tickets and the open tickets each person holds
(docs/architecture.md, "Who gets the next lease"). Who may use them: ``OWNERS`` and
``LENT_TO`` (docs/architecture.md, "A service reaches only its tables")."""
from __future__ import annotations

import json
from typing import Any, NamedTuple

from device_loop.core.vocabulary import BAND_RANK, OPEN_TICKET_STATES, TicketKind, TicketState, sql_list

from ..rows import CouldServe, DeviceFacts, TicketRow
from .core import Store
from .counts import count_down, count_up
from .facts import DEVICE_FACTS, FREE, LIVE_SQL, VIRTUAL_FIRST, needs_met

# the coordinator modules whose tables these are, and those handed them besides (in rules.py)
OWNERS = ("scheduler.py", "estimates.py")
LENT_TO = ("jobs.py",)


_OPEN_TICKETS_SQL = sql_list(OPEN_TICKET_STATES)
# The order of service (docs/architecture.md, "Shares of one lab": the queue is fair, by band):
# band, then interactive before batch (an aged batch ticket counts as interactive), then turn,
# then first come, then id. One key, in SQL only, so a grant, a place and the board read the
# same order (a place compares a ticket's key with its own row's: ``tickets_ahead``).


def _order(t: str) -> str:
    """The key of ticket ``t`` (an alias of ``tickets``) in the order of service, as SQL."""
    band = " ".join(f"WHEN '{band}' THEN {rank}" for band, rank in BAND_RANK.items())
    return (f"CASE {t}.band {band} ELSE {len(BAND_RANK)} END, "
            f"CASE WHEN {t}.kind = :interactive OR {t}.created_at <= :aged THEN 0 ELSE 1 END, "
            f"{t}.turn, {t}.created_at, {t}.id")


_FIRST, _ITS_OWN = _order("t"), _order("me")
_EVER = 1e15  # a time past every ticket's fallback: what could serve it once its wait is over


class Want(NamedTuple):
    """The thing a ticket waits for: tickets for the same one are placed and take turns among
    themselves (its fallback aside: it changes which devices could serve it, not its place)."""
    device: str
    device_class: str
    tags: tuple[str, ...]
    needs: str


def want_of(ticket: TicketRow) -> Want:
    """What ``ticket`` waits for (an absent name, class or needs as ''; SQL's ``_SAME_WANT``)."""
    return Want(ticket["device"] or "", ticket["device_class"] or "", tuple(ticket["tags"]), ticket["needs"] or "")


# ``want_of`` in SQL: waiting ticket ``t`` waits for the Want bound by ``_want_binds``
_SAME_WANT = ("COALESCE(t.device, '') = :d AND COALESCE(t.device_class, '') = :c AND t.tags = :tags AND "
              "COALESCE(t.needs, '') = :needs")


def _want_binds(ticket: TicketRow) -> dict[str, Any]:
    want = want_of(ticket)
    return {"d": want.device, "c": want.device_class, "tags": json.dumps(list(want.tags)), "needs": want.needs}


class TicketQueries:
    """The statements on tickets."""

    def __init__(self, db: Store):
        self.db = db

    async def insert_ticket(self, row: TicketRow) -> None:
        await self.db.insert("tickets", row)

    async def next_turn(self, ticket: TicketRow) -> int:
        """The turn of ``ticket`` about to wait (docs/architecture.md, "Shares of one lab"):
        one more than its requester's latest waiting ticket's in its band, and never below the
        lowest turn waiting in its band for the same thing (start-time fair queueing: who
        comes late starts where the queue stands, not at its start). One statement."""
        row = await self.db.row(
            f"SELECT MAX(CASE WHEN t.requester = :r THEN t.turn + 1 END) AS mine, "
            f"MIN(CASE WHEN {_SAME_WANT} THEN t.turn END) AS low FROM tickets t WHERE t.state = :w AND t.band = :b",
            r=ticket["requester"], w=TicketState.WAITING, b=ticket["band"], **_want_binds(ticket))
        return max(row["mine"] or 0, row["low"] or 0)

    async def ticket(self, ticket_id: str, for_update: bool = False) -> TicketRow | None:
        return await self.db.row("SELECT * FROM tickets WHERE id = :id" + (self.db.for_update if for_update else ""),
                                 id=ticket_id)

    async def any_waiting_ticket(self) -> bool:
        return await self.db.row("SELECT id FROM tickets WHERE state = :w LIMIT 1", w=TicketState.WAITING) is not None

    def _matching(self, name: str, device_class: str, tags: str, fidelity: str) -> str:
        """SQL: waiting ticket ``t`` would take, at ``:now``, the device whose name, class,
        tags (JSON) and fidelity these SQL expressions are (its needs: ``facts.needs_met``)."""
        return (f"t.state = :waiting AND (t.device IS NULL OR t.device = {name}) AND (t.device_class IS NULL OR "
                f"t.device_class = {device_class}) AND {self.db.tags_within('t.tags', tags)} AND "
                f"{needs_met('t.needs', 't.fallback_at', fidelity)}")

    async def first_ticket_for(self, device: DeviceFacts, aged_before: float, now: float) -> TicketRow | None:
        """The waiting ticket that ``device`` goes to at ``now``, in the order of service: band,
        then interactive ones and batch ones older than ``aged_before``, then the others; by
        turn, then first come, within each. On PostgreSQL it is locked, and one another grant
        holds is skipped."""
        lock = " FOR UPDATE OF t SKIP LOCKED" if self.db.dialect == "postgresql" else ""
        return await self.db.row(
            f"SELECT t.* FROM tickets t WHERE {self._matching(':name', ':class', ':tags', ':fidelity')} "
            f"ORDER BY {_FIRST} LIMIT 1{lock}", name=device["name"], tags=json.dumps(device["tags"]),
            fidelity=device["fidelity"], now=now, waiting=TicketState.WAITING, interactive=TicketKind.INTERACTIVE,
            aged=aged_before, **{"class": device["class"]})

    async def free_devices_wanted(self, limit: int, now: float) -> list[DeviceFacts]:
        """Devices free to lease that a waiting ticket would take at ``now``: what a grant on
        becoming idle missed (a ticket made in another process at that moment), and what a
        ticket's fallback to real hardware takes once its time came (one query, whatever the
        number of devices or tickets). Virtual devices first: a ticket that may fall back
        takes one of those where it can."""
        return await self.db.rows(
            f"{DEVICE_FACTS} WHERE {FREE} AND EXISTS (SELECT 1 FROM tickets t WHERE "
            f"{self._matching('d.name', 'd.class', 'd.tags', 'd.fidelity')}) ORDER BY {VIRTUAL_FIRST}, d.host, "
            "COALESCE(d.state_since, 0), d.name LIMIT :n",
            n=limit, waiting=TicketState.WAITING, now=now)

    async def could_serve(self, device: str | None, device_class: str | None, tags: list[str], needs: str | None,
                          fallback: str | None, limit: int) -> list[CouldServe]:
        """The devices, retired ones aside, that a ticket (or a request) for ``device``, or
        ``device_class`` and ``tags``, with ``needs`` could ever be granted (its ``fallback``'s
        devices counted: its wait ends), with the live lease on each: one query, at most
        ``limit`` rows."""
        return await self.db.rows(
            "SELECT d.name, d.class AS device_class, d.state, l.created_at AS since, "
            "COALESCE(l.ends_at, l.expires_at) AS until FROM devices d "
            f"LEFT JOIN leases l ON l.device = d.name AND l.state IN {LIVE_SQL} "
            "WHERE NOT d.retired AND (:d = '' OR d.name = :d) AND (:c = '' OR d.class = :c) AND "
            f"{self.db.tags_within(':tags', 'd.tags')} AND "
            f"{needs_met('CAST(:needs AS TEXT)', 'CAST(:fallback_at AS DOUBLE PRECISION)', 'd.fidelity')} "
            "ORDER BY d.name LIMIT :n",
            d=device or "", c=device_class or "", tags=json.dumps(tags),
            needs=needs, fallback_at=None if fallback is None else 0.0, now=0.0, n=limit)

    async def end_none_can_serve(self, device: DeviceFacts, reason: str, now: float,
                                 limit: int) -> list[TicketRow]:
        """The waiting tickets retired ``device`` could have served that no device left (not
        retired) could ever serve (a fallback's devices counted) end ``cancelled`` for
        ``reason``, the first ``limit`` of them: the ended rows. One statement."""
        served = self._matching("d.name", "d.class", "d.tags", "d.fidelity")
        where = (f"{self._matching(':name', ':class', ':tags', ':fidelity')} AND NOT EXISTS "
                 f"(SELECT 1 FROM devices d WHERE NOT d.retired AND {served})")
        return await self._end_waiting(where, {**_of_device(device), "now": _EVER}, reason, now, limit)

    async def end_tickets_of_token(self, token_id: str, device: DeviceFacts, reason: str, now: float,
                                   limit: int) -> list[TicketRow]:
        """The waiting tickets of token ``token_id`` that ``device`` would serve at ``now`` end
        ``cancelled`` for ``reason`` (its grant to each would be refused alike), the first
        ``limit`` of them, those another grant holds skipped: the ended rows. One statement."""
        where = f"t.token_id = :token AND {self._matching(':name', ':class', ':tags', ':fidelity')}"
        return await self._end_waiting(where, {**_of_device(device), "now": now, "token": token_id}, reason, now,
                                       limit, skip_locked=True)

    async def _end_waiting(self, where: str, values: dict[str, Any], reason: str, now: float, limit: int,
                           skip_locked: bool = False) -> list[TicketRow]:
        """The waiting tickets ``t`` that ``where`` holds of end ``cancelled``: the first
        ``limit``, oldest first (on PostgreSQL, ``skip_locked``: not those another transaction
        holds: its grant of one then ends it, and no lock is waited for out of order)."""
        lock = " FOR UPDATE SKIP LOCKED" if skip_locked and self.db.dialect == "postgresql" else ""
        return await self.db.rows(
            "UPDATE tickets SET state = :cancelled, reason = :reason, ended_at = :ended WHERE state = :waiting AND id "
            f"IN (SELECT t.id FROM tickets t WHERE {where} ORDER BY t.created_at, t.id LIMIT :n{lock}) RETURNING *",
            cancelled=TicketState.CANCELLED, reason=reason, ended=now, waiting=TicketState.WAITING, n=limit,
            **values)

    async def lease_durations(self, classes: list[str], limit: int) -> list[float]:
        """How long the latest ``limit`` ended leases of devices of ``classes`` lasted, from
        grant to end: one query."""
        if not classes:
            return []
        names: dict[str, Any] = {f"c{i}": name for i, name in enumerate(classes)}
        rows = await self.db.rows(
            "SELECT l.ended_at - l.created_at AS s FROM leases l JOIN devices d ON d.name = l.device WHERE "
            f"l.ended_at IS NOT NULL AND d.class IN ({', '.join(':' + key for key in names)}) "
            "ORDER BY l.ended_at DESC LIMIT :n", n=limit, **names)
        return [row["s"] for row in rows]

    async def grant_ticket(self, ticket_id: str, lease_id: str, device: str, now: float,
                           lapses_at: float | None = None) -> bool:
        """A waiting ticket is granted ``lease_id`` (and lapses at ``lapses_at`` unless claimed);
        False if it no longer waits (cancelled, or granted by another process meanwhile)."""
        row = await self.db.row("UPDATE tickets SET state = :g, granted_at = :now, lease_id = :l, granted_device = :d, "
                                "lapses_at = :lapse WHERE id = :id AND state = :w RETURNING id", g=TicketState.GRANTED,
                                now=now, l=lease_id, d=device, lapse=lapses_at, id=ticket_id, w=TicketState.WAITING)
        return row is not None

    async def end_ticket(self, ticket_id: str, state: TicketState, reason: str, now: float,
                         from_states: tuple[TicketState, ...], lapsed: bool = False) -> TicketRow | None:
        """Move a ticket in one of ``from_states`` (and, when ``lapsed``, still past its lapse:
        not read meanwhile) to ``state``: the ticket as it is now, or None if it was in none of
        them (here or in another process). The conditions are in the statement."""
        marks = ", ".join(f"'{s}'" for s in from_states)
        past = " AND lapses_at <= :now" if lapsed else ""
        return await self.db.row(f"UPDATE tickets SET state = :s, reason = :r, ended_at = :now WHERE id = :id AND "
                                 f"state IN ({marks}){past} RETURNING *", s=state, r=reason, now=now, id=ticket_id)

    async def keep_waiting(self, ticket_id: str, now: float) -> None:
        """A waiting keepalive ticket's requester asked: it lapses ``keepalive_s`` from ``now``."""
        await self.db.run("UPDATE tickets SET lapses_at = :now + keepalive_s WHERE id = :id AND state = :w AND "
                          "keepalive_s IS NOT NULL", now=now, id=ticket_id, w=TicketState.WAITING)

    async def forgive_lapses(self, now: float) -> None:
        """Every open keepalive ticket lapses ``keepalive_s`` from ``now`` at the earliest: the
        lab is back from a time its clients could not reach it (docs/architecture.md, "A lab
        that was away")."""
        await self.db.run(f"UPDATE tickets SET lapses_at = :now + keepalive_s WHERE state IN {_OPEN_TICKETS_SQL} "
                          "AND keepalive_s IS NOT NULL AND lapses_at < :now + keepalive_s", now=now)

    async def tickets_lapsed_before(self, now: float) -> list[TicketRow]:
        """Open keepalive tickets nobody read since their lapse (waiting, or granted and not claimed)."""
        return await self.db.rows(f"SELECT * FROM tickets WHERE state IN {_OPEN_TICKETS_SQL} AND lapses_at < :now "
                                  "ORDER BY lapses_at, id", now=now)

    async def claim_ticket(self, ticket_id: str, now: float) -> bool:
        """A granted ticket's requester has seen its lease."""
        row = await self.db.row("UPDATE tickets SET state = :c, ended_at = :now WHERE id = :id AND state = :g "
                                "RETURNING id", c=TicketState.CLAIMED, now=now, id=ticket_id, g=TicketState.GRANTED)
        return row is not None

    async def granted_past_their_lease(self) -> list[TicketRow]:
        """Granted tickets whose lease ended before they were claimed (revoked with its device's
        retirement, say)."""
        return await self.db.rows(f"SELECT t.* FROM tickets t JOIN leases l ON l.id = t.lease_id WHERE t.state = :g "
                                  f"AND l.state NOT IN {LIVE_SQL} ORDER BY t.granted_at", g=TicketState.GRANTED)

    async def tickets_granted_before(self, before: float) -> list[TicketRow]:
        return await self.db.rows("SELECT * FROM tickets WHERE state = :g AND granted_at < :b ORDER BY granted_at",
                                  g=TicketState.GRANTED, b=before)

    async def tickets_of(self, requester: str | None, limit: int) -> list[TicketRow]:
        """``requester``'s tickets (everyone's: None), the open ones first, newest first."""
        where = "" if requester is None else "WHERE requester = :r"
        values: dict[str, Any] = {} if requester is None else {"r": requester}
        return await self.db.rows(f"SELECT * FROM tickets {where} ORDER BY CASE WHEN state IN {_OPEN_TICKETS_SQL} "
                                  "THEN 0 ELSE 1 END, created_at DESC LIMIT :n", n=limit, **values)

    async def waiting_tickets(self, limit: int, aged_before: float) -> list[TicketRow]:
        """The first ``limit`` waiting tickets in the order they are served."""
        return await self.db.rows(f"SELECT t.* FROM tickets t WHERE t.state = :w ORDER BY {_FIRST} LIMIT :n",
                                  w=TicketState.WAITING, n=limit, interactive=TicketKind.INTERACTIVE, aged=aged_before)

    async def tickets_ahead(self, ticket: TicketRow, aged_before: float) -> int:
        """How many waiting tickets for the same thing are served before ``ticket`` (its key in
        the order of service read from its own row)."""
        row = await self.db.row(
            f"SELECT COUNT(*) AS n FROM tickets t JOIN tickets me ON me.id = :id WHERE t.state = :w AND "
            f"{_SAME_WANT} AND t.id <> me.id AND ({_FIRST}) < ({_ITS_OWN})",
            w=TicketState.WAITING, interactive=TicketKind.INTERACTIVE, aged=aged_before, id=ticket["id"],
            **_want_binds(ticket))
        return row["n"]

    async def count_ticket(self, requester: str, limit: int | None) -> bool:
        """Count an open ticket of ``requester``: False, and nothing counted, at ``limit``."""
        return await count_up(self.db, "open_tickets", requester, 1, limit)

    async def uncount_ticket(self, requester: str, tickets: int = 1) -> None:
        """``tickets`` fewer open tickets of ``requester``."""
        await count_down(self.db, "open_tickets", requester, tickets)


def _of_device(device: DeviceFacts) -> dict[str, Any]:
    """What ``TicketQueries._matching`` binds of ``device``."""
    return {"name": device["name"], "class": device["class"], "tags": json.dumps(device["tags"]),
            "fidelity": device["fidelity"]}
