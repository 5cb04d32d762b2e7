"""The statements on what scoped tokens hold (docs/architecture.md, "Shares of one lab"): each
token's budget per period (``token_usage``: device-seconds held ahead by live leases, used by
ended ones) and its live leases (``token_counts``), each changed in one conditional statement
so that two coordinator processes cannot both see room for one more. Who may use them:
``OWNERS`` and ``LENT_TO`` (docs/architecture.md, "A service reaches only its tables")."""
from __future__ import annotations

from ..rows import TokenUsageRow
from .core import Store

# the coordinator modules whose tables these are, and those handed them besides (in rules.py)
OWNERS = ("budgets.py",)
LENT_TO = ()


class BudgetQueries:
    """The statements on token_usage and token_counts (and the scope a ticket's token has now)."""

    def __init__(self, db: Store):
        self.db = db

    async def hold(self, token_id: str, period: str, want: float, budget: float, least: float) -> float | None:
        """Hold up to ``want`` seconds of ``token_id``'s ``budget`` in ``period``: what is held
        (``want``, or what is left if less), or None, and nothing held, if less than ``least``
        is left. One statement: the row's lock orders two processes, and the second sees the
        first's hold in its condition."""
        if budget < least:
            return None  # (the INSERT below holds a first amount without asking)
        least_of = "MIN" if self.db.dialect == "sqlite" else "LEAST"
        grant = f"{least_of}(:want, :budget - token_usage.held_s - token_usage.used_s)"
        row = await self.db.row(
            "INSERT INTO token_usage (token_id, period, held_s, used_s, last_hold_s) "
            "VALUES (:t, :p, :first, 0, :first) ON CONFLICT (token_id, period) DO UPDATE "
            f"SET held_s = token_usage.held_s + {grant}, last_hold_s = {grant} "
            "WHERE token_usage.held_s + token_usage.used_s + :least <= :budget RETURNING last_hold_s",
            t=token_id, p=period, first=min(want, budget), want=want, budget=budget, least=least)
        return None if row is None else float(row["last_hold_s"])

    async def settle(self, token_id: str, period: str, held: float, used: float) -> None:
        """A hold of ``held`` seconds ends having used ``used`` of them: the rest is given back."""
        await self.db.run("UPDATE token_usage SET held_s = held_s - :held, used_s = used_s + :used "
                          "WHERE token_id = :t AND period = :p", held=held, used=used, t=token_id, p=period)

    async def usage(self, token_id: str, period: str) -> TokenUsageRow | None:
        """``token_id``'s budget in ``period``: None if nothing was ever held there."""
        return await self.db.row("SELECT token_id, period, held_s, used_s FROM token_usage "
                                 "WHERE token_id = :t AND period = :p", t=token_id, p=period)

    async def usage_in(self, periods: list[str]) -> list[TokenUsageRow]:
        """Every token's budget in any of ``periods`` (today's, and the tokens' lives)."""
        where, params = self.db.in_list("period", "periods", periods)
        return await self.db.rows(f"SELECT token_id, period, held_s, used_s FROM token_usage WHERE {where} "
                                  "ORDER BY token_id, period", **params)

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

    async def count_lease(self, token_id: str, limit: int | None) -> bool:
        """Count a new live lease of ``token_id``: False, and nothing counted, if it holds
        ``limit`` already (None: counted, never refused). One statement (as ``counts.count_up``)."""
        if limit is not None and limit < 1:
            return False
        row = await self.db.row(
            "INSERT INTO token_counts (token_id, live_leases) VALUES (:t, 1) ON CONFLICT (token_id) DO UPDATE "
            "SET live_leases = token_counts.live_leases + 1 WHERE token_counts.live_leases + 1 <= :limit "
            "RETURNING token_id", t=token_id, limit=2**62 if limit is None else limit)
        return row is not None

    async def uncount_lease(self, token_id: str) -> None:
        """One live lease fewer for ``token_id``."""
        await self.db.run("UPDATE token_counts SET live_leases = live_leases - 1 WHERE token_id = :t", t=token_id)

    async def live_leases(self, token_id: str) -> int:
        """How many live leases count against ``token_id``'s most leases at once."""
        row = await self.db.row("SELECT live_leases FROM token_counts WHERE token_id = :t", t=token_id)
        return 0 if row is None else int(row["live_leases"])

    async def token_scope(self, token_id: str) -> str | None:
        """The scope (JSON) token ``token_id`` has now, for a grant from its ticket: an admin
        may have changed it since the ticket was made (None: unscoped now, or no such token)."""
        row = await self.db.row("SELECT scope FROM tokens WHERE id = :t", t=token_id)
        return None if row is None else row["scope"]
