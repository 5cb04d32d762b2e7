"""Operations from the command line, each followed to its end: ``device-loop op run`` (any
kind a device's resources run), ``flash`` and ``recover`` (the image registry's), ``op``
(one operation), ``ops`` and ``flashes`` (a device's history)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
import json
import math
import shlex
import sys

import click

from device_loop.core import FLASH_KIND, POWER_KIND
from device_loop.core.vocabulary import FIRST_PHASES

from .commands import _my_lease, json_option, lab_command
from device_loop.client.http import CoordinatorError
from device_loop.client.lab import Lab, follow_op
from device_loop.core.errors import ErrorCode
from .output import emit, fail, on_terminal, progress_bar, table

if TYPE_CHECKING:
    from device_loop.core.answers import OperationAnswer


detach_option = click.option("--detach", is_flag=True,
                             help="print the operation's id and return; follow it with 'device-loop op OP --wait'")


# ---- how an operation reads -------------------------------------------------------------------

def _what(op: Mapping[str, Any]) -> str:
    """``op-…: flash of sim-board-0 with build-1 (3f2a…)``, ``op-…: capture-boot-log of sim-board-0``."""
    if op.get("image"):
        image = op["image"]
        return f"{op['id']}: {op['purpose']} of {op['device']} with {image['name']} ({image['sha256'][:12]})"
    return f"{op['id']}: {op['kind']} of {op['device']}"


def _progress(op: Mapping[str, Any]) -> str:
    """``writing, 3/8 MiB``, ``capturing, 2/5 seconds``, or just the phase."""
    progress = op["progress"]
    done, total, unit = progress["done"], progress["total"], progress["unit"]
    if unit == "bytes":
        amount = f"{done >> 20}/{total >> 20} MiB" if total is not None else f"{done >> 20} MiB"
    elif done or total:
        amount = f"{done}/{total}" if total is not None else f"{done}"
        amount += f" {unit}" if unit else ""
    else:
        return op["phase"]
    return f"{op['phase']}, {amount}"


def _result_text(result: dict) -> list[str]:
    """An operation's result for people: ``key: value`` lines, a text of several lines as a block."""
    lines = []
    for key, value in result.items():
        if isinstance(value, str) and "\n" in value:
            lines.append(f"  {key}:")
            lines += [f"    {line}" for line in value.rstrip("\n").split("\n")]
        elif isinstance(value, list):
            lines.append(f"  {key}: {', '.join(map(str, value))}")
        elif isinstance(value, dict):
            lines.append(f"  {key}: " + ", ".join(f"{k}={v}" for k, v in value.items()))
        else:
            lines.append(f"  {key}: {json.dumps(value) if not isinstance(value, str) else value}")
    return lines


def _state_of(op: Mapping[str, Any]) -> str:
    """An operation's state for people; a power operation that ended is verified or unverified,
    never merely done (docs/architecture.md, "Power")."""
    if op["state"] == "done" and op["kind"] == POWER_KIND:
        result = op["result"] if isinstance(op.get("result"), dict) else {}
        return "verified" if result.get("verdict") == "verified" else "unverified"
    return op["state"]


def op_text(op: Mapping[str, Any]) -> str:
    lines = [f"{_what(op)}: {_state_of(op)}" + (f" ({_progress(op)})" if op["state"] == "running" else "")]
    if op["message"]:
        lines.append(f"  {op['message']}")
    if op["seconds"]:
        lines.append("  " + ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in op["seconds"].items()))
    lines.append(f"  asked by {op['requester']} at {op['created_at']}"
                 + (f", ended {op['ended_at']}" if op["ended_at"] else ""))
    if op.get("result"):
        lines += _result_text(op["result"])
    return "\n".join(lines)


def _draw(op: Mapping[str, Any]) -> None:
    """The operation's progress, over the last drawing, on stderr."""
    progress = op["progress"]
    phase = op["phase"] if op["state"] == "running" else _state_of(op)
    done, total, unit = progress["done"], progress["total"], progress["unit"]
    if unit == "bytes" and total:
        progress_bar(phase, done, total)
        return
    if total:
        filled = 30 * min(done, total) // max(total, 1)
        bar = f"[{'#' * filled}{'.' * (30 - filled)}] {done}/{total}" + (f" {unit}" if unit else "")
    else:
        bar = f"{done} {unit}".strip() if done else ""
    sys.stderr.write(f"\r  {phase:<10} {bar}\033[K")
    sys.stderr.flush()


def follow_and_show(lab: Lab, op: OperationAnswer, detach: bool, as_json: bool) -> None:
    """Follow ``op`` to its end drawing its progress (on a terminal), print it, exit 1 if it failed."""
    if detach:
        emit(as_json, op, lambda o: o["id"])
        return
    kind = FLASH_KIND if op.get("image") else op["kind"]
    drawing = on_terminal(as_json)
    if drawing:
        click.echo(f"{_what(op)} (Ctrl-C stops following; the {kind} goes on)", err=True)

    def show(current: Mapping[str, Any]) -> None:
        if drawing:
            _draw(current)

    try:
        final = follow_op(lab.api, op, on_progress=show)
    except KeyboardInterrupt:
        if drawing:
            click.echo("", err=True)  # off the progress bar's line
        fail(as_json, ErrorCode.INTERRUPTED, f"no longer following {op['id']}; the {kind} goes on: "
                                             f"device-loop op {op['id']} --wait", exit_code=130, op=op["id"])
    if drawing:
        show(final)
        click.echo("", err=True)
    if final["state"] != "done":
        fail(as_json, "flash_failed" if final["kind"] == FLASH_KIND else "operation_failed", _failure(lab, final),
             op=final["id"])
    emit(as_json, final, op_text)


def _failure(lab: Lab, op: Mapping[str, Any]) -> str:
    """Why an operation failed, and what to do now."""
    device = lab.api.get(f"/devices/{op['device']}")
    if op["kind"] == FLASH_KIND:
        when = "before anything was written" if op["phase"] in FIRST_PHASES else f"while {op['phase']}"
    else:
        when = "before it began" if op["phase"] in FIRST_PHASES else f"while {op['phase']}"
    said = f"{op['id']} failed {when}: {op['message']}"
    if device["health"] == "failed":  # recovering or trying again would fail the same way
        return (f"{said}; {op['device']} itself is not usable ({device['health_reason']}): fix that on host "
                f"{device['host']} first (device-loop hosts), then: device-loop recover {op['device']}")
    if device["needs_recovery"]:
        return f"{said}; {op['device']} now needs recovery: device-loop recover {op['device']}"
    if op["kind"] == FLASH_KIND or _destructive(device, op["kind"]):
        return f"{said}; the device was not changed"
    args = "".join(" --arg " + shlex.quote(f"{name}={_typed(value)}") for name, value in op["args"].items())
    takes = "; ".join(f"{name}: {what}" for name, what in _declared(device, op["kind"]).get("args", {}).items())
    return (f"{said}; once that is fixed, run it again: device-loop op run {op['kind']} {op['device']}{args}"
            + (f" (it takes {takes})" if takes else ""))


def _declared(device: dict, kind: str) -> dict:
    """What the device's resources say of ``kind`` (its description, args, exclusive, destructive)."""
    return next((k for r in device["resources"] for k in r.get("operations", []) if k["kind"] == kind), {})


def _destructive(device: dict, kind: str) -> bool:
    return bool(_declared(device, kind).get("destructive"))


# ---- --arg NAME=VALUE ---------------------------------------------------------------------------

ARG_HELP = ("an argument of the operation, NAME=VALUE (again for each); a VALUE that reads as a JSON number, "
            "true, false or null is sent as one, anything else as text: quote it as JSON to send a text that "
            "looks like a number (--arg tag='\"42\"')")


def _arg_value(text: str):
    """``--arg`` VALUE as it is sent: a JSON number, true, false, null or "quoted text" as that; else the text."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, float) and not math.isfinite(value):
        return text  # NaN, Infinity: not numbers an argument may be
    return value if isinstance(value, (str, bool, int, float)) or value is None else text


def _typed(value) -> str:
    """An argument's VALUE as ``--arg`` takes it back (a text that would read as another JSON value, quoted)."""
    if isinstance(value, str):
        return value if _arg_value(value) == value else json.dumps(value)
    return json.dumps(value)


def _args(ctx, param, given: tuple[str, ...]) -> dict:
    args = {}
    for item in given:
        name, equals, text = item.partition("=")
        name = name.strip()
        if not equals or not name:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE (e.g. --arg seconds=5)")
        if name in args:
            raise click.BadParameter(f"{name} is given twice")
        args[name] = _arg_value(text)
    return args


# ---- the commands -------------------------------------------------------------------------------

@click.command("run")
@click.argument("kind")
@click.argument("target", metavar="DEVICE|LEASE")
@click.option("--arg", "args", multiple=True, metavar="NAME=VALUE", callback=_args, help=ARG_HELP)
@detach_option
@json_option
@lab_command
def op_run_command(lab: Lab, kind: str, target: str, args: dict, detach: bool, as_json: bool):
    """Start an operation of KIND on a device you hold (your lease of DEVICE, or LEASE) and follow it to
    its end: its progress on a terminal, then its message and result; exit 1 if it failed, saying what
    to do next.

    The kinds a device runs, with their arguments, are in 'device-loop ls --json' (resources[].operations);
    the coordinator refuses a kind the device does not run, or an argument its kind does not take.

    \b
    device-loop op run capture-boot-log jupiter --arg seconds=10 --arg until=login:
    """
    op = lab.api.post(f"/leases/{_my_lease(lab, target).id}/operations", {"kind": kind, "args": args})
    follow_and_show(lab, op, detach, as_json)


@click.command("show")
@click.argument("op_id", metavar="OP")
@click.option("--wait", is_flag=True, help="follow it to its end (exit 1 if it failed)")
@json_option
@lab_command
def op_show_command(lab: Lab, op_id: str, wait: bool, as_json: bool):
    """Show an operation: kind, state, phase, progress, seconds per phase, message and result
    ('device-loop op OP' is this)."""
    op = lab.op(op_id).data
    if wait:
        follow_and_show(lab, op, False, as_json)
    else:
        emit(as_json, op, op_text)


class OpGroup(click.Group):
    """``op OP [--wait]`` (an operation, as ``op show``) beside ``op run KIND TARGET``: a
    first argument that names no subcommand is an operation id."""

    DEFAULT = "show"
    _VALUE_OPTIONS = ("--coordinator", "--user", "--arg")  # options whose value is the next word

    def parse_args(self, ctx, args):
        if any(a in ("-h", "--help") for a in args) and self._first_word(args) is None:
            return super().parse_args(ctx, args)  # `op --help`: the group's own help
        if args:
            first = self._first_word(args)
            if first is not None and args[first] in self.commands:
                args = [args[first], *args[:first], *args[first + 1:]]  # options may come before it
            else:
                args = [self.DEFAULT, *args]
        return super().parse_args(ctx, args)

    def _first_word(self, args: list[str]) -> int | None:
        """The index of the first argument that is not an option (nor an option's value)."""
        skip = False
        for index, arg in enumerate(args):
            if skip:
                skip = False
            elif arg in self._VALUE_OPTIONS:
                skip = True
            elif not arg.startswith("-"):
                return index
        return None

    def format_usage(self, ctx, formatter):
        formatter.write_usage(ctx.command_path, "OP [--wait] [--json]")
        formatter.write_usage(ctx.command_path, "run KIND DEVICE|LEASE [--arg NAME=VALUE ...] [--detach] [--json]",
                              prefix=" " * len("Usage: "))


@click.group("op", cls=OpGroup, context_settings={"help_option_names": ["-h", "--help"]})
def op_command():
    """Show an operation (op OP), or start one and follow it (op run KIND DEVICE|LEASE).

    \b
    device-loop op op-1f2e3d4c5b6a7980 --wait
    device-loop op run capture-boot-log jupiter --arg seconds=10
    """


op_command.add_command(op_show_command)
op_command.add_command(op_run_command)


@click.command("ops")
@click.argument("device")
@click.option("--kind", help="only the operations of this kind (flash, capture-boot-log, ...)")
@json_option
@lab_command
def ops_command(lab: Lab, device: str, kind: str | None, as_json: bool):
    """A device's last 20 operations, newest first: kind, state, phase, progress, who asked, when
    (device-loop op OP shows one with its result)."""
    def text(ops: list[dict]) -> str:
        if not ops:
            return f"{device} has run no {kind + ' ' if kind else ''}operation"
        return table(["OP", "KIND", "STATE", "PHASE", "PROGRESS", "BY", "ASKED AT", "MESSAGE"],
                     [[o["id"], o["kind"], _state_of(o), o["phase"], _progress(o).partition(", ")[2] or "-",
                       o["requester"], o["created_at"],
                       (o["message"][:50] + "...") if len(o["message"]) > 53 else o["message"]] for o in ops])
    emit(as_json, [op.data for op in lab.operations(device, kind)], text)


@click.command("flash")
@click.argument("target", metavar="DEVICE|LEASE")
@click.argument("image")
@detach_option
@json_option
@lab_command
def flash_command(lab: Lab, target: str, image: str, detach: bool, as_json: bool):
    """Flash IMAGE (its REF, sha256:..., or its name, from 'device-loop images ls') onto a device you hold,
    and follow it to its end (exit 1 if it failed)."""
    follow_and_show(lab, _my_lease(lab, target).operate(FLASH_KIND, wait=False, image=image).data, detach, as_json)


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
        if exc.code not in (ErrorCode.NO_LEASE, ErrorCode.LEASE_ENDED):
            raise
        # (a VM slot's base, too, is written by an admin's recovery: not only a device that needs it)
        device, path = target, f"/admin/devices/{target}/recover"  # admins only: says so otherwise
    if not as_json and not lab.api.get(f"/devices/{device}")["needs_recovery"]:
        click.echo(f"note: {device} does not need recovery; writing its known-good image anyway", err=True)
    follow_and_show(lab, lab.api.post(path), detach, as_json)


@click.command("flashes")
@click.argument("device")
@json_option
@lab_command
def flashes_command(lab: Lab, device: str, as_json: bool):
    """A device's last 20 flashes: when, what, by whom, how it ended (all its operations: device-loop ops)."""
    emit(as_json, lab.api.get(f"/devices/{device}/flashes"), lambda ops: table(
        ["OP", "ASKED AT", "WHAT", "IMAGE", "BY", "STATE", "RESULT"],
        [[o["id"], o["created_at"], o["purpose"], o["image"]["name"], o["requester"], o["state"],
          (o["message"][:60] + "...") if len(o["message"]) > 63 else o["message"]] for o in ops])
        if ops else f"{device} was never flashed")
