"""``device-loop adb`` and ``device-loop env``: the local adb against a lease's adb server."""
from __future__ import annotations

import shlex
import shutil
import subprocess
import sys

import click

from device_loop.core.gate import LocalForward
from device_loop.core.usage import by_role, environment, gated, out_of_scope
from device_loop.core.vocabulary import EndpointRole

from .commands import _my_lease, json_option, lab_command
from device_loop.client.http import CoordinatorError
from device_loop.client.lab import Lab
from device_loop.core.errors import ErrorCode
from .output import emit, fail


def adb_environment(lease, forward: bool = False) -> dict[str, str]:
    """The variables that point adb (and scrcpy, and friends) at the lease's phone. A gated
    endpoint is reached through a local port of this process if ``forward``."""
    endpoint = next(iter(by_role(lease.data, EndpointRole.ADB)), None)
    if endpoint is None and not lease.data["ready"]:
        raise CoordinatorError(ErrorCode.NOT_READY, f"{lease.data['device']} is not ready: {lease.data['reason']}")
    if endpoint is None and (withheld := out_of_scope(lease.data, "adb", "ADB")):
        raise CoordinatorError(ErrorCode.OUT_OF_SCOPE, withheld)
    if endpoint is None:
        raise CoordinatorError(ErrorCode.NO_ADB, f"{lease.data['device']} has no ADB")
    if secret := endpoint.get("secret"):
        if not forward:
            raise CoordinatorError(ErrorCode.GATED, f"this lab's endpoints ask for the lease's secret: run "
                                                    f"'device-loop forward {lease.id}' and point adb at the port it "
                                                    f"prints")
        endpoint = LocalForward(endpoint, secret).endpoint  # for as long as this process runs
    return environment(lease.data, [endpoint])


@click.command("adb", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("target", metavar="DEVICE|LEASE")
@click.argument("adb_args", nargs=-1, type=click.UNPROCESSED)
@lab_command
def adb_command(lab: Lab, target: str, adb_args: tuple[str, ...], as_json: bool):
    """Run the local adb against your lease's phone: device-loop adb DEVICE -- shell ls"""
    if not shutil.which("adb"):
        fail(as_json, ErrorCode.NO_ADB, "adb is not installed here (Debian: apt-get install adb)")
    env = adb_environment(_my_lease(lab, target), forward=True)
    if adb_args[:1] == ("--",):  # the separator is ours, not adb's
        adb_args = adb_args[1:]
    argv = ["adb", "-H", env["ANDROID_ADB_SERVER_ADDRESS"], "-P", env["ANDROID_ADB_SERVER_PORT"],
            "-s", env["ANDROID_SERIAL"], *adb_args]
    lab.api.close()
    # not exec: a gated endpoint's local port lives in this process
    sys.exit(subprocess.run(argv).returncode)


@click.command("env")
@click.argument("target", metavar="DEVICE|LEASE")
@json_option
@lab_command
def env_command(lab: Lab, target: str, as_json: bool):
    """Shell exports that point tools at your lease's endpoints: eval "$(device-loop env LEASE)" """
    lease = _my_lease(lab, target)
    if not lease.data["ready"]:
        raise CoordinatorError(ErrorCode.NOT_READY, f"{lease.data['device']} is not ready: {lease.data['reason']}")
    if gated(lease.data):
        raise CoordinatorError(ErrorCode.GATED, f"this lab's endpoints ask for the lease's secret: run "
                                                f"'device-loop forward {lease.id}' and point your tools at the ports "
                                                f"it prints")
    emit(as_json, environment(lease.data), lambda env: "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())
         or f"# {lease.data['device']}'s endpoints name no environment")
