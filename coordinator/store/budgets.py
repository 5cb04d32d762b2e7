"""The statements on what scoped tokens hold (docs/architecture.md, "Shares of one lab"): each
token's budget per period (``token_usage``: device-seconds held ahead by live leases, used by
ended ones) and its live leases (``token_counts``), each changed in one conditional statement
so that two coordinator processes cannot both see room for one more. Who may use them:
``OWNERS`` and ``LENT_TO`` (docs/architecture.md, "A service reaches only its tables")."""
from __future__ import annotations

from typing import Any, NamedTuple

from device_loop.core.vocabulary import BudgetPeriod

from ..rows import TokenUsageRow
from .core import Store

# the coordinator modules whose tables these are, and those handed them besides (in rules.py)
OWNERS = ("budgets.py",)
LENT_TO = ()


class HoldAsk(NamedTuple):
    """What a hold asks of a budget: up to ``want`` seconds of ``budget`` in ``period``, none if
    less than ``least`` is left."""
    period: str
    want: float
    budget: float
    least: float


class BudgetQueries:
    """The statements on token_usage and token_counts (and the scope a ticket's token has now)."""

    def __init__(self, db: Store):
        self.db = db

    def _hold_sql(self, ask: HoldAsk) -> tuple[str, dict[str, Any]]:
        """Hold up to ``ask.want`` seconds of the budget in ``ask.period`` (what is left, if
        less), unless less than ``ask.least`` is left: returns ``last_hold_s``, or no row. The
        row's lock orders two processes; the second sees the first's hold in its condition."""
        grant = f"{self.db.least}(:want, :budget - token_usage.held_s - token_usage.used_s)"
        return ("INSERT INTO token_usage (token_id, period, held_s, used_s, last_hold_s) "
                "VALUES (:t, :p, :first, 0, :first) ON CONFLICT (token_id, period) DO UPDATE "
                f"SET held_s = token_usage.held_s + {grant}, last_hold_s = {grant} "
                "WHERE token_usage.held_s + token_usage.used_s + :least <= :budget RETURNING last_hold_s",
                {"p": ask.period, "first": min(ask.want, ask.budget), "want": ask.want, "budget": ask.budget,
                 "least": ask.least})

    _COUNT = ("INSERT INTO token_counts (token_id, live_leases) VALUES (:t, 1) ON CONFLICT (token_id) DO UPDATE "
              "SET live_leases = token_counts.live_leases + 1 WHERE token_counts.live_leases + 1 <= :limit "
              "RETURNING token_id")

    async def take(self, token_id: str, ask: HoldAsk | None, count: bool,
                   limit: int | None) -> tuple[float | None, bool]:
        """For a new lease of ``token_id``: hold what ``ask`` asks of its budget, and (``count``)
        count it against its leases at once unless it holds ``limit`` (None: never refused).
        (seconds held or None, counted). Each is conditional, so two coordinator processes
        cannot both see room for one more; on PostgreSQL both are one statement (two
        data-modifying parts), on SQLite (one writer) one each. What one did when the other
        refused is the caller's to give back (``settle``)."""
        if ask is not None and ask.budget < ask.least:
            return None, False  # nothing to hold, nothing counted (its INSERT would hold a first amount unasked)
        values: dict[str, Any] = {"t": token_id, "limit": 2**62 if limit is None else limit}
        hold_sql = None
        if ask is not None:
            hold_sql, hold_values = self._hold_sql(ask)
            values |= hold_values
        if self.db.dialect == "postgresql" and hold_sql is not None and count:
            row = await self.db.row(f"WITH h AS ({hold_sql}), c AS ({self._COUNT}) SELECT (SELECT last_hold_s FROM h) "
                                    "AS held, (SELECT COUNT(*) FROM c) AS counted", **values)
            return (None if row["held"] is None else float(row["held"])), bool(row["counted"])
        held: float | None = None
        if hold_sql is not None:
            row = await self.db.row(hold_sql, **values)
            held = None if row is None else float(row["last_hold_s"])
        counted = count and (limit is None or limit >= 1) and await self.db.row(self._COUNT, **values) is not None
        return held, bool(counted)

    async def settle(self, token_id: str, period: str | None, held: float, used: float, uncount: bool) -> None:
        """A hold of ``held`` seconds in ``period`` (None: none) ends having used ``used`` of
        them: the rest is given back; with ``uncount``, one live lease fewer. One statement."""
        give_back = ("UPDATE token_usage SET held_s = held_s - :held, used_s = used_s + :used "
                     "WHERE token_id = :t AND period = :p")
        fewer = "UPDATE token_counts SET live_leases = live_leases - 1 WHERE token_id = :t"
        values = {"t": token_id, "held": held, "used": used, "p": period}
        if period is not None and uncount and self.db.dialect == "postgresql":
            await self.db.run(f"WITH g AS ({give_back} RETURNING token_id), f AS ({fewer} RETURNING token_id) "
                              "SELECT 1", **values)
            return
        if period is not None:
            await self.db.run(give_back, **values)
        if uncount:
            await self.db.run(fewer, t=token_id)

    async def usage(self, token_id: str, period: str) -> TokenUsageRow | None:
        """``token_id``'s budget in ``period``: None if nothing was ever held there."""
        return await self.db.row("SELECT token_id, period, held_s, used_s FROM token_usage "
                                 "WHERE token_id = :t AND period = :p", t=token_id, p=period)

    async def scoped_tokens(self, periods: list[str], limit: int) -> list[dict]:
        """The scoped tokens not revoked (``limit`` at most), each with its usage in any of
        ``periods`` (a row per period; none: nothing held there yet), for the admins' table."""
        where, params = self.db.in_list("u.period", "periods", periods)
        return await self.db.rows(
            "SELECT t.id AS token_id, t.username AS username, t.kind AS kind, t.band AS band, t.scope AS scope, "
            "u.period AS period, u.held_s AS held_s, u.used_s AS used_s, COALESCE(c.live_leases, 0) AS live_leases "
            f"FROM tokens t LEFT JOIN token_usage u ON u.token_id = t.id AND {where} "
            "LEFT JOIN token_counts c ON c.token_id = t.id "
            "WHERE t.scope IS NOT NULL AND t.revoked_at IS NULL ORDER BY t.username, t.id LIMIT :n", n=limit,
            **params)

    async def prune_usage(self, before_day: str) -> None:
        """The days' usage rows of days before ``before_day`` (YYYY-MM-DD) go; a token's life's stays."""
        await self.db.run("DELETE FROM token_usage WHERE period < :day AND period <> :token", day=before_day,
                          token=BudgetPeriod.TOKEN.value)

    async def live_leases(self, token_id: str) -> int:
        """How many live leases count against ``token_id``'s most leases at once."""
        row = await self.db.row("SELECT live_leases FROM token_counts WHERE token_id = :t", t=token_id)
        return 0 if row is None else int(row["live_leases"])

    async def token_scope(self, token_id: str) -> str | None:
        """The scope (JSON) token ``token_id`` has now, for a grant from its ticket: an admin
        may have changed it since the ticket was made (None: unscoped now, or no such token)."""
        row = await self.db.row("SELECT scope FROM tokens WHERE id = :t", t=token_id)
        return None if row is None else row["scope"]
