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

import math
from typing import Any

from device_loop.core import POWER_KIND
from device_loop.core.durations import iso
from device_loop.core.protocol import Heartbeat
from device_loop.core.vocabulary import (AutoRecover, DeviceState, FaultKind, HealthStatus, OperationState, PowerAction,
                                         PowerState, PowerVerdict, Purpose)

from .lifecycle import NO_FAULT, Lifecycle, fault, held_off
from .operations import Operations, kinds_of
from .rows import DeviceFacts, OperationRow
from .store.devices import DeviceQueries
from .who import COORDINATOR

REARM_S = 3600.0              # a device is power-cycled on its own at most once in this long
# how the faults a power operation leaves begin, for people (the rules read their FaultKind)
POWERED_OFF = "switched off"
UNVERIFIED_ON = "switched on, unverified"


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

    def __init__(self, life: Lifecycle, operations: Operations, *,
                 devices_sql: DeviceQueries):
        self.life, self.operations = life, operations
        self.store = life.store
        self.devices_sql = devices_sql

    async def ended(self, ops: list[OperationRow], actor: str) -> None:
        """The power operations among ``ops`` (that ended in this report) each leave a line in
        their device's log; an automatic one says what comes next."""
        for op in ops:
            if op["kind"] != POWER_KIND:
                continue
            device = await self.devices_sql.device(op["device"])
            if device is None:
                continue
            line = log_line(op)
            if op["requester"] == COORDINATOR:  # (only the automatic recovery asks as the coordinator)
                line = f"auto-recover: {line}"
                if device["health"] != HealthStatus.OK:
                    line += ("; not power-cycled again for this failure: if its health stays failed it is left "
                             "faulty for a person")
            await self.life.note(device, line, actor)
            await self._left_off(device, op, actor)

    async def _left_off(self, device: DeviceFacts, op: OperationRow, actor: str) -> None:
        """A device a person switched off (or whose off or cycle failed part-way: it may be off)
        is not handed to the next one dead: it is faulty (once its lease ends) until someone
        switches it on and that is verified, which clears that fault and no other (a failed
        step's stays). An on that nothing showed leaves a fault an admin clears once they saw
        the board run."""
        action, mine = op["args"].get("action"), held_off(device["fault_kind"])
        if op["requester"] == COORDINATOR or action == PowerAction.STATUS:
            return
        if op["state"] == OperationState.DONE and action in (PowerAction.ON, PowerAction.CYCLE):
            if not mine:
                return
            result = op["result"] if isinstance(op["result"], dict) else {}
            if result.get("verdict") == PowerVerdict.VERIFIED:
                await self.life.change(device, f"switched on again ({op['id']})", actor, NO_FAULT)
                return
            words = (f"{UNVERIFIED_ON}: power {action} {op['id']} by {op['requester']} ended, but nothing showed "
                     f"the board on ({op['message'] or 'no reason given'}): switch it on again, or an admin who "
                     f"saw it run clears this (device-loop admin clear-fault {device['name']})")
            await self.life.change(device, words[:500], actor, fault(FaultKind.UNVERIFIED_ON, words))
            return
        failed_part_way = op["state"] == OperationState.FAILED and op["phase"] in ("off", "on", "booting")
        if device.get("fault") and not mine:
            return  # (a failed step's fault says more; it stays)
        if action == PowerAction.OFF and op["state"] == OperationState.DONE:
            words = (f"{POWERED_OFF} by {op['requester']} at {iso(op['ended_at'] or self.life.clock())} "
                     f"({op['id']}): switch it on with device-loop power on {device['name']} (once it is "
                     "released, an admin does)")
        elif action in (PowerAction.OFF, PowerAction.CYCLE) and failed_part_way:
            words = (f"{POWERED_OFF}, perhaps: power {action} {op['id']} by {op['requester']} failed while "
                     f"{op['phase']}: switch it on with device-loop power on {device['name']} (once it is "
                     "released, an admin does)")
        else:
            return
        await self.life.change(device, words[:500], actor, fault(FaultKind.SWITCHED_OFF, words))

    async def rearm(self, rows: list[dict[str, Any]]) -> None:
        """A device among ``rows`` (those a report wrote) whose health is ok again may be
        power-cycled on its own the next time it fails (but not sooner than ``REARM_S`` after
        the last time: a board that hangs at every boot is not cycled in a loop)."""
        for row in rows:
            if row.get("auto_recovery") and row["health"] == HealthStatus.OK:
                await self.devices_sql.update_device(row["name"], auto_recovery=None)

    async def recover(self, report: Heartbeat) -> None:
        """Devices of ``report`` whose health failed and whose config allows an automatic power
        cycle get one, once per failure: not while a lease holds them (their holder decides),
        nor while a step or another operation runs on them (asked again at the next report), nor
        when a person switched them off. Nothing is read when no reported device qualifies."""
        wanted = [d.name for d in report.devices
                  if d.auto_recover == AutoRecover.POWER_CYCLE and any(r.health == HealthStatus.FAILED
                                                                       for r in d.resources)]
        if not wanted:
            return
        for device in await self.devices_sql.devices_named(wanted):
            if (device.get("auto_recovery") or device["state"] != DeviceState.FAULTY or device["lease_id"]
                    or device["reclaim_lease"] or device["op_id"] or device["retired"] or not device["present"]
                    or not device["host_online"]):
                continue
            await self._cycle(device)

    async def _cycle(self, device: DeviceFacts) -> None:
        now = self.life.clock()
        why = f"health failed: {device['health_reason'] or 'no reason given'}"
        if held_off(device["fault_kind"]):
            await self.life.note(device, f"auto-recover: not power-cycling it ({why}): {device['fault']}"[:500],
                                 COORDINATOR, auto_recovery="off")
            return
        since = device.get("auto_recovered_at")
        if since is not None and now - since < REARM_S:
            await self.life.note(device, f"auto-recover: not power-cycling it again ({why}): it was power-cycled "
                                         f"{(now - since) / 60:.0f} min ago; left faulty for a person"[:500],
                                 COORDINATOR, auto_recovery="too-soon")
            return
        offered = kinds_of(device)
        if POWER_KIND not in offered:
            await self.life.note(device, f"auto-recover: {why}, and it has no power switch to cycle", COORDINATOR,
                                 auto_recovery="no-switch")
            return
        _, switch = offered[POWER_KIND]
        # (another process beginning an operation on it this moment fails this report with 409, as any
        # concurrent write does: the exporter reports again, and then the device is busy)
        op = await self.operations.queue(device, POWER_KIND, switch["identifier"], switch["plugin"],
                                         power_args(PowerAction.CYCLE, None), None, COORDINATOR, exclusive=True,
                                         destructive=False, purpose=Purpose.RECOVERY, action="auto_recover",
                                         audit={"cause": why})
        said = f"auto-recover: power-cycling it ({op['id']}), once for this failure ({why})"
        await self.life.note(device, said[:500], COORDINATOR, auto_recovery=op["id"], auto_recovered_at=now)
