"""A waiting ticket's estimate (docs/architecture.md, "Shares of one lab": every waiting
ticket has an estimate): what the store says of the devices that could serve it and of the
recent leases of their class, reckoned by ``core/queue_estimate.py``. Two bounded queries per
distinct thing waited for; a listing reads each once (``Cache``), and at most ``MAX_WANTS``;
the reckoning, which is CPU, is made once per thing waited for and state of its devices'
leases, and reused for a few seconds (``Reckonings``)."""
from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Callable, NamedTuple

from device_loop.core.answers import TicketEstimate
from device_loop.core.durations import format_duration, iso
from device_loop.core.queue_estimate import Estimate, Holding, quantile, reckon, replays
from device_loop.core.vocabulary import DeviceState

from .rows import CouldServe, TicketRow
from .store.tickets import TicketQueries, Want, want_of

MAX_DEVICES = 500   # devices an estimate reads (a class of more is reckoned from these)
HISTORY = 200       # the latest ended leases of their class whose durations it takes
#: the states of a device that serves tickets now (an offline or faulty one may come back:
#: it still counts for none_can_serve, not for when)
IN_SERVICE = frozenset({DeviceState.IDLE, DeviceState.ALLOCATING, DeviceState.IN_USE, DeviceState.RECLAIMING})

MAX_WANTS = 64      # distinct things waited for one listing reckons (those further down: no estimate)
REUSE_S = 5.0       # a reckoning is reused this long while what it is reckoned from is unchanged
KEPT = 256          # reckonings kept (the least recently used go)
ON_LOOP_DRAWS = 5000  # a reckoning of more draws (about 5 ms of CPU) is made in a thread


class Cache:
    """What one listing read: per thing waited for, and the durations per set of classes
    (the things of one class share them)."""

    def __init__(self) -> None:
        self.reads: dict[tuple[Want, bool], _Read] = {}
        self.durations: dict[tuple[str, ...], list[float]] = {}


def _at(when: float) -> str:
    return iso(when) or ""  # (never None: a time)


def _read_key(row: TicketRow) -> tuple[Want, bool]:
    """What a read is for: the thing waited for, and whether a fallback's devices count."""
    return want_of(row), row["fallback"] is not None


class _Read:
    """What the store said of one thing waited for, and the reckoning so far."""

    def __init__(self, devices: list[CouldServe], durations: list[float]):
        self.serving = [d for d in devices if d["state"] in IN_SERVICE]
        self.durations = durations
        self.reckoned: list[Estimate] = []


def _not_before(reckoned: Estimate, now: float) -> Estimate:
    """``reckoned`` (perhaps a few seconds old: ``Reckonings``) as of ``now``: never in the past."""
    return Estimate(max(reckoned.earliest, now), max(reckoned.likely, now), max(reckoned.latest, now))


class _Kept(NamedTuple):
    at: float                            # the clock when it was reckoned
    most_ahead: int                      # the furthest place back it reckons
    reckoning: asyncio.Future[list[Estimate]]


class Reckonings:
    """Reckonings kept across requests (a ticket's long-poll, every board read, each listing):
    one is made again only when what it is reckoned from changed (a lease on a device that
    could serve, the recent durations, the ttl standing in for them), it reckons too few
    places back, or it is ``REUSE_S`` old. Requests at once for the same share one; a long
    one (a class of hundreds of devices) is made in a thread."""

    def __init__(self) -> None:
        self.kept: OrderedDict[tuple, _Kept] = OrderedDict()
        self.made = 0  # reckonings made (what a test counts)

    async def of(self, serving: list[CouldServe], durations: list[float], fresh_s: float, most_ahead: int,
                 now: float) -> list[Estimate]:
        """The estimates of the places 0 to at least ``most_ahead`` back for ``serving``."""
        holdings = tuple((d["since"], d["until"]) for d in serving)
        key = (holdings, tuple(durations), fresh_s)
        kept = self.kept.get(key)
        if kept is None or abs(now - kept.at) >= REUSE_S or kept.most_ahead < most_ahead:
            kept = _Kept(now, most_ahead, asyncio.ensure_future(self._reckon(holdings, durations, fresh_s,
                                                                             most_ahead, now)))
            self.kept[key] = kept
            while len(self.kept) > KEPT:
                self.kept.popitem(last=False)
        self.kept.move_to_end(key)
        try:
            return await asyncio.shield(kept.reckoning)
        except BaseException:
            if self.kept.get(key) is kept and kept.reckoning.done():
                del self.kept[key]  # (a failed one is not kept)
            raise

    async def _reckon(self, holdings: tuple, durations: list[float], fresh_s: float, most_ahead: int,
                      now: float) -> list[Estimate]:
        self.made += 1
        devices = [Holding(since, until) for since, until in holdings]
        draws = replays(len(devices), most_ahead) * (len(devices) + most_ahead + 1)
        if draws > ON_LOOP_DRAWS:  # (milliseconds of CPU: the loop's thread gets its turns meanwhile)
            return await asyncio.to_thread(reckon, devices, most_ahead, now, durations, fresh_s)
        return reckon(devices, most_ahead, now, durations, fresh_s)


class Estimates:
    """When waiting tickets are likely granted."""

    def __init__(self, tickets_sql: TicketQueries, clock: Callable[[], float]):
        self.tickets_sql, self.clock = tickets_sql, clock
        self.reckonings = Reckonings()

    async def _read(self, row: TicketRow, cache: Cache | None) -> _Read | None:
        key = _read_key(row)
        if cache is not None and key in cache.reads:
            return cache.reads[key]
        if cache is not None and len(cache.reads) >= MAX_WANTS:
            return None  # (a listing's cost stays bounded whatever the queue holds)
        devices = await self.tickets_sql.could_serve(row["device"], row["device_class"], row["tags"], row["needs"],
                                                     row["fallback"], MAX_DEVICES)
        classes = tuple(sorted({d["device_class"] for d in devices}))
        durations = None if cache is None else cache.durations.get(classes)
        if durations is None:
            durations = await self.tickets_sql.lease_durations(list(classes), HISTORY)
        read = _Read(devices, durations)
        if cache is not None:
            cache.reads[key], cache.durations[classes] = read, durations
        return read

    async def estimate(self, row: TicketRow, ahead: int, cache: Cache | None = None) -> TicketEstimate | None:
        """The estimate of waiting ticket ``row`` with ``ahead`` tickets served before it; None
        when no device that could serve it is in service now."""
        read = await self._read(row, cache)
        if read is None:
            return None
        now = self.clock()
        if ahead >= len(read.reckoned):  # (a listing asks further back each time: reckoned ahead, doubling)
            read.reckoned = await self.reckonings.of(read.serving, read.durations, row["ttl_s"],
                                                     max(ahead, 2 * len(read.reckoned), 8), now)
        if not read.reckoned:
            return None
        reckoned = _not_before(read.reckoned[min(ahead, len(read.reckoned) - 1)], now)
        ordered = sorted(read.durations)
        p50, p90 = (quantile(ordered, 0.5), quantile(ordered, 0.9)) if ordered else (None, None)
        leased = sum(1 for d in read.serving if d["since"] is not None)
        lasts = (f"recent leases last {format_duration(p50)} (median) to {format_duration(p90)} (9 in 10)"
                 if p50 is not None and p90 is not None else
                 f"no lease of theirs ended yet: its ttl ({format_duration(row['ttl_s'])}) stands in")
        return {"earliest_at": _at(reckoned.earliest), "likely_at": _at(reckoned.likely),
                "latest_at": _at(reckoned.latest), "devices": len(read.serving), "ahead": ahead,
                "lease_p50_s": p50, "lease_p90_s": p90,
                "basis": f"{len(read.serving)} device(s) could serve it ({leased} leased), {ahead} ticket(s) before "
                         f"it; {lasts}"}
