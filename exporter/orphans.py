"""Who else holds a device node (DESIGN §8): the orphan half of the reclaim rule.

A process holding the node is an orphan unless it already held it when the lease began
(a pty's creator, a daemon that always holds the node) or is one of our services. What
held each node when its lease began is kept on disk, so a restarted exporter still
knows it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from device_loop.core.holders import command_of, holders
from device_loop.core.model import Resource


class OrphanWatch:
    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / "node-holders.json"
        try:
            self.baseline = {k: set(v) for k, v in json.loads(self.path.read_text()).items()}
        except (OSError, ValueError):
            self.baseline = {}

    def _save(self) -> None:
        partial = self.path.with_suffix(".tmp")
        partial.write_text(json.dumps({k: sorted(v) for k, v in self.baseline.items()}))
        partial.replace(self.path)

    def lease_begins(self, resource: Resource) -> None:
        """Remember who holds the node now, as the lease for it begins."""
        if resource.node:
            self.baseline[resource.identifier] = holders(resource.node) - {os.getpid()}
            self._save()

    def orphans(self, resource: Resource, ours: set[int]) -> list[dict]:
        """Holders of the node that are neither ``ours`` nor held it before."""
        if not resource.node:
            return []
        current = holders(resource.node) - ours - {os.getpid()}
        if resource.identifier not in self.baseline:  # first sight: whoever holds it now was there first
            self.baseline[resource.identifier] = current
            self._save()
        return [{"pid": pid, "command": command_of(pid)} for pid in sorted(current - self.baseline[resource.identifier])]
