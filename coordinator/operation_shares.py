"""What a lease's operations may take of its device's exporter (docs/architecture.md, "Shares
of one lab"): a burst of operations, then a steady rate (a token bucket per lease), and which
operations only read a state, so that one asked while another of its kind is live on the
lease answers that one rather than starting another (on IPMI each spawns ipmitool)."""
from __future__ import annotations

import math
from typing import Any

from device_loop.core import POWER_KIND, SETTLE_KIND
from device_loop.core.errors import ErrorCode
from device_loop.core.vocabulary import PowerAction

from .errors import APIError

# An A/B job settles before each run, and a benchmark's run may take a tenth of a second:
# the steady rate must not be what times a job's loop; a runaway client's hundreds a second are
# what it stops (and the client waits out a 429's Retry-After rather than failing).
OPERATION_BURST = 30        # operations a lease may start at once ...
OPERATIONS_PER_S = 10.0     # ... then this many a second
BUCKETS_KEPT = 10_000       # leases whose bucket is remembered; a full bucket is forgotten first


def status_only(kind: str, args: dict[str, Any]) -> bool:
    """Whether an operation of ``kind`` with ``args`` only reads (a power status, a settle:
    it waits for the device to be cool), so one live of its kind on the lease answers it."""
    return kind == SETTLE_KIND or (kind == POWER_KIND and args.get("action") == PowerAction.STATUS)


class LeaseBuckets:
    """A token bucket per lease, in this process (each coordinator process keeps its own:
    no statement is spent on it). The lab's clock is read by the caller, so a test moves it."""

    def __init__(self, burst: int = OPERATION_BURST, per_s: float = OPERATIONS_PER_S, kept: int = BUCKETS_KEPT):
        self.burst, self.per_s, self.kept = burst, per_s, kept
        self._buckets: dict[str, tuple[float, float]] = {}  # lease -> (tokens, when counted)

    def _tokens(self, lease_id: str, now: float) -> float:
        tokens, at = self._buckets.get(lease_id, (float(self.burst), now))
        return min(float(self.burst), tokens + max(0.0, now - at) * self.per_s)

    def take(self, lease_id: str, now: float) -> None:
        """Spend one of ``lease_id``'s operations, or raise 429 ``too_many_operations`` saying
        when the next may start (``APIError.headers``: Retry-After, in whole seconds)."""
        tokens = self._tokens(lease_id, now)
        if tokens < 1.0:
            wait_s = (1.0 - tokens) / self.per_s
            refused = APIError(429, ErrorCode.TOO_MANY_OPERATIONS,
                               f"lease {lease_id} started {self.burst} operations in a burst and may start "
                               f"{self.per_s:g} a second after them: the next in {wait_s:.1f} s (a status or a "
                               f"settle while one of its kind runs is answered by that one)")
            refused.headers = {"Retry-After": str(max(1, math.ceil(wait_s)))}
            raise refused
        self._buckets[lease_id] = (tokens - 1.0, now)
        if len(self._buckets) > self.kept:
            self._forget(now)

    def _forget(self, now: float) -> None:
        """Forget the buckets that are full again (the same as none), then the oldest."""
        for lease_id in [k for k in self._buckets if self._tokens(k, now) >= self.burst]:
            del self._buckets[lease_id]
        while len(self._buckets) > self.kept:
            del self._buckets[next(iter(self._buckets))]
