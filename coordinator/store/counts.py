"""What each person holds (``user_counts``), counted where it changes: one column a
service's (live leases, image bytes, open tickets, open jobs, stored job runs), each counted by its own
query module through these two."""
from __future__ import annotations

from .core import Store

_NO_LIMIT = 2**62  # a count's limit where there is none (BIGINT)
_COUNTED = ("live_leases", "image_bytes", "open_tickets", "open_jobs", "stored_runs")


async def count_up(db: Store, column: str, name: str, amount: int, limit: int | None) -> bool:
    """Count ``amount`` more of ``column`` for ``name``: False, and nothing counted, if that
    would take it over ``limit``. One statement, so two coordinator processes cannot both
    see room for one more: the second waits for the first's row and sees its count."""
    if limit is not None and amount > limit:
        return False  # (the INSERT below counts a first amount without asking)
    others = [c for c in _COUNTED if c != column]
    zeros = ", ".join("0" for _ in others)
    row = await db.row(
        f"INSERT INTO user_counts (name, {column}, {', '.join(others)}) VALUES (:n, :a, {zeros}) "
        f"ON CONFLICT (name) DO UPDATE SET {column} = user_counts.{column} + :a "
        f"WHERE user_counts.{column} + :a <= :limit RETURNING name",
        n=name, a=amount, limit=_NO_LIMIT if limit is None else limit)
    return row is not None


async def count_down(db: Store, column: str, name: str, amount: int = 1) -> None:
    """``amount`` less of ``column`` for ``name``."""
    await db.run(f"UPDATE user_counts SET {column} = {column} - :a WHERE name = :n", a=amount, n=name)
