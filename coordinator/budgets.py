"""A scoped token's budget and its leases at once (docs/architecture.md, "Shares of one lab":
"A budget is held ahead, then settled").

Granting a lease to a budgeted token holds its whole length against the current period
(a UTC day, or the token's life) in one conditional statement, or what is left if less: the
lease then ends at the budget's end. A renewal with a ttl settles what the lease held so far
and holds afresh from now (each hold charged to the period it was made in); a lease that ends
gives back what it did not use. Left = budget - held - used. The live leases of a token whose
scope bounds them are counted the same way, one statement each.
"""
from __future__ import annotations

import calendar
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from typing_extensions import TypedDict

from device_loop.core.answers import BudgetAnswer, WhoamiAnswer
from device_loop.core.durations import iso
from device_loop.core.errors import ErrorCode
from device_loop.core.scopes import TokenScope
from device_loop.core.vocabulary import BudgetPeriod

from .errors import APIError
from .identity import scope_of
from .lease_scope import out_of_scope
from .rows import LeaseRow, TokenUsageRow
from .store.budgets import BudgetQueries, HoldAsk
from .who import Who

if TYPE_CHECKING:  # (lifecycle imports the metrics, which read the periods here)
    from .lifecycle import Lifecycle

MAX_BOARD_TOKENS = 200  # scoped tokens the web page's table shows
LEAST_HOLD_S = 1.0  # less left than this is nothing left: no lease is granted for under a second
USAGE_KEPT_DAYS = 400  # a day's usage per token is kept this long (a year's look back, and a month)


def period_of(now: float, period: BudgetPeriod) -> str:
    """The period a hold made at ``now`` is charged to: its UTC day, or the token's life."""
    return time.strftime("%Y-%m-%d", time.gmtime(now)) if period == BudgetPeriod.DAY else BudgetPeriod.TOKEN.value


def period_kind(period: str) -> BudgetPeriod:
    """What kind of period ``period`` (as ``period_of`` names it) is."""
    return BudgetPeriod.TOKEN if period == BudgetPeriod.TOKEN.value else BudgetPeriod.DAY


def period_end(now: float, period: BudgetPeriod) -> float | None:
    """When the period holding ``now`` ends (the next 00:00 UTC), or None: a token's never does."""
    if period != BudgetPeriod.DAY:
        return None
    day = time.gmtime(now)
    return calendar.timegm((day.tm_year, day.tm_mon, day.tm_mday, 0, 0, 0)) + 86400.0


def _minutes(seconds: float) -> str:
    """Device-minutes in words: whole ones, or tenths below ten."""
    minutes = max(0.0, seconds) / 60
    return f"{minutes:.0f}" if minutes >= 10 or minutes == int(minutes) else f"{minutes:.1f}"


def budget_words(budget_s: float, period: BudgetPeriod, left_s: float, now: float) -> str:
    """``budget: 3 of 120 device-minutes left today; it renews at 00:00 UTC``."""
    if period == BudgetPeriod.DAY:
        return (f"budget: {_minutes(left_s)} of {_minutes(budget_s)} device-minutes left today; it renews at "
                "00:00 UTC")
    return (f"budget: {_minutes(left_s)} of {_minutes(budget_s)} device-minutes left for this token's life; an admin "
            "raises it (device-loop admin token set TOKEN_ID --budget ...)")


class TokenUsage(TypedDict):
    """A scoped token's row of the admins' "Tokens" table."""
    token_id: str
    user: str
    kind: str
    band: str
    live_leases: int
    max_leases: int | None
    budget: BudgetAnswer | None


@dataclass(frozen=True)
class Spender:
    """A scoped token a lease is granted to: what its budget and its leases at once are kept under."""
    token_id: str
    scope: TokenScope

    @staticmethod
    def of(who: Who) -> Spender | None:
        """The caller's scoped token, or None (unscoped: nothing is held or counted)."""
        return None if who.scope is None or who.token_id is None else Spender(who.token_id, who.scope)


@dataclass(frozen=True)
class Hold:
    """What a grant or a renewal held: ``seconds`` in ``period``, fewer than asked if ``capped``."""
    seconds: float
    period: str
    capped: bool

    @staticmethod
    def of(held: float, want: float, period: str) -> Hold:
        """``held`` seconds of the ``want`` asked, in ``period``: capped if less (a float's
        rounding in the database's sum aside)."""
        return Hold(held, period, held < want - 1e-6)

    def columns(self, now: float) -> dict[str, Any]:
        """The lease's columns that record it."""
        return {"held_s": self.seconds, "held_from": now, "held_period": self.period, "budget_capped": self.capped}


NO_HOLD: dict[str, Any] = {"held_s": None, "held_from": None, "held_period": None, "budget_capped": False}


def used_of(lease: LeaseRow | dict, now: float) -> float:
    """What a lease's current hold used by ``now`` (never more than it held)."""
    held, start = lease["held_s"], lease["held_from"]
    return 0.0 if held is None or start is None else min(max(0.0, now - start), held)


class Budgets:
    """Holds and settlements of scoped tokens' budgets, and their leases at once."""

    def __init__(self, life: Lifecycle, *, budgets_sql: BudgetQueries):
        self.life = life
        self.budgets_sql = budgets_sql

    async def spender_of_ticket(self, token_id: str | None) -> Spender | None:
        """The scoped token a ticket was made with, under the scope it has now (an admin may
        have changed it since)."""
        if token_id is None:
            return None
        scope = scope_of(await self.budgets_sql.token_scope(token_id))
        return None if scope is None else Spender(token_id, scope)

    async def take(self, spender: Spender | None, want: float, now: float,
                   admitted: bool) -> tuple[Hold | None, bool]:
        """For a new lease of ``spender``: hold ``want`` seconds of its budget from ``now`` (what
        is left, if less; 403 ``budget_spent`` if nothing is), and count it against its most
        leases at once (403 ``out_of_scope`` at the bound, unless ``admitted``: a ticket's grant,
        the ticket was admitted, as the per-person count). (the hold or None: no budget,
        whether it was counted: its scope bounds them)."""
        if spender is None:
            return None, False
        scope = spender.scope
        ask = None if scope.budget_s is None else HoldAsk(period_of(now, scope.budget_period), want, scope.budget_s,
                                                          LEAST_HOLD_S)
        limit = scope.max_leases
        if ask is None and limit is None:
            return None, False
        held, counted = await self.budgets_sql.take(spender.token_id, ask, limit is not None,
                                                    None if admitted else limit)
        hold = None if ask is None or held is None else Hold.of(held, want, ask.period)
        if ask is not None and hold is None:
            await self.give_back(spender, None, counted)  # (a ticket's grant goes on in its transaction)
            raise await self.spent(spender, now)
        if limit is not None and not counted:
            await self.give_back(spender, hold, False)
            plural = "s" if limit > 1 else ""
            raise out_of_scope(f"this token may hold {limit} lease{plural} at once; release one first")
        return hold, counted

    async def hold(self, spender: Spender | None, want: float, now: float) -> Hold | None:
        """Hold ``want`` seconds of ``spender``'s budget from ``now`` (a renewal's; what is left,
        if less): None if it has no budget; 403 ``budget_spent`` if nothing is left."""
        budget = None if spender is None else spender.scope.budget_s
        if spender is None or budget is None:
            return None
        ask = HoldAsk(period_of(now, spender.scope.budget_period), want, budget, LEAST_HOLD_S)
        held, _ = await self.budgets_sql.take(spender.token_id, ask, False, None)
        if held is None:
            raise await self.spent(spender, now)
        return Hold.of(held, want, ask.period)

    async def spent(self, spender: Spender, now: float) -> APIError:
        """403 ``budget_spent``, saying what is left and when it renews."""
        scope = spender.scope
        budget = scope.budget_s or 0.0
        usage = await self.budgets_sql.usage(spender.token_id, period_of(now, scope.budget_period))
        left = budget - (usage["held_s"] + usage["used_s"] if usage else 0.0)
        return APIError(403, ErrorCode.BUDGET_SPENT, budget_words(budget, scope.budget_period, left, now))

    async def give_back(self, spender: Spender | None, hold: Hold | None, counted: bool) -> None:
        """What was held and counted for a lease that was not granted after all (its device
        taken meanwhile by another process, or the other half of ``take`` refused)."""
        if spender is not None and (hold is not None or counted):
            await self.budgets_sql.settle(spender.token_id, None if hold is None else hold.period,
                                          0.0 if hold is None else hold.seconds, 0.0, counted)

    async def settle(self, lease: dict, now: float) -> None:
        """A lease ended at ``now`` (the row ``end_lease`` returned): what it held and did not
        use is given back, and it no longer counts against its token's leases at once."""
        token_id = lease["token_id"]
        if token_id is None or (lease["held_s"] is None and not lease["token_counted"]):
            return
        await self.budgets_sql.settle(token_id, None if lease["held_s"] is None else lease["held_period"],
                                      lease["held_s"] or 0.0, used_of(lease, now), bool(lease["token_counted"]))

    async def renewal(self, lease: LeaseRow, spender: Spender | None, want: float, now: float) -> Hold | None:
        """A renewal with a ttl: what the lease held so far is settled as used to ``now``, and
        ``want`` seconds from now held afresh in the current period (None: no budget now)."""
        if lease["held_s"] is not None and lease["token_id"] is not None:
            await self.budgets_sql.settle(lease["token_id"], lease["held_period"], lease["held_s"], used_of(lease, now),
                                          False)
        return await self.hold(spender, want, now)

    async def prune(self, now: float) -> None:
        """Days of usage older than ``USAGE_KEPT_DAYS`` go (a token's life's is kept): one
        statement, run with the reaper's other pruning."""
        async with self.life.store.tx():
            await self.budgets_sql.prune_usage(period_of(now - USAGE_KEPT_DAYS * 86400.0, BudgetPeriod.DAY))

    async def whoami(self, who: Who) -> WhoamiAnswer:
        """Who the caller is, its scope, and (a budgeted token) its budget now."""
        scope, budget, live = who.scope, None, None
        if scope is not None and who.token_id is not None:
            if scope.max_leases is not None:
                live = await self.budgets_sql.live_leases(who.token_id)
            if scope.budget_s is not None:
                budget = await self.budget(who.token_id, scope, self.life.clock())
        return {"name": who.name, "kind": str(who.kind), "admin": who.admin, "token_id": who.token_id,
                "band": who.band, "scope": None if scope is None else scope.model_dump(mode="json"),
                "live_leases": live, "budget": budget}

    async def tokens_board(self) -> list[TokenUsage]:
        """The scoped tokens and what they hold and used of their budgets now, for the admins'
        "Tokens" table on the web page (``MAX_BOARD_TOKENS`` at most)."""
        now = self.life.clock()
        periods = [period_of(now, BudgetPeriod.DAY), period_of(now, BudgetPeriod.TOKEN)]
        rows = await self.budgets_sql.scoped_tokens(periods, MAX_BOARD_TOKENS)
        shown: dict[str, TokenUsage] = {}
        for row in rows:
            try:
                scope = scope_of(row["scope"])
            except APIError:  # (a scope that no longer holds: its calls are refused; admin token ls shows it)
                continue
            if scope is None:
                continue
            usage: TokenUsageRow | None = None
            if row["period"] is not None and row["period"] == period_of(now, scope.budget_period):
                usage = {"token_id": row["token_id"], "period": row["period"], "held_s": row["held_s"],
                         "used_s": row["used_s"]}
            if usage is None and row["token_id"] in shown:
                continue  # (a row of the period its budget is not in now)
            shown[row["token_id"]] = {
                "token_id": row["token_id"], "user": row["username"], "kind": row["kind"], "band": row["band"],
                "live_leases": int(row["live_leases"]), "max_leases": scope.max_leases,
                "budget": None if scope.budget_s is None else budget_answer(scope, usage, now)}
        return list(shown.values())

    async def budget(self, token_id: str, scope: TokenScope, now: float) -> BudgetAnswer:
        """``token_id``'s budget in the period of ``now``."""
        usage = await self.budgets_sql.usage(token_id, period_of(now, scope.budget_period))
        return budget_answer(scope, usage, now)


def budget_answer(scope: TokenScope, usage: TokenUsageRow | None, now: float) -> BudgetAnswer:
    """A budget as whoami, the web page and the metrics show it."""
    budget = scope.budget_s or 0.0
    held = usage["held_s"] if usage else 0.0
    used = usage["used_s"] if usage else 0.0
    left = max(0.0, budget - held - used)
    return {"budget_s": budget, "period": scope.budget_period, "held_s": round(held, 3), "used_s": round(used, 3),
            "left_s": round(left, 3), "renews_at": iso(period_end(now, scope.budget_period)),
            "words": budget_words(budget, scope.budget_period, left, now)}
