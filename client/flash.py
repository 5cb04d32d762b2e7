"""``device-loop flash``, ``recover`` and ``op``: mediated flash, followed to its end."""
from __future__ import annotations

import click

from device_loop.core import WRITING_PHASES

from .commands import _my_lease, json_option, lab_command
from .http import CoordinatorError
from .lab import Lab, follow_op
from .output import emit, fail, on_terminal, progress_bar, table


detach_option = click.option("--detach", is_flag=True,
                             help="print the operation's id and return; follow it with 'device-loop op'")


def op_text(op: dict) -> str:
    image = op["image"]
    lines = [f"{op['id']}: {op['purpose']} of {op['device']} with {image['name']} ({image['sha256'][:12]}): "
             f"{op['state']}" + (f" ({op['phase']}, {op['done_bytes'] >> 20}/{op['total_bytes'] >> 20} MiB)"
                                 if op["state"] == "running" else "")]
    if op["message"]:
        lines.append(f"  {op['message']}")
    if op["seconds"]:
        lines.append("  " + ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in op["seconds"].items()))
    lines.append(f"  asked by {op['requester']} at {op['created_at']}"
                 + (f", ended {op['ended_at']}" if op["ended_at"] else ""))
    return "\n".join(lines)


def _follow_and_show(lab: Lab, op: dict, detach: bool, as_json: bool) -> None:
    if detach:
        emit(as_json, op, lambda o: o["id"])
        return
    drawing = on_terminal(as_json)
    if drawing:
        click.echo(f"{op['id']}: {op['purpose']} of {op['device']} with {op['image']['name']} "
                   "(Ctrl-C stops following; the flash goes on)", err=True)

    def show(current: dict) -> None:
        if drawing:
            phase = current["phase"] if current["state"] == "running" else current["state"]
            progress_bar(phase, current["done_bytes"], current["total_bytes"])

    try:
        final = follow_op(lab.api, op, on_progress=show)
    except KeyboardInterrupt:
        if drawing:
            click.echo("", err=True)  # off the progress bar's line
        fail(as_json, "interrupted", f"no longer following {op['id']}; the flash goes on: "
                                     f"device-loop op {op['id']} --wait", exit_code=130, op=op["id"])
    if drawing:
        show(final)
        click.echo("", err=True)
    if final["state"] != "done":
        fail(as_json, "flash_failed", _failure(lab, final), op=final["id"])
    emit(as_json, final, op_text)


def _failure(lab: Lab, op: dict) -> str:
    """Why a flash failed, and what to do now."""
    device = lab.api.get(f"/devices/{op['device']}")
    when = f"while {op['phase']}" if op["phase"] in WRITING_PHASES else "before anything was written"
    said = f"{op['id']} failed {when}: {op['message']}"
    if device["health"] == "failed":  # recovering would fail the same way
        return (f"{said}; {op['device']} itself is not usable ({device['health_reason']}): fix that on host "
                f"{device['host']} first (device-loop hosts), then: device-loop recover {op['device']}")
    if device["needs_recovery"]:
        return f"{said}; {op['device']} now needs recovery: device-loop recover {op['device']}"
    return f"{said}; the device was not changed"


@click.command("flash")
@click.argument("target", metavar="DEVICE|LEASE")
@click.argument("image")
@detach_option
@json_option
@lab_command
def flash_command(lab: Lab, target: str, image: str, detach: bool, as_json: bool):
    """Flash IMAGE (its REF, sha256:..., or its name, from 'device-loop images ls') onto a device you hold,
    and follow it to its end (exit 1 if it failed)."""
    op = lab.api.post(f"/leases/{_my_lease(lab, target).id}/flash", {"image": image})
    _follow_and_show(lab, op, detach, as_json)


@click.command("recover")
@click.argument("target", metavar="DEVICE|LEASE")
@detach_option
@json_option
@lab_command
def recover_command(lab: Lab, target: str, detach: bool, as_json: bool):
    """Flash the latest known-good image onto a device you hold (an admin: onto one nobody
    holds); this clears its needs-recovery mark."""
    try:
        lease = _my_lease(lab, target)
        device, path = lease.data["device"], f"/leases/{lease.id}/recover"
    except CoordinatorError as exc:
        if exc.code not in ("no_lease", "lease_ended") or not lab.api.get("/devices/" + target).get("needs_recovery"):
            raise
        device, path = target, f"/admin/devices/{target}/recover"  # admins only: says so otherwise
    if not as_json and not lab.api.get(f"/devices/{device}")["needs_recovery"]:
        click.echo(f"note: {device} does not need recovery; writing its known-good image anyway", err=True)
    _follow_and_show(lab, lab.api.post(path), detach, as_json)


@click.command("flashes")
@click.argument("device")
@json_option
@lab_command
def flashes_command(lab: Lab, device: str, as_json: bool):
    """A device's last 20 flashes: when, what, by whom, how it ended."""
    emit(as_json, lab.api.get(f"/devices/{device}/flashes"), lambda ops: table(
        ["OP", "ASKED AT", "WHAT", "IMAGE", "BY", "STATE", "RESULT"],
        [[o["id"], o["created_at"], o["purpose"], o["image"]["name"], o["requester"], o["state"],
          (o["message"][:60] + "...") if len(o["message"]) > 63 else o["message"]] for o in ops])
        if ops else f"{device} was never flashed")


@click.command("op")
@click.argument("op_id", metavar="OP")
@click.option("--wait", is_flag=True, help="follow it to its end")
@json_option
@lab_command
def op_command(lab: Lab, op_id: str, wait: bool, as_json: bool):
    """Show a flash operation (state, progress, result)."""
    op = lab.op(op_id)
    if wait:
        _follow_and_show(lab, op, False, as_json)
    else:
        emit(as_json, op, op_text)
