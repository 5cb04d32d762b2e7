"""``device-loop cdi DEVICE|LEASE [--output FILE]``: a leased device's CDI spec, and the name
``podman run --device`` takes for it (docs/architecture.md, "Containers and CDI")."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from device_loop.client.http import CoordinatorError
from device_loop.client.lab import Lab
from device_loop.core.errors import ErrorCode

from .commands import _my_lease, json_option, lab_command
from .output import emit

if TYPE_CHECKING:
    from device_loop.core.answers import CdiAnswer


def _how(answer: CdiAnswer) -> str:
    """How to use it, in words."""
    where = f" on {answer['host']}" if answer["host"] else ""
    lines = [f"the exporter{where} keeps it as {answer['file']} in its CDI folder (/var/run/cdi unless configured);",
             f"there: podman run --device {answer['device_name']} ..."]
    if answer["note"]:
        lines.append(f"note: {answer['note']}")
    return "\n".join(lines)


@click.command("cdi")
@click.argument("target", metavar="DEVICE|LEASE")
@click.option("--output", "-o", "output", type=click.Path(dir_okay=False, path_type=Path),
              help="write the spec to this file instead of printing it")
@json_option
@lab_command
def cdi_command(lab: Lab, target: str, output: Path | None, as_json: bool):
    """The CDI spec of a device you hold, which its exporter wrote for the lease: on that host,
    `podman run --device device-loop.dev/CLASS=DEVICE` gets the device's nodes, mounts and
    variables. The spec goes to standard output (or FILE), how to use it to standard error."""
    lease = _my_lease(lab, target)
    answer = lease.cdi()
    if as_json:
        emit(True, answer, str)
        return
    text = json.dumps(answer["spec"], indent=2) + "\n"
    if output is None:
        click.echo(text, nl=False)
        click.echo(_how(answer), err=True)
        return
    try:
        output.write_text(text)
    except OSError as exc:
        raise CoordinatorError(ErrorCode.CANNOT_WRITE, f"cannot write {output}: {exc.strerror}") from None
    click.echo(f"wrote {output} (cdiVersion {answer['cdi_version']})\n{_how(answer)}")
