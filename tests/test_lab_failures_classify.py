"""Whose failure a job's failed command was (docs/architecture.md, "Lab failures"): exit 75
is the lab's whatever else; then the lab's trouble after it failed (the lease ended, its
device faulty or offline, switched off, the lease not ready); then the deadline; else the
test's. Pure: no lab, no process."""
from __future__ import annotations

import pytest

from device_loop.client.local_run import LocalResult
from device_loop.client.runner import lab_trouble, lost_reason, whose_failure
from device_loop.core.vocabulary import LAB_FAILURE_STATUS, FailureKind

pytestmark = pytest.mark.timeout(10)

SERVING = {"id": "lease-1", "device": "b0", "state": "active", "device_state": "in_use", "ready": True,
           "reason": "ready", "switched_off": None}


def result(status: int, timed_out: bool = False) -> LocalResult:
    return LocalResult(status=status, stdout="", stderr="", started_at=0.0, ended_at=1.0, timed_out=timed_out)


def devices(name: str) -> dict:
    return {"name": name, "reason": "health failed: console silent"}


def test_exit_75_is_the_labs_and_what_the_lab_knows_says_why():
    """A command's 75 (``device-loop exec`` on a board gone) is the lab's; the lease, read, says
    the cause better than the command's output ("connection refused" of a revoked lease's relay)."""
    assert whose_failure(result(LAB_FAILURE_STATUS), lambda: None) == (FailureKind.LAB, None)
    revoked = {**SERVING, "state": "revoked", "reason": "revoked by admin root"}
    kind, why = whose_failure(result(LAB_FAILURE_STATUS), lambda: lab_trouble(revoked, devices))
    assert kind is FailureKind.LAB and "the lease lease-1 on b0 is revoked" in why


@pytest.mark.parametrize(("lease", "said"), [
    ({**SERVING, "state": "revoked", "reason": "revoked by admin root"}, "the lease lease-1 on b0 is revoked"),
    ({**SERVING, "device_state": "faulty"}, "b0 is faulty: health failed: console silent"),
    ({**SERVING, "device_state": "offline"}, "b0 is offline"),
    ({**SERVING, "switched_off": "switched off by ann at noon"}, "b0 was switched off: switched off by ann"),
    ({**SERVING, "ready": False, "reason": "exporter host-a is restarting the services"}, "b0 was not ready"),
])
def test_a_failure_while_the_lab_was_in_trouble_is_the_labs_with_why(lease, said):
    for failed in (result(1), result(-9, timed_out=True)):  # (the lab's trouble before the deadline too)
        kind, why = whose_failure(failed, lambda: lab_trouble(lease, devices))
        assert kind is FailureKind.LAB and said in why, why


def test_else_the_deadline_then_the_test():
    def serving() -> str | None:
        return lab_trouble(SERVING, devices)
    assert whose_failure(result(-9, timed_out=True), serving) == (FailureKind.TIMEOUT, None)
    assert whose_failure(result(1), serving) == (FailureKind.TEST, None)
    assert lost_reason(SERVING, devices) is None
