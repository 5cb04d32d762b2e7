"""``device-loop forward``: local ports for a lease's gated endpoints, so unmodified
tools (nc, telnet, adb -H -P, a VNC viewer) connect to localhost."""
from __future__ import annotations

import asyncio
import json
import socket

import click

from device_loop.core import LIVE_LEASE_STATES
from device_loop.core.gate import serve_forward

from .commands import _my_lease, json_option, lab_command
from .lab import Lab
from .output import fail


def _hint(local: dict) -> str:
    where = f"127.0.0.1:{local['port']}"
    if local["kind"] == "adb":
        serial = (local.get("params") or {}).get("serial", "")
        return f"adb -H 127.0.0.1 -P {local['port']} -s {serial} devices"
    if local.get("protocol") == "rfc2217":
        return f"pyserial: rfc2217://{where}?ign_set_control"
    return f"nc 127.0.0.1 {local['port']}"


async def _forward_until_the_lease_ends(pairs, lease) -> dict:
    """Serve every local port until the lease ends; the lease as it ended."""
    forwarding = asyncio.gather(*(serve_forward(listener, e["host"], e["port"], secret)
                                  for listener, e, secret in pairs))
    while True:
        watching = asyncio.create_task(asyncio.to_thread(lease.api.get, f"/leases/{lease.id}", wait=30,
                                                         unless="active"))
        done, _ = await asyncio.wait([forwarding, watching], return_when=asyncio.FIRST_COMPLETED)
        if forwarding in done:
            watching.cancel()
            return forwarding.result()
        ended = watching.result()
        if ended["state"] not in LIVE_LEASE_STATES:
            forwarding.cancel()
            return ended


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
    secret = lease.data.get("secret")
    if not secret:
        click.echo(json.dumps(lease.endpoints) if as_json else
                   "this lab does not gate endpoints: connect to them directly:\n" +
                   "\n".join(f"  {e['kind']:<6} {e['host']}:{e['port']}" for e in lease.endpoints))
        return
    pairs = [(socket.create_server(("127.0.0.1", 0)), e, secret) for e in lease.endpoints]
    local = [{**e, "host": "127.0.0.1", "port": listener.getsockname()[1]} for listener, e, _ in pairs]
    if as_json:
        click.echo(json.dumps(local), nl=True)
    else:
        click.echo(f"forwarding {lease.data['device']} ({lease.id}) until Ctrl-C:")
        for entry in local:
            click.echo(f"  {entry['kind']:<6} 127.0.0.1:{entry['port']:<6} {_hint(entry)}")
    click.get_text_stream("stdout").flush()
    try:
        ended = asyncio.run(_forward_until_the_lease_ends(pairs, lease))
    except KeyboardInterrupt:
        return
    fail(as_json, "lease_ended", f"lease {lease.id} is {ended['state']} ({ended['reason']}): forwarding stopped")
