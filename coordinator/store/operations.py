"""The statements on the operations table. Who may use them: ``OWNERS`` and ``LENT_TO``
(docs/architecture.md, "A service reaches only its tables")."""
from __future__ import annotations

from typing import Any

from device_loop.core import FLASH_KIND
from device_loop.core.vocabulary import OperationState

from ..rows import FlashedImage, OperationRow, OperationView
from .core import Store
from .facts import ENDED_OP_SQL, LIVE_OP_SQL

# the coordinator modules whose tables these are, and those handed them besides (in rules.py)
OWNERS = ("operations.py",)
LENT_TO = ("hosts.py", "steps.py", "admin.py", "images.py", "devices.py")


DONE_SQL = f"('{OperationState.DONE}')"
_OPERATION_VIEW = "SELECT o.*, h.online AS host_online FROM operations o LEFT JOIN hosts h ON h.name = o.host"


class OperationQueries:
    """The statements on operations."""

    def __init__(self, db: Store):
        self.db = db

    async def insert_operation(self, row: OperationRow) -> None:
        await self.db.insert("operations", dict(row))

    async def operation(self, op_id: str) -> OperationView | None:
        return await self.db.row(f"{_OPERATION_VIEW} WHERE o.id = :id", id=op_id)

    async def operations_of_device(self, device: str, limit: int, kind: str | None = None) -> list[OperationView]:
        """A device's latest operations (of ``kind``), newest first."""
        of_kind = "" if kind is None else " AND o.kind = :k"
        by_kind: dict[str, Any] = {"k": kind} if kind else {}
        return await self.db.rows(f"{_OPERATION_VIEW} WHERE o.device = :d{of_kind} ORDER BY o.created_at DESC "
                                  "LIMIT :n", d=device, n=limit, **by_kind)

    async def last_flashed_image(self, device: str) -> FlashedImage | None:
        """The image of the device's latest flash that completed (a fingerprint names it)."""
        return await self.db.row("SELECT image_name AS name, image_sha256 AS sha256 FROM operations WHERE device = :d "
                                 f"AND kind = '{FLASH_KIND}' AND state = '{OperationState.DONE}' "
                                 "AND image_sha256 IS NOT NULL ORDER BY created_at DESC LIMIT 1", d=device)

    async def live_image_uses(self, sha256: str, host: str | None = None) -> list[OperationRow]:
        """The live operations that write image ``sha256`` (on ``host``)."""
        on_host = "" if host is None else " AND host = :h"
        by_host: dict[str, Any] = {"h": host} if host else {}
        return await self.db.rows(f"SELECT * FROM operations WHERE image_sha256 = :s AND state IN {LIVE_OP_SQL}"
                                  f"{on_host} ORDER BY created_at", s=sha256, **by_host)

    async def queued_operations(self, host: str) -> list[OperationRow]:
        """The operations ``host`` should begin (those it began are its own to finish)."""
        return await self.db.rows("SELECT * FROM operations WHERE host = :h AND state = :q ORDER BY created_at",
                                  h=host, q=OperationState.QUEUED)

    async def operations_to_update(self, host: str, reported: list[str], restarted: bool,
                                   boot_id: str) -> list[OperationRow]:
        """The operations of ``host`` its report speaks of (an exporter speaks only for its
        own host), and after a restart of its exporter those it ran under an earlier boot."""
        where, params = self.db.in_list("id", "ids", reported)
        if restarted:
            where += " OR (state = :running AND boot_id <> :boot)"
            params |= {"boot": boot_id, "running": OperationState.RUNNING}
        return await self.db.rows(f"SELECT * FROM operations WHERE host = :h AND ({where})", h=host,
                                  **params)

    async def update_operation(self, op_id: str, fields: dict[str, Any]) -> None:
        await self.db.update("operations", "id", op_id, fields)

    async def live_operations_of_lease(self, lease_id: str, kind: str) -> list[OperationRow]:
        """The live operations of ``kind`` on lease ``lease_id``, oldest first."""
        return await self.db.rows(f"SELECT * FROM operations WHERE lease_id = :l AND state IN {LIVE_OP_SQL} "
                                  "AND kind = :k ORDER BY created_at, id", l=lease_id, k=kind)

    async def prune_operations(self, before: float, limit: int) -> int:
        """Delete at most ``limit`` operations that ended before ``before``, the oldest first;
        never a device's latest flash that ended, nor its latest that completed (what a
        fingerprint names, what a reserve's image prefers). How many went."""
        latest = (f"(SELECT g.id FROM operations g WHERE g.device = o.device AND g.kind = '{FLASH_KIND}' AND g.state "
                  "IN {states} ORDER BY g.created_at DESC, g.id DESC LIMIT 1)")
        gone = await self.db.rows(
            f"DELETE FROM operations WHERE id IN (SELECT o.id FROM operations o WHERE o.ended_at < :b "
            f"AND o.state IN {ENDED_OP_SQL} AND NOT (o.kind = '{FLASH_KIND}' AND "
            f"(o.id = {latest.format(states=ENDED_OP_SQL)} OR o.id = {latest.format(states=DONE_SQL)})) "
            "ORDER BY o.ended_at LIMIT :n) RETURNING id", b=before, n=limit)
        return len(gone)
