"""Each resource's health schedule (docs/architecture.md, "Health that heals"): when its
next check is due, which health is reported, and its quarantine.

A resource is checked every ``period_s``. A result that differs from the reported health
(its status, and its kind where it is not ok) is not reported yet: the resource is checked
again every ``recheck_s`` until two results in a row agree, and only then does the reported
health change, so a card that flaps once is never faulty and one that fails twice in a row
is. A reported health that turned ``failed`` (transient) ``quarantine_failures`` times within
``quarantine_window_s`` puts the resource in quarantine: it stays ``failed``, is probed first
after ``period_s``, then at an interval doubled after each failed probe up to
``quarantine_ceiling_s``, and is re-admitted after ``good_probes`` probes in a row that are
not ``failed``. A ``permanent`` failure is never quarantined: it waits for a person.

Only the lab's failures count toward a quarantine, never a holder's: a failure that begins
while a lease holds the resource (``held``; a kernel panic of its holder's own image) is
reported, but not counted, and no quarantine begins during the lease. One still reported
when the lease lets go of the resource is its holder's until the health is next not
``failed`` (the steps between leases reset the device), or until ``steps_done`` says the
steps are over: then it counts, once, as the lab's.

The schedule runs no check itself and reads no clock but the one it is given: the
reporter asks which resources are due, checks them, and hands it the results.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable

from device_loop.core.model import Health
from device_loop.core.protocol import MAX_REASON_CHARS, Quarantine
from device_loop.core.vocabulary import HealthKind, HealthStatus


@dataclass(frozen=True)
class HealthRules:
    """The schedule's settings (the exporter config's ``health_*`` and ``quarantine_*`` keys)."""
    period_s: float = 10.0
    recheck_s: float = 1.5
    quarantine_failures: int = 3
    quarantine_window_s: float = 1800.0
    quarantine_ceiling_s: float = 300.0
    good_probes: int = 3


@dataclass
class _Track:
    due: float
    reported: Health | None = None
    pending: Health | None = None  # a result that differs from the reported one, not confirmed yet
    turned_failed: deque[float] = field(default_factory=deque)  # when the reported health turned failed
    quarantine: Quarantine | None = None
    held: bool = False  # a lease holds it: its failures are its holder's
    left_failed: bool = False  # its last holder left it failed, and the steps after the lease are not over


def _failed_transient(health: Health | None) -> bool:
    return health is not None and health.status == HealthStatus.FAILED and health.kind == HealthKind.TRANSIENT


def _key(health: Health) -> tuple[str, str]:
    """What two results must share to agree: the status, and the kind of a fault."""
    return health.status, "" if health.status == HealthStatus.OK else health.kind


class HealthSchedule:
    """The health schedule of every resource of one exporter, by identifier."""

    def __init__(self, rules: HealthRules | None = None, clock: Callable[[], float] = time.monotonic):
        self.rules = rules or HealthRules()
        self.clock = clock
        self._tracks: dict[str, _Track] = {}
        self._held: set[str] = set()

    def sync(self, identifiers: Iterable[str]) -> None:
        """Follow exactly ``identifiers`` (the resources as last discovered): a new one is due
        at once, one no longer discovered is forgotten."""
        now, wanted = self.clock(), set(identifiers)
        for identifier in wanted - self._tracks.keys():
            self._tracks[identifier] = _Track(due=now, held=identifier in self._held)
        for identifier in self._tracks.keys() - wanted:
            del self._tracks[identifier]

    def due(self) -> list[str]:
        """The resources whose check is due now."""
        now = self.clock()
        return [identifier for identifier, track in self._tracks.items() if track.due <= now]

    def next_due(self) -> float | None:
        """When the next check is due (on the schedule's clock), None with nothing to check."""
        return min((track.due for track in self._tracks.values()), default=None)

    def reported(self, identifier: str) -> Health:
        """The health reported for ``identifier`` (ok until its first check)."""
        track = self._tracks.get(identifier)
        return track.reported if track is not None and track.reported is not None else Health()

    def quarantine(self, identifier: str) -> Quarantine | None:
        """``identifier``'s quarantine, None when it is not in one."""
        track = self._tracks.get(identifier)
        return track.quarantine if track is not None else None

    def held(self, identifiers: Iterable[str]) -> None:
        """The resources a lease holds now (all others: none). One it lets go of while its
        reported health is failed is left failed by its holder (see the module's words)."""
        holding = self._held = set(identifiers)
        for identifier, track in self._tracks.items():
            if track.held and identifier not in holding:
                track.left_failed = _failed_transient(track.reported)
            elif identifier in holding:
                track.left_failed = False
            track.held = identifier in holding

    def steps_done(self, identifiers: Iterable[str]) -> bool:
        """The steps between leases of ``identifiers`` are over: a failure their last holder
        left that is still reported counts now, as the lab's. True if a quarantine began."""
        now, began = self.clock(), False
        for identifier in identifiers:
            track = self._tracks.get(identifier)
            if track is None or not track.left_failed:
                continue
            track.left_failed = False
            if track.quarantine is None and track.reported is not None and _failed_transient(track.reported):
                began |= self._count(track, track.reported, now)
        return began

    def record(self, identifier: str, result: Health) -> bool:
        """Take the result of ``identifier``'s check; True if what is reported of it changed
        (its health, or its quarantine: each probe is a change)."""
        track = self._tracks.get(identifier)
        if track is None:
            return False
        now = self.clock()
        if track.quarantine is not None:
            return self._probe(track, result, now)
        track.due = now + self.rules.period_s
        if track.reported is None or _key(result) == _key(track.reported):
            changed = result != (track.reported or Health())  # (ok is reported until the first check)
            first = track.reported is None
            track.reported, track.pending = result, None
            if first:
                self._turned(track, result, now)
            return changed
        if track.pending is not None and _key(result) == _key(track.pending):  # two in a row agree
            track.reported, track.pending = result, None
            self._turned(track, result, now)
            return True
        track.pending = result
        track.due = now + self.rules.recheck_s
        return False

    def _turned(self, track: _Track, result: Health, now: float) -> None:
        """The reported health became ``result``: count a transient failure of the lab's
        (not of a lease's holder), and quarantine the resource when they keep coming back."""
        if result.status != HealthStatus.FAILED:
            track.left_failed = False  # (what its last holder left failed was reset)
        if _failed_transient(result) and not track.held:
            self._count(track, result, now)

    def _count(self, track: _Track, result: Health, now: float) -> bool:
        """Count a failure, and quarantine the resource when they keep coming back; True if a
        quarantine began."""
        rules = self.rules
        track.turned_failed.append(now)
        while track.turned_failed[0] < now - rules.quarantine_window_s:
            track.turned_failed.popleft()
        if len(track.turned_failed) < rules.quarantine_failures:
            return False
        track.quarantine = Quarantine(failures=len(track.turned_failed), window_s=rules.quarantine_window_s,
                                      probe_s=rules.period_s, needed=rules.good_probes,
                                      reason=result.reason[:MAX_REASON_CHARS])
        track.due = now + rules.period_s
        return True

    def _probe(self, track: _Track, result: Health, now: float) -> bool:
        """A quarantined resource's probe: re-admitted after enough good ones in a row, else
        probed again, later after each failed one."""
        quarantine = track.quarantine
        assert quarantine is not None
        if result.status == HealthStatus.FAILED and result.kind == HealthKind.TRANSIENT:
            probe_s = min(quarantine.probe_s * 2, max(self.rules.quarantine_ceiling_s, self.rules.period_s))
            track.quarantine = quarantine.model_copy(update={
                "probes": quarantine.probes + 1, "good": 0, "probe_s": probe_s,
                "reason": result.reason[:MAX_REASON_CHARS]})
            track.reported, track.due = result, now + probe_s
            return True
        good = quarantine.good + 1
        if good < quarantine.needed and result.status != HealthStatus.FAILED:
            track.quarantine = quarantine.model_copy(update={"probes": quarantine.probes + 1, "good": good})
            track.due = now + quarantine.probe_s
            return True
        # re-admitted (or failed for good, which a person clears): the count starts afresh
        track.quarantine, track.reported, track.pending = None, result, None
        track.turned_failed.clear()
        track.due = now + self.rules.period_s
        return True
