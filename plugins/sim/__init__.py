"""Simulated boards: a UART on a pty with a scripted console, for demos and tests.

Config: ``[[devices]]`` with ``plugin = "sim"``, ``name``, and optionally ``class``,
``tags``, ``baud``, ``ambient`` (the room's temperature, default 40 °C) and ``tau`` (how
fast the board cools toward it, default 17s). The board powers on when the exporter starts
and off when it stops; its UART is served as a raw TCP endpoint by the serial bridge
(``start_bridge``), as a thread of the exporter (the boards live there too). Its
temperature (one zone, ``cpu``: ``devloop_thermal``) rises with the work its console does,
most with ``stress`` (``board.py``, ``thermal.py``), which a cooldown step waits out.
"""
import os
import re

from pydantic import Field, field_validator

from device_loop.plugin import Duration, Health, PluginConfig, hookimpl, start_bridge

from .board import SimBoard
from .thermal import DEFAULT_AMBIENT_C, DEFAULT_TAU_S, Thermal

_DEGREES = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(?:°\s*)?[Cc]?\s*$")


class SimConfig(PluginConfig):
    """A simulated board's entry."""

    baud: int = Field(default=115200, gt=0, description="the speed its console says it runs at")
    ambient: float = Field(default=DEFAULT_AMBIENT_C, description="the temperature it cools toward (°C)")
    tau: Duration = Field(default=DEFAULT_TAU_S, description="its cooling's time constant (seconds, or 30s, 1m)")

    @field_validator("ambient", mode="before")
    @classmethod
    def _degrees(cls, value):
        match = _DEGREES.match(value) if isinstance(value, str) else None
        if match:
            return float(match.group(1))
        if isinstance(value, (int, float)) and not isinstance(value, bool) and -50 <= value <= 150:
            return float(value)
        raise ValueError(f"ambient must be a temperature (40, 40.5, \"40C\" or \"40 °C\"), not {value!r}")


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
                thermal = Thermal(entry.config.ambient, entry.config.tau)
                self.boards[entry.device] = SimBoard(entry.device, host.state_dir / "sim" / entry.device, thermal)

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
    def devloop_thermal(self, resource):
        board = self.boards.get(resource.device)
        return {"cpu": round(board.thermal.read(), 2)} if board is not None else None

    @hookimpl
    def devloop_start(self, host, resource, lease):
        self.boards[resource.device].fresh_line()  # a lease starts: not glued to what the last holder typed
        return start_bridge(host, resource, lease, resource.node, resource.config.baud,
                            in_thread=True)
