"""``device-loop with``: a lease that lives exactly as long as a command (docs/architecture.md,
"A lease bound to a command"; the work is ``client/command_lease.py``'s)."""
from __future__ import annotations

import json
import sys

import click

from device_loop.cli.ci_results import check_distinct, ci_options, prepare_command_results, write_command_results
from device_loop.cli.commands import _given, _ttl, coordinator_url, target_options
from device_loop.client.command_lease import (DEFAULT_KEEPALIVE_S, DEFAULT_TIMEOUT_S, CommandRequest, WrongRequest,
                                              run_command)
from device_loop.client.http import CoordinatorError
from device_loop.client.lab import Lab
from device_loop.core.command_outcome import CommandOutcome
from device_loop.core.durations import KEEPALIVE_RANGE, format_duration
from device_loop.core.vocabulary import LAB_FAILURE_STATUS, FailureKind


class _CommandAfterDashes(click.Command):
    """Everything after the first ``--`` is the command, untouched by click (100,000 arguments
    are counted and refused, not parsed as options)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            at = args.index("--")
            ctx.meta["with.command"] = tuple(args[at + 1:])
            args = args[:at]
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return [*super().collect_usage_pieces(ctx), "-- COMMAND..."]


def _say(text: str) -> None:
    click.echo(f"device-loop: {text}", err=True)


@click.command("with", cls=_CommandAfterDashes, short_help="Run COMMAND with a device leased for exactly as long "
                                                          "as it runs")
@target_options
@click.option("--queue", is_flag=True, help="nothing that matches is free: wait in the queue (its place on stderr)")
@click.option("--image", help="the registry image the device must run: flashed first unless it runs it already")
@click.option("--timeout", callback=_ttl, help="how long to wait for a ready device, queue included  "
                                                f"[default: {format_duration(DEFAULT_TIMEOUT_S)}]")
@click.option("--keepalive", callback=_ttl, help=f"the lease ends this long after `with` stops renewing it "
                                                  f"({KEEPALIVE_RANGE})  "
                                                  f"[default: {format_duration(DEFAULT_KEEPALIVE_S)}]")
@click.option("--max-time", callback=_ttl, help="cut the command after this long (exit 124)")
@click.option("--json", "as_json", is_flag=True, help="print the outcome as one JSON object, the last line on stdout")
@ci_options
@click.option("--coordinator", envvar="DEVICE_LOOP_COORDINATOR", callback=coordinator_url, help="coordinator URL")
@click.option("--user", envvar="DEVICE_LOOP_USER", help="who you are to the lab (without tokens only)")
@click.pass_context
def with_command(ctx, device, device_class, tags, needs, queue, image, timeout, keepalive, max_time, as_json,
                 junit_file, markdown_file, coordinator, user):
    """Run COMMAND with DEVICE (or any device of --class / --tags) leased for exactly as long
    as it runs:  device-loop with sim-board-0 -- ./test.sh

    The command gets the lease in its environment (DEVICE_LOOP_LEASE, DEVICE_LOOP_DEVICE, the
    endpoints' variables) and runs in a process group of its own. SIGINT, SIGTERM or SIGHUP is
    passed to it, the lease is given back once it ended (or a second later), and a second
    signal kills it. Exit status: the command's own; 128+N when signal N cancelled it; 124
    when --max-time cut it; 75 when the lab failed it (no device in time, the lease lost, the
    device gone, a flash failed), the reason on stderr; 2 for a wrong request."""
    command = ctx.meta.get("with.command", ())
    check_distinct(junit_file, markdown_file)
    prepare_command_results(junit_file, markdown_file)
    request = CommandRequest(command=command, device=device, class_=device_class, tags=tuple(tags),
                             needs=needs, queue=queue, image=image,
                             timeout_s=DEFAULT_TIMEOUT_S if timeout is None else timeout,
                             keepalive_s=DEFAULT_KEEPALIVE_S if keepalive is None else keepalive, max_time_s=max_time)
    try:
        lab = Lab(_given(ctx, "coordinator", coordinator) or ctx.obj["coordinator"],
                  _given(ctx, "user", user) or ctx.obj["user"])
    except CoordinatorError as exc:
        raise click.UsageError(exc.message) from None
    try:
        outcome = run_command(lab, request, _say)
        _report(outcome, as_json)
        write_command_results(lab, outcome, junit_file, markdown_file)
    except WrongRequest as exc:
        raise click.UsageError(str(exc)) from None
    finally:
        lab.api.close()
    sys.exit(outcome.status)


def _report(outcome: CommandOutcome, as_json: bool) -> None:
    """The lab failure's one line on stderr; with --json, the outcome, the last line on stdout."""
    if outcome.failure == FailureKind.LAB and outcome.status == LAB_FAILURE_STATUS:
        click.echo(f"device-loop: lab failure: {outcome.reason}", err=True)
    elif outcome.failure == FailureKind.TIMEOUT or outcome.cancelled:
        click.echo(f"device-loop: {outcome.reason}", err=True)
    if as_json:
        sys.stdout.flush()
        click.echo(json.dumps(outcome.to_json()))



