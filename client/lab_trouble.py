"""Whether the lab, not the command, failed a command on a lease (docs/architecture.md, "Lab
failures"): what a job's runner and ``device-loop with`` both read of a lease, written once."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from device_loop.core import LIVE_LEASE_STATES
from device_loop.core.errors import ErrorCode
from device_loop.core.vocabulary import DeviceState

from .http import CoordinatorError

if TYPE_CHECKING:  # (pydantic is heavy: a with starts its command without loading it)
    from device_loop.core.answers import LeaseAnswer

#: Refusals no retry cures: the request is wrong (``with`` exits 2, a job's cell failed for no
#: one's fault but its spec's), not the lab (docs/architecture.md, "Lab failures").
WRONG_REQUEST = frozenset({ErrorCode.UNKNOWN_DEVICE, ErrorCode.UNKNOWN_IMAGE, ErrorCode.AMBIGUOUS_IMAGE,
                           ErrorCode.INVALID, ErrorCode.BAD_REQUEST, ErrorCode.BAD_TOKEN, ErrorCode.BAD_USER,
                           ErrorCode.FORBIDDEN, ErrorCode.NO_SUCH_DEVICES, ErrorCode.WRONG_FIDELITY,
                           ErrorCode.OUT_OF_SCOPE})
#: Refusals of what the lab could not give then, whatever their status: a token's budget is
#: spent until its period renews (403, yet the lab's: exit 75; docs/architecture.md, "Shares of one lab").
LAB_REFUSALS = frozenset({ErrorCode.BUDGET_SPENT})


def wrong_request(exc: CoordinatorError) -> bool:
    """Whether the coordinator refused a request as wrong (no wait or retry cures it), rather
    than for what the lab could not give then."""
    if exc.code in LAB_REFUSALS:
        return False
    return exc.code in WRONG_REQUEST or exc.status in (400, 401, 403, 404, 422)


#: ``device(name)``: a device's row as the coordinator answers it (its ``reason`` says why it is in its state).
DeviceReader = Callable[[str], Mapping[str, Any]]
#: Device states in which a failed command's result says nothing of it: the lab failed it.
LOST_DEVICE_STATES = (DeviceState.OFFLINE, DeviceState.FAULTY)


def lost_reason(lease: LeaseAnswer, device: DeviceReader) -> str | None:
    """Why ``lease`` (a ``LeaseAnswer``) no longer serves a command: it ended, or its device is
    faulty or offline (``device(name)`` says why); else None."""
    if lease["state"] not in LIVE_LEASE_STATES:
        return f"the lease {lease['id']} on {lease['device']} is {lease['state']}: {lease.get('reason') or 'ended'}"
    state = lease.get("device_state")
    if state in LOST_DEVICE_STATES:
        row = device(lease["device"])
        return f"{lease['device']} is {state}: {row.get('reason') or row.get('health_reason') or 'no reason given'}"
    return None


def lab_trouble(lease: LeaseAnswer, device: DeviceReader) -> str | None:
    """After a command failed on ``lease``: why the lab may have failed it (the lease not
    live and ready, its device faulty, switched off or offline), or None."""
    if (lost := lost_reason(lease, device)) is not None:
        return lost
    if lease.get("switched_off"):
        return f"{lease['device']} was switched off: {lease['switched_off']}"
    if not lease.get("ready"):
        return f"{lease['device']} was not ready when the command failed: {lease.get('reason')}"
    return None
