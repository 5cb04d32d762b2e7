"""``device-loop forward``: local ports for a lease's gated endpoints, so unmodified
tools (nc, telnet, adb -H -P, a VNC viewer) connect to localhost."""
from __future__ import annotations

import asyncio
import json
import socket

import click

from device_loop.core.gate import serve_forward

from .commands import _my_lease, json_option, lab_command
from .lab import Lab


def _hint(local: dict) -> str:
    where = f"127.0.0.1:{local['port']}"
    if local["kind"] == "adb":
        serial = (local.get("params") or {}).get("serial", "")
        return f"adb -H 127.0.0.1 -P {local['port']} -s {serial} devices"
    if local.get("protocol") == "rfc2217":
        return f"pyserial: rfc2217://{where}?ign_set_control"
    return f"nc 127.0.0.1 {local['port']}"


async def _forward_all(pairs) -> None:
    await asyncio.gather(*(serve_forward(listener, e["host"], e["port"], secret) for listener, e, secret in pairs))


@click.command("forward")
@click.argument("target", metavar="LEASE|DEVICE")
@json_option
@lab_command
def forward_command(lab: Lab, target: str, as_json: bool):
    """Local ports that pass your lease's gate; runs until Ctrl-C."""
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
        asyncio.run(_forward_all(pairs))
    except KeyboardInterrupt:
        pass
