"""What each running service changed outside its processes, kept on disk
(docs/architecture.md, "Lifecycle").

A service's ``Service.data`` is written here when it starts and removed once it stopped.
A record still here at the next start belongs to a service whose exporter died (kill -9):
its processes were stopped as leftovers, and its plugin's ``devloop_cleanup`` undoes the
rest (a relay left switched on).
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from device_loop.core.files import write_atomically

log = logging.getLogger("device_loop.exporter")


class ServiceRecords:
    def __init__(self, state_dir: Path):
        self.dir = Path(state_dir) / "services"
        self.dir.mkdir(parents=True, exist_ok=True)

    def _path(self, lease: str, identifier: str) -> Path:
        return self.dir / f"{lease}-{hashlib.sha1(identifier.encode()).hexdigest()[:12]}.json"

    def started(self, lease: str, identifier: str, plugin: str, data: dict) -> None:
        try:
            text = json.dumps({"lease": lease, "identifier": identifier, "plugin": plugin, "data": data})
        except TypeError as exc:
            log.error("plugin %s: Service.data of %s is not JSON (%s); it cannot be cleaned up after a crash",
                      plugin, identifier, exc)
            return
        write_atomically(self._path(lease, identifier), text)

    def stopped(self, lease: str, identifier: str) -> None:
        self._path(lease, identifier).unlink(missing_ok=True)

    def take_leftovers(self) -> list[dict]:
        """The records an earlier run left (and forget them)."""
        out = []
        for path in sorted(self.dir.glob("*.json")):
            try:
                out.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                pass
            path.unlink(missing_ok=True)
        return out
