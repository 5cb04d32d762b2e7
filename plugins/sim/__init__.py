"""Simulated boards: a UART on a pty with a scripted console, for demos and tests.

Config: ``[[devices]]`` with ``plugin = "sim"``, ``name``, and optionally ``class``,
``tags`` and ``baud``. The board powers on when the exporter starts
and off when it stops; its UART is served as a raw TCP endpoint by
the serial bridge (``start_bridge``), as a thread of the exporter (the boards live there too).
"""
import os

from pydantic import Field

from device_loop.plugin import Health, PluginConfig, hookimpl, start_bridge

from .board import SimBoard


class SimConfig(PluginConfig):
    """A simulated board's entry."""

    baud: int = Field(default=115200, gt=0, description="the speed its console says it runs at")


class SimPlugin:
    """The boards of one exporter (a plugin object: each exporter that loads it has its own)."""

    def __init__(self):
        self.boards: dict[str, SimBoard] = {}

    @hookimpl
    def devloop_config_model(self):
        return SimConfig

    @hookimpl
    def devloop_available(self, host):
        return None

    @hookimpl
    def devloop_startup(self, host):
        for entry in host.entries:
            if entry.device not in self.boards:
                self.boards[entry.device] = SimBoard(entry.device, host.state_dir / "sim" / entry.device)

    @hookimpl
    def devloop_shutdown(self, host):
        while self.boards:
            self.boards.popitem()[1].power_off()

    @hookimpl
    def devloop_discover(self, host):
        return [entry.resource("uart", f"sim:{host.name}:{entry.device}", node=self.boards[entry.device].node)
                for entry in host.entries if entry.device in self.boards]

    @hookimpl
    def devloop_health(self, resource):
        if resource.node and os.path.exists(resource.node):
            return Health("ok")
        return Health("failed", f"console {resource.node} is gone")

    @hookimpl
    def devloop_start(self, host, resource, lease):
        self.boards[resource.device].fresh_line()  # a lease starts: not glued to what the last holder typed
        return start_bridge(host, resource, lease, resource.node, resource.config.baud,
                            in_thread=True)
