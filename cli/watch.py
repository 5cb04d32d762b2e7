"""``device-loop watch``: one line per device change, from the coordinator's event stream."""
from __future__ import annotations

import json
import time
from datetime import datetime

import click
import httpx2

from device_loop.core import API_PREFIX, EVENTS_KEEPALIVE_S

from .commands import lab_command
from device_loop.client.http import CoordinatorError
from device_loop.client.lab import Lab
from device_loop.core.errors import ErrorCode

RECONNECT_S = 1.0
KEEPALIVE_GRACE_S = 3 * EVENTS_KEEPALIVE_S  # silent that long: the stream is gone


def changes(lab: Lab, connected=lambda devices: None):
    """(previous state or None, device) for each device change, for ever (``connected``
    is told the devices at each connection). A stream that breaks is opened again, and what
    changed meanwhile is told from its new snapshot."""
    known: dict[str, dict] = {}
    broken = False
    while True:
        try:
            with lab.api.http.sse(f"{API_PREFIX}/events", max_event_size=None,
                                  timeout=httpx2.Timeout(15.0, read=KEEPALIVE_GRACE_S)) as source:
                if source.response.status_code != 200:
                    error = json.loads(source.response.read() or b"{}")
                    raise CoordinatorError(error.get("error", "error"), error.get("message", "no event stream"),
                                           source.response.status_code)
                broken = False
                for event in source:
                    again = bool(known)  # a snapshot after a break: what changed meanwhile is news
                    if event.event == "snapshot":  # (JSON objects: as event.json(), typed)
                        devices: list[dict] = json.loads(event.data)
                        connected(devices)
                    elif event.event == "device":
                        devices = [json.loads(event.data)]
                    else:
                        continue  # the reconnection delay the stream starts with
                    for device in devices:
                        before = known.get(device["name"])
                        known[device["name"]] = device
                        if event.event == "device" or again and (before is None or _moved(before, device)):
                            yield (before or {}).get("state"), device
        except httpx2.TransportError as exc:
            if not known:
                raise CoordinatorError(ErrorCode.UNREACHABLE, f"cannot reach the coordinator at {lab.api.url}: "
                                                              f"{exc}") from None
        if not broken:
            click.echo("device-loop: the coordinator's event stream broke; reconnecting", err=True)
            broken = True
        time.sleep(RECONNECT_S)


def _moved(before: dict, after: dict) -> bool:
    return (before["state"], before["holder"]) != (after["state"], after["holder"])


def line(previous: str | None, device: dict) -> str:
    """``12:04:05  sim-board-0  idle -> allocating  alice``."""
    state = device["state"] if previous in (None, device["state"]) else f"{previous} -> {device['state']}"
    return f"{datetime.now():%H:%M:%S}  {device['name']}  {state}  {device['holder'] or '-'}"


@click.command("watch")
@click.option("--json", "as_json", is_flag=True,
              help="one JSON object a line: at, device, from, to, holder, expires_at")
@lab_command
def watch_command(lab: Lab, as_json: bool):
    """Print each device change as it happens (state, holder), until Ctrl-C."""
    def connected(devices: list[dict]) -> None:
        click.echo(f"device-loop: watching {len(devices)} devices (Ctrl-C stops)", err=True)

    try:
        for previous, device in changes(lab, connected):
            if as_json:
                click.echo(json.dumps({"at": datetime.now().astimezone().isoformat(timespec="seconds"),
                                       "device": device["name"], "from": previous, "to": device["state"],
                                       "holder": device["holder"], "expires_at": device["expires_at"]}))
            else:
                click.echo(line(previous, device))
    except KeyboardInterrupt:
        pass
