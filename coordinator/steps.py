"""Steps between leases (docs/architecture.md, "Steps between leases"): what a device's
exporter runs on it after every lease and before it is idle again, and ``settle``, its
cool-down steps run inside a lease on request.

The steps are the exporter's config (it reports them, ``DeviceReport.steps``); running
them is the coordinator's sequence of operations, one a step, in the shape every
operation has: once the exporter confirmed a lease's services stopped, the device stays
``reclaiming`` while step 0 runs, then step 1..., and is idle after the last one. A step
that fails leaves it ``faulty`` with the step's reason (``fault``) until an admin clears
it or its health does; one interrupted by a restart of its exporter makes the steps run
again from the first (they are written to be repeatable). ``reflash`` is the flash of the
device's latest known-good image, through the mediated flash path.
"""
from __future__ import annotations

from typing import Any

from device_loop.core import REFLASH_STEP, SETTLE_KIND
from device_loop.core.answers import OperationAnswer
from device_loop.core.protocol import EXPORTER_STEPS
from device_loop.core.vocabulary import FaultKind, OperationState, Purpose
from device_loop.core.errors import ErrorCode

from .errors import APIError, conflict, not_found
from .leases import Leases
from .lifecycle import Lifecycle, fault
from .operations import Operations, op_json
from .rows import DeviceFacts, OperationRow
from .store import Store
from .who import COORDINATOR, Who
from .store.devices import DeviceQueries
from .store.operations import OperationQueries



class Steps:
    """The sequence of a device's steps between two leases, and ``settle``."""

    def __init__(self, life: Lifecycle, leases: Leases, operations: Operations, *,
                 devices_sql: DeviceQueries, operations_sql: OperationQueries):
        self.life, self.leases, self.operations = life, leases, operations
        self.store: Store = life.store
        self.devices_sql = devices_sql
        self.operations_sql = operations_sql

    async def begin(self, names: list[str]) -> None:
        """The exporter confirmed these devices' last lease is over: their first step begins."""
        for device in await self.devices_sql.devices_named(sorted(names)):
            if device["reclaim_lease"] and device["reclaim_step"] is None and device["steps"] and not device["op_id"]:
                await self._queue(device, 0, f"lease {device['reclaim_lease']} ended")

    async def _queue(self, device: DeviceFacts, index: int, cause: str) -> None:
        steps = device["steps"]
        step = steps[index]
        audit: dict[str, Any] = {"step": index, "of": len(steps), "cause": cause}
        try:
            if step["step"] == REFLASH_STEP:
                op = await self.operations.reflash(device, COORDINATOR, index, audit)
            else:
                op = await self.operations.queue(device, step["step"], step["identifier"], step["plugin"], {}, None,
                                                 COORDINATOR, exclusive=True, destructive=False, purpose=Purpose.STEP,
                                                 step=index, action="step", audit=audit)
        except APIError as refusal:  # (no known-good image to reflash, say)
            await self._fail(device, index, refusal.message)
            return
        await self.devices_sql.update_device(device["name"], reclaim_step=index, reclaim_op=op["id"])
        self.life.notify("board")

    async def after_operations(self, ended: list[OperationRow]) -> list[str]:
        """Operations that just ended: a device's step among them moves its sequence on.
        Returns the devices whose last step succeeded (idle now)."""
        idle: list[str] = []
        for op in ended:
            device = await self.devices_sql.device(op["device"])
            if device is None or device["reclaim_op"] != op["id"] or device["reclaim_step"] is None:
                continue
            index, steps = device["reclaim_step"], device["steps"]
            what = f"step {index + 1}/{len(steps)} {steps[index]['step'] if index < len(steps) else op['kind']}"
            if op["state"] == OperationState.DONE and index + 1 < len(steps):
                await self.life.note(device, f"{what} done: {op['message']}", COORDINATOR)
                await self._queue(device, index + 1, f"{what} done")
            elif op["state"] == OperationState.DONE:
                await self.life.change(device, f"{what} done: {op['message']}; steps between leases done", COORDINATOR,
                                       {"reclaim_lease": None, "reclaim_step": None, "reclaim_op": None})
                idle.append(device["name"])
            elif op["interrupted"]:  # (its exporter's restart or stop, never a plugin's words)
                await self.life.note(device, f"{what} {op['message']}; the steps run again from the first", COORDINATOR)
                await self._queue(device, 0, f"{what} was interrupted")
            else:
                await self._fail(device, index, op["message"])
        return idle

    async def _fail(self, device: DeviceFacts, index: int, why: str) -> None:
        steps = device["steps"]
        words = f"step {index + 1}/{len(steps)} {steps[index]['step']} failed: {why}"
        await self.life.change(device, words, COORDINATOR, {"reclaim_lease": None, "reclaim_step": None,
                                                      "reclaim_op": None, **fault(FaultKind.STEP_FAILED, words)})

    async def settle(self, lease_id: str, who: Who) -> OperationAnswer:
        """Run the device's cool-down steps inside the lease (what an A/B runner asks between
        two runs): an operation to follow; done at once when the device has none."""
        async with self.store.tx():
            view = await self.leases.live_view(lease_id, who, "settle it")
            device = await self.devices_sql.device(view["device"])
            if device is None:
                raise not_found("device", view["device"])
            if not (device["host_online"] and device["present"]):
                raise conflict(ErrorCode.OFFLINE, f"{device['name']} is offline (host {device['host']}): nothing runs "
                                                  f"on it now")
            first = device["resources"][0] if device["resources"] else None
            if first is None:
                raise conflict(ErrorCode.NO_RESOURCES, f"{device['name']} reports no resource to run on")
            settling = [s["step"] for s in device["steps"] if s.get("settle")]
            live = await self.operations.shared(SETTLE_KIND, {}, lease_id, device["name"])
            if live is not None:
                return live
            self.operations.take_share(lease_id)  # (one with no cool-down step too: it is a row and an entry)
            answer = await self.operations.queue(device, SETTLE_KIND, first["identifier"], EXPORTER_STEPS, {},
                                                 lease_id, who.name, exclusive=False, destructive=False,
                                                 purpose=Purpose.SETTLE, audit={"steps": settling})
            if settling:
                return answer
            # nothing to wait for: the operation is over before it reaches the exporter
            message = "nothing to settle: no cool-down step (its exporter's config lists none)"
            now = self.life.clock()
            fields: dict[str, Any] = {"state": OperationState.DONE, "phase": "done", "message": message,
                                      "started_at": now, "ended_at": now}
            await self.operations_sql.update_operation(answer["id"], fields)
            row = await self.operations_sql.operation(answer["id"])
            assert row is not None
            return op_json(row, theirs=True)
