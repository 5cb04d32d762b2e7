"""The ISA features a slot's CPU model gives its guest, as tags (docs/architecture.md, "Virtual
devices"): what a matrix asks for (``tags = ["sve2"]``) without booting a VM to look.

Each row was checked against a guest's ``/proc/cpuinfo`` under this QEMU (7.2, TCG), its
``flags`` (x86) or ``Features`` (arm64) line; Arm's ``asimd`` is tagged ``neon``, the name
people ask for. A CPU model that is not in the table gets no feature tags: a tag is never
guessed. AVX-512 is not in TCG at all.
"""
from __future__ import annotations

ISA: dict[tuple[str, str], tuple[str, ...]] = {
    ("x86_64", "max"): ("avx2", "avx", "fma", "bmi2", "aes", "sse4_2"),
    ("aarch64", "max"): ("sve2", "sve", "neon", "aes", "sha3", "i8mm", "bf16"),
    ("aarch64", "cortex-a72"): ("neon", "aes", "crc32"),
}


def isa_tags(arch: str, cpu: str) -> tuple[str, ...]:
    """The feature tags of the CPU model ``cpu`` (its properties after a comma aside)."""
    return ISA.get((arch, cpu.split(",", 1)[0]), ())
