"""A device page's "Power" section (docs/architecture.md, "Power"): its buttons, for who may
switch the device, and its last power operations.

Who sees the buttons is decided here, as for the page's other holder-only actions: the
holder of the device's lease (through the lease's route), and admins (a device nobody
holds through the admin route, a held one through its lease's, which admins may use too).
The REST routes decide what anyone may do; this decides only what the page offers.

What a power operation's result holds came from an exporter: it is data, of any shape.
Each row takes from it only what it shows, checked: a verdict that is not "verified" is
shown unverified, a time to first byte that is no number is not shown.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from device_loop.core import LIVE_OP_STATES, POWER_KIND
from device_loop.core.vocabulary import OperationState, PowerVerdict

if TYPE_CHECKING:
    from ..rules import Rules
    from .pages import Viewer

SHOWN = 10           # the last power operations the page lists


def has_switch(device: Mapping[str, Any]) -> bool:
    """Whether one of the device's resources runs power operations (its power switch)."""
    return any(kind.get("kind") == POWER_KIND for resource in device["resources"]
               for kind in resource.get("operations") or [])


def _seconds(value: Any) -> str | None:
    """A time in seconds, as a row shows it (None: no number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return f"{value:.2f} s"


def _action(args: Mapping[str, Any]) -> str:
    """What it was asked to do: ``cycle (off 5 s)``."""
    action, off = str(args.get("action", "?")), args.get("off_time_s")
    if action == "cycle" and _seconds(off) is not None:
        return f"{action} (off {off:g} s)"
    return action


def row(op: Mapping[str, Any]) -> dict[str, Any]:
    """A power operation as the section's table shows it."""
    result = op["result"] if isinstance(op.get("result"), dict) else {}
    if op["state"] in LIVE_OP_STATES:
        verdict = None
    elif op["state"] != OperationState.DONE:
        verdict = "failed"
    else:
        verdict = PowerVerdict.VERIFIED.value if result.get("verdict") == PowerVerdict.VERIFIED \
            else PowerVerdict.UNVERIFIED.value
    message = op["message"] or (result.get("message") if isinstance(result.get("message"), str) else "") or ""
    return {"id": op["id"], "at": op["created_at"], "action": _action(op["args"] or {}), "requester": op["requester"],
            "state": op["state"], "phase": op["phase"], "detail": op["progress"]["detail"], "verdict": verdict,
            "first_byte": _seconds(result.get("first_byte_s")), "message": message,
            "live": op["state"] in LIVE_OP_STATES}


@dataclass(frozen=True)
class PowerPanel:
    """What the page's "Power" section shows (``shown`` False: no section)."""
    switch: bool                  # the device has a power switch
    lease: str | None = None      # the lease whose route the viewer's buttons post to
    unleased: bool = False        # the viewer's buttons post to the admin route (nobody holds it)
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def buttons(self) -> bool:
        return self.switch and (self.lease is not None or self.unleased)

    @property
    def shown(self) -> bool:
        return self.switch or bool(self.rows)


async def power_panel(rules: Rules, device: Mapping[str, Any], mine: list[dict], viewer: Viewer) -> PowerPanel:
    """The "Power" section of ``device``'s page for ``viewer`` (``mine``: their live leases on it;
    ``device`` as an admin's device_info shows it to an admin: with its lease's id)."""
    ops = await rules.operations.of_device(device["name"], SHOWN, kind=POWER_KIND, who=viewer.who)
    switch = has_switch(device)
    lease, unleased = None, False
    if switch and viewer.name is not None:
        if mine:
            lease = mine[0]["id"]
        elif viewer.admin:  # another's lease: only for who may act on it (docs/architecture.md, "Who may act on what")
            lease = device.get("lease") if viewer.who.may_act_on(device["holder"]) else None
            unleased = device.get("lease") is None
    return PowerPanel(switch, lease, unleased, [row(op) for op in ops])
