"""One VM of a slot (docs/architecture.md, "Virtual devices"): its command line, its boot to
the console's prompt, and its end.

The command line is built from the slot's config alone (``argv``: no lease, no operation
reaches it) and run without a shell, in a process group of its own, recorded by the
exporter's process registry, and gets SIGTERM the moment the exporter is gone, however it
went (``kill -9`` too). Everything a VM owns is in its folder ``STATE_DIR/qemu/run/VM-ID/``:
the QMP socket, the VNC server's socket, the qcow2 overlay over the slot's base disk, and what
its lease flashed (its own disk or initramfs), deleted with the VM.

A guest's network is QEMU's user networking with ``restrict=on``: it reaches nothing of the
host or beyond, and the host reaches its sshd only through the slot's forward.

The console is a pty (``-chardev pty``). QEMU drops what the guest prints while nobody
holds the pty's other end, so the VM holds it itself from the start to its end (a file
descriptor it reads only while booting and probing): the serial bridge and the power watch
open it beside, and nothing is lost between one reader and the next.
"""
from __future__ import annotations

import asyncio
import os
import re
import secrets
import select
import shutil
import signal
import termios
import threading
import time
import tty
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from qemu.qmp import QMPClient, QMPError

from device_loop.plugin import DiskFormat, HostContext, disk_format, find_program, last_lines

from .config import DISPLAY_DEVICE, QemuConfig

MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes, its NUL included
QMP_TIMEOUT_S = 5.0
QUIT_WAIT_S = 3.0  # after QMP quit, before the process group is killed
NUDGE_S = 1.0  # a boot's console is sent a newline this often until its prompt shows
# A boot's wall-clock ceiling, in boot_timeouts: its budget is QEMU's own CPU time (a loaded
# host runs the same boot in many times the wall time: 6x at a load of 15), the ceiling is for
# a guest that waits without running (docs/architecture.md, "Virtual devices")
BOOT_CEILING = 10
_TICKS_S = os.sysconf("SC_CLK_TCK")
_ESCAPES = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]|\r")


class VmError(Exception):
    """A VM did not start, boot or answer; the message says why, for the lease holder."""


def program_of(arch: str) -> str:
    return f"qemu-system-{arch}"


def socket_path_problem(state_dir: Path, slot: str) -> str | None:
    """Why a VM of ``slot`` cannot have its QMP socket under ``state_dir`` (a unix socket's
    path holds 107 bytes), or None: said by the slot's health, so that its devices are not
    offered to a lease that could only fail at its start."""
    longest = len(str(Launch(state_dir / "qemu" / "run" / f"{slot[:24]}-{'0' * 8}", "tcg").qmp_socket))
    if longest <= MAX_SOCKET_PATH:
        return None
    return (f"the state folder's path is too long for a VM's QMP socket ({longest} bytes of the "
            f"{MAX_SOCKET_PATH} a unix socket holds): give the exporter a shorter state_dir")


@dataclass(frozen=True)
class Launch:
    """What one VM is started with, besides the slot's config: where it lives, how it is
    accelerated, the host port its sshd is forwarded to (None: no ssh), whether it has a
    screen, and the initramfs its lease flashed in place of the slot's (in its folder)."""

    folder: Path
    accel: str  # tcg or kvm
    ssh_port: int | None = None
    display: bool = False
    initrd: Path | None = None

    @property
    def qmp_socket(self) -> Path:
        return self.folder / "qmp.sock"

    @property
    def vnc_socket(self) -> Path:
        """Its VNC server's: a unix socket in its folder, which only the exporter's account enters."""
        return self.folder / "vnc.sock"

    @property
    def overlay(self) -> Path:
        return self.folder / "disk.qcow2"

    @property
    def flashed_disk(self) -> Path:
        """Where a flash in its lease puts the disk it boots from then on (its overlay's base)."""
        return self.folder / "flashed-disk"

    @property
    def flashed_initrd(self) -> Path:
        return self.folder / "flashed-initrd"


def argv(config: QemuConfig, launch: Launch, program: str) -> list[str]:
    """The VM's command line: the slot's config and ``launch``, nothing else (a lease's
    arguments cannot reach it: this function never sees one)."""
    cpu = "host" if launch.accel == "kvm" and config.cpu is None else config.cpu_model
    line = [program, "-accel", launch.accel, "-machine", config.machine_name, "-cpu", cpu,
            "-m", str(config.memory), "-smp", str(config.cores),
            "-nodefaults", "-no-user-config", "-display", "none",
            # a guest that breaks out of QEMU finds a process that may not exec, gain privileges or renice
            "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
            "-chardev", "pty,id=console", "-serial", "chardev:console",
            "-qmp", f"unix:{launch.qmp_socket},server=on,wait=off",
            "-kernel", config.kernel, "-append", config.command_line()]
    initrd = str(launch.initrd) if launch.initrd is not None else config.initrd
    if initrd:
        line += ["-initrd", initrd]
    if config.disk:
        # the overlay's format stated (never probed); it names its base and the base's format itself
        line += ["-drive", f"file={launch.overlay},format=qcow2,if=virtio"]
    if launch.ssh_port is not None:
        # restrict=on: the guest reaches nothing outside (not the host's loopback services at
        # 10.0.2.2, not the network); the forward to its port 22 is all that crosses
        line += ["-nic", f"user,model=virtio-net-pci,restrict=on,hostfwd=tcp:127.0.0.1:{launch.ssh_port}-:22"]
    if launch.display:
        line += ["-device", DISPLAY_DEVICE[config.arch], "-vnc", f"unix:{launch.vnc_socket}"]
    return line


def qmp(socket_path: Path, command: str, timeout: float = QMP_TIMEOUT_S, **args: Any) -> Any:
    """One QMP command on the VM's monitor (a connection of its own, from any thread)."""
    async def call() -> Any:
        client = QMPClient("devloop")
        await asyncio.wait_for(client.connect(str(socket_path)), timeout)
        try:
            return await asyncio.wait_for(client.execute(command, args or None), timeout)
        finally:
            try:
                await client.disconnect()
            except (EOFError, OSError):  # (quit: QEMU is gone before the goodbye)
                pass
    return asyncio.run(call())


def screen_text(data: bytes) -> str:
    """What a console shows of ``data``: escape sequences and carriage returns taken out."""
    return _ESCAPES.sub(b"", data).decode(errors="replace")


def shows_prompt(data: bytes, prompt: re.Pattern[str]) -> bool:
    """Whether the console's last line is its prompt."""
    return bool(prompt.search(screen_text(data).rstrip("\n").rsplit("\n", 1)[-1]))


class VM:
    """One QEMU process of a slot, from its start to its end."""

    def __init__(self, host: HostContext, config: QemuConfig, slot: str, accel: str):
        self.host, self.config, self.slot, self.accel = host, config, slot, accel
        self.id = f"{slot[:24]}-{secrets.token_hex(4)}"
        self.launch = Launch(host.state_dir / "qemu" / "run" / self.id, accel,
                             host.free_port() if config.ssh else None, config.display)
        self.prompt = re.compile(config.prompt)
        self.proc: Any = None  # the process registry's record of its QEMU, while it runs
        self.pty: str | None = None
        self._console: int | None = None
        self._lock = threading.Lock()  # one reader of the console at a time (boot, probe)
        # one power-off at a time: a second (the exporter's shutdown, while a lease's stop ends
        # the VM) waits for the first to be done, so neither returns with QEMU still running
        self._power_lock = threading.Lock()
        self.booted_s: float | None = None  # how long its last boot took, to the prompt
        self._overlay_base: tuple[int, int] | None = None  # the base file its overlay was made over
        self.own_disk: Path | None = None  # what its lease flashed: the base of its overlay from then on

    # ---- start -------------------------------------------------------------------------------

    def start(self) -> None:
        """Make its folder (and overlay) and start QEMU; return once its monitor answers and
        its console is held. ``VmError`` otherwise (what QEMU said)."""
        program = find_program(program_of(self.config.arch))
        if program is None:
            raise VmError(f"{program_of(self.config.arch)} is not installed")
        if len(str(self.launch.qmp_socket)) > MAX_SOCKET_PATH:
            raise VmError(f"the state folder's path is too long for a unix socket ({self.launch.qmp_socket})")
        self.launch.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.config.disk and self.launch.overlay.exists() and self._base_id() != self._overlay_base:
            # the base was flashed since (a power cycle in the lease): an overlay over the old one
            # would read the new one's blocks as its own
            self.launch.overlay.unlink()
        if self.config.disk and not self.launch.overlay.exists():
            self._overlay()
        self.launch.qmp_socket.unlink(missing_ok=True)
        # a job: the plugin ends it, not the sweep of strays (it serves no lease while in the pool)
        # it dies with the exporter (kill -9 included): a VM outliving its exporter serves nobody
        self.proc = self.host.processes.spawn(argv(self.config, self.launch, program), name=f"qemu-{self.id}",
                                              job=True, die_with_parent=True)
        self.pty = self._wait_monitor(time.monotonic() + QMP_TIMEOUT_S * 2)
        fd = os.open(self.pty, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
        tty.setraw(fd)
        attributes = termios.tcgetattr(fd)
        attributes[3] &= ~termios.ECHO
        termios.tcsetattr(fd, termios.TCSANOW, attributes)
        self._console = fd

    def base(self) -> str:
        """The disk its overlay is made over: what its lease flashed, else the slot's."""
        assert self.config.disk is not None
        return str(self.own_disk) if self.own_disk is not None else self.config.disk

    def _base_id(self) -> tuple[int, int]:
        """Which file the base is now (a flash renames another over it)."""
        info = os.stat(self.base())
        return info.st_dev, info.st_ino

    def _overlay(self) -> None:
        base = self.base()
        self._overlay_base = self._base_id()
        base_format = disk_format(base)  # (read again: a flash may have changed it)
        program = find_program("qemu-img")
        if program is None:
            raise VmError("qemu-img is not installed")
        code, output = self.host.run_to_end(
            [program, "create", "-q", "-f", DiskFormat.QCOW2, "-b", base, "-F", base_format,
             str(self.launch.overlay)], name=f"qemu-img-{self.id}", timeout=30)
        if code != 0:
            raise VmError(f"qemu-img could not make the VM's overlay: {last_lines(output)}")

    def _wait_monitor(self, deadline: float) -> str:
        """The console's pty, once QEMU's monitor answers."""
        while True:
            if not self.alive():
                raise VmError(f"QEMU exited: {last_lines(self.proc.output()) if self.proc else ''}")
            if self.launch.qmp_socket.exists():
                try:
                    chardevs = qmp(self.launch.qmp_socket, "query-chardev")
                    return next(c["filename"] for c in chardevs if c["label"] == "console").removeprefix("pty:")
                except (OSError, EOFError, asyncio.TimeoutError, StopIteration, QMPError) as exc:
                    if time.monotonic() > deadline:
                        raise VmError(f"QEMU's monitor did not answer: {exc!r}") from None
            if time.monotonic() > deadline:
                raise VmError("QEMU's monitor did not come up")
            time.sleep(0.01)

    def boot(self, stop: threading.Event | None = None) -> float:
        """Start it and read its console until the prompt, within the slot's ``boot_timeout``:
        the seconds it took. ``VmError`` (the VM ended) if it did not, or ``stop`` was set."""
        began = time.monotonic()
        try:
            self.start()
            self.wait_prompt(began + BOOT_CEILING * self.config.boot_timeout, stop, ran_s=self.config.boot_timeout)
        except BaseException:
            self.end()
            raise
        self.booted_s = time.monotonic() - began
        return self.booted_s

    def ran_s(self) -> float:
        """The CPU time QEMU has had so far (its guest's, emulated or not): how far a boot got,
        whatever else the host runs meanwhile."""
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        except (OSError, AttributeError):
            return 0.0
        fields = stat[stat.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS_S

    # ---- the console -------------------------------------------------------------------------

    def wait_prompt(self, deadline: float, stop: threading.Event | None = None, settle_s: float = 0.05,
                    ran_s: float | None = None) -> None:
        """Nudge the console with a newline until it shows its prompt, then nothing more for
        ``settle_s``; ``VmError`` past ``deadline``, or once QEMU has run ``ran_s`` seconds of
        CPU time (``ran_s``: a boot's budget, which a loaded host does not eat)."""
        entered = time.monotonic()
        with self._lock:
            fd = self._console
            if fd is None:
                raise VmError("the VM's console is closed")
            seen, nudged = b"", 0.0
            while True:
                now = time.monotonic()
                if stop is not None and stop.is_set():
                    raise VmError("stopped while it booted")
                ran = self.ran_s() if ran_s is not None else 0.0
                if now > deadline or ran_s is not None and ran > ran_s:
                    tail = screen_text(seen[-200:]).strip().splitlines()
                    when = (f"within {deadline - entered:.0f}s" if ran_s is None else
                            f"after QEMU ran {ran:.1f}s, its boot_timeout ({ran_s:g}s of its own time; "
                            f"{now - entered:.0f}s passed)")
                    raise VmError(f"no prompt on the console {when}"
                                  + (f" (it last showed {tail[-1][-80:]!r})" if tail else " (it showed nothing)"))
                if not self.alive():
                    said = last_lines(self.proc.output()) if self.proc is not None else ""
                    raise VmError(f"QEMU exited while the VM booted: {said}")
                if now - nudged >= NUDGE_S:
                    try:
                        os.write(fd, b"\n")
                    except BlockingIOError:
                        pass
                    nudged = now
                readable, _, _ = select.select([fd], [], [], min(0.1, max(0.0, deadline - now)))
                if readable:
                    try:
                        seen = (seen + os.read(fd, 65536))[-4096:]
                    except (BlockingIOError, OSError):
                        continue
                    if shows_prompt(seen, self.prompt) and self._quiet(fd, settle_s):
                        return

    def _quiet(self, fd: int, for_s: float = 0.05) -> bool:
        """Nothing more comes for ``for_s``: a prompt, not a line that happens to end like one."""
        readable, _, _ = select.select([fd], [], [], for_s)
        return not readable

    def probe(self, timeout: float = 3.0) -> bool:
        """Whether its console answers a newline with its prompt within ``timeout`` (what was
        printed before is dropped: nobody watches a VM in the pool)."""
        fd = self._console
        if fd is None or not self.alive():
            return False
        try:
            termios.tcflush(fd, termios.TCIFLUSH)
            # what came before is flushed, so the prompt the newline brings is the last thing
            # printed: no quiet wait (it was 50 ms of every warm lease's hand-out)
            self.wait_prompt(time.monotonic() + timeout, settle_s=0.0)
        except (VmError, OSError):
            return False
        return True

    # ---- state and end -----------------------------------------------------------------------

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def status(self) -> str:
        """QMP's ``query-status`` (``running``, ``paused``, ``internal-error``, ``guest-panicked``...),
        ``off`` when its QEMU is gone, ``no answer`` when its monitor does not answer."""
        if not self.alive():
            return "off"
        try:
            return str(qmp(self.launch.qmp_socket, "query-status", timeout=2.0).get("status"))
        except (OSError, EOFError, asyncio.TimeoutError, QMPError):
            return "no answer"

    def running(self) -> bool:
        """Its guest runs (QMP), as a power switch reads back."""
        return self.status() == "running"

    def power_off(self) -> None:
        """End its QEMU (QMP ``quit``, then its process group killed if it lingers) but keep its
        folder: its disk, like a board's, survives a power cycle."""
        with self._power_lock:
            self._power_off()

    def _power_off(self) -> None:
        proc, self.proc = self.proc, None
        if self._console is not None:
            os.close(self._console)
            self._console = None
        self.pty = None
        if proc is None:
            return
        if proc.alive():
            try:
                qmp(self.launch.qmp_socket, "quit", timeout=2.0)
            except (OSError, EOFError, asyncio.TimeoutError, QMPError):
                pass  # (killed below)
        if not proc.wait(QUIT_WAIT_S):
            proc.signal(signal.SIGKILL)
            proc.wait(10.0)
        proc.registry.forget(proc)

    def flashed(self, path: Path, is_disk: bool) -> None:
        """Boot what its lease flashed (``path``, in its folder) from its next start on: its
        disk (a new overlay over it) or its initramfs. The running guest goes on as it is,
        as a board goes on running until it is reset."""
        if is_disk:
            self.own_disk = path
        else:
            self.launch = replace(self.launch, initrd=path)

    def end(self) -> None:
        """Power it off and delete its folder (the overlay with it): nothing it did survives."""
        self.power_off()
        shutil.rmtree(self.launch.folder, ignore_errors=True)
