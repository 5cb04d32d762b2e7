"""``device-loop flash``, ``recover`` and ``op``: mediated flash, followed to its end."""
from __future__ import annotations

import click

from .commands import _my_lease, json_option, lab_command
from .http import CoordinatorError
from .lab import Lab, follow_op
from .output import emit, fail, on_terminal, progress_bar


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

    def show(current: dict) -> None:
        if drawing:
            phase = current["phase"] if current["state"] == "running" else current["state"]
            progress_bar(phase, current["done_bytes"], current["total_bytes"])

    final = follow_op(lab.api, op, on_progress=show)
    if drawing:
        show(final)
        click.echo("", err=True)
    if final["state"] != "done":
        device = lab.api.get(f"/devices/{final['device']}")
        after = (f"; {final['device']} now needs recovery: device-loop recover {final['device']}"
                 if device["needs_recovery"] else "; the device was not changed")
        fail(as_json, "flash_failed", f"{final['id']} failed while {final['phase']}: {final['message']}{after}",
             op=final["id"])
    emit(as_json, final, op_text)


@click.command("flash")
@click.argument("target", metavar="DEVICE|LEASE")
@click.argument("image")
@click.option("--detach", is_flag=True, help="print the operation's id and return; follow it with 'device-loop op'")
@json_option
@lab_command
def flash_command(lab: Lab, target: str, image: str, detach: bool, as_json: bool):
    """Flash IMAGE (name or sha256, from 'device-loop images ls') onto a device you hold,
    and follow it to its end (exit 1 if it failed)."""
    op = lab.api.post(f"/leases/{_my_lease(lab, target).id}/flash", {"image": image})
    _follow_and_show(lab, op, detach, as_json)


@click.command("recover")
@click.argument("target", metavar="DEVICE|LEASE")
@click.option("--detach", is_flag=True, help="print the operation's id and return")
@json_option
@lab_command
def recover_command(lab: Lab, target: str, detach: bool, as_json: bool):
    """Flash the latest known-good image onto a device you hold (an admin: onto one nobody
    holds); this clears its needs-recovery mark."""
    try:
        path = f"/leases/{_my_lease(lab, target).id}/recover"
    except CoordinatorError as exc:
        if exc.code not in ("no_lease", "lease_ended") or not lab.api.get("/devices/" + target).get("needs_recovery"):
            raise
        path = f"/admin/devices/{target}/recover"  # admins only: says so otherwise
    _follow_and_show(lab, lab.api.post(path), detach, as_json)


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
