"""Simulated boards: a UART on a pty with a scripted console, for demos and tests.

Config: ``[[devices]]`` with ``plugin = "sim"``, ``name``, and optionally ``class``,
``tags`` and ``baud``. The board powers on when the exporter starts
and off when it stops; its UART is served as a raw TCP endpoint by
the serial bridge (``start_bridge``), as a thread of the exporter (the boards live there too).
"""
import os

from device_loop.plugin import Health, hookimpl, start_bridge

from .board import SimBoard

_boards: dict[tuple[str, str], SimBoard] = {}


@hookimpl
def devloop_available(host):
    return None


@hookimpl
def devloop_startup(host):
    for entry in host.configured("sim"):
        key = (host.name, entry.device)
        if key not in _boards:
            _boards[key] = SimBoard(entry.device, host.state_dir / "sim" / entry.device)


@hookimpl
def devloop_shutdown(host):
    for key in [k for k in _boards if k[0] == host.name]:
        _boards.pop(key).power_off()


@hookimpl
def devloop_discover(host):
    resources = []
    for entry in host.configured("sim"):
        board = _boards.get((host.name, entry.device))
        if board is not None:
            resources.append(entry.resource("uart", f"sim:{host.name}:{entry.device}", node=board.node))
    return resources


@hookimpl
def devloop_health(resource):
    if resource.node and os.path.exists(resource.node):
        return Health("ok")
    return Health("failed", f"console {resource.node} is gone")


@hookimpl
def devloop_start(host, resource, lease):
    return start_bridge(host, resource, lease, resource.node, int(resource.config.get("baud", 115200)), in_thread=True)
