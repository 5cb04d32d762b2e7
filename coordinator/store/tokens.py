"""The statements on API tokens (only their hashes are stored). Who may use them: ``OWNERS``
and ``LENT_TO`` (docs/architecture.md, "A service reaches only its tables")."""
from __future__ import annotations

from ..rows import TokenRow
from .core import Store

# the coordinator modules whose tables these are, and those handed them besides (in rules.py)
OWNERS = ("identity.py", "admin.py")
LENT_TO = ()


class TokenQueries:
    """The statements on tokens."""

    def __init__(self, db: Store):
        self.db = db

    async def insert_token(self, row: TokenRow) -> None:
        async with self.db.tx():
            await self.db.insert("tokens", row)

    async def token(self, token_id: str, for_update: bool = False) -> TokenRow | None:
        """Token ``token_id``; ``for_update``: its row locked to the transaction's end."""
        return await self.db.row("SELECT * FROM tokens WHERE id = :id" + (self.db.for_update if for_update else ""),
                                 id=token_id)

    async def token_by_hash(self, digest: str) -> TokenRow | None:
        return await self.db.row("SELECT * FROM tokens WHERE hash = :h", h=digest)

    async def tokens(self) -> list[TokenRow]:
        return await self.db.rows("SELECT * FROM tokens ORDER BY created_at")

    async def revoke_token(self, token_id: str, now: float) -> None:
        await self.db.run("UPDATE tokens SET revoked_at = :now WHERE id = :id AND revoked_at IS NULL",
                          now=now, id=token_id)

    async def set_scope(self, token_id: str, scope: str | None, band: str) -> None:
        await self.db.run("UPDATE tokens SET scope = :scope, band = :band WHERE id = :id", scope=scope, band=band,
                          id=token_id)
