"""core/ab/fingerprint.py: the commands it sends (plain ;-separated reads a minimal shell runs)
and its parsers on realistic /proc/cpuinfo of x86, arm64 and riscv, and on garbage."""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

import pytest

from device_loop.core.ab import fingerprint as fp
from device_loop.core.ab.jobs import MAX_COMMAND_CHARS, Fingerprint, Readings

X86_CPU = """processor\t: {n}
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 85
model name\t: Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz
stepping\t: 7
cpu MHz\t\t: 2100.000
cache size\t: 28160 KB
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ss \
ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology cpuid pni pclmulqdq ssse3 fma cx16 pcid sse4_1 \
sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm abm 3dnowprefetch fsgsbase bmi1 hle avx2 \
smep bmi2 erms invpcid rtm avx512f avx512dq rdseed adx smap clflushopt clwb avx512cd avx512bw avx512vl xsaveopt \
xsavec xgetbv1 xsaves arat pku ospke avx512_vnni md_clear arch_capabilities
bugs\t\t: spectre_v1 spectre_v2 spec_store_bypass swapgs taa itlb_multihit
bogomips\t: 4200.00
address sizes\t: 46 bits physical, 48 bits virtual

"""

ARM64_CPU = """processor\t: {n}
BogoMIPS\t: 38.40
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop \
sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg dcpodp sve2 sveaes svepmull \
svebitperm svesha3 svesm4 flagm2 frint svei8mm svebf16 i8mm bf16 dgh bti
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x{variant}
CPU part\t: {part}
CPU revision\t: 0

"""

RISCV_CPU = """processor\t: {n}
hart\t\t: {n}
isa\t\t: rv64imafdcv_zicbom_zicboz_zicntr_zicsr_zifencei_zihintpause_zihpm_zba_zbb_zbs_zvl256b
mmu\t\t: sv39
uarch\t\t: thead,c908
mvendorid\t: 0x5b7
marchid\t\t: 0x0
mimpid\t\t: 0x0

"""


def x86_cpuinfo(cpus=4):
    return "".join(X86_CPU.format(n=n) for n in range(cpus))


def arm64_cpuinfo():
    parts = ["0xd46"] * 4 + ["0xd47"] * 3 + ["0xd48"]
    return "".join(ARM64_CPU.format(n=n, part=p, variant=0) for n, p in enumerate(parts)) + \
        "Hardware\t: Qualcomm Technologies, Inc SM8450\n"


def riscv_cpuinfo():
    return "".join(RISCV_CPU.format(n=n) for n in range(4))


@dataclass
class Result:
    stdout: str
    status: int = 0
    channel: str = "console"


class MiniShell:
    """What the simulated board's console runs: ;-separated echo, cat of a fixed path,
    uname -a, nproc, getprop; nothing else (no globs, pipes, loops, redirections)."""

    def __init__(self, files, channel="console", uname="Linux board 6.6.0 #1 SMP aarch64 GNU/Linux", nproc="8",
                 props=None):
        self.files, self.channel, self.uname, self.nproc = files, channel, uname, nproc
        self.props = props or {}
        self.commands = []

    def __call__(self, command, timeout_s):
        assert timeout_s > 0
        self.commands.append(command)
        assert len(command) <= MAX_COMMAND_CHARS
        assert not re.search(r"[|*?<>`&]|\bfor\b|\bwhile\b|\$\(", command), command
        out = []
        for part in command.split("; "):
            word, _, arg = part.partition(" ")
            if word == "echo":
                out.append(arg)
            elif word == "cat":
                out.append(self.files[arg].rstrip("\n") if arg in self.files
                           else f"cat: can't open '{arg}': No such file or directory")
            elif part == "uname -a":
                out.append(self.uname)
            elif part == "nproc":
                out.append(self.nproc)
            elif word == "getprop" and self.channel == "adb":
                out.append(self.props.get(arg, ""))
            else:
                out.append(f"sh: {word}: not found")
        return Result("\r\n".join(out) + "\r\n", 0, self.channel)


def board_files(cpuinfo, policies=(0, 4, 7)):
    files = {
        "/proc/cpuinfo": cpuinfo,
        "/proc/meminfo": "MemTotal:        7869604 kB\nMemFree:          123456 kB\n",
        "/proc/loadavg": "1.25 0.80 0.50 2/345 6789\n",
        "/sys/devices/system/cpu/online": "0-7\n",
        "/sys/class/thermal/thermal_zone0/type": "cpu-thermal\n",
        "/sys/class/thermal/thermal_zone0/temp": "48312\n",
        "/sys/class/thermal/thermal_zone1/type": "cpu-thermal\n",
        "/sys/class/thermal/thermal_zone1/temp": "47000\n",
        "/sys/class/thermal/thermal_zone2/type": "battery\n",
        "/sys/class/thermal/thermal_zone2/temp": "-273000\n",          # a broken sensor: left out
    }
    for n in policies:
        base = f"/sys/devices/system/cpu/cpufreq/policy{n}/scaling_"
        files.update({base + "governor": "schedutil\n", base + "cur_freq": f"{1000000 + n}\n",
                      base + "min_freq": "300000\n", base + "max_freq": "2841600\n"})
    return files


def test_gather_on_a_phone_like_board_over_adb():
    shell = MiniShell(board_files(arm64_cpuinfo()), channel="adb",
                      props={"ro.build.fingerprint": "google/raven/raven:14/UQ1A/1234:user/release-keys"})
    lease = {"id": "L1", "device": "pixel-6", "host": "lab-1", "endpoints": []}
    device = {"name": "pixel-6", "class": "phone", "tags": ["sve2"], "facts": {"board.rev": "B3", "emulated": "no"},
              "image": {"name": "android-14.img", "sha256": "ab" * 32}}
    f = fp.gather(shell, lease, device, "0.1.0")
    assert isinstance(f, Fingerprint)
    assert len(shell.commands) <= 3
    assert f.device == "pixel-6" and f.device_class == "phone" and f.host == "lab-1" and f.channel == "adb"
    assert f.kernel.startswith("Linux board 6.6.0")
    assert f.cpu_model == "Qualcomm Technologies, Inc SM8450: 4x Cortex-A510 + 3x Cortex-A710 + 1x Cortex-X2"
    assert {"asimd", "sve", "sve2", "i8mm", "bf16"} <= set(f.isa)
    assert fp.notable_isa(f.isa)[:2] == ["asimd", "asimdhp"]
    assert f.cores == 8 and f.online == "0-7" and f.memory_kb == 7869604
    assert [p["policy"] for p in f.cpufreq] == ["policy0", "policy4", "policy7"]
    assert f.cpufreq[1] == {"policy": "policy4", "governor": "schedutil", "cur_khz": "1000004",
                            "min_khz": "300000", "max_khz": "2841600"}
    assert f.thermal == {"cpu-thermal": 48.312, "cpu-thermal#1": 47.0}
    assert f.os_build == "google/raven/raven:14/UQ1A/1234:user/release-keys"
    assert f.image == "android-14.img" and f.image_sha256 == "ab" * 32
    assert f.device_loop_version and not f.emulated
    assert f.extra == {"board.rev": "B3", "emulated": "no"}


def test_gather_over_a_console_reads_no_build_and_marks_emulated():
    shell = MiniShell(board_files(x86_cpuinfo(), policies=(0, 1)), nproc="4",
                      uname="Linux sim-1 6.1.0-sim #1 SMP PREEMPT x86_64 GNU/Linux")
    f = fp.gather(shell, {"device": "sim-1"}, {"fidelity": "emulated", "facts": {}, "tags": []}, "9.9.9")
    assert len(shell.commands) == 2 and not any("getprop" in c for c in shell.commands)
    assert f.channel == "console" and f.os_build == "" and f.emulated
    assert f.cpu_model == "Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz"
    assert {"avx2", "avx512f", "avx512_vnni", "sse4_2"} <= set(f.isa) and "fpu" in f.isa
    assert fp.notable_isa(f.isa) == ["fma", "sse4_2", "avx", "avx2", "avx512f", "avx512dq", "avx512cd", "avx512bw",
                                     "avx512vl", "avx512_vnni"]
    assert f.cores == 4 and f.image == "" and f.image_sha256 == ""
    assert "coordinator 9.9.9" in f.device_loop_version
    assert fp.is_emulated({"fidelity": "simulated"}) and not fp.is_emulated({})
    assert not fp.is_emulated({"fidelity": "hardware"}) and not fp.is_emulated({"fidelity": "virtual"})


def test_emulated_is_the_device_s_typed_fidelity_never_a_tag_or_a_fact_s_words():
    # (docs/architecture.md, "Lifecycle": what a device is, its plugins say in a type)
    assert not fp.is_emulated({"tags": ["emulated", "simulated"], "fidelity": "hardware"})
    assert not fp.is_emulated({"facts": {"simulated": "true", "emulated": "yes"}, "fidelity": "hardware"})


def test_riscv_isa_string():
    blocks = fp.cpuinfo_blocks(riscv_cpuinfo())
    isa = fp.parse_isa(blocks)
    assert isa[:7] == ["i", "m", "a", "f", "d", "c", "v"]
    assert {"zba", "zbb", "zbs", "zicbom", "zvl256b"} <= set(isa)
    assert fp.notable_isa(isa) == ["v", "zba", "zbb", "zbs", "zvl256b"]
    assert fp.parse_cpu_model(blocks) == "thead,c908"
    assert fp.parse_riscv_isa("rv64gc") == ["i", "m", "a", "f", "d", "zicsr", "zifencei", "c"]
    assert fp.parse_riscv_isa("rv64i2p1_m2p0_v1p0_zba1p0") == ["i", "m", "v", "zba"]
    assert fp.parse_riscv_isa("not an isa") == []


def test_isa_is_what_every_core_has():
    text = "processor : 0\nFeatures : fp asimd sve2\n\nprocessor : 1\nFeatures : fp asimd\n"
    assert fp.parse_isa(fp.cpuinfo_blocks(text)) == ["fp", "asimd"]
    unknown = "processor : 0\nCPU implementer : 0x51\nCPU part : 0x805\n"
    assert fp.parse_cpu_model(fp.cpuinfo_blocks(unknown)) == "0x51:0x805"


def test_readings_in_one_round_trip_and_unfit():
    shell = MiniShell(board_files(arm64_cpuinfo()))
    r = fp.readings(shell)
    assert len(shell.commands) == 1
    assert r == Readings(temperatures={"cpu-thermal": 48.312, "cpu-thermal#1": 47.0}, governor="schedutil",
                         freq_khz=1000000, load=1.25)
    assert fp.unfit(r, max_temp_c=None, governor=None) is None
    assert fp.unfit(r, max_temp_c=50, governor="schedutil") is None
    assert fp.unfit(r, max_temp_c=48, governor="performance") == \
        "cpu-thermal at 48.3 °C, above 48 °C; governor schedutil, not performance"
    assert fp.unfit(Readings(), max_temp_c=45, governor="performance") == "governor unreadable, not performance"


def test_readings_of_a_device_with_nothing():
    r = fp.readings(MiniShell({}))
    assert r == Readings()


def test_single_value_parsers():
    assert fp.parse_celsius("45000\n") == 45.0 and fp.parse_celsius("45") == 45.0
    assert fp.parse_celsius("cat: /sys/x: Permission denied") is None and fp.parse_celsius("9" * 40) is None
    assert fp.parse_word("performance\n") == "performance" and fp.parse_word("two words") is None
    assert fp.parse_load("0.52 0.3 0.1 1/100 42") == 0.52 and fp.parse_load("nan 1 1") is None
    assert fp.parse_load("inf") is None and fp.parse_load("") is None
    assert fp.parse_online("0-3,6\n") == "0-3,6" and fp.parse_online("<b>0</b>") == ""
    assert fp.parse_meminfo("MemFree: 1 kB\nMemTotal:  2048 kB\n") == 2048 and fp.parse_meminfo("junk") is None
    assert fp.parse_kernel("sh: uname: not found") == ""
    assert fp.parse_cores("abc", fp.cpuinfo_blocks(x86_cpuinfo(3))) == 3


def test_sections_ignore_the_echoed_command_and_carriage_returns():
    out = "echo @@a; cat /x\r\n@@a\r\nvalue\r\n@@b\r\n"
    assert fp.sections(out) == {"a": "value", "b": ""}


def test_batches_fit_a_command_and_keep_the_order():
    reads = fp.IDENTITY_READS + fp.thermal_reads(8) + fp.cpufreq_reads(range(16))
    commands = fp.batches(reads)
    assert all(len(c) <= fp.MAX_COMMAND for c in commands) and len(commands) >= 2
    assert [m for c in commands for m in re.findall(r"echo @@(\S+);", c)] == [r.key for r in reads]


@pytest.mark.parametrize("seed", range(3))
def test_garbage_and_huge_output_never_raises_and_stays_bounded(seed):
    rng = random.Random(seed)
    alphabet = "abcdefxyz0123456789 :\t\n\r@|`<>&;_-.,/\\\x00\x1b" + "é€🙂"
    garbage = "".join(rng.choice(alphabet) for _ in range(20000))
    huge_line = "flags\t: " + " ".join(f"f{n}" for n in range(5000)) + " " + "x" * 100000 + "\n"

    def exec(command, timeout_s):
        keys = re.findall(r"echo @@(\S+);", command)
        noise = "".join(f"@@{k}\n{garbage if rng.random() < 0.5 else huge_line}\n" for k in keys)
        return Result(noise * rng.choice([1, 3]), rng.choice([0, 1, 127]), rng.choice(["console", "adb", "x"]))

    f = fp.gather(exec, {"device": "d" * 500, "host": 42}, {"facts": {"x" * 100: "y", "ok": "z" * 99999,
                                                                     "image": ["bad"]}, "image": "junk"})
    assert len(f.isa) <= fp.MAX_ISA and all(len(i) <= 32 for i in f.isa)
    assert len(f.cpu_model) <= 4000 and len(f.kernel) <= 4000 and len(f.device) == 64
    assert f.extra.keys() <= {"ok", "image"}
    r = fp.readings(exec)
    assert isinstance(r, Readings)
    assert fp.parse_isa(fp.cpuinfo_blocks(huge_line * 20)) is not None
    assert fp.cpuinfo_blocks("\x00" * 10**6) == []
