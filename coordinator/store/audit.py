"""The statements on the audit log. Who may use them: ``OWNERS`` and ``LENT_TO``
(docs/architecture.md, "A service reaches only its tables")."""
from __future__ import annotations

from ..rows import AuditRow
from .core import Store

# the coordinator modules whose tables these are, and those handed them besides (in rules.py)
OWNERS = ("lifecycle.py",)
LENT_TO = ("devices.py",)


class AuditQueries:
    """The statements on the audit log."""

    def __init__(self, db: Store):
        self.db = db

    async def add_audit(self, row: dict) -> int:
        """Append to the audit log; the entry's id."""
        if not self.db.in_transaction():
            async with self.db.tx():
                return await self.add_audit(row)
        columns = ", ".join(row)
        entry = await self.db.row(f"INSERT INTO audit ({columns}) VALUES ({', '.join(':' + c for c in row)}) "
                                  "RETURNING id", **row)
        return entry["id"]

    async def audit(self, limit: int = 100) -> list[AuditRow]:
        return await self.db.rows("SELECT * FROM audit ORDER BY id DESC LIMIT :n", n=limit)

    async def prune_audit(self, before: float, limit: int) -> int:
        """Delete at most ``limit`` entries written before ``before``, the oldest first; how many went."""
        gone = await self.db.rows("DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE at < :b ORDER BY at, id "
                                  "LIMIT :n) RETURNING id", b=before, n=limit)
        return len(gone)
