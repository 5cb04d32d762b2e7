"""Whether KVM works on this host: tried, never assumed (docs/architecture.md, "Virtual devices").

A ``/dev/kvm`` that opens proves little: under a nested hypervisor QEMU may start with
``-accel kvm``, run real mode, and die at the guest's first MSR, ``cmpxchg16b`` or ``xrstor``.
So the exporter boots a tiny guest once, with the CPU model a KVM slot would use (``host``):
one boot sector (``kvm_try.S``) that walks the steps a Linux kernel takes early (protected
mode, an MSR write, long mode with paging, cpuid, cmpxchg16b, an interrupt, xsave/xrstor),
printing a letter on the serial port after each, then a marker. KVM works only if the marker
comes within the timeout; otherwise the letters say where the guest stopped. The answer is
kept for the exporter's run.
"""
from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

from device_loop.plugin import HostContext, find_program, last_lines

MARKER = b"DEVLOOP-KVM-OK"
TRY_TIMEOUT_S = 10.0
# what QEMU writes when KVM cannot run the guest's next instruction (it then pauses, alive)
KVM_FAILED = ("KVM internal error", "emulation failure")

# kvm_try.S assembled (its header says how; a test checks the two agree), without the zeros
# before the boot signature
_CODE = bytes.fromhex(
    "fa31c08ed88ec08ed0bc007cbaf803b072ee660f0116487d0f20c06683c8010f22c066ea2a7c0000080066b810008ed8"
    "8ec08ed0b070eebf0010000031c0b9000c0000f3abc7050010000003200000c7050020000003300000c7050030000083"
    "0000000f20e083c8200f22e0b8001000000f22d8b9800000c00f320d000100000f300f20c00d000000800f22c0ea947c"
    "0000180066baf803b06cee31c00fa266baf803b063ee31c031d231db31c9480fc70c250040000066baf803b078ee0f01"
    "1c258e7d0000cc66baf803b069ee0f20e0480d000604000f22e031c9b80300000031d20f01d10fae2425005000000fae"
    "2c250050000066baf803b073ee488d350e000000ac84c07403eeebf8faf4ebfc48cf4445564c4f4f502d4b564d2d4f4b"
    "000f1f80000000000000000000000000ffff0000009acf00ffff00000092cf00ffff0000009aaf001f00287d00000000"
    "00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000107d"
    "1800008e000000000000000000003f004e7d")

# the letter the guest prints after each step (kvm_try.S), in order
STEPS = (("r", "real mode"), ("p", "protected mode"), ("l", "long mode with paging"), ("c", "cpuid"),
         ("x", "cmpxchg16b"), ("i", "an interrupt (int3)"), ("s", "xsave/xrstor"))


def boot_sector() -> bytes:
    """The try's whole disk: code and marker, zeros, the boot signature."""
    return _CODE + bytes(510 - len(_CODE)) + b"\x55\xaa"


def stopped_at(serial: bytes) -> str:
    """Where a try's guest stopped, from the letters it printed: "at cmpxchg16b (after cpuid)"."""
    done = 0
    for letter, _ in STEPS:
        if serial[done:done + 1] != letter.encode():
            break
        done += 1
    if done == len(STEPS):
        return "before its marker"
    return f"at {STEPS[done][1]}" + (f" (after {STEPS[done - 1][1]})" if done else " (it printed nothing)")


@dataclass(frozen=True)
class KvmVerdict:
    works: bool
    reason: str  # what the try showed, in words


def try_kvm(host: HostContext, accel: str = "kvm", timeout_s: float = TRY_TIMEOUT_S) -> KvmVerdict:
    """Boot the tiny guest with ``-accel accel`` (``tcg`` checks the try itself) and say whether it
    reached its marker within ``timeout_s``."""
    if platform.machine() != "x86_64":
        return KvmVerdict(False, f"not tried: the try boots an x86_64 guest, this host is {platform.machine()}")
    if accel == "kvm" and not os.path.exists("/dev/kvm"):
        return KvmVerdict(False, "no /dev/kvm")
    program = find_program("qemu-system-x86_64")
    if program is None:
        return KvmVerdict(False, "not tried: qemu-system-x86_64 is not installed")
    folder = host.state_dir / "qemu" / f"{accel}-try"
    folder.mkdir(parents=True, exist_ok=True)
    disk, out = folder / "boot.img", folder / "serial.out"
    disk.write_bytes(boot_sector())
    out.unlink(missing_ok=True)
    argv = [program, "-accel", accel, "-machine", "pc", "-cpu", "host" if accel == "kvm" else "max",
            "-m", "16", "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-drive", f"file={disk},format=raw,if=ide", "-chardev", f"file,id=ser0,path={out}",
            "-serial", "chardev:ser0"]
    proc = host.processes.spawn(argv, name=f"qemu-{accel}-try", job=True)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and proc.alive() and not _kvm_failed(proc.output()):
            if MARKER in _read(out):
                return KvmVerdict(True, f"a guest ran under -accel {accel}")
            time.sleep(0.05)
        serial = _read(out)
        if MARKER in serial:
            return KvmVerdict(True, f"a guest ran under -accel {accel}")
        said = proc.output()
        how = ("QEMU said: " + next(line for line in said.splitlines() if _kvm_failed(line))[:120]
               if _kvm_failed(said) else "exited: " + last_lines(said, 2, 200) if not proc.alive()
               else f"nothing more within {timeout_s:g}s")
        return KvmVerdict(False, f"a guest under -accel {accel} did not run: it stopped {stopped_at(serial)}; {how}")
    finally:
        proc.stop(grace=1.0)


def _kvm_failed(said: str) -> bool:
    return any(words in said for words in KVM_FAILED)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
