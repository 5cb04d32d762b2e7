"""The statements on idempotency keys and the answers kept for them. Who may use them:
``OWNERS`` and ``LENT_TO`` (docs/architecture.md, "A service reaches only its tables")."""
from __future__ import annotations

from ..rows import IdempotencyRow
from .core import Store

# the coordinator modules whose tables these are, and those handed them besides (in rules.py)
OWNERS = ("idempotency.py",)
LENT_TO = ()


class IdempotencyQueries:
    """The statements on idempotency keys."""

    def __init__(self, db: Store):
        self.db = db

    async def idempotency_key(self, caller: str, key: str) -> IdempotencyRow | None:
        return await self.db.row("SELECT * FROM idempotency WHERE caller = :c AND key = :k", c=caller, k=key)

    async def save_idempotency_key(self, row: IdempotencyRow) -> None:
        await self.db.insert("idempotency", row)

    async def drop_idempotency_keys_before(self, before: float) -> None:
        await self.db.run("DELETE FROM idempotency WHERE created_at < :t", t=before)
