"""The client waits out a share's "not yet" (docs/architecture.md, "Shares of one lab"): a
lease past its burst of operations gets 429 with a short Retry-After from the real
coordinator, and the client asks again after it, with the same Idempotency-Key (a 429 is not
kept for the key); a long wait, or none, is the caller's to decide."""
from __future__ import annotations

import time

import pytest

from device_loop.client import Lab
from device_loop.client.http import MAX_RETRY_AFTER_S, _retry_after
from device_loop.coordinator.operation_shares import OPERATION_BURST, OPERATIONS_PER_S
from helpers import wait_state

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("header, waited", [("1", 1.0), ("0", 0.0), (str(int(MAX_RETRY_AFTER_S)), MAX_RETRY_AFTER_S),
                                            (str(int(MAX_RETRY_AFTER_S) + 1), None), (None, None), ("soon", None),
                                            ("-3", None), ("Wed, 21 Oct 2026 07:28:00 GMT", None)])
def test_a_429_is_waited_out_only_when_it_says_a_short_while(header, waited):
    assert _retry_after(header) == waited


@pytest.mark.service
def test_a_lease_past_its_burst_of_settles_is_slowed_not_failed(coordinator, exporter_factory):
    exporter_factory()  # sim boards: no cool-down step, so each settle is done at once and takes its share
    wait_state(coordinator, "sim-board-0", "idle")
    lease = Lab(coordinator.url, "alice").reserve("sim-board-0")
    started = time.monotonic()
    settled = [lease.settle().state for _ in range(OPERATION_BURST + int(OPERATIONS_PER_S) + 1)]
    assert settled == ["done"] * len(settled), "past the burst the client waited and asked again"
    assert time.monotonic() - started >= 1.0, "it waited what Retry-After said (1 s at least)"
    audited = [e for e in lease.api.get("/admin/audit") if e["lease"] == lease.id and e["action"] == "settle"]
    assert len(audited) == len(settled), "each retry started one settle: none twice, none lost"
    lease.release()
