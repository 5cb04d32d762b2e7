"""``device-loop power on|off|cycle|status DEVICE|LEASE``: switch a device's power through the
coordinator and say what was observed (docs/architecture.md, "Power")."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any
import click

from device_loop.core.vocabulary import PowerAction, PowerVerdict

from .commands import _my_lease, json_option, lab_command
from .exec import _seconds
from device_loop.client.http import CoordinatorError
from device_loop.client.lab import Lab, follow_op
from device_loop.core.errors import ErrorCode
from .operations import detach_option
from .output import emit, fail

#: The exit status of a power operation that ran but whose effect nobody observed.
UNVERIFIED = 3


def _result(op: Mapping[str, Any]) -> dict:
    result = op.get("result")
    return result if isinstance(result, dict) else {}


def verdict_of(op: Mapping[str, Any]) -> str:
    """A power operation's word for people: ``verified`` or ``unverified`` once it is done (what
    an exporter reported is data: anything else reads as unverified), else its state."""
    if op["state"] != "done":
        return op["state"]
    result = _result(op)
    return PowerVerdict.VERIFIED.value if result.get("verdict") == PowerVerdict.VERIFIED else \
        PowerVerdict.UNVERIFIED.value


def power_text(op: Mapping[str, Any]) -> str:
    """``sim-board-0: power cycle verified (...)`` and the observations, one a line."""
    result = _result(op)
    action = op["args"].get("action", "?")
    lines = [f"{op['device']}: power {action} {verdict_of(op)} ({op['id']})"]
    how = result.get("how")
    lines += [f"  {line}" for line in (how if isinstance(how, list) else []) if isinstance(line, str)]
    first = result.get("first_byte_s")
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        lines.append(f"  time to the console's first byte after on: {first:.2f} s")
    if verdict_of(op) == PowerVerdict.UNVERIFIED:
        lines.append(f"  {op['message']}")
    lines.append(f"  switch: {result.get('backend', '?')}; console {result.get('console', '?')}")
    return "\n".join(lines)


@click.command("power")
@click.argument("action", type=click.Choice([a.value for a in PowerAction]))
@click.argument("target", metavar="DEVICE|LEASE")
@click.option("--off-time", "off_time", callback=lambda ctx, param, value: None if value is None else
              _seconds(ctx, param, value), metavar="DURATION",
              help="a cycle's time with the power off (5s, 0.5s, 1m; default: the switch's own)")
@detach_option
@json_option
@lab_command
def power_command(lab: Lab, action: str, target: str, off_time: float | None, detach: bool, as_json: bool):
    """Switch the power of a device you hold (your lease of DEVICE, or LEASE; an admin: of a device
    nobody holds) and say what was observed: the switch's read-back, and whether the console went
    silent while the power was off and printed again after on (with the time to its first byte).

    Exit status: 0 verified, 3 unverified (it ran, and nothing showed that it happened), 1 failed.

    \b
    device-loop power cycle sim-board-0
    device-loop power off jupiter && device-loop power on jupiter
    device-loop power status jupiter --json
    """
    body: dict = {"action": action}
    if off_time is not None:
        if action != PowerAction.CYCLE:
            raise click.BadParameter("--off-time goes with cycle", param_hint="--off-time")
        body["off_time_s"] = off_time
    try:
        path = f"/leases/{_my_lease(lab, target).id}/power"
    except CoordinatorError as exc:
        if exc.code not in (ErrorCode.NO_LEASE, ErrorCode.LEASE_ENDED) or target.startswith("lease-"):
            raise
        path = f"/admin/devices/{target}/power"  # a device nobody holds (yours no longer): an admin's
    try:
        op = lab.api.post(path, body)
    except CoordinatorError as exc:
        if exc.status != 403 or not path.startswith("/admin/"):
            raise
        fail(as_json, exc.code, f"you hold no lease of {target}, and only an admin switches a device nobody holds: "
                                f"ask one to run device-loop power {action} {target}")
    if detach:
        emit(as_json, op, lambda o: o["id"])
        return
    try:
        final = follow_op(lab.api, op)
    except KeyboardInterrupt:
        fail(as_json, ErrorCode.INTERRUPTED, f"no longer following {op['id']}; the power {action} goes on: "
                                             f"device-loop op {op['id']} --wait", exit_code=130, op=op["id"])
    if final["state"] != "done":
        fail(as_json, ErrorCode.POWER_FAILED, f"power {action} of {final['device']} failed ({final['id']}): "
                                              f"{final['message']}", op=final["id"])
    emit(as_json, final, power_text)
    if verdict_of(final) != PowerVerdict.VERIFIED:
        raise SystemExit(UNVERIFIED)
