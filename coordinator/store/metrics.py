"""What the Prometheus exposition counts of the whole lab: a few reads across tables, and no
write. Who may use them: ``OWNERS`` and ``LENT_TO``
(docs/architecture.md, "A service reaches only its tables")."""
from __future__ import annotations

from device_loop.core.vocabulary import TicketState

from .core import Store
from .facts import LIVE_SQL

# the coordinator modules whose tables these are, and those handed them besides (in rules.py)
OWNERS = ("metrics.py",)
LENT_TO = ()


class MetricQueries:
    """The counts the Prometheus exposition reads."""

    def __init__(self, db: Store):
        self.db = db

    async def device_counts(self) -> list[dict]:
        """How many devices there are of each state and class."""
        return await self.db.rows("SELECT state, class, COUNT(*) AS n FROM devices GROUP BY state, class")

    async def live_lease_counts(self) -> dict[str, int]:
        """Live leases in the whole lab, by state."""
        rows = await self.db.rows(f"SELECT state, COUNT(*) AS n FROM leases WHERE state IN {LIVE_SQL} GROUP BY state")
        return {r["state"]: r["n"] for r in rows}

    async def host_heartbeats(self) -> list[dict]:
        """Each host's name, whether it is online, and when it last reported."""
        return await self.db.rows("SELECT name, online, last_seen FROM hosts ORDER BY name")

    async def online_host_plugins(self) -> list[dict]:
        """Each online host's name and its plugins as its last heartbeat reported them (what
        they measure of themselves among it)."""
        return await self.db.rows("SELECT name, plugins FROM hosts WHERE online ORDER BY name")

    async def waiting_ticket_counts(self) -> list[dict]:
        """Waiting tickets by what they wait for (a class, or a device's) and kind."""
        return await self.db.rows("SELECT COALESCE(t.device_class, d.class, '') AS class, t.kind AS kind, "
                                  "COUNT(*) AS n FROM tickets t LEFT JOIN devices d ON d.name = t.device "
                                  "WHERE t.state = :w GROUP BY COALESCE(t.device_class, d.class, ''), t.kind",
                                  w=TicketState.WAITING)

    async def token_usage(self, periods: list[str]) -> list[dict]:
        """Each scoped token's device-seconds held and used in any of ``periods`` (today's and
        the tokens' lives), with its owner's name."""
        where, params = self.db.in_list("u.period", "periods", periods)
        return await self.db.rows("SELECT u.token_id AS token_id, t.username AS username, u.period AS period, "
                                  "u.held_s AS held_s, u.used_s AS used_s FROM token_usage u "
                                  f"JOIN tokens t ON t.id = u.token_id WHERE {where} ORDER BY u.token_id, u.period",
                                  **params)

