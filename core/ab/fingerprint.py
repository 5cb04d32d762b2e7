"""A device's fingerprint and its readings at a run's start, read through ``exec``
(docs/architecture.md, "Running a command on a device" and "Jobs and evidence").

The reads are batched: each command sent is plain ``;``-separated ``echo @@KEY`` and
``cat``/``uname``/``nproc`` of fixed paths (no globbing, loops, pipes or redirections), so it
works on a POSIX sh, busybox, toybox and the simulated board's console alike; the markers cut
the output into sections. A file that is missing or unreadable yields a section holding an
error message or nothing, which the parsers read as absent. Everything read from a device is
untrusted: parsers never raise on garbage, and every value is clipped to ``core/ab/jobs.py``'s
bounds before a model is built.
"""
from __future__ import annotations

import importlib.metadata
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

from device_loop.core.ab.jobs import MAX_TEXT_CHARS, FactKey, Fingerprint, Readings
from device_loop.core.protocol import MAX_FACTS
from device_loop.core.needs import FIDELITY_DETAIL
from device_loop.core.vocabulary import NOT_FOR_TIMING, Fidelity

MAX_ZONES = 8              # thermal_zone0..7: what a board has; a phone's first few are its CPU's
MAX_POLICIES = 16          # cpufreq policies are named by their first CPU: policy0..policy(cores-1)
MAX_COMMAND = 1900         # under core/ab/jobs.py's MAX_COMMAND_CHARS, and a console's line
MAX_OUTPUT = 2_000_000     # characters of one answer parsed (a 256-CPU cpuinfo is ~400 kB)
MAX_ISA = 512
TIMEOUT_S = 20.0

_MARKER = re.compile(r"^@@([a-z0-9_.]+)$")
_WORD = re.compile(r"^[A-Za-z0-9_.:+-]{1,64}$")
_FEATURE = re.compile(r"^[a-z0-9_.+-]{1,32}$")
_INT = re.compile(r"^-?\d{1,12}$")
_ERROR = re.compile(r"not found|no such file|permission denied|cannot|can't|unknown command|inaccessible", re.I)

THERMAL = "/sys/class/thermal/thermal_zone{n}/{file}"
CPUFREQ = "/sys/devices/system/cpu/cpufreq/policy{n}/scaling_{file}"
_CPUFREQ_FILES = {"governor": "governor", "cur_khz": "cur_freq", "min_khz": "min_freq", "max_khz": "max_freq"}


class ExecLike(Protocol):
    """What an exec answers (``core/device_exec.py``'s result has these and more)."""
    @property
    def stdout(self) -> str: ...
    @property
    def status(self) -> int: ...
    @property
    def channel(self) -> str: ...


Exec = Callable[[str, float], ExecLike]


@dataclass(frozen=True)
class Read:
    """One read of a batch: the section's key and the command that fills it."""
    key: str
    command: str


def batches(reads: list[Read], limit: int = MAX_COMMAND) -> list[str]:
    """The reads as few commands as fit ``limit`` characters each, in order."""
    commands: list[str] = []
    current = ""
    for read in reads:
        part = f"echo @@{read.key}; {read.command}"
        if current and len(current) + 2 + len(part) > limit:
            commands.append(current)
            current = ""
        current = f"{current}; {part}" if current else part
    if current:
        commands.append(current)
    return commands


def sections(stdout: str) -> dict[str, str]:
    """The output of a batch cut at its ``@@KEY`` lines: KEY -> the text after it (bounded)."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for raw in stdout[:MAX_OUTPUT].splitlines():
        line = raw.rstrip("\r")
        marker = _MARKER.match(line.strip())
        if marker:
            current = found.setdefault(marker.group(1), [])
        elif current is not None:
            current.append(line)
    return {key: "\n".join(lines) for key, lines in found.items()}


def run_reads(exec: Exec, reads: list[Read], timeout_s: float = TIMEOUT_S) -> tuple[dict[str, str], str]:
    """Run ``reads`` in batches: their sections, and the channel exec went through."""
    found: dict[str, str] = {}
    channel = ""
    for command in batches(reads):
        result = exec(command, timeout_s)
        channel = channel or str(result.channel)
        found.update(sections(result.stdout if isinstance(result.stdout, str) else ""))
    return found, channel


# --- what to read -------------------------------------------------------------------------

def thermal_reads(zones: int = MAX_ZONES) -> list[Read]:
    """Each thermal zone's type and temperature."""
    return [Read(f"tz.{n}.{f}", f"cat {THERMAL.format(n=n, file=f)}") for n in range(zones) for f in ("type", "temp")]


def cpufreq_reads(policies: range, files: tuple[str, ...] = tuple(_CPUFREQ_FILES)) -> list[Read]:
    """The cpufreq ``files`` (governor, cur_khz, min_khz, max_khz) of each policy."""
    return [Read(f"cf.{n}.{f}", f"cat {CPUFREQ.format(n=n, file=_CPUFREQ_FILES[f])}") for n in policies for f in files]


IDENTITY_READS = [
    Read("uname", "uname -a"),
    Read("nproc", "nproc"),
    Read("cpuinfo", "cat /proc/cpuinfo"),
    Read("meminfo", "cat /proc/meminfo"),
    Read("online", "cat /sys/devices/system/cpu/online"),
]
LOADAVG = Read("loadavg", "cat /proc/loadavg")
OS_BUILD = Read("build", "getprop ro.build.fingerprint")


# --- parsers: text in, bounded values out, never an exception --------------------------------

def clip(text: object, limit: int) -> str:
    """``text`` as a string of at most ``limit`` characters."""
    return str(text)[:limit]


def first_line(text: str) -> str:
    """The first non-blank line, stripped and clipped, or "" when it reads as an error message."""
    for line in text[:MAX_OUTPUT].splitlines():
        line = line.strip()[:MAX_TEXT_CHARS]
        if line:
            return "" if _ERROR.search(line) else line
    return ""


def parse_int(text: str, low: int = 0, high: int = 10**12) -> int | None:
    """The integer a one-value file holds, within [low, high], else None."""
    value = first_line(text)
    if not _INT.match(value):
        return None
    number = int(value)
    return number if low <= number <= high else None


def parse_word(text: str, limit: int = 64) -> str | None:
    """A one-word file (a governor, a zone's type), else None."""
    value = first_line(text)
    return value[:limit] if _WORD.match(value) else None


def parse_celsius(text: str) -> float | None:
    """A thermal zone's ``temp``: millidegrees by the kernel's ABI (a driver that reports
    whole degrees is read as such below 200), None outside what a device can be."""
    value = parse_int(text, -300_000, 1_000_000)
    if value is None:
        return None
    celsius = value if abs(value) < 200 else value / 1000
    return round(celsius, 3) if -60 <= celsius <= 250 else None


def parse_load(text: str) -> float | None:
    """The 1-minute load average from ``/proc/loadavg``."""
    fields = first_line(text).split()
    try:
        load = float(fields[0]) if fields else math.nan
    except ValueError:
        return None
    return load if math.isfinite(load) and 0 <= load < 1e6 else None


def parse_online(text: str) -> str:
    """``/sys/devices/system/cpu/online``: a CPU list like ``0-3,6``."""
    value = first_line(text)
    return value[:200] if re.fullmatch(r"[0-9,\- ]{1,200}", value) else ""


def parse_meminfo(text: str) -> int | None:
    """MemTotal in kB."""
    match = re.search(r"^MemTotal:\s*(\d{1,15})\s*kB", text[:MAX_OUTPUT], re.M)
    return int(match.group(1)) if match else None


def parse_kernel(text: str) -> str:
    """``uname -a``'s line."""
    return clip(first_line(text), MAX_TEXT_CHARS)


def cpuinfo_blocks(text: str) -> list[dict[str, str]]:
    """``/proc/cpuinfo`` as its blocks (one per processor, and arm's trailing one), each
    ``key (lowercased) -> value``; lines without a colon are skipped."""
    blocks: list[dict[str, str]] = []
    block: dict[str, str] = {}
    for line in text[:MAX_OUTPUT].splitlines():
        if not line.strip():
            if block:
                blocks.append(block)
            block = {}
            continue
        key, colon, value = line.partition(":")
        if colon and len(key) <= 64:
            block.setdefault(key.strip().lower(), value.strip()[:MAX_TEXT_CHARS])
    if block:
        blocks.append(block)
    return blocks[:4096]


# Arm's own core designs (implementer 0x41), by part number: what an arm64 /proc/cpuinfo
# says instead of a model name.
ARM_PARTS = {
    "0xd03": "Cortex-A53", "0xd04": "Cortex-A35", "0xd05": "Cortex-A55", "0xd07": "Cortex-A57",
    "0xd08": "Cortex-A72", "0xd09": "Cortex-A73", "0xd0a": "Cortex-A75", "0xd0b": "Cortex-A76",
    "0xd0c": "Neoverse-N1", "0xd0d": "Cortex-A77", "0xd0e": "Cortex-A76AE", "0xd40": "Neoverse-V1",
    "0xd41": "Cortex-A78", "0xd44": "Cortex-X1", "0xd46": "Cortex-A510", "0xd47": "Cortex-A710",
    "0xd48": "Cortex-X2", "0xd49": "Neoverse-N2", "0xd4a": "Neoverse-E1", "0xd4b": "Cortex-A78C",
    "0xd4d": "Cortex-A715", "0xd4e": "Cortex-X3", "0xd4f": "Neoverse-V2", "0xd80": "Cortex-A520",
    "0xd81": "Cortex-A720", "0xd82": "Cortex-X4", "0xd84": "Neoverse-V3", "0xd85": "Cortex-X925",
    "0xd87": "Cortex-A725", "0xd8e": "Neoverse-N3",
}


def _counted(names: list[str]) -> str:
    """``4x Cortex-A55 + 4x Cortex-A76``, or the one name when all are the same."""
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    if len(counts) == 1:
        return next(iter(counts))
    return " + ".join(f"{n}x {name}" for name, n in counts.items())


def parse_cpu_model(blocks: list[dict[str, str]]) -> str:
    """The CPU's name: x86's (and arm32's) ``model name``, riscv's ``uarch``, arm64's cores
    by implementer and part, prefixed by the SoC's ``Hardware``/``Model`` line when there is one."""
    def values(key: str) -> list[str]:
        return [b[key] for b in blocks if b.get(key)]

    cores = values("model name") or values("uarch")
    if not cores:
        for block in blocks:
            part = block.get("cpu part", "").lower()
            if part:
                implementer = block.get("cpu implementer", "").lower()
                name = ARM_PARTS.get(part) if implementer == "0x41" else None
                cores.append(name or f"{implementer}:{part}")
    # x86's "model" is a number; a Raspberry Pi's names the board
    boards = values("hardware") or [v for v in values("model") if re.search("[A-Za-z]", v)]
    board = boards[0] if boards else ""
    model = _counted(cores) if cores else ""
    text = f"{board}: {model}" if board and model and board != model else board or model
    return clip(text, MAX_TEXT_CHARS)


def parse_riscv_isa(isa: str) -> list[str]:
    """``rv64imafdcv_zba_zbb`` -> ``i m a f d c v zba zbb`` (``g`` stands for ``imafd`` with
    ``zicsr`` and ``zifencei``; version numbers are dropped)."""
    text = isa.strip().lower()
    match = re.match(r"rv(32|64|128)([a-z0-9]*)(.*)$", text)
    if not match:
        return []
    base = re.sub(r"\d+(p\d+)?", "", match.group(2))
    letters: list[str] = []
    for letter in base:
        letters.extend(["i", "m", "a", "f", "d", "zicsr", "zifencei"] if letter == "g" else [letter])
    extensions = [re.sub(r"\d+p\d+$", "", e) for e in match.group(3).split("_") if e]
    return letters + extensions


def parse_isa(blocks: list[dict[str, str]]) -> list[str]:
    """The ISA features every processor reports: x86 ``flags``, arm ``Features``, riscv ``isa``
    (the intersection, in the first processor's order, so a heterogeneous SoC lists what all
    its cores can run), bounded and deduplicated."""
    per_cpu: list[list[str]] = []
    for block in blocks:
        if block.get("flags") or block.get("features"):
            per_cpu.append((block.get("flags") or block.get("features", "")).lower().split())
        elif block.get("isa"):
            per_cpu.append(parse_riscv_isa(block["isa"]))
    if not per_cpu:
        return []
    common = set(per_cpu[0]).intersection(*per_cpu[1:])
    seen: set[str] = set()
    features: list[str] = []
    for feature in per_cpu[0]:
        if feature in common and feature not in seen and _FEATURE.match(feature):
            seen.add(feature)
            features.append(feature)
    return features[:MAX_ISA]


_NOTABLE = re.compile(r"^(sse4_2|avx.*|fma|amx.*"                      # x86
                      r"|neon|asimd.*|sve.*|sme(\d\w*|[a-z]\d\w*|fa64)?|i8mm|bf16"  # arm (not x86's smep)
                      r"|v|zv.*|zba|zbb|zbs|zfh)$")                      # riscv


def notable_isa(isa: list[str]) -> list[str]:
    """The vector and SIMD features of an ISA list, the ones a performance claim turns on
    (x86's ``sme`` is AMD's memory encryption, not Arm's matrix extension)."""
    x86 = "sse2" in isa or "fpu" in isa
    return [f for f in isa if _NOTABLE.match(f) and not (x86 and f == "sme")]


def parse_cores(nproc: str, blocks: list[dict[str, str]]) -> int | None:
    """``nproc``, else the processors cpuinfo counts."""
    counted = sum(1 for b in blocks if "processor" in b and (b["processor"].isdigit()))
    return parse_int(nproc, 1, 1_000_000) or counted or None


def parse_thermal(found: Mapping[str, str], zones: int) -> dict[str, float]:
    """Each zone's type -> °C (a type met again is ``type#N``, one without ``zoneN``)."""
    thermal: dict[str, float] = {}
    for n in range(zones):
        celsius = parse_celsius(found.get(f"tz.{n}.temp", ""))
        if celsius is None:
            continue
        name = parse_word(found.get(f"tz.{n}.type", "")) or f"zone{n}"
        thermal[name if name not in thermal else f"{name[:58]}#{n}"] = celsius
    return dict(list(thermal.items())[:MAX_FACTS])


def parse_cpufreq(found: Mapping[str, str], policies: range) -> list[dict[str, str]]:
    """Per policy that answered: ``policy``, ``governor``, ``cur_khz``, ``min_khz``, ``max_khz``."""
    result: list[dict[str, str]] = []
    for n in policies:
        entry: dict[str, str] = {}
        governor = parse_word(found.get(f"cf.{n}.governor", ""), 64)
        if governor:
            entry["governor"] = governor
        for key in ("cur_khz", "min_khz", "max_khz"):
            khz = parse_int(found.get(f"cf.{n}.{key}", ""), 0, 10**9)
            if khz is not None:
                entry[key] = str(khz)
        if entry:
            result.append({"policy": f"policy{n}", **entry})
    return result[:64]


# --- what the coordinator says -----------------------------------------------------------------

def is_emulated(device: Mapping[str, Any]) -> bool:
    """Whether the coordinator says the device is simulated or emulated (its ``fidelity``, a
    typed fact its plugins report; never a tag or a fact's words): its numbers are not for
    timing."""
    return device.get("fidelity") in NOT_FOR_TIMING


def _fidelity(device: Mapping[str, Any]) -> Fidelity | None:
    """The device's fidelity as the coordinator says it (None: it says none it knows)."""
    said = device.get("fidelity")
    return Fidelity(str(said)) if said in Fidelity.__members__.values() else None


def _fidelity_detail(device: Mapping[str, Any]) -> str:
    """How its plugin says it is emulated or virtualised (its fact ``fidelity.detail``: ``TCG``)."""
    facts = device.get("facts") or {}
    said = facts.get(FIDELITY_DETAIL) if isinstance(facts, Mapping) else None
    return clip(plain_word(said), 64) if isinstance(said, str) else ""


def plain_word(text: str) -> str:
    """``text`` without control characters, on one line (a plugin's words, shown as they are)."""
    return " ".join("".join(c for c in text if c.isprintable()).split())


_FACT_KEY = re.compile(get_args(FactKey)[1].pattern)  # (the protocol's rule, not a copy of it)


def _extra(device: Mapping[str, Any]) -> dict[str, str]:
    facts = device.get("facts") or {}
    if not isinstance(facts, Mapping):
        return {}
    extra = {str(k): clip(v, MAX_TEXT_CHARS) for k, v in facts.items() if isinstance(k, str) and _FACT_KEY.fullmatch(k)}
    return dict(list(extra.items())[:MAX_FACTS])


def _image(device: Mapping[str, Any]) -> tuple[str, str]:
    image = device.get("image") or device.get("last_image") or {}
    if not isinstance(image, Mapping):
        return "", ""
    sha = str(image.get("sha256") or "").lower()
    return clip(image.get("name") or "", 255), sha if re.fullmatch(r"[0-9a-f]{64}", sha) else ""


def version(coordinator_version: str = "") -> str:
    """This device-loop's version, and the coordinator's when it differs."""
    try:
        mine = importlib.metadata.version("device-loop")
    except importlib.metadata.PackageNotFoundError:
        mine = "unknown"
    text = mine if not coordinator_version or coordinator_version == mine else \
        f"{mine} (coordinator {coordinator_version})"
    return clip(text, 64)


# --- the two entry points ---------------------------------------------------------------------

def gather(exec: Exec, lease: Mapping[str, Any], device: Mapping[str, Any], coordinator_version: str = "", *,
           zones: int = MAX_ZONES, timeout_s: float = TIMEOUT_S) -> Fingerprint:
    """The device's fingerprint, in two or three exec round trips (the second sized by the
    CPU count the first found) and what the coordinator says of it (``lease`` and ``device``
    are its answers; a missing key is an absent fact). An exec that raises is not caught."""
    found, channel = run_reads(exec, IDENTITY_READS + thermal_reads(zones), timeout_s)
    blocks = cpuinfo_blocks(found.get("cpuinfo", ""))
    cores = parse_cores(found.get("nproc", ""), blocks)
    policies = range(min(cores or 8, MAX_POLICIES))
    more = cpufreq_reads(policies) + ([OS_BUILD] if channel == "adb" else [])
    found.update(run_reads(exec, more, timeout_s)[0])
    image, image_sha256 = _image(device)
    found_fingerprint = Fingerprint(
        device=clip(lease.get("device") or device.get("name") or "", 64),
        host=clip(lease.get("host") or device.get("host") or "", 255),
        channel=_channel(channel),
        kernel=parse_kernel(found.get("uname", "")),
        cpu_model=parse_cpu_model(blocks),
        isa=parse_isa(blocks),
        cores=cores,
        online=parse_online(found.get("online", "")),
        cpufreq=parse_cpufreq(found, policies),
        thermal=parse_thermal(found, zones),
        memory_kb=parse_meminfo(found.get("meminfo", "")),
        os_build=clip(first_line(found.get("build", "")), MAX_TEXT_CHARS) if channel == "adb" else "",
        image=image,
        image_sha256=image_sha256,
        device_loop_version=version(coordinator_version),
        emulated=is_emulated(device),
        fidelity=_fidelity(device),
        fidelity_detail=_fidelity_detail(device),
        extra=_extra(device),
    )
    # the field's alias is "class", which a keyword cannot be: clipped above like the rest
    return found_fingerprint.model_copy(update={"device_class": clip(device.get("class") or "", 64)})


def _channel(name: str) -> Literal["adb", "ssh", "console", ""]:
    return "adb" if name == "adb" else "ssh" if name == "ssh" else "console" if name == "console" else ""


def readings_reads(zones: int = MAX_ZONES) -> list[Read]:
    """What a run's start reads: the zones, policy0's governor and frequency, the load."""
    return thermal_reads(zones) + cpufreq_reads(range(1), ("governor", "cur_khz")) + [LOADAVG]


def parse_readings(found: Mapping[str, str], zones: int = MAX_ZONES) -> Readings:
    """Readings from the sections of ``readings_reads``."""
    return Readings(
        temperatures=parse_thermal(found, zones),
        governor=parse_word(found.get("cf.0.governor", ""), 32),
        freq_khz=parse_int(found.get("cf.0.cur_khz", ""), 0, 10**9),
        load=parse_load(found.get("loadavg", "")),
    )


def readings(exec: Exec, *, zones: int = MAX_ZONES, timeout_s: float = TIMEOUT_S) -> Readings:
    """The device at a run's start, in one exec round trip."""
    return parse_readings(run_reads(exec, readings_reads(zones), timeout_s)[0], zones)


def unfit(readings: Readings, *, max_temp_c: float | None, governor: str | None) -> str | None:
    """Why the device is not fit to measure (a zone above ``max_temp_c``, a governor other
    than ``governor``), or None. A governor that could not be read is not the one asked for."""
    reasons = []
    if max_temp_c is not None:
        hot = {zone: c for zone, c in readings.temperatures.items() if c > max_temp_c}
        reasons += [f"{zone} at {c:.1f} °C, above {max_temp_c:g} °C" for zone, c in sorted(hot.items())]
    if governor is not None and readings.governor != governor:
        reasons.append(f"governor {readings.governor or 'unreadable'}, not {governor}")
    return clip("; ".join(reasons), MAX_TEXT_CHARS) if reasons else None
