"""The statements on the hosts table, and on what hosts found and were told to adopt
(candidates, adoptions). Who may use them: ``OWNERS`` and ``LENT_TO``
(docs/architecture.md, "A service reaches only its tables")."""
from __future__ import annotations

from ..rows import AdoptionRow, CandidateRow, HostRow
from .core import Store

# the coordinator modules whose tables these are, and those handed them besides (in rules.py)
OWNERS = ("hosts.py",)
LENT_TO = ("admin.py", "devices.py")


class HostQueries:
    """The statements on hosts, candidates and adoptions."""

    def __init__(self, db: Store):
        self.db = db

    async def host(self, name: str, for_update: bool = False) -> HostRow | None:
        return await self.db.row("SELECT * FROM hosts WHERE name = :name" + (self.db.for_update if for_update else ""),
                                 name=name)

    async def hosts(self) -> list[HostRow]:
        return await self.db.rows("SELECT * FROM hosts ORDER BY name")

    async def save_host(self, row: dict, new: bool) -> None:
        if new:
            await self.db.insert("hosts", row)
        else:
            await self.db.update("hosts", "name", row["name"], {k: v for k, v in row.items() if k != "name"})

    async def hosts_silent_since(self, now: float, periods: float, minimum: float, serving_since: float) -> list[str]:
        """Online hosts not heard of for ``periods`` of their heartbeat (``minimum`` seconds at
        least), counting from ``serving_since`` at the earliest."""
        rows = await self.db.rows(
            "SELECT name FROM hosts WHERE online AND "
            "CASE WHEN last_seen > :since THEN last_seen ELSE :since END < :now - "
            "CASE WHEN heartbeat_s * :periods > :minimum THEN heartbeat_s * :periods ELSE :minimum END ORDER BY name",
            now=now, periods=periods, minimum=minimum, since=serving_since)
        return [r["name"] for r in rows]

    async def set_host_draining(self, name: str, draining: bool) -> None:
        await self.db.run("UPDATE hosts SET draining = :d WHERE name = :name", d=draining, name=name)

    async def set_link_lost(self, name: str, boot_id: str) -> None:
        """``boot_id`` of ``name`` dropped its long-poll (no later boot has reported yet)."""
        await self.db.run("UPDATE hosts SET link_lost = :lost WHERE name = :name AND boot_id = :boot",
                          lost=True, name=name, boot=boot_id)

    async def set_host_offline(self, name: str) -> None:
        await self.db.run("UPDATE hosts SET online = :off WHERE name = :name", off=False, name=name)

    async def save_candidates(self, rows: list[dict]) -> None:
        await self.db.insert_many("candidates", rows, upsert_key="identifier")

    async def candidates(self) -> list[CandidateRow]:
        return await self.db.rows(
            "SELECT c.*, a.name AS adopted_as FROM candidates c LEFT JOIN adoptions a ON a.identifier = c.identifier "
            "ORDER BY c.host, c.identifier")

    async def candidate(self, identifier: str) -> dict | None:
        return await self.db.row("SELECT * FROM candidates WHERE identifier = :i", i=identifier)

    async def insert_adoption(self, row: AdoptionRow) -> None:
        await self.db.insert("adoptions", row)

    async def adoptions_on_host(self, host: str) -> list[AdoptionRow]:
        return await self.db.rows("SELECT * FROM adoptions WHERE host = :h ORDER BY identifier", h=host)

    async def forget_host(self, name: str) -> None:
        """Delete a host with what it found and was told to adopt (its devices are
        ``forget_devices``'s to delete, its claims ``drop_claims``'s)."""
        await self.db.run("DELETE FROM candidates WHERE host = :h", h=name)
        await self.db.run("DELETE FROM adoptions WHERE host = :h", h=name)
        await self.db.run("DELETE FROM hosts WHERE name = :h", h=name)
