"""Every rule of the lab, in one place: the class routes and MCP tools call, and nothing else.

Each job reads alone: ``lifecycle`` (device states and their ring log), ``views`` (what
users see), ``leases`` (reserve, renew, release), ``heartbeats`` (snapshots and desired
state), ``images`` (the registry), ``flashes`` (mediated flash), ``admin``. SQL lives in ``store``. Each method that writes runs in one
transaction and wakes the long-polls once it committed.
"""
from __future__ import annotations

from .admin import Admin
from .heartbeats import Heartbeats
from .image_files import ImageFiles
from .lifecycle import Settings

__all__ = ["Rules", "Settings"]


class Rules(Admin, Heartbeats):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.image_files = ImageFiles(self.settings.image_dir)

    async def reap(self) -> None:
        """Expire leases, fail allocations that took too long, mark silent hosts offline."""
        async with self.store.tx():
            now = self.clock()
            await self._end_overdue_leases(now, "coordinator")
            await self._mark_silent_hosts(now, "coordinator")
            await self.store.drop_idempotency_keys_before(now - 86400)
        await self.sweep_files_if_due()
