"""Entry point of the ``device-loop`` command. Exit codes: 0 ok, 1 refused, 2 usage."""
from __future__ import annotations

import json
import os
import sys

import click

from device_loop.cli.commands import COMMANDS, coordinator_url

from .lazy_commands import load, stand_in

# Commands that run a server (or a terminal) import a larger stack; load them only when
# they run, so that the other client commands (and --help) start fast.
LAZY_COMMANDS = {
    "console": "device_loop.cli.console:console_command",
    "adb": "device_loop.cli.adb:adb_command",
    "env": "device_loop.cli.adb:env_command",
    "admin": "device_loop.cli.admin:admin_group",
    "images": "device_loop.cli.images:images_group",
    "flash": "device_loop.cli.operations:flash_command",
    "recover": "device_loop.cli.operations:recover_command",
    "op": "device_loop.cli.operations:op_command",
    "ops": "device_loop.cli.operations:ops_command",
    "flashes": "device_loop.cli.operations:flashes_command",
    "video": "device_loop.cli.video:video_command",
    "cdi": "device_loop.cli.cdi:cdi_command",
    "vnc": "device_loop.cli.vnc:vnc_command",
    "watch": "device_loop.cli.watch:watch_command",
    "forward": "device_loop.cli.forward:forward_command",
    "up": "device_loop.cli.up:up_command",
    "qemu-guest": "device_loop.cli.qemu_guest:qemu_guest_command",
    "coordinator": "device_loop.coordinator.serve:coordinator_command",
    "exporter": "device_loop.exporter.run:exporter_command",
    "exec": "device_loop.cli.exec:exec_command",
    "fingerprint": "device_loop.cli.exec:fingerprint_command",
    "run": "device_loop.cli.jobs:run_command",
    "ab": "device_loop.cli.jobs:ab_command",
    "matrix": "device_loop.cli.jobs:matrix_command",
    "jobs": "device_loop.cli.jobs:jobs_command",
    "job": "device_loop.cli.jobs:job_group",
    "worker": "device_loop.cli.worker:worker_command",
    "power": "device_loop.cli.power:power_command",
    "with": "device_loop.cli.with_command:with_command",
}


_short_command = False  # a client command that asks the coordinator and prints (not a server)


class Commands(click.Group):
    def list_commands(self, ctx):
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx, name):
        if name in LAZY_COMMANDS:
            return load(LAZY_COMMANDS[name])
        return super().get_command(ctx, name)

    def format_commands(self, ctx, formatter):
        """--help's list of commands, as click writes it, with the lazy ones not imported."""
        commands = [(name, stand_in(name, LAZY_COMMANDS[name]) if name in LAZY_COMMANDS
                     else self.get_command(ctx, name)) for name in self.list_commands(ctx)]
        shown = [(name, command) for name, command in commands if command is not None and not command.hidden]
        if shown:
            limit = formatter.width - 6 - max(len(name) for name, _ in shown)
            with formatter.section("Commands"):
                formatter.write_dl([(name, command.get_short_help_str(limit)) for name, command in shown])


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--coordinator", envvar="DEVICE_LOOP_COORDINATOR", callback=coordinator_url,
              help="coordinator URL (or DEVICE_LOOP_COORDINATOR; default http://127.0.0.1:7420)")
@click.option("--user", envvar="DEVICE_LOOP_USER",
              help="who you are to the lab (or DEVICE_LOOP_USER; default: your login)")
@click.version_option(package_name="device-loop")
@click.pass_context
def cli(ctx, coordinator, user):
    """device-loop: reserve lab devices by name, get their endpoints, give them back."""
    global _short_command
    _short_command = ctx.invoked_subcommand not in LAZY_COMMANDS
    ctx.obj = {"coordinator": coordinator, "user": user}


for command in COMMANDS:
    cli.add_command(command)


def main() -> None:
    code = _run()
    if _short_command:
        # A client command is done and printed: skip the interpreter's teardown of every
        # module, 10-15 ms of a `device-loop ls` (servers and terminals end the usual way)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _run() -> int:
    try:
        cli.main(standalone_mode=False)
    except click.UsageError as exc:
        if "--json" in sys.argv:
            click.echo(json.dumps({"error": "usage", "message": exc.format_message()}))
        else:
            exc.show()
        return 2
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code  # 1, or 2 for a config refused (a usage error)
    except click.Abort:
        return 130
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0
