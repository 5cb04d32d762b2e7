"""``device-loop vnc``: a leased device's screen, in a browser or a VNC viewer."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any
import click

from device_loop.core.usage import by_role, out_of_scope, screen_url
from device_loop.core.vocabulary import EndpointRole

from .commands import _my_lease, json_option, lab_command
from device_loop.client.http import CoordinatorError
from device_loop.client.lab import Lab, require_ready
from device_loop.core.errors import ErrorCode
from .output import emit


def screen(lease: Mapping[str, Any]) -> dict:
    """The browser viewer's URL and how to point a VNC viewer at a ready lease's screen."""
    require_ready(lease)
    screens = by_role(lease, EndpointRole.RFB)
    if not screens and (withheld := out_of_scope(lease, "screen", "screen")):
        raise CoordinatorError(ErrorCode.OUT_OF_SCOPE, withheld)
    if not screens:
        kinds = ", ".join(sorted({e["kind"] for e in lease["endpoints"]})) or "none"
        raise CoordinatorError(ErrorCode.NO_SCREEN, f"{lease['device']} has no VNC screen (its endpoints: {kinds})")
    rfb = screens[0]
    viewer = (f"device-loop forward {lease['id']}   # then: vncviewer 127.0.0.1::PORT (the vnc port it prints)"
              if rfb.get("secret") else f"vncviewer {rfb['host']}::{rfb['port']}")
    return {"browser": screen_url(lease), "vncviewer": viewer}


@click.command("vnc")
@click.argument("target", metavar="DEVICE|LEASE")
@json_option
@lab_command
def vnc_command(lab: Lab, target: str, as_json: bool):
    """The screen of a device you hold: a URL that shows it in a browser, and a vncviewer command."""
    emit(as_json, screen(_my_lease(lab, target).data),
         lambda s: f"{s['browser']}\n  or: {s['vncviewer']}" if s["browser"] else s["vncviewer"])
