"""Guests for the tests that boot QEMU: built from the Debian packages ./lab test fetched
before pytest started (tests/prepare.py: nothing is fetched here, a missing one fails the
test), and a guest booted by hand (QEMU under TCG, its serial console on a loopback TCP port)
to compare with or to drive over its console as ``exec`` does."""
from __future__ import annotations

import contextlib
import select
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from device_loop.core.ports import free_port
from device_loop.plugins.qemu.guest import ARCHES, PROMPT_PATTERN, Guest, GuestNotFetched, build_guest
from prepare import guest_cache, not_prepared

BOOT_WAIT_S = 120.0  # a TCG boot takes seconds; two cores shared with other tests make it slower
MEMORY_MIB = {"x86_64": 256, "aarch64": 512}
MACHINE = {"x86_64": ["-M", "pc"], "aarch64": ["-M", "virt", "-cpu", "max,pauth-impdef=on"]}


def need_qemu(arch: str) -> None:
    """Fail (not skip: ./lab test installs QEMU) when QEMU for ``arch`` is missing."""
    program = ARCHES[arch].qemu
    assert shutil.which(program), f"{program} is not installed (./lab test installs it; Debian: qemu-system-*)"


def prepared_guest(arch: str, authorized_key: str | None = None) -> Guest:
    """``arch``'s guest built from the packages ./lab test fetched (the initramfs is the
    session's: a fraction of a CPU-second); the test fails, saying so, if one is missing."""
    try:
        guest = build_guest(arch, guest_cache(), authorized_key=authorized_key, fetch=False)
    except GuestNotFetched as exc:
        not_prepared(f"the {arch} VM guest's Debian packages", str(exc))
    need_qemu(arch)
    return guest


def boot_argv(guest: Guest, console_port: int, disk: Path | None = None, ssh_port: int | None = None) -> list[str]:
    """QEMU started by hand for ``guest``: TCG, no display, its serial port on 127.0.0.1:PORT."""
    argv = [ARCHES[guest.arch].qemu, *MACHINE[guest.arch], "-accel", "tcg", "-m", str(MEMORY_MIB[guest.arch]),
            "-nographic", "-nodefaults", "-no-reboot", "-monitor", "none",
            "-kernel", str(guest.kernel), "-initrd", str(guest.initrd), "-append", guest.append,
            "-chardev", f"socket,id=console,host=127.0.0.1,port={console_port},server=on,wait=off",
            "-serial", "chardev:console"]
    if disk is not None:
        argv += ["-drive", f"file={disk},if=virtio,format=qcow2,snapshot=on"]
    if ssh_port is not None:
        argv += ["-nic", f"user,model=virtio-net-pci,hostfwd=tcp:127.0.0.1:{ssh_port}-:22"]
    return argv


@contextlib.contextmanager
def booted(guest: Guest, disk: Path | None = None, ssh_port: int | None = None) -> Iterator[dict]:
    """``guest`` booted by hand to its prompt: a lease-like dict whose console endpoint
    ``exec_on_lease`` drives, plus ``boot_s`` (start to prompt) and the process."""
    port = free_port()
    began = time.monotonic()
    process = subprocess.Popen(boot_argv(guest, port, disk, ssh_port), stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_prompt(process, port)
        yield {"device": f"hand-{guest.arch}", "ready": True, "process": process,
               "boot_s": time.monotonic() - began,
               "endpoints": [{"kind": "uart", "role": "console", "protocol": "raw", "host": "127.0.0.1",
                              "port": port}]}
    finally:
        process.kill()
        process.wait(10)
        assert process.stderr is not None
        process.stderr.close()


def wait_prompt(process: subprocess.Popen, port: int, timeout: float = BOOT_WAIT_S) -> None:
    """Wait until the guest's console shows its prompt (Enter sent each second it is quiet:
    QEMU drops what the guest wrote before anyone connected)."""
    deadline = time.monotonic() + timeout
    while True:  # QEMU listens once it has parsed its arguments
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=1)
            break
        except OSError:
            assert process.poll() is None, f"QEMU ended: {process.stderr.read().decode(errors='replace')[-2000:]}"
            assert time.monotonic() < deadline, "QEMU never listened on its console port"
            select.select([], [], [], 0.05)
    with sock:
        seen = b""
        while not PROMPT_PATTERN.search(seen.decode(errors="replace")):
            assert time.monotonic() < deadline, f"no prompt within {timeout:g}s: {seen[-500:]!r}"
            assert process.poll() is None, f"QEMU ended: {process.stderr.read().decode(errors='replace')[-2000:]}"
            if select.select([sock], [], [], 1.0)[0]:
                data = sock.recv(4096)
                assert data, "QEMU hung up the console"
                seen = (seen + data)[-4096:]
            else:
                sock.sendall(b"\r")


def ssh_guest(arch: str, identity: Path) -> Guest:
    """``arch``'s guest whose dropbear lets the key ``identity`` (its ``.pub`` beside it) in."""
    return prepared_guest(arch, authorized_key=identity.with_name(identity.name + ".pub").read_text())


@pytest.fixture(scope="session")
def guest_identity(tmp_path_factory) -> Path:
    """An ssh key pair made once for the session's ssh guests: the private key's path."""
    keys = tmp_path_factory.mktemp("guest-key")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / "id")], check=True, timeout=30)
    return keys / "id"


@pytest.fixture(scope="session")
def x86_64_guest() -> Guest:
    return prepared_guest("x86_64")


@pytest.fixture(scope="session")
def aarch64_guest() -> Guest:
    return prepared_guest("aarch64")
