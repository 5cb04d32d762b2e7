"""NVIDIA cards: what the driver says of a GPU in procfs (its UUID and device minor, read as
files), and one ``nvidia-smi`` query for all cards, shared by every check within a period.

The query is the one process a health check of this plugin runs: only where ``nvidia-smi``
is installed and a card's driver is ``nvidia``, with a timeout, and never in discovery.
"""
from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from device_loop.plugin import find_program, last_lines, run

from .sysfs import TABLE_LIMIT, read_text

DRIVER = "nvidia"
#: What is asked, in this order: cheap fields every driver since long knows (an unknown field
#: fails the whole query).
FIELDS = ("pci.bus_id", "uuid", "temperature.gpu", "ecc.errors.uncorrected.volatile.total")
#: One answer serves every check within this many seconds: the checks of one scan share a
#: query, while a re-check 1-2 s later (docs/architecture.md, "Health that heals") asks again.
TTL_S = 1.0
TIMEOUT_S = 3.0  # below the exporter's hook deadline, so a hung driver is a reason, not a timeout
MAX_ROWS = 64
#: What nvidia-smi writes in a field of a GPU the driver lost.
LOST = ("[gpu requires reset]", "[unknown error]", "[gpu is lost]", "[no permission]")
UUID = re.compile(r"GPU-[0-9a-fA-F-]{8,60}")


@dataclass(frozen=True)
class GpuInformation:
    """What ``/proc/driver/nvidia/gpus/ADDRESS/information`` says of a GPU."""

    uuid: str | None
    minor: int | None


def gpu_information(proc_root: Path, address: str) -> GpuInformation:
    """The UUID and device minor the nvidia driver gives the GPU at ``address`` (read from
    procfs; both None where the driver is not loaded)."""
    text = read_text(proc_root / "driver" / "nvidia" / "gpus" / address / "information", TABLE_LIMIT)
    uuid = minor = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        value = value.strip()
        if key.strip() == "GPU UUID" and UUID.fullmatch(value):
            uuid = value
        elif key.strip() == "Device Minor" and value.isdigit() and int(value) < 256:
            minor = int(value)
    return GpuInformation(uuid, minor)


@dataclass(frozen=True)
class SmiRow:
    """One GPU as nvidia-smi answered: its fields by name (``FIELDS``), as written."""

    address: str
    fields: dict[str, str]

    def lost(self) -> str | None:
        """The field that says the driver lost the GPU, in words; None if none does."""
        for name, value in self.fields.items():
            if value.lower() in LOST:
                return f"nvidia-smi: {name} is {value}"
        return None

    def number(self, name: str) -> int | None:
        """The field ``name`` as a whole number, None when it is not one (``[N/A]``)."""
        value = self.fields.get(name, "")
        return int(value) if value.isdigit() and len(value) < 12 else None


def bus_address(bus_id: str) -> str | None:
    """nvidia-smi's bus id (``00000000:01:00.0``) as sysfs writes the address (``0000:01:00.0``)."""
    match = re.fullmatch(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-1][0-9a-fA-F])\.([0-7])", bus_id.strip())
    if not match:
        return None
    domain = int(match.group(1), 16)
    return f"{domain:04x}:{match.group(2).lower()}:{match.group(3).lower()}.{match.group(4)}" if domain < 0x10000 \
        else None


def parse(output: str) -> dict[str, SmiRow]:
    """The rows of ``--format=csv,noheader,nounits`` by address (rows that are not one left out)."""
    rows = {}
    for line in output.splitlines()[:MAX_ROWS]:
        values = [v.strip()[:64] for v in line.split(",")]
        if len(values) != len(FIELDS):
            continue
        address = bus_address(values[0])
        if address is not None:
            rows[address] = SmiRow(address, dict(zip(FIELDS, values)))
    return rows


@dataclass(frozen=True)
class SmiAnswer:
    """One query's answer: the GPUs it listed, or why there was none (``problem``)."""

    rows: dict[str, SmiRow]
    problem: str | None = None


class NvidiaSmi:
    """The shared query: ``answer()`` runs nvidia-smi at most once per ``TTL_S``, whoever
    asks (checks run in several threads at once: one runs it, the others wait for its answer)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.calls = 0
        self._lock = threading.Lock()
        self._answer: SmiAnswer | None = None
        self._at = 0.0

    @staticmethod
    def program() -> str | None:
        """nvidia-smi's path, None where it is not installed."""
        return find_program("nvidia-smi")

    def answer(self) -> SmiAnswer | None:
        """The GPUs nvidia-smi lists now (or within ``TTL_S``); None where it is not installed."""
        with self._lock:
            if self._answer is not None and self.clock() - self._at < TTL_S:
                return self._answer
            program = self.program()
            if program is None:
                return None
            self.calls += 1
            code, output = run([program, f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits"],
                               timeout=TIMEOUT_S)
            if code != 0:
                problem = last_lines(output) or f"exit code {code}"
                self._answer = SmiAnswer({}, f"nvidia-smi failed: {problem}")
            else:
                self._answer = SmiAnswer(parse(output))
            self._at = self.clock()
            return self._answer
