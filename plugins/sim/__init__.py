"""Simulated boards: a UART on a pty with a small shell on its console, for demos and tests.

Config: ``[[devices]]`` with ``plugin = "sim"``, ``name``, and optionally ``class``,
``tags``, ``baud``, ``ambient`` (the room's temperature, default 40 °C) and ``tau`` (how
fast the board cools toward it, default 17s); what the board is, as its shell shows it
(``facts.py``): ``arch`` (riscv64, aarch64 or x86_64), ``cpu_model``, ``cpu_part`` (aarch64),
``isa`` (its features, e.g. ``["i", "m", "a", "f", "d", "c", "v"]`` or ``["fp", "asimd",
"sve2"]``), ``cores``, ``memory_mb``, ``governor``, ``min_mhz``, ``max_mhz``; and how its
``run-workload`` behaves (``workload.py``): ``workload_s``, ``work_heat`` (°C a second of
work), ``throttle_above`` (°C), ``throttle_per_c``, ``noise``, ``seed``; and ``power_switch``,
the path of its power switch file (default ``STATE_DIR/sim/NAME.power``).

The board powers on when the exporter starts and off when it stops, and in between follows
its switch (``board.py``): ``off`` as the file's first word powers it off (its UART's pty
hangs up and goes away), ``on`` powers it on again (a new pty, the boot banner); the board
says what it is in ``SWITCH.state`` (``on`` or ``off``). Whatever writes the switch is its
power supply: the ``sim`` power backend, or a pdudaemon whose ``localcmdline`` driver writes
the file. Its resource's ``node`` is a stable link to the pty of the moment
(``STATE_DIR/sim/NAME``, as ``/dev/serial/by-id`` names a USB adapter), present while the board
is on. A board switched off is ``degraded`` (off on purpose is not a fault); one whose
console hung (``hang`` on its shell: a kernel panic) ``failed``, until a power cycle. Its
health file (``STATE_DIR/sim/NAME.health``) makes its health fail and recover at run time, as
a test wants it: ``failed [transient|permanent] REASON`` or ``degraded REASON`` in it is its
health, ``ok`` or no file its own. Its UART
is served as a raw TCP endpoint by the serial bridge (``start_bridge``), as a thread of the
exporter (the boards live there too), which opens the link while a client is connected
and keeps it across power cycles: a person at the console sees the board go silent and boot
again. Its temperature (one zone, ``cpu``: ``devloop_thermal``) rises with the work its
console does, most with ``stress`` and ``run-workload`` (``board.py``, ``thermal.py``), which
a cooldown step waits out.
Its resources say the board is simulated (``Fidelity.SIMULATED``); ``devloop_fingerprint``
says what no file of the board says: its workload's seed.
A container gets the console (``devloop_environment``) as a bind mount of that link at
``/dev/device-loop/console`` (``DEVICE_LOOP_CONSOLE`` names it): a pty opens only inside devpts.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
import os
import re
import stat
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, field_validator

from pathlib import Path

from device_loop.plugin import (ContainerEnvironment, Duration, Fidelity, Health, HealthKind, HostContext, LeaseRef,
                                PluginConfig, Resource, Service, hookimpl, start_bridge, tty_environment)

from .board import SimBoard
from .facts import DEFAULT_CPU_MODEL, BoardFacts
from .thermal import (DEFAULT_AMBIENT_C, DEFAULT_TAU_S, DEFAULT_THROTTLE_ABOVE_C, DEFAULT_THROTTLE_PER_C,
                      DEFAULT_WORK_HEAT_C_PER_S, Thermal)
from .workload import DEFAULT_NOISE, DEFAULT_WORKLOAD_S, WorkloadModel

MAX_HEALTH_FILE_BYTES = 1000
_DEGREES = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(?:°\s*)?[Cc]?\s*$")
Feature = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_.+-]{0,31}$")]


def _degrees(value):
    match = _DEGREES.match(value) if isinstance(value, str) else None
    if match:
        return float(match.group(1))
    if isinstance(value, (int, float)) and not isinstance(value, bool) and -50 <= value <= 150:
        return float(value)
    raise ValueError(f"a temperature is 40, 40.5, \"40C\" or \"40 °C\", not {value!r}")


class SimConfig(PluginConfig):
    """A simulated board's entry."""

    baud: int = Field(default=115200, gt=0, description="the speed its console says it runs at")
    ambient: float = Field(default=DEFAULT_AMBIENT_C, description="the temperature it cools toward (°C)")
    tau: Duration = Field(default=DEFAULT_TAU_S, description="its cooling's time constant (seconds, or 30s, 1m)")
    arch: Literal["riscv64", "aarch64", "x86_64"] = Field(default="riscv64", description="its CPU's architecture")
    cpu_model: str | None = Field(default=None, max_length=64,
                                  description="riscv's uarch, x86's model name, arm64's Hardware line")
    cpu_part: str = Field(default="0xd0b", pattern=r"^0x[0-9a-f]{3}$",
                          description="aarch64: the core's part number (Arm's 0xd0b: Cortex-A76)")
    isa: list[Feature] | None = Field(default=None, max_length=128,
                                      description="its ISA features (riscv: single letters and extensions)")
    cores: int = Field(default=4, ge=1, le=256)
    memory_mb: int = Field(default=2048, ge=16, le=1 << 22)
    governor: str = Field(default="schedutil", pattern=r"^[a-z][a-z0-9_-]{0,31}$")
    min_mhz: int = Field(default=600, ge=1, le=100_000)
    max_mhz: int = Field(default=1800, ge=1, le=100_000)
    workload_s: Duration = Field(default=DEFAULT_WORKLOAD_S, le=3600,
                                 description="how long run-workload --cost 1 takes on a cool board")
    work_heat: float = Field(default=DEFAULT_WORK_HEAT_C_PER_S, ge=0, le=1000,
                             description="the degrees a second of run-workload puts in")
    throttle_above: float = Field(default=DEFAULT_THROTTLE_ABOVE_C,
                                  description="the temperature above which work slows down (°C)")
    throttle_per_c: float = Field(default=DEFAULT_THROTTLE_PER_C, ge=0, le=1,
                                  description="how much slower work gets per degree above it (0.02: 2 %)")
    noise: float = Field(default=DEFAULT_NOISE, ge=0, le=0.3, description="the run-to-run spread (0.01: 1 %)")
    seed: int = Field(default=0, ge=0, le=2**32 - 1, description="seeds the run-to-run spread")
    power_switch: str | None = Field(default=None, min_length=1,
                                     description="its power switch file (default: STATE_DIR/sim/NAME.power); "
                                                 "'off' or 'on' in it powers the board off or on")

    @field_validator("ambient", "throttle_above", mode="before")
    @classmethod
    def _temperature(cls, value):
        return _degrees(value)

    @field_validator("max_mhz")
    @classmethod
    def _frequencies(cls, value, info):
        if value < info.data.get("min_mhz", 0):
            raise ValueError("max_mhz must be at least min_mhz")
        return value

    def facts(self, name: str) -> BoardFacts:
        """The board's hardware, as its shell shows it."""
        return BoardFacts(name=name, arch=self.arch, cpu_part=self.cpu_part, isa=tuple(self.isa or ()),
                          cpu_model=DEFAULT_CPU_MODEL[self.arch] if self.cpu_model is None else self.cpu_model,
                          cores=self.cores, memory_mb=self.memory_mb, governor=self.governor,
                          min_mhz=self.min_mhz, max_mhz=self.max_mhz)

    def switch(self, state_dir: Path, name: str) -> Path:
        """The board's power switch file (what it is: the same path with ``.state`` appended)."""
        return Path(self.power_switch) if self.power_switch is not None else switch_path(state_dir, name)

    def workload(self) -> WorkloadModel:
        return WorkloadModel(seconds=self.workload_s, throttle_above_c=self.throttle_above,
                             throttle_per_c=self.throttle_per_c, noise=self.noise, seed=self.seed)


def switch_path(state_dir: Path, name: str) -> Path:
    """The default power switch of the board ``name`` of an exporter whose state folder is ``state_dir``."""
    return Path(state_dir) / "sim" / f"{name}.power"


def health_path(state_dir: Path, name: str) -> Path:
    """The file that makes the board ``name``'s health fail and recover at run time."""
    return Path(state_dir) / "sim" / f"{name}.health"


def injected_health(path: Path) -> Health | None:
    """The health its file says (``failed [transient|permanent] REASON``, ``degraded ...``),
    None when there is no file or it says ``ok``: the board's own health then."""
    try:  # (a FIFO or a node put there is never read: a health check must not block on it)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        words = os.read(fd, MAX_HEALTH_FILE_BYTES).decode(errors="replace").split()
    except OSError:
        return None
    finally:
        os.close(fd)
    if not words or words[0] not in ("degraded", "failed"):
        return None
    kind = HealthKind.TRANSIENT
    if len(words) > 1 and words[1] in tuple(HealthKind):
        kind = HealthKind(words.pop(1))
    return Health(words[0], " ".join(words[1:]) or "made to fail (its health file)", kind)


class SimPlugin:
    """The boards of one exporter (a plugin object: each exporter that loads it has its own)."""

    def __init__(self):
        self.boards: dict[str, SimBoard] = {}

    @hookimpl
    def devloop_config_model(self) -> type[PluginConfig] | None:
        return SimConfig

    @hookimpl
    def devloop_available(self, host: HostContext) -> str | None:
        return None

    @hookimpl
    def devloop_startup(self, host: HostContext) -> None:
        for entry in host.entries:
            if entry.device not in self.boards:
                config = entry.config
                thermal = Thermal(config.ambient, config.tau, work_heat_c_per_s=config.work_heat)
                self.boards[entry.device] = SimBoard(entry.device, host.state_dir / "sim" / entry.device, thermal,
                                                     config.facts(entry.device), config.workload(),
                                                     switch=config.switch(host.state_dir, entry.device))

    @hookimpl
    def devloop_shutdown(self, host: HostContext) -> None:
        while self.boards:
            self.boards.popitem()[1].power_off()

    @hookimpl
    def devloop_discover(self, host: HostContext) -> Sequence[Resource] | None:
        # the stable link, not the pty of the moment (a new one at each power-on): a board
        # powered off is still there, and its service keeps serving it
        return [entry.resource("uart", f"sim:{host.name}:{entry.device}", node=str(self.boards[entry.device].link),
                               fidelity=Fidelity.SIMULATED)
                for entry in host.entries if entry.device in self.boards]

    @hookimpl
    def devloop_health(self, host: HostContext, resource: Resource) -> Health | None:
        injected = injected_health(health_path(host.state_dir, resource.device))
        if injected is not None:
            return injected
        board = self.boards.get(resource.device)
        if board is not None and not board.powered:
            return Health("degraded", "powered off (its switch says off)")
        if board is not None and board.hung:
            return Health("failed", "console hung: a kernel panic, it answers nothing (power-cycle it)")
        if resource.node and os.path.exists(resource.node):
            return Health("ok")
        return Health("failed", f"console {resource.node} is gone")

    @hookimpl
    def devloop_thermal(self, resource: Resource) -> Mapping[str, float] | None:
        board = self.boards.get(resource.device)
        return {"cpu": round(board.thermal.read(), 2)} if board is not None else None

    @hookimpl
    def devloop_fingerprint(self, host: HostContext, resource: Resource) -> Mapping[str, str] | None:
        board = self.boards.get(resource.device)
        if board is None:
            return None
        return {"sim.seed": str(board.workload.model.seed),
                "sim.workload_s": f"{board.workload.model.seconds:g}"}

    @hookimpl
    def devloop_start(self, host: HostContext, resource: Resource, lease: LeaseRef) -> Service | None:
        self.boards[resource.device].fresh_line()  # a lease starts: not glued to what the last holder typed
        # (the node is the link: after a power cycle the bridge opens the new pty)
        assert resource.node is not None  # (discovery gives each board its link)
        return start_bridge(host, resource, lease, resource.node, resource.config.baud, in_thread=True)

    @hookimpl
    def devloop_environment(self, host: HostContext, resource: Resource,
                            service: Service | None) -> ContainerEnvironment | None:
        """The board's console for a container: its pty, bind-mounted through the stable
        link (the pty of the moment when the container starts); None while it is off."""
        if resource.node is None or not os.path.exists(resource.node):
            return None
        return tty_environment(resource.node)
