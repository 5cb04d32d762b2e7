"""Entry point of the ``device-loop`` command. Exit codes: 0 ok, 1 refused, 2 usage."""
from __future__ import annotations

import json
import sys

import click

from device_loop.client.commands import COMMANDS
from device_loop.client.http import default_url, default_user
from device_loop.coordinator.serve import coordinator_command
from device_loop.exporter.run import exporter_command

from .up import up_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--coordinator", envvar="DEVICE_LOOP_COORDINATOR", default=default_url, show_default=True,
              help="coordinator URL (or DEVICE_LOOP_COORDINATOR)")
@click.option("--user", envvar="DEVICE_LOOP_USER", default=default_user,
              help="who you are to the lab (or DEVICE_LOOP_USER; default: your login)")
@click.version_option(package_name="device-loop")
@click.pass_context
def cli(ctx, coordinator, user):
    """device-loop: reserve lab devices by name, get their endpoints, give them back."""
    ctx.obj = {"coordinator": coordinator, "user": user}


for command in [*COMMANDS, up_command, coordinator_command, exporter_command]:
    cli.add_command(command)


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.UsageError as exc:
        if "--json" in sys.argv:
            click.echo(json.dumps({"error": "usage", "message": exc.format_message()}))
        else:
            exc.show()
        sys.exit(2)
    except click.ClickException as exc:
        exc.show()
        sys.exit(1)
    except click.Abort:
        sys.exit(130)
    sys.exit(0)
