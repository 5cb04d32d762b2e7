"""The statements on the image registry (images, their files, known-good marks) and the
bytes each person uploaded (docs/architecture.md, "Image registry"). Who may use them:
``OWNERS`` and ``LENT_TO`` (docs/architecture.md, "A service reaches only its tables")."""
from __future__ import annotations

from ..rows import ImageRow, KnownGoodImage, ListedImage
from .core import Store
from .counts import count_down, count_up
from .facts import LIVE_OP_SQL

# the coordinator modules whose tables these are, and those handed them besides (in rules.py)
OWNERS = ("images.py",)
LENT_TO = ("operations.py",)


class ImageQueries:
    """The statements on images, their files and known-good marks."""

    def __init__(self, db: Store):
        self.db = db

    async def insert_image(self, row: ImageRow) -> None:
        await self.db.insert("images", row)

    async def image(self, sha256: str) -> ImageRow | None:
        """An image by its sha256 (never by its name: images.py says why)."""
        return await self.db.row("SELECT * FROM images WHERE sha256 = :s", s=sha256)

    async def images_by_prefix(self, prefix: str) -> list[ImageRow]:
        """Images whose sha256 starts with ``prefix`` (lower-case hex): a few, to name them."""
        return await self.db.rows("SELECT * FROM images WHERE sha256 LIKE :p ORDER BY name LIMIT 5", p=prefix + "%")

    async def image_names(self, limit: int) -> list[str]:
        """The images' names (the first ``limit``, in order)."""
        return [r["name"] for r in await self.db.rows("SELECT DISTINCT name FROM images WHERE name IS NOT NULL "
                                                      "ORDER BY name LIMIT :n", n=limit)]

    async def images_named(self, name: str) -> list[ImageRow]:
        """The images called ``name`` (one per target at most)."""
        return await self.db.rows("SELECT * FROM images WHERE name = :n ORDER BY target", n=name)

    async def pin_image_file(self, sha256: str, at: float) -> None:
        """An upload is about to put the file of ``sha256`` in place: the sweep leaves it alone
        until its row is there (or the pin is old)."""
        await self.db.insert_many("image_files", [{"sha256": sha256, "pinned_at": at}], upsert_key="sha256")

    async def adopt_image_files(self, sha256s: list[str], at: float) -> None:
        """Files found in the registry's folder without a row of their own (left by an earlier
        version, or a crash): rows for them, pinned ``at``, so the sweep treats them as any other."""
        if sha256s:
            # (WHERE true: SQLite reads an INSERT ... SELECT's ON CONFLICT as a join's ON without it)
            await self.db.run("INSERT INTO image_files (sha256, pinned_at) SELECT value, :at FROM "
                              f"({self.db.rows_of('value', 'shas')}) found WHERE true ON CONFLICT (sha256) DO NOTHING",
                             at=at, shas=self.db.list_param(sha256s))

    async def image_file_names(self) -> set[str]:
        return {r["sha256"] for r in await self.db.rows("SELECT sha256 FROM image_files")}

    async def unused_image_files(self, pinned_before: float) -> list[str]:
        """Take the rows of files that no image uses and no upload pinned since
        ``pinned_before``; their files are the caller's to remove before the transaction
        commits (PostgreSQL keeps those rows locked meanwhile, so a new pin waits)."""
        rows = await self.db.rows("DELETE FROM image_files WHERE pinned_at < :b AND sha256 NOT IN "
                                  "(SELECT sha256 FROM images) RETURNING sha256", b=pinned_before)
        return [r["sha256"] for r in rows]

    async def images(self, targets: list[str] | None = None) -> list[ListedImage]:
        """Every image (or those for ``targets``), with the targets it is known-good for."""
        rows: list[ImageRow] = await self.db.rows("SELECT * FROM images ORDER BY created_at DESC")
        good: dict[str, list[str]] = {}
        for mark in await self.db.rows("SELECT DISTINCT sha256, target FROM known_good ORDER BY target"):
               good.setdefault(mark["sha256"], []).append(mark["target"])
        return [{**r, "known_good_for": good.get(r["sha256"], [])} for r in rows
                if targets is None or r["target"] in targets]

    async def mark_known_good(self, row: dict) -> None:
        await self.db.insert("known_good", row)

    async def latest_known_good(self, target: str) -> KnownGoodImage | None:
        return await self.db.row("SELECT i.*, k.at AS marked_at FROM known_good k JOIN images i ON i.sha256 = k.sha256 "
                                 "WHERE k.target = :t ORDER BY k.id DESC LIMIT 1", t=target)

    async def sole_known_good_targets(self, sha256: str) -> list[str]:
        """The targets for which this image is the only known-good one."""
        rows = await self.db.rows(
            "SELECT target FROM known_good WHERE sha256 = :s AND target NOT IN "
            "(SELECT target FROM known_good WHERE sha256 <> :s) GROUP BY target ORDER BY target", s=sha256)
        return [r["target"] for r in rows]

    async def delete_image(self, sha256: str) -> None:
        await self.db.run("DELETE FROM known_good WHERE sha256 = :s", s=sha256)
        await self.db.run("DELETE FROM images WHERE sha256 = :s", s=sha256)

    async def images_unused_since(self, before: float) -> list[ImageRow]:
        """Images no target has as known-good, and that nothing used since ``before``."""
        return await self.db.rows("SELECT * FROM images WHERE last_used_at < :b AND sha256 NOT IN "
                                  "(SELECT sha256 FROM known_good) AND sha256 NOT IN (SELECT image_sha256 FROM "
                                  f"operations WHERE image_sha256 IS NOT NULL AND state IN {LIVE_OP_SQL}) "
                                  "ORDER BY name", b=before)

    async def known_good_targets(self, sha256: str) -> list[str]:
        return [r["target"] for r in await self.db.rows("SELECT DISTINCT target FROM known_good WHERE sha256 = :s "
                                                        "ORDER BY target", s=sha256)]

    async def set_image_used(self, sha256: str, at: float) -> None:
        await self.db.run("UPDATE images SET last_used_at = :at WHERE sha256 = :s", at=at, s=sha256)

    async def count_image_bytes(self, uploader: str, size: int, quota: int | None) -> bool:
        """Count ``size`` more bytes of images uploaded by ``uploader``: False, and nothing
        counted, if that would take them over ``quota``."""
        return await count_up(self.db, "image_bytes", uploader, size, quota)

    async def uncount_image_bytes(self, uploader: str, size: int) -> None:
        await count_down(self.db, "image_bytes", uploader, size)

    async def user_counts(self, name: str) -> dict:
        """What ``name`` holds: live leases and bytes of uploaded images."""
        row = await self.db.row("SELECT live_leases, image_bytes FROM user_counts WHERE name = :n", n=name)
        return row or {"live_leases": 0, "image_bytes": 0}
