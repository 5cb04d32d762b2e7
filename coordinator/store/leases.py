"""The statements on the leases table and the live leases each person holds, and the host
locks a lease's beginning or end takes (docs/architecture.md, "Leases": one lock order). Who
may use them: ``OWNERS`` and ``LENT_TO``
(docs/architecture.md, "A service reaches only its tables")."""
from __future__ import annotations

from typing import Any

from ..rows import LeaseRow, LeaseView
from .core import Store
from .counts import count_down, count_up
from .facts import LIVE_EXCLUSIVE, LIVE_SQL

# the coordinator modules whose tables these are, and those handed them besides (in rules.py)
OWNERS = ("leases.py",)
LENT_TO = ("scheduler.py", "jobs.py", "admin.py", "hosts.py", "operations.py")


_LEASE_VIEW = ("SELECT l.*, d.state AS device_state, d.host AS device_host, d.resources, d.needs_recovery, "
               "d.fault AS device_fault, d.fault_kind AS device_fault_kind, "
               "h.online AS host_online, h.link_lost AS host_link_lost, h.services AS host_services, "
               "o.id AS op_id, o.kind AS op_kind, t.scope AS token_scope FROM leases l "
               "JOIN devices d ON d.name = l.device LEFT JOIN hosts h ON h.name = d.host "
               f"LEFT JOIN operations o ON o.device = l.device AND {LIVE_EXCLUSIVE} "
               "LEFT JOIN tokens t ON t.id = l.token_id")


class LeaseQueries:
    """The statements on leases, and the host locks around them."""

    def __init__(self, db: Store):
        self.db = db

    async def lock_hosts(self, names: list[str]) -> None:
        """Take the row locks of hosts ``names`` (in the order of their names), as every
        heartbeat does for its own host first (docs/architecture.md, "Leases": one lock order).
        A write that begins or ends a lease takes its device's host's first, so it never
        interleaves with that host's heartbeat, which writes the devices' rows back whole.
        SQLite has one writer: nothing to take there."""
        if self.db.dialect == "postgresql" and names:
            await self.db.rows("SELECT name FROM hosts WHERE name = ANY(:names) ORDER BY name FOR UPDATE",
                               names=sorted(set(names)))

    async def lock_host_of_device(self, device: str) -> None:
        """``lock_hosts`` for the host of ``device``."""
        if self.db.dialect == "postgresql":
            await self.db.rows("SELECT h.name FROM hosts h JOIN devices d ON d.host = h.name WHERE d.name = :d "
                               "FOR UPDATE OF h", d=device)

    async def lease(self, lease_id: str, for_update: bool = False) -> LeaseRow | None:
        """The lease ``lease_id``; ``for_update``: its row locked to the transaction's end (take
        its host's lock first: ``lock_host_of_device``)."""
        return await self.db.row("SELECT * FROM leases WHERE id = :id" + (self.db.for_update if for_update else ""),
                                 id=lease_id)

    async def lease_holders(self, lease_ids: list[str]) -> dict[str, str]:
        """Lease id -> its holder, for ``lease_ids`` (those that exist)."""
        where, params = self.db.in_list("id", "ids", lease_ids)
        rows = await self.db.rows(f"SELECT id, holder FROM leases WHERE {where}", **params)
        return {r["id"]: r["holder"] for r in rows}

    async def lease_view(self, lease_id: str) -> LeaseView | None:
        """A lease with what its answer shows: its device's state and resources, its host's services."""
        return await self.db.row(f"{_LEASE_VIEW} WHERE l.id = :id", id=lease_id)

    async def live_lease_views_of_holder(self, holder: str) -> list[LeaseView]:
        return await self.db.rows(f"{_LEASE_VIEW} WHERE l.holder = :h AND l.state IN {LIVE_SQL} "
                                  "ORDER BY l.created_at", h=holder)

    async def last_lease_view(self, holder: str, device: str) -> LeaseView | None:
        """``holder``'s latest lease on ``device``, live or ended."""
        return await self.db.row(f"{_LEASE_VIEW} WHERE l.holder = :h AND l.device = :d "
                                 "ORDER BY l.created_at DESC LIMIT 1", h=holder, d=device)

    async def live_leases_of_holder(self, holder: str) -> list[LeaseRow]:
        return await self.db.rows(f"SELECT * FROM leases WHERE holder = :h AND state IN {LIVE_SQL} ORDER BY created_at",
                                  h=holder)

    async def desired_services(self, host: str) -> list[dict]:
        """The live leases of the devices ``host`` serves, with those devices' resources."""
        return await self.db.rows(
            "SELECT l.id, l.holder, l.device, l.secret, d.resources FROM leases l JOIN devices d ON d.name = l.device "
            f"WHERE d.host = :host AND d.present AND NOT d.retired AND l.state IN {LIVE_SQL} ORDER BY l.id", host=host)

    async def leases_past(self, column: str, states: tuple[str, ...], before: float) -> list[LeaseRow]:
        """Leases in ``states`` whose ``column`` is before ``before``, by their devices' hosts
        (ending them takes those hosts' locks in that order: two reapers never cross)."""
        marks = ", ".join(f"'{s}'" for s in states)
        return await self.db.rows(f"SELECT l.* FROM leases l LEFT JOIN devices d ON d.name = l.device WHERE l.state IN "
                                  f"({marks}) AND l.{column} < :before ORDER BY d.host, l.id", before=before)

    async def end_lease(self, lease_id: str, state: str, reason: str, now: float, overdue: bool = False,
                        pending: bool = False) -> dict | None:
        """Move a live lease to a final state: what it held of its token's budget (to settle),
        or None if it was no longer live (here or in another coordinator process), or no
        longer ``overdue`` (renewed meanwhile) or ``pending`` (its services came up meanwhile)
        when asked to be. The conditions are in the statement: a commit of another process in
        between is what it sees."""
        where = f"id = :id AND state IN {LIVE_SQL}"
        where += " AND expires_at <= :now" if overdue else ""
        where += " AND state = 'pending'" if pending else ""
        ended = await self.db.row(  # its secret dies with it: nothing keeps it longer
            f"UPDATE leases SET state = :state, end_reason = :reason, ended_at = :now, secret = NULL WHERE {where} "
            "RETURNING holder, token_id, held_s, held_from, held_period, token_counted", state=state, reason=reason,
            now=now, id=lease_id)
        if ended is None:
            return None
        await count_down(self.db, "live_leases", ended["holder"])
        return ended

    async def insert_lease_if_free(self, row: LeaseRow) -> bool:
        """Insert a lease unless its device has a live one (the partial UNIQUE index says so):
        False then, and nothing written, so the transaction goes on (a grant tries another)."""
        columns = list(row)
        inserted = await self.db.row(f"INSERT INTO leases ({', '.join(columns)}) VALUES "
                                     f"({', '.join(':' + c for c in columns)}) ON CONFLICT DO NOTHING RETURNING id",
                                     **row)
        return inserted is not None

    async def count_lease(self, holder: str, limit: int | None) -> bool:
        """Count a new live lease of ``holder``: False, and nothing counted, if they hold
        ``limit`` already. One statement, so two coordinator processes cannot both see room
        for one more: the second waits for the first's row and sees its count."""
        return await count_up(self.db, "live_leases", holder, 1, limit)

    async def activate_leases(self, lease_ids: list[str]) -> list[dict]:
        """Pending leases become active; those that did, with their ``created_at``."""
        if not lease_ids:
            return []
        where, params = self.db.in_list("id", "ids", lease_ids)
        return await self.db.rows(f"UPDATE leases SET state = 'active' WHERE state = 'pending' AND {where} "
                                  "RETURNING id, created_at", **params)

    async def set_lease_expiry(self, lease_id: str, expires_at: float, ends_at: float,
                               hold: dict[str, Any] | None = None) -> bool:
        """False if the lease is no longer live (ended by another process meanwhile). With
        ``hold``, what it holds of its token's budget now (its ``held_*`` columns)."""
        sets = "".join(f", {column} = :{column}" for column in hold or {})
        renewed = await self.db.row(f"UPDATE leases SET expires_at = :e, ends_at = :end{sets} WHERE id = :id AND "
                                    f"state IN {LIVE_SQL} RETURNING id", e=expires_at, end=ends_at, id=lease_id,
                                    **(hold or {}))
        return renewed is not None

    async def forgive_lapses(self, now: float) -> None:
        """Every live keepalive lease lapses ``keepalive_s`` from ``now`` at the earliest (never
        past its end): the lab is back from a time its clients could not reach it
        (docs/architecture.md, "A lab that was away")."""
        await self.db.run(f"UPDATE leases SET expires_at = {self.db.least}(:now + keepalive_s, ends_at) WHERE "
                          f"keepalive_s IS NOT NULL AND state IN {LIVE_SQL} AND expires_at < "
                          f"{self.db.least}(:now + keepalive_s, ends_at)", now=now)

    async def keep_alive(self, lease_id: str, now: float) -> None:
        """A keepalive lease that still lives lapses ``keepalive_s`` from ``now``, never past
        its end (docs/architecture.md, "Leases that live as long as their client"); any other
        is left as it is."""
        await self.db.run(f"UPDATE leases SET expires_at = {self.db.least}(:now + keepalive_s, ends_at) WHERE "
                          f"id = :id AND keepalive_s IS NOT NULL AND state IN {LIVE_SQL}", now=now, id=lease_id)
