"""Whether KVM works on this host: tried, never assumed (docs/architecture.md, "Virtual devices").

A ``/dev/kvm`` that opens proves little: under a nested hypervisor QEMU may start with
``-accel kvm`` and die at the guest's first MSR or ``xrstor``. So the exporter boots a tiny
guest once, with the CPU model a KVM slot would use (``host``): a 512-byte boot sector that
prints a marker on the serial port and halts. KVM works only if the marker comes within
the timeout. The answer is kept for the exporter's run.
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

# real mode, loaded at 0x7c00: ds = 0; si = the marker; each byte out to COM1 (0x3f8); then halt for good
_CODE = bytes([0x31, 0xC0, 0x8E, 0xD8, 0xFC,  # xor ax,ax; mov ds,ax; cld
               0xBA, 0xF8, 0x03,              # mov dx,0x3f8
               0xBE, 0x17, 0x7C,              # mov si,0x7c17 (the marker, below)
               0xAC, 0x84, 0xC0, 0x74, 0x03,  # lodsb; test al,al; jz +3
               0xEE, 0xEB, 0xF8,              # out dx,al; jmp lodsb
               0xFA, 0xF4, 0xEB, 0xFD])       # cli; hlt; jmp hlt


def boot_sector() -> bytes:
    """The try's whole disk: code, marker, the boot signature."""
    body = _CODE + MARKER + b"\0"
    return body + bytes(510 - len(body)) + b"\x55\xaa"


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
        while time.monotonic() < deadline and proc.alive():
            if MARKER in _read(out):
                return KvmVerdict(True, f"a guest ran under -accel {accel}")
            time.sleep(0.05)
        if MARKER in _read(out):
            return KvmVerdict(True, f"a guest ran under -accel {accel}")
        said = last_lines(proc.output(), 2, 200)
        return KvmVerdict(False, f"a guest under -accel {accel} did not run "
                                 f"({'exited: ' + said if not proc.alive() else f'nothing within {timeout_s:g}s'})")
    finally:
        proc.stop(grace=1.0)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
