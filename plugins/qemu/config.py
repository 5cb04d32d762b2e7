"""A VM slot's config entry (docs/architecture.md, "Virtual devices"): what the admin writes,
checked when the exporter loads its config.

Every value here is the admin's; nothing a lease or an operation says reaches a VM's command
line. The files a slot boots (``kernel``, ``initrd``, ``disk``) are named relative to
``STATE_DIR/qemu/images`` or absolutely, and must resolve, links followed, inside the
exporter's state folder: a slot cannot be pointed at ``/etc/shadow`` or another exporter's
files. The model needs the state folder for that, from its validation context
(``context={"state_dir": ...}``, which the exporter's config loader passes).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from device_loop.plugin import LOGIN_NAME_PATTERN, Duration, PluginConfig, pinned_host_key

MIN_MEMORY_MIB = 64
MAX_MEMORY_MIB = 16384
MAX_INSTANCES = 16
MAX_APPEND_CHARS = 1024
MAX_PROMPT_CHARS = 200
#: What a busybox (or any) root shell's prompt ends with, escape sequences taken out.
DEFAULT_PROMPT = r"[#$] ?$"
#: The CPU model and machine when the slot names none: what boots fast under TCG here (the
#: notes of "Virtual devices": aarch64's pointer authentication emulated exactly costs 3x).
DEFAULT_CPU = {"x86_64": "max", "aarch64": "max,pauth-impdef=on"}
DEFAULT_MACHINE = {"x86_64": "pc", "aarch64": "virt"}
#: The serial console each machine's kernel names.
CONSOLE_TTY = {"x86_64": "ttyS0", "aarch64": "ttyAMA0"}
#: The screen a VM with a display gets (-nodefaults gives it none).
DISPLAY_DEVICE = {"x86_64": "VGA", "aarch64": "virtio-gpu-pci"}
IMAGES = "qemu/images"  # under the state folder: where relative image paths are

# a -cpu or -machine value: a model and its properties (max,pauth-impdef=on), never a space or an option
_MODEL = re.compile(r"^[a-z0-9][a-zA-Z0-9_.,=-]{0,127}$")
_MACHINE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


def host_memory_mib() -> int:
    """The host's RAM (MemTotal), in MiB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise OSError("/proc/meminfo has no MemTotal")


def inside_state_dir(value: str, state_dir: Path) -> str:
    """``value`` (relative to ``STATE_DIR/qemu/images``, or absolute) resolved with its links
    followed; ``ValueError`` unless that lies inside ``state_dir`` (and outside its run folder)."""
    if "\0" in value or len(value) > 4096:
        raise ValueError("a path without NUL, at most 4096 characters")
    root = Path(os.path.realpath(state_dir))
    path = Path(os.path.realpath(Path(state_dir) / IMAGES / Path(value).expanduser())) \
        if not os.path.isabs(value) else Path(os.path.realpath(value))
    if not path.is_relative_to(root) or path == root:
        raise ValueError(f"{value!r} resolves to {path}, outside the exporter's state folder {root}: "
                         f"put the file in {root / IMAGES}")
    if path.is_relative_to(root / "qemu" / "run"):
        raise ValueError(f"{value!r} is in {root / 'qemu' / 'run'}, where the VMs' own files come and go")
    return str(path)


class QemuConfig(PluginConfig):
    """A VM slot: what each of its VMs is, and how many of them there are."""

    arch: Literal["x86_64", "aarch64"] = Field(default="x86_64", description="the guest's architecture")
    cpu: str | None = Field(default=None, description="QEMU's CPU model, with properties "
                                                      "(default max; aarch64 max,pauth-impdef=on)")
    machine: str | None = Field(default=None, description="QEMU's machine (default pc; aarch64 virt)")
    memory: int = Field(default=256, ge=MIN_MEMORY_MIB, le=MAX_MEMORY_MIB, description="MiB of RAM of each VM")
    cores: int = Field(default=1, ge=1, description="virtual CPUs of each VM (at most the host's cores)")
    kernel: str = Field(description="the kernel to boot (in STATE_DIR/qemu/images, or an absolute path there)")
    initrd: str | None = Field(default=None, description="its initramfs")
    append: str = Field(default="quiet", max_length=MAX_APPEND_CHARS,
                        description="more of the kernel's command line (the console is set already)")
    disk: str | None = Field(default=None, description="a base disk image (qcow2 or raw): each VM writes to an "
                                                       "overlay of its own, deleted with it")
    instances: int = Field(default=1, ge=1, le=MAX_INSTANCES, description="how many devices the slot is")
    warm: int = Field(default=0, ge=0, le=MAX_INSTANCES, description="VMs booted ahead, handed out at a lease")
    prompt: str = Field(default=DEFAULT_PROMPT, min_length=1, max_length=MAX_PROMPT_CHARS,
                        description="a regex of what the console shows once booted")
    boot_timeout: Duration = Field(default=25.0, gt=0, le=600,
                                   description="how long a boot may take to the prompt, counted in the time QEMU "
                                               "runs (its CPU time: a loaded host does not eat it), ten times that "
                                               "on the clock at most")
    ssh: bool = Field(default=False, description="the guest runs sshd on port 22: served as an ssh resource")
    display: bool = Field(default=False, description="the VM has a screen: QEMU's VNC server on loopback, "
                                                     "relayed for the lease as a vnc endpoint")
    ssh_user: str = Field(default="root", pattern=LOGIN_NAME_PATTERN, description="whom to log in as")
    ssh_host_key: str | None = Field(default=None, description="the guest's public host key (ssh-ed25519 AAAA...), "
                                                               "which clients pin")

    @field_validator("cpu")
    @classmethod
    def _cpu(cls, value: str | None) -> str | None:
        if value is not None and not _MODEL.match(value):
            raise ValueError(f"a CPU model and its properties (max, cortex-a72, max,pauth-impdef=on), not {value!r}")
        return value

    @field_validator("machine")
    @classmethod
    def _machine(cls, value: str | None) -> str | None:
        if value is not None and not _MACHINE.match(value):
            raise ValueError(f"a machine's name (pc, q35, virt), not {value!r}")
        return value

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: int) -> int:
        half = host_memory_mib() // 2
        if value > half:
            raise ValueError(f"{value} MiB is more than half this host's RAM ({half} MiB)")
        return value

    @field_validator("cores")
    @classmethod
    def _cores(cls, value: int) -> int:
        if value > (os.cpu_count() or 1):
            raise ValueError(f"{value} cores: this host has {os.cpu_count()}")
        return value

    @field_validator("append")
    @classmethod
    def _append(cls, value: str) -> str:
        # one argument of -append: the kernel's, never QEMU's; a control character would only hide what it says
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ValueError("the kernel's command line is one line of printable characters")
        return value

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regex: {exc}") from None
        return value

    @field_validator("ssh_host_key")
    @classmethod
    def _host_key(cls, value: str | None) -> str | None:
        if value is None:
            return None
        return pinned_host_key(value)

    @field_validator("kernel", "initrd", "disk")
    @classmethod
    def _inside(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        state_dir = (info.context or {}).get("state_dir")
        if state_dir is None:
            raise ValueError("a slot's files are checked against the exporter's state folder, and none was given")
        return inside_state_dir(value, Path(state_dir))

    @model_validator(mode="after")
    def _pool(self):
        if self.warm > self.instances:
            raise ValueError(f"warm ({self.warm}) is more than instances ({self.instances})")
        return self

    @property
    def cpu_model(self) -> str:
        """The ``-cpu`` value: the slot's, else the architecture's default."""
        return self.cpu or DEFAULT_CPU[self.arch]

    @property
    def machine_name(self) -> str:
        return self.machine or DEFAULT_MACHINE[self.arch]

    def command_line(self) -> str:
        """The kernel's command line: its console on the serial port, then the slot's ``append``."""
        return f"console={CONSOLE_TTY[self.arch]} {self.append}".strip()

    def files(self) -> dict[str, str]:
        """The slot's files by key (``kernel``, ``initrd``, ``disk``)."""
        return {key: value for key in ("kernel", "initrd", "disk") if (value := getattr(self, key)) is not None}

    def devices(self, name: str) -> list[str]:
        """The devices the slot ``name`` is: itself, or ``NAME-0`` ... for several instances."""
        return [name] if self.instances == 1 else [f"{name}-{i}" for i in range(self.instances)]
