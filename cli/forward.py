"""``device-loop forward``: local ports for a lease's gated endpoints, so unmodified
tools (nc, telnet, adb -H -P, a VNC viewer, a browser) connect to localhost."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any
import json
import sys
import urllib.parse

import click

from device_loop.core import LIVE_LEASE_STATES
from device_loop.core.gate import LocalForward
from device_loop.core.usage import gated
from device_loop.core.vocabulary import EndpointRole

from .commands import _my_lease, json_option, lab_command
from device_loop.client.lab import Lab
from device_loop.core.errors import ErrorCode
from .output import fail

WATCH_S = 30  # each long-poll of the lease; Ctrl-C interrupts it at once (it runs in the main thread)


def local_url(url: str, port: int, secret: str) -> str:
    """A gated HTTP endpoint's URL through its local port: the local port spoke the gate's
    handshake already, so the capability (``<secret>/``, in the path and in noVNC's
    websocket path) comes out."""
    parts = urllib.parse.urlsplit(url.replace(f"{secret}/", "").replace(f"{secret}%2F", ""))
    return urllib.parse.urlunsplit(("http", f"127.0.0.1:{port}", parts.path, parts.query, parts.fragment))


def _address(endpoint: Mapping[str, Any]) -> str:
    """Where to point a tool: an HTTP endpoint's URL, else HOST:PORT."""
    return endpoint.get("url") or f"{endpoint['host']}:{endpoint['port']}"


def _hint(local: dict) -> str:
    where = f"127.0.0.1:{local['port']}"
    if local.get("role") == EndpointRole.ADB:
        serial = (local.get("params") or {}).get("serial", "")
        return f"adb -H 127.0.0.1 -P {local['port']} -s {serial} devices"
    if local.get("protocol") == "rfc2217":
        return f"pyserial: rfc2217://{where}?ign_set_control"
    if local.get("protocol") == "http":
        return f"a browser: {_address(local)}"
    return f"nc 127.0.0.1 {local['port']}"


def _until_the_lease_ends(lease) -> dict:
    """Watch the lease (long-polls) until it is no longer live; the lease as it ended."""
    while True:
        now = lease.api.get(f"/leases/{lease.id}", wait=WATCH_S, unless="active")
        if now["state"] not in LIVE_LEASE_STATES:
            return now


@click.command("forward")
@click.argument("target", metavar="LEASE|DEVICE")
@json_option
@lab_command
def forward_command(lab: Lab, target: str, as_json: bool):
    """Local ports that pass your lease's gate; runs until Ctrl-C, or until the lease ends
    (exit status 1)."""
    lease = _my_lease(lab, target)
    if not lease.data["ready"]:
        lease.wait_ready(60)
    if not gated(lease.data):
        click.echo(json.dumps(lease.endpoints) if as_json else
                   "this lab does not gate endpoints: connect to them directly:\n" +
                   "\n".join(f"  {e['kind']:<8} {_address(e)}" for e in lease.endpoints))
        return
    forwards: list[LocalForward] = []  # each serves its port from a thread of its own
    try:
        secrets = [(e, secret) for e in lease.endpoints if (secret := e.get("secret"))]
        forwards += [LocalForward(e, secret) for e, secret in secrets]
        local = [{**f.endpoint, "url": local_url(f.endpoint["url"], f.endpoint["port"], secret)
                  if f.endpoint.get("url") else None} for f, (_, secret) in zip(forwards, secrets)]
        if as_json:
            click.echo(json.dumps(local), nl=True)
        else:
            click.echo(f"forwarding {lease.data['device']} ({lease.id}) until Ctrl-C:")
            for entry in local:
                click.echo(f"  {entry['kind']:<8} 127.0.0.1:{entry['port']:<6} {_hint(entry)}")
        sys.stdout.flush()  # (click.get_text_stream is deprecated since click 8.5; it gave sys.stdout here)
        ended = _until_the_lease_ends(lease)
    except KeyboardInterrupt:
        return  # how it is meant to stop: quietly, its ports closed below
    finally:
        for forward in forwards:
            forward.close()
    fail(as_json, ErrorCode.LEASE_ENDED, f"lease {lease.id} is {ended['state']} ({ended['reason']}): forwarding "
                                         f"stopped")
