"""Who else holds a device node (docs/architecture.md, "Lifecycle"): the orphan half
of the reclaim rule, and the admin's kill of them ("Containers and CDI").

A process holding the node is an orphan unless it already held it when the lease began
(a pty's creator, a daemon that always holds the node) or is one of our services. What
held each node when its lease began is kept on disk, so a restarted exporter still
knows it. Each orphan is reported with its pid, command line and cgroup (a container's
cgroup names the container).
"""
from __future__ import annotations

import json
import logging
import os
import select
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from device_loop.core.files import write_atomically
from device_loop.core.holders import cgroup_of, command_of, holders, start_time_of
from device_loop.core.model import Resource
from device_loop.core.protocol import MAX_CGROUP_CHARS, MAX_COMMAND_CHARS, MAX_HOLDERS, DesiredOperation, Holder

log = logging.getLogger("device_loop.exporter")
KILL_WAIT_S = 5.0  # how long a kill waits for each process to end before saying it did not
KILL_RESULT_COMMAND_CHARS = 200  # of each killed process's command line in the result (64 of them fit its bound)


@dataclass(frozen=True)
class Orphan:
    """An orphan as this exporter found it: the pid with its start time names one process."""
    pid: int
    started: int | None
    node: str

    def holder(self) -> Holder:
        """The orphan as a report carries it: pid, command line and cgroup, each cut to its bound."""
        return Holder(pid=self.pid, command=command_of(self.pid)[:MAX_COMMAND_CHARS],
                      cgroup=cgroup_of(self.pid)[:MAX_CGROUP_CHARS])


@dataclass(frozen=True)
class KillOutcome:
    """What a kill of a device's orphans did: those killed, and those left (gone or changed
    meanwhile, or still there after the wait), each in words."""
    killed: list[Holder]
    left: list[str]


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

    def orphans(self, resources: list[Resource], ours: set[int]) -> dict[str, list[Holder]]:
        """Identifier -> holders of its node that are neither ``ours`` nor held it before."""
        return {identifier: [orphan.holder() for orphan in found]
                for identifier, found in self._find(resources, ours).items()}

    def _find(self, resources: list[Resource], ours: set[int]) -> dict[str, list[Orphan]]:
        with_node = [(r, r.node) for r in resources if r.node]
        held = holders({node for _, node in with_node}, skip=ours | {os.getpid()})
        out: dict[str, list[Orphan]] = {}
        with self._lock:
            first_sight = False
            for resource, node in with_node:
                current = held[node]
                if resource.identifier not in self.baseline:  # whoever holds it now was there first
                    self.baseline[resource.identifier] = current
                    first_sight = True
                extra = sorted(current - self.baseline[resource.identifier])
                if extra:
                    out[resource.identifier] = [Orphan(pid, start_time_of(pid), node) for pid in extra]
            if first_sight:
                self._save()
        return out

    def kill(self, resources: list[Resource], ours: set[int]) -> KillOutcome:
        """Kill (SIGKILL) the orphans of ``resources`` as this exporter sees them now — never
        a pid it is told — each checked again just before: the same process (pid and start
        time, held through a pidfd from then on) still holding the node; wait for each to end."""
        killed, left = [], []
        for found in self._find(resources, ours).values():
            for orphan in found:
                holder = orphan.holder()
                said = _kill(orphan)
                if said:
                    left.append(f"pid {orphan.pid}: {said}")
                else:
                    killed.append(holder)
                    log.warning("killed orphan pid %d (%s, cgroup %s) holding %s", orphan.pid,
                                holder.command[:200], holder.cgroup or "?", orphan.node)
        return KillOutcome(killed, left)


def _kill(orphan: Orphan) -> str:
    """Kill ``orphan`` if it is still that process holding that node; "" once it ended, else why not."""
    try:
        pidfd = os.pidfd_open(orphan.pid)
    except OSError:
        return "gone before the kill"
    try:
        # (after pidfd_open the pid cannot name another process for us: check it is still the one found)
        if orphan.started is None or start_time_of(orphan.pid) != orphan.started:
            return "another process has that pid now"
        if orphan.pid not in holders({orphan.node}, among={orphan.pid})[orphan.node]:
            return "no longer holds the node"
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        ended, _, _ = select.select([pidfd], [], [], KILL_WAIT_S)  # a pidfd reads ready once its process ended
        return "" if ended else f"still running {KILL_WAIT_S:g} s after SIGKILL"
    except ProcessLookupError:
        return "gone before the kill"
    finally:
        os.close(pidfd)


class OrphanKill:
    """The exporter's handler of an admin's kill of a device's orphans (``ORPHANS_KIND``,
    an operation like any other: the coordinator puts it in the desired state, this acts)."""

    def __init__(self, watch: OrphanWatch, ours: Callable[[], set[int]], rescan: Callable[[], None]):
        self.watch, self.ours, self.rescan = watch, ours, rescan

    def __call__(self, job, want: DesiredOperation, resource: Resource | None, resources: list[Resource],
                 declared: set[str]) -> dict:
        outcome = self.watch.kill([r for r in resources if r.device == want.device], self.ours())
        self.rescan()  # the next report says who holds the device now
        killed = outcome.killed[:MAX_HOLDERS]
        words = ", ".join(f"pid {h.pid}" for h in killed) or "none"
        message = f"killed {len(outcome.killed)} orphan(s) of {want.device}: {words}"
        if outcome.left:
            message += f"; not killed: {'; '.join(outcome.left)}"
        return {"message": message, "killed": [h.pid for h in killed],
                "processes": [f"pid {h.pid} (cgroup {h.cgroup or '?'}): {h.command[:KILL_RESULT_COMMAND_CHARS]}"
                              for h in killed],
                "left": outcome.left[:MAX_HOLDERS]}
