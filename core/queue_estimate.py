"""When a waiting ticket is likely granted (docs/architecture.md, "Shares of one lab": every
waiting ticket has an estimate), from what the coordinator read: the devices that could
serve it and the lease each holds, the recent lease durations of their class, and how many
tickets are served before it. Pure: no clock, no database.

The leases ahead are replayed ``REPLAYS`` times (fewer for a class of hundreds:
``replays``), each lease's length drawn from the recent durations (a lease that lasted
``age`` so far from those that lasted at least as long, never past its own end); in each
replay a device that frees goes to the next ticket, whose lease is drawn again. A ticket
``ahead`` tickets back is granted at the ``ahead + 1``-th free in a replay: its earliest,
likely and latest times are the 5th, 50th and 95th percentile of that over the replays. (A
sum of leases is not the sum of their medians: replaying is what keeps "likely" a median and
the range narrow for tickets far back.) The replays are drawn from a
fixed seed: the same inputs give the same estimate.
"""
from __future__ import annotations

import bisect
import heapq
import random
from dataclasses import dataclass
from typing import Callable, Sequence

REPLAYS = 100
MIN_REPLAYS = 40               # (of which the 5th percentile is the 3rd: not the extreme draw)
MAX_DRAWS = 20_000             # draws a reckoning makes, about (a replay draws each device and each ticket once)
PERCENTILES = (0.05, 0.5, 0.95)  # earliest, likely, latest: 9 in 10 replays between the two ends
MAX_AHEAD = 1000               # (bounds the reckoning: tickets further back are reckoned as this far)
_SEED = 33


@dataclass(frozen=True)
class Holding:
    """A device that could serve a ticket: unleased (``since`` None), or leased since
    ``since`` until at most ``until`` (its end: a keepalive lease's own end, or its expiry)."""
    since: float | None = None
    until: float | None = None


@dataclass(frozen=True)
class Estimate:
    """When a ticket is granted: ``earliest``, ``likely`` (about half the time by then),
    ``latest`` (almost surely by then), as times of the clock the inputs were read with."""
    earliest: float
    likely: float
    latest: float


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``sorted_values`` (not empty), by nearest rank."""
    rank = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[rank]


def _ends(device: Holding, now: float, ordered: Sequence[float], fresh: float) -> Callable[[random.Random], float]:
    """How to draw when ``device`` is free in one replay, from the recent durations
    ``ordered`` (sorted: those at least its age are a tail of them, found by bisection once,
    not filtered once a device)."""
    if device.since is None:
        return lambda rng: now
    since, until = device.since, device.until
    first, count = bisect.bisect_left(ordered, max(0.0, now - since)), len(ordered)

    def bounded(end: float) -> float:
        return max(now, end if until is None else min(end, until))
    if first < count:
        return lambda rng: bounded(since + ordered[rng.randrange(first, count)])
    if until is not None:  # longer than any recent lease (or none yet): it may end any time until its end
        return (lambda rng: bounded(rng.uniform(now, until))) if ordered else (lambda rng: bounded(until))
    return lambda rng: now + fresh


def replays(devices: int, most_ahead: int) -> int:
    """How many replays a reckoning makes: ``REPLAYS``, fewer where each is long (a class of
    hundreds of devices), so that its draws stay about ``MAX_DRAWS`` (never below
    ``MIN_REPLAYS``: the 5th and 95th percentiles still part from the ends)."""
    return max(MIN_REPLAYS, min(REPLAYS, MAX_DRAWS // max(1, devices + most_ahead + 1)))


def reckon(devices: Sequence[Holding], most_ahead: int, now: float, durations: Sequence[float],
           fresh_s: float) -> list[Estimate]:
    """The estimates of the tickets 0 to ``most_ahead`` back in the queue for ``devices``
    (those that could serve them and are in service), given the recent lease ``durations``
    of their class; ``fresh_s`` stands for a lease's length while there is no history (the
    tickets' ttl). Empty when no device could serve them now."""
    if not devices:
        return []
    most_ahead = max(0, min(most_ahead, MAX_AHEAD))
    rng = random.Random(_SEED)
    grants: list[list[float]] = [[] for _ in range(most_ahead + 1)]  # position -> its grant in each replay
    ordered = sorted(durations)
    ends = [_ends(d, now, ordered, fresh_s) for d in devices]
    # (no history: nothing to draw, one replay says it)
    for _ in range(replays(len(devices), most_ahead) if durations else 1):
        frees = [end(rng) for end in ends]
        heapq.heapify(frees)
        for position in range(most_ahead + 1):
            free = frees[0]
            grants[position].append(free)
            heapq.heapreplace(frees, free + (rng.choice(durations) if durations else fresh_s))
    estimates = []
    for times in grants:
        times.sort()
        low, mid, high = (quantile(times, q) for q in PERCENTILES)
        estimates.append(Estimate(now if not durations else low, mid, high))
    return estimates


def estimate(devices: Sequence[Holding], ahead: int, now: float, durations: Sequence[float],
             fresh_s: float) -> Estimate | None:
    """The estimate of one ticket with ``ahead`` tickets served before it (``reckon``); None
    when no device could serve it now."""
    reckoned = reckon(devices, ahead, now, durations, fresh_s)
    return reckoned[min(ahead, len(reckoned) - 1)] if reckoned else None
