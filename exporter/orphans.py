"""Who else holds a device node (docs/architecture.md, "Lifecycle"): the orphan half
of the reclaim rule.

A process holding the node is an orphan unless it already held it when the lease began
(a pty's creator, a daemon that always holds the node) or is one of our services. What
held each node when its lease began is kept on disk, so a restarted exporter still
knows it.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from device_loop.core.files import write_atomically
from device_loop.core.holders import command_of, holders
from device_loop.core.model import Resource


class OrphanWatch:
    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / "node-holders.json"
        self._lock = threading.Lock()  # leases begin in several service threads at once
        try:
            self.baseline = {k: set(v) for k, v in json.loads(self.path.read_text()).items()}
        except (OSError, ValueError):
            self.baseline = {}

    def _save(self) -> None:
        write_atomically(self.path, json.dumps({k: sorted(v) for k, v in self.baseline.items()}))

    def lease_begins(self, resource: Resource, ours: set[int]) -> None:
        """Remember who holds the node now, as the lease for it begins (but for ``ours``)."""
        if resource.node:
            now = holders({resource.node}, skip=ours | {os.getpid()})[resource.node]
            with self._lock:
                if self.baseline.get(resource.identifier) != now:
                    self.baseline[resource.identifier] = now
                    self._save()

    def orphans(self, resources: list[Resource], ours: set[int]) -> dict[str, list[dict]]:
        """Identifier -> holders of its node that are neither ``ours`` nor held it before."""
        with_node = [(r, r.node) for r in resources if r.node]
        held = holders({node for _, node in with_node}, skip=ours | {os.getpid()})
        out: dict[str, list[dict]] = {}
        with self._lock:
            first_sight = False
            for resource, node in with_node:
                current = held[node]
                if resource.identifier not in self.baseline:  # whoever holds it now was there first
                    self.baseline[resource.identifier] = current
                    first_sight = True
                extra = sorted(current - self.baseline[resource.identifier])
                if extra:
                    out[resource.identifier] = [{"pid": pid, "command": command_of(pid)} for pid in extra]
            if first_sight:
                self._save()
        return out
