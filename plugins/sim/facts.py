"""What a simulated board is (its CPU, ISA, memory, cpufreq) and the ``/proc`` and ``/sys``
files its shell's ``cat`` reads, written the way the real kernel writes them for its arch:
riscv's ``isa : rv64imafdcv_zba_zbb``, arm64's ``Features : fp asimd ... sve2``, x86's
``flags : ... avx2`` (and the lines around them: riscv's ``uarch``, arm64's ``CPU part``, x86's
``model name``, where each names its CPU)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .thermal import Thermal

ARCHES = ("riscv64", "aarch64", "x86_64")
DEFAULT_ISA = {
    "riscv64": ("i", "m", "a", "f", "d", "c", "zicsr", "zifencei", "zba", "zbb"),
    "aarch64": ("fp", "asimd", "evtstrm", "aes", "pmull", "sha1", "sha2", "crc32", "atomics", "fphp", "asimdhp",
                "cpuid", "asimdrdm", "lrcpc", "dcpop", "asimddp"),
    "x86_64": ("fpu", "vme", "de", "pse", "tsc", "msr", "pae", "mce", "cx8", "apic", "sep", "mtrr", "pge", "mca",
               "cmov", "pat", "pse36", "clflush", "mmx", "fxsr", "sse", "sse2", "ht", "syscall", "nx", "lm",
               "constant_tsc", "pni", "ssse3", "fma", "cx16", "sse4_1", "sse4_2", "popcnt", "aes", "avx"),
}
DEFAULT_CPU_MODEL = {"riscv64": "sim,rv64-core", "aarch64": "", "x86_64": "Simulated x86-64 CPU @ 2.00GHz"}
ZONE_TYPE = "cpu-thermal"
_RISCV_ORDER = "imafdqlcbkjtpvh"  # the order of riscv's single-letter extensions in an ISA string


@dataclass(frozen=True)
class BoardFacts:
    """A simulated board's hardware, from its config entry."""
    name: str
    arch: str = "riscv64"
    cpu_model: str = ""          # riscv's uarch, x86's model name, arm64's Hardware line ("" for none)
    cpu_part: str = "0xd0b"      # arm64: the core's part number (Arm's 0xd0b is a Cortex-A76)
    isa: tuple[str, ...] = ()    # the features, one word each; () for the arch's default
    cores: int = 4
    memory_mb: int = 2048
    governor: str = "schedutil"
    min_mhz: int = 600
    max_mhz: int = 1800

    @property
    def features(self) -> tuple[str, ...]:
        return self.isa or DEFAULT_ISA[self.arch]

    def uname(self, flag: str = "-a") -> str | None:
        """``uname FLAG``'s line (None for a flag it does not know)."""
        fields = {"-s": "Linux", "-n": self.name, "-r": "6.1.0-sim", "-m": self.arch, "-o": "GNU/Linux",
                  "-v": "#1 SMP PREEMPT Thu Jan  1 00:00:00 UTC 2026"}
        if flag == "-a":
            return " ".join(fields[f] for f in ("-s", "-n", "-r", "-v", "-m", "-o"))
        return fields.get(flag)

    def riscv_isa(self) -> str:
        letters = sorted((f for f in self.features if len(f) == 1), key=lambda f: _RISCV_ORDER.find(f) % 99)
        extensions = [f for f in self.features if len(f) > 1]
        return "_".join(["rv64" + "".join(letters), *extensions])

    def cpuinfo(self) -> str:
        blocks = [self._processor(n) for n in range(self.cores)]
        if self.arch == "aarch64" and self.cpu_model:
            blocks.append(f"Hardware\t: {self.cpu_model}\n")
        return "\n".join(blocks)

    def _processor(self, n: int) -> str:
        if self.arch == "riscv64":
            lines = [("processor", n), ("hart", n), ("isa", self.riscv_isa()), ("mmu", "sv39")]
            lines += [("uarch", self.cpu_model)] if self.cpu_model else []
            lines += [("mvendorid", "0x0"), ("marchid", "0x0"), ("mimpid", "0x0")]
        elif self.arch == "aarch64":
            lines = [("processor", n), ("BogoMIPS", "50.00"), ("Features", " ".join(self.features)),
                     ("CPU implementer", "0x41"), ("CPU architecture", 8), ("CPU variant", "0x4"),
                     ("CPU part", self.cpu_part), ("CPU revision", 1)]
        else:
            lines = [("processor", n), ("vendor_id", "GenuineIntel"), ("cpu family", 6), ("model", 85),
                     ("model name", self.cpu_model), ("stepping", 7),
                     ("cpu MHz", f"{self.max_mhz:.3f}"), ("physical id", 0), ("siblings", self.cores),
                     ("core id", n), ("cpu cores", self.cores), ("flags", " ".join(self.features)),
                     ("bogomips", f"{2 * self.max_mhz:.2f}")]
        return "".join(_line(key, value) for key, value in lines)

    def meminfo(self) -> str:
        total = self.memory_mb * 1024
        return (f"MemTotal:       {total:>8} kB\nMemFree:        {total * 3 // 4:>8} kB\n"
                f"MemAvailable:   {total * 7 // 8:>8} kB\n")


def _line(key: str, value: object) -> str:
    """``key<TAB>: value`` padded the way the kernel's seq_printf formats do (tabs to column 16)."""
    tabs = "\t" * max(1, 2 - len(key) // 8)
    return f"{key}{tabs}: {value}\n" if len(key) < 16 else f"{key}: {value}\n"


def files(facts: BoardFacts, thermal: Thermal, slowdown: Callable[[], float],
          busy: Callable[[], bool]) -> dict[str, Callable[[], str]]:
    """Path -> its text now. ``slowdown`` is the current throttle factor (the frequency drops by
    it), ``busy`` whether a workload runs (the load average)."""
    policy = "/sys/devices/system/cpu/cpufreq/policy0/"

    def current_khz() -> str:
        return f"{max(facts.min_mhz * 1000, round(facts.max_mhz * 1000 / slowdown()))}\n"

    return {
        "/proc/cpuinfo": facts.cpuinfo,
        "/proc/meminfo": facts.meminfo,
        "/proc/loadavg": lambda: ("1.00 0.62 0.25 2/97 412\n" if busy() else "0.08 0.03 0.01 1/96 411\n"),
        "/sys/devices/system/cpu/online": lambda: f"0-{facts.cores - 1}\n" if facts.cores > 1 else "0\n",
        "/sys/class/thermal/thermal_zone0/temp": lambda: f"{round(thermal.read() * 1000)}\n",
        "/sys/class/thermal/thermal_zone0/type": lambda: f"{ZONE_TYPE}\n",
        policy + "scaling_governor": lambda: f"{facts.governor}\n",
        policy + "scaling_cur_freq": current_khz,
        policy + "scaling_min_freq": lambda: f"{facts.min_mhz * 1000}\n",
        policy + "scaling_max_freq": lambda: f"{facts.max_mhz * 1000}\n",
        policy + "affected_cpus": lambda: " ".join(str(n) for n in range(facts.cores)) + "\n",
    }
