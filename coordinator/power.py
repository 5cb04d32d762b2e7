"""Power, as the coordinator sees it (docs/architecture.md, "Power"): what a power operation
takes, what the device's log keeps of one that ended, and the one automatic power cycle an
admin may allow a device whose health failed (``auto_recover = "power-cycle"``).

A power operation is an operation like any other (``operations.py``): queued for the
device's exporter, one exclusive operation per device at a time, audited. What is its own
is here: the line each one leaves in the device's ring log (verified or not, the time to
the console's first byte after power-on) and the auto-recovery rule: once per failure,
never in a loop, never under a holder's feet.
"""
from __future__ import annotations

import json
import math
from typing import Any

from device_loop.core import POWER_KIND
from device_loop.core.vocabulary import DeviceState, HealthStatus, OperationState, PowerAction, PowerState, PowerVerdict

from .lifecycle import Lifecycle
from .operations import Operations, kinds_of
from .rows import DeviceFacts, OperationRow

AUTO_RECOVER = "power-cycle"  # the one automatic recovery there is
REQUESTER = "coordinator"     # who an automatic power cycle is asked by, in the logs


def power_args(action: PowerAction, off_time_s: float | None) -> dict[str, Any]:
    """A power operation's arguments as the exporter takes them."""
    args: dict[str, Any] = {"action": action.value}
    if off_time_s is not None:
        args["off_time_s"] = off_time_s
    return args


def log_line(op: OperationRow) -> str:
    """What the device's ring log keeps of a power operation that ended."""
    action = op["args"].get("action", "?")
    if op["state"] != OperationState.DONE:
        return f"power {action} {op['id']} by {op['requester']} failed: {op['message']}"[:500]
    result = op["result"] if isinstance(op["result"], dict) else {}
    # what an exporter reported is data: only the values this line expects are taken from it
    verdict = "verified" if result.get("verdict") == PowerVerdict.VERIFIED else "unverified"
    said = f"power {action} {op['id']} by {op['requester']}: {verdict}"
    first = result.get("first_byte_s")
    if isinstance(first, (int, float)) and not isinstance(first, bool) and math.isfinite(first):
        said += f"; first console byte {first:.2f} s after on"
    if result.get("state") in (PowerState.ON, PowerState.OFF):
        said += f"; the switch reads {result['state']}"
    return said[:500]


class Power:
    """The power rules of the coordinator that are not every operation's."""

    def __init__(self, life: Lifecycle, operations: Operations):
        self.life, self.operations = life, operations
        self.store = life.store

    async def ended(self, ops: list[OperationRow], actor: str) -> None:
        """The power operations among ``ops`` (that ended in this report) each leave a line in
        their device's log; an automatic one says what comes next."""
        for op in ops:
            if op["kind"] != POWER_KIND:
                continue
            device = await self.store.device(op["device"])
            if device is None:
                continue
            line = log_line(op)
            if op["requester"] == REQUESTER:  # (only the automatic recovery asks as the coordinator)
                line = f"auto-recover: {line}"
                if device["health"] != HealthStatus.OK:
                    line += ("; it is not power-cycled again for this failure (faulty until its health is ok, or a "
                             "person clears it)")
            await self.life.note(device, line, actor)

    async def recover(self, rows: list[dict[str, Any]]) -> None:
        """Devices of a report (rows as written) whose health failed and that allow an automatic
        power cycle get one, once per failure: not while a lease holds them (their holder
        decides), nor while another operation runs; a device whose health is ok again may get
        one the next time it fails."""
        for row in rows:
            if row.get("auto_recovery") and row["health"] == HealthStatus.OK:
                await self.store.update_device(row["name"], auto_recovery=None)
                continue
            if (row.get("auto_recover") != AUTO_RECOVER or row["health"] != HealthStatus.FAILED
                    or row.get("auto_recovery") or row["state"] != DeviceState.FAULTY or row.get("lease_id")
                    or row.get("reclaim_lease") or row.get("op_id") or row["retired"] or not row["present"]):
                continue
            await self._cycle(row)

    async def _cycle(self, row: dict[str, Any]) -> None:
        resources = row["resources"] if isinstance(row["resources"], list) else json.loads(row["resources"])
        device: DeviceFacts = {**row, "resources": resources}  # type: ignore[typeddict-item]
        offered = kinds_of(device)
        if POWER_KIND not in offered:
            await self.life.note(device, "auto-recover: its health failed, and it has no power switch to cycle",
                                 REQUESTER, auto_recovery="none")
            return
        _, switch = offered[POWER_KIND]
        op = await self.operations.queue(device, POWER_KIND, switch["identifier"], switch["plugin"],
                                         power_args(PowerAction.CYCLE, None), None, REQUESTER, exclusive=True,
                                         destructive=False, action="auto_recover",
                                         audit={"cause": f"health failed: {row['health_reason'] or 'no reason'}"})
        await self.life.note(device, f"auto-recover: power-cycling it ({op['id']}), once for this failure (health "
                                     f"failed: {row['health_reason'] or 'no reason given'})"[:500], REQUESTER,
                             auto_recovery=op["id"])
