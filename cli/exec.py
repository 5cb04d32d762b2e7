"""``device-loop exec`` and ``device-loop fingerprint``: a command run on your leased device,
and what a reviewer needs to judge a number measured there (docs/architecture.md, "Running a
command on a device"). Both run from this machine, straight to the lease's endpoints.

``exec`` starts for every command a job runs, so it loads no more than it needs: the
fingerprint's models (pydantic) only for ``fingerprint``.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from typing import NoReturn

import click

from device_loop.core.command_outcome import TIMEOUT_STATUS
from device_loop.core.device_exec import LAB_EXEC_ERRORS, ExecError
from device_loop.core.durations import parse_duration
from device_loop.core.usage import LEASE_ANSWER_ENV

from .commands import _my_lease, json_option, lab_command
from device_loop.client.lab import Lab, Lease
from device_loop.core.errors import ErrorCode
from device_loop.core.vocabulary import LAB_FAILURE_STATUS
from .output import fail


def _refused(as_json: bool, exc: ExecError) -> NoReturn:
    """The command could not run: the lab's failure (exit 75) or the caller's (1). The words
    stay the refusal's own (a device its holder switched off says how to switch it on)."""
    fail(as_json, exc.code, exc.message, LAB_FAILURE_STATUS if exc.code in LAB_EXEC_ERRORS else 1)


def _seconds(ctx, param, value):
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


identity_option = click.option(
    "--identity", "identity", metavar="FILE", envvar="DEVICE_LOOP_SSH_IDENTITY",
    type=click.Path(exists=True, dir_okay=False),
    help="the ssh key for a device reached over ssh (or DEVICE_LOOP_SSH_IDENTITY; else ssh's own keys and agent)")


def _lease_of_this_job(lab: Lab, target: str) -> Lease | None:
    """The lease a job's worker gave this command (``LEASE_ANSWER_ENV``), when it is the one
    asked for: no coordinator round trip, and no token needed."""
    given = os.environ.get(LEASE_ANSWER_ENV)
    if not given:
        return None
    try:
        data = json.loads(given)
    except ValueError:
        return None
    if not isinstance(data, dict) or target not in (data.get("id"), data.get("device")) or not data.get("ready"):
        return None
    return Lease(lab.api, data)  # type: ignore[arg-type]  # (the lease's answer, as `device-loop env` wrote it)


def shell_line(words: tuple[str, ...]) -> str:
    """The shell line ``exec`` runs for its arguments: one argument is a shell line already;
    several are quoted, each reaching the command as it was given."""
    if len(words) == 1:
        return words[0]
    return shlex.join(words)


@click.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("target", metavar="DEVICE|LEASE")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--timeout", "timeout_s", default="60s", callback=_seconds, metavar="DURATION",
              help="how long the command may run (60s); then it is interrupted and the exit status is 124")
@identity_option
@json_option
@lab_command
def exec_command(lab: Lab, target: str, command: tuple[str, ...], timeout_s: float, identity: str | None,
                 as_json: bool):
    """Run a command on your leased device: device-loop exec DEVICE -- uname -a

    It goes through the device's own channel (adb shell, ssh, else its UART console: there
    stderr comes with stdout). Several arguments are each passed as given, as docker exec
    does (exec DEV -- sh -c 'echo hi; exit 3'); one argument is a shell line (exec DEV --
    'cd /data && ls | wc -l'). Prints what it printed and exits with its status; 124 when it
    outlived --timeout, 75 when the lab failed it (no channel, no prompt, unreachable,
    switched off).
    """
    lease = _lease_of_this_job(lab, target) or _my_lease(lab, target)
    words = command[1:] if command[:1] == ("--",) else command
    try:
        result = lease.exec(shell_line(words), timeout_s, identity_file=identity)
    except ExecError as exc:
        if exc.code == ErrorCode.TIMEOUT:
            if as_json:
                click.echo(json.dumps({"error": exc.code, "message": exc.message, "stdout": exc.output}))
            else:
                sys.stdout.write(exc.output)
                click.echo(f"device-loop: {exc.message}", err=True)
            sys.exit(TIMEOUT_STATUS)
        _refused(as_json, exc)
    if as_json:
        click.echo(json.dumps({"stdout": result.stdout, "stderr": result.stderr, "status": result.status,
                               "channel": result.channel, "elapsed_s": result.elapsed_s,
                               "truncated": result.truncated}))
    else:
        sys.stdout.write(result.stdout)
        sys.stdout.flush()
        sys.stderr.write(result.stderr)
    sys.exit(result.status)


@click.command("fingerprint")
@click.argument("target", metavar="DEVICE|LEASE")
@identity_option
@json_option
@lab_command
def fingerprint_command(lab: Lab, target: str, identity: str | None, as_json: bool):
    """What a reviewer needs to judge a number measured on your leased device: kernel, CPU
    model and ISA features, cores, cpufreq, thermal zones, memory, OS build, the image last
    flashed, its host and the device-loop version."""
    lease = _my_lease(lab, target)
    try:
        found = lease.fingerprint(identity_file=identity)
    except ExecError as exc:
        _refused(as_json, exc)
    data = found.model_dump(mode="json", by_alias=True)
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(fingerprint_text(data))


def fingerprint_text(data: dict) -> str:
    """A fingerprint for people: one fact a line, empty ones left out."""
    lines = [f"{data['device']} ({data.get('class') or 'no class'}) on {data.get('host') or '?'}, "
             f"reached over {data.get('channel') or '?'}"]
    facts = [("kernel", data.get("kernel")), ("cpu", data.get("cpu_model")),
             ("isa", " ".join(data.get("isa") or [])), ("cores", data.get("cores")),
             ("online", data.get("online")), ("memory", f"{data['memory_kb']} kB" if data.get("memory_kb") else ""),
             ("os build", data.get("os_build")),
             ("image", f"{data['image']} (sha256:{data.get('image_sha256') or '?'})" if data.get("image") else ""),
             ("device-loop", data.get("device_loop_version"))]
    facts += [(policy.get("policy", "cpufreq"), ", ".join(f"{k} {v}" for k, v in policy.items() if k != "policy"))
              for policy in data.get("cpufreq") or []]
    facts += [(f"thermal {zone}", f"{celsius:.1f} °C") for zone, celsius in (data.get("thermal") or {}).items()]
    facts += [(key, value) for key, value in (data.get("extra") or {}).items()]
    from device_loop.core.ab.jobs import Fingerprint  # (as the fingerprint command has it loaded already)

    shown = Fingerprint.model_validate(data)
    facts.append(("fidelity", shown.timing_note or shown.what))
    width = max(len(name) for name, _ in facts)
    lines += [f"  {name:<{width}}  {value}" for name, value in facts if value not in (None, "")]
    return "\n".join(lines)
