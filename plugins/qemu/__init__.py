"""VM slots: devices that are QEMU virtual machines, fresh for every lease
(docs/architecture.md, "Virtual devices").

Config: a ``[[devices]]`` entry with ``plugin = "qemu"`` is a slot (``config.py``: ``arch``,
``cpu``, ``machine``, ``memory``, ``cores``, ``kernel``, ``initrd``, ``append``, ``disk``,
``instances``, ``warm``, ``prompt``, ``boot_timeout``, ``ssh``, ``ssh_user``). It is
``instances`` devices: its name when one, else ``NAME-0`` ... Each device has a ``uart``
resource (the VM's serial console, served by the serial bridge like a board's), a ``power``
one (QMP: off is the VM's end, on a fresh boot of the same disk), a ``flash`` one (in a lease,
writes that lease's own disk, or initramfs when the slot has no disk, gone at its end; an
admin's recovery or a reflash step between leases, both a known-good image, replaces the
slot's base) and an ``ssh`` one when the guest runs sshd (QEMU's user network forwards a
loopback port to its port 22, relayed like the ``ssh`` plugin's).

A lease's first service takes a VM from the slot's pool (``pool.py``: booted ahead, else
booted then), its last one's stop ends it, overlay and all (``vm.py``). Fidelity is
``emulated`` under TCG and ``virtual`` where KVM was tried and works (``kvm.py``); the tags
say ``virtual``, the architecture and the ISA features of the CPU model (``isa.py``).
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from device_loop.plugin import (POWER_KIND, EndpointRole, Fidelity, Health, HostContext, LeaseRef, Operation,
                                OperationError, OperationKind, PluginConfig, PowerReading, Purpose, Resource, Service,
                                ServiceError, find_program, hookimpl, last_lines, run, start_bridge, start_relay)

from .config import QemuConfig
from .images import BaseImages, install
from .isa import isa_tags
from .kvm import KvmVerdict, try_kvm
from .pool import Pool, PoolCounts, PoolRefused
from .vm import VM, VmError, program_of, socket_path_problem

FLASH = OperationKind("flash", "write an image of the registry as the lease's VM disk (its initramfs when the slot "
                               "has no disk), booted from its next power-on and gone at the lease's end; an admin's "
                               "recovery between leases replaces the slot's base", exclusive=True, destructive=True)
SSH_COMMAND = "ssh -p {port} {user}@{host}"
VNC_COMMAND = "device-loop vnc {lease}"
BAUD = 115200  # what the console endpoint says (a pty has no speed)
MAX_NAME_CHARS = 64  # a device's name (core NAME_PATTERN)
MAX_METRICS = 64  # names a plugin may report (core/hookspecs.py, devloop_metrics)


@dataclass
class Slot:
    name: str
    config: QemuConfig
    device_class: str
    tags: tuple[str, ...]
    devices: list[str]
    pool: Pool


@dataclass
class Attached:
    """The VM of a device's live lease, and which of the lease's services are up on it."""

    lease: str
    vm: VM
    services: set[str] = field(default_factory=set)


def sshd_answers(port: int, deadline: float) -> bool:
    """Whether the guest's sshd greets (``SSH-``) on the forwarded ``port`` before ``deadline``:
    QEMU accepts a connection before the guest listens, so a connect proves nothing."""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                sock.settimeout(2)
                if sock.recv(4).startswith(b"SSH-"):
                    return True
        except OSError:
            pass
        threading.Event().wait(0.2)  # (a guest that is still starting its sshd)
    return False


class QemuPlugin:
    """The slots of one exporter (a plugin object: each exporter that loads it has its own)."""

    def __init__(self) -> None:
        self.slots: dict[str, Slot] = {}  # by the slot's name
        self.slot_of: dict[str, Slot] = {}  # by device
        self.attached: dict[str, Attached] = {}  # by device
        self.locks: dict[str, threading.Lock] = {}  # by device: one start or stop of its VM at a time
        self.kvm = KvmVerdict(False, "not tried")
        self.versions: dict[str, str] = {}  # program -> its --version's first line
        self.images: BaseImages | None = None

    # ---- loading -----------------------------------------------------------------------------

    @hookimpl
    def devloop_config_model(self) -> type[PluginConfig] | None:
        return QemuConfig

    @hookimpl
    def devloop_available(self, host: HostContext) -> str | None:
        wanted = sorted({program_of(entry.config.arch) for entry in host.entries} or {program_of("x86_64")})
        missing = [program for program in [*wanted, "qemu-img"] if find_program(program) is None]
        return f"{', '.join(missing)} not installed (Debian: qemu-system-x86, qemu-system-arm, qemu-utils)" \
            if missing else None

    @hookimpl
    def devloop_startup(self, host: HostContext) -> None:
        qemu = host.state_dir / "qemu"
        # what an earlier run left: its QEMUs were stopped as leftovers already (the process registry)
        for leftover in ("run", "consoles"):
            shutil.rmtree(qemu / leftover, ignore_errors=True)
        (qemu / "consoles").mkdir(parents=True, exist_ok=True)
        self.images = BaseImages(qemu / "digests.json")
        for entry in host.entries:
            self.images.first_sight(entry.config.files())
            if entry.config.disk:
                self.images.check_base(entry.config.disk)
        if any(entry.config.arch == "x86_64" for entry in host.entries):
            self.kvm = try_kvm(host)
        for program in {program_of(entry.config.arch) for entry in host.entries}:
            code, output = run([find_program(program) or program, "--version"], timeout=10)
            self.versions[program] = output.strip().splitlines()[0] if code == 0 and output.strip() else "unknown"
        for entry in host.entries:
            config: QemuConfig = entry.config
            long = [device for device in config.devices(entry.device) if len(device) > MAX_NAME_CHARS]
            if long:
                raise ValueError(f"slot {entry.device}: its device {long[0]} has a name longer than "
                                 f"{MAX_NAME_CHARS} characters (a shorter slot name)")
            slot = Slot(entry.device, config, entry.device_class, entry.tags, config.devices(entry.device),
                        Pool(entry.device, config, functools.partial(self._vm, host, config, entry.device)))
            self.slots[slot.name] = slot
            for device in slot.devices:
                self.slot_of[device] = slot
                self.locks[device] = threading.Lock()
        for slot in self.slots.values():
            slot.pool.start()

    @hookimpl
    def devloop_shutdown(self, host: HostContext) -> None:
        for slot in self.slots.values():
            slot.pool.stop()
        while self.attached:
            self.attached.popitem()[1].vm.end()

    def _accel(self, config: QemuConfig) -> str:
        return "kvm" if self.kvm.works and config.arch == "x86_64" else "tcg"

    def _vm(self, host: HostContext, config: QemuConfig, slot: str) -> VM:
        return VM(host, config, slot, self._accel(config))

    def fidelity(self, config: QemuConfig) -> Fidelity:
        return Fidelity.VIRTUAL if self._accel(config) == "kvm" else Fidelity.EMULATED

    # ---- what there is -----------------------------------------------------------------------

    def console_link(self, host: HostContext, device: str) -> Path:
        """The device's console as the bridge and the power watch open it: a link to the pty of
        its VM of the moment (none between leases, nor while it is off)."""
        return host.state_dir / "qemu" / "consoles" / device

    @hookimpl
    def devloop_discover(self, host: HostContext) -> Sequence[Resource] | None:
        found = []
        for slot in self.slots.values():
            config = slot.config
            tags = tuple(dict.fromkeys([*slot.tags, "virtual", config.arch, *isa_tags(config.arch, config.cpu_model)]))
            for device in slot.devices:
                base = Resource(device=device, kind="uart", identifier=f"qemu:{host.name}:{device}",
                                device_class=slot.device_class, tags=tags, config=config,
                                fidelity=self.fidelity(config), node=str(self.console_link(host, device)))
                found.append(base)
                found.append(replace(base, kind=POWER_KIND, identifier=f"{base.identifier}:power", node=None,
                                     serves_lease=False))
                found.append(replace(base, kind=FLASH.kind, identifier=f"{base.identifier}:flash", node=None,
                                     serves_lease=False))
                if config.ssh:
                    found.append(replace(base, kind="ssh", identifier=f"{base.identifier}:ssh", node=None))
                if config.display:
                    found.append(replace(base, kind="vnc", identifier=f"{base.identifier}:vnc", node=None))
        return found

    @hookimpl
    def devloop_health(self, host: HostContext, resource: Resource) -> Health | None:
        if resource.kind != "uart":  # the device's health is its console's (said once)
            return Health("ok")
        slot = self.slot_of.get(resource.device)
        if slot is None:
            return Health("failed", "not a slot of this exporter any more")
        program = program_of(slot.config.arch)
        if find_program(program) is None:
            return Health("failed", f"{program} is not installed")
        problem = socket_path_problem(host.state_dir, slot.name)
        if problem:
            return Health("failed", problem)
        assert self.images is not None
        problem = self.images.problem(slot.config.files())
        if problem:
            return Health("failed", problem)
        attached = self.attached.get(resource.device)
        if attached is not None and attached.vm.proc is not None:  # (proc None: powered off on purpose)
            vm = attached.vm
            if not vm.alive():
                return Health("failed", f"its VM exited: {last_lines(vm.proc.output(), 2, 200)}")
            status = vm.status()
            if status != "running":  # a guest QEMU stopped (an internal error, a panic) or a hung monitor
                return Health("failed", f"its VM is {status} (QMP): it ends with the lease, the next one is fresh")
        if slot.pool.last_error:
            return Health("degraded", slot.pool.last_error)
        return Health("ok")

    @hookimpl
    def devloop_fingerprint(self, host: HostContext, resource: Resource) -> Mapping[str, str] | None:
        slot = self.slot_of.get(resource.device)
        if slot is None or resource.kind != "uart":
            return None
        config = slot.config
        return {"fidelity.detail": "KVM" if self._accel(config) == "kvm" else "TCG",
                "qemu.version": self.versions.get(program_of(config.arch), "unknown"),
                "qemu.cpu": "host" if self._accel(config) == "kvm" and config.cpu is None else config.cpu_model,
                "qemu.machine": config.machine_name, "qemu.kvm": self.kvm.reason[:200],
                "qemu.memory_mib": str(config.memory),
                "qemu.cores": str(config.cores)}

    @hookimpl
    def devloop_metrics(self, host: HostContext) -> Mapping[str, float] | None:
        """The pools (``pool.PoolCounts``): ``vm_NAME`` summed over the slots, and ``slot_SLOT_NAME``
        for each slot while the names fit the hook's 64."""
        counts = {slot.name: vars(slot.pool.counts()) for slot in self.slots.values()}
        out: dict[str, float] = {}
        for name in vars(PoolCounts(0, 0, 0, 0, 0.0, 0, 0, 0)):
            out[f"vm_{name}"] = float(sum(slot[name] for slot in counts.values()))
        for slot, values in counts.items():
            if len(out) + len(values) > MAX_METRICS:
                break
            word = re.sub(r"[^a-z0-9]+", "_", slot.lower()).strip("_")[:32] or "slot"
            out.update({f"slot_{word}_{name}": float(value) for name, value in values.items()})
        return out

    # ---- leases ------------------------------------------------------------------------------

    @hookimpl
    def devloop_start(self, host: HostContext, resource: Resource, lease: LeaseRef) -> Service | None:
        slot = self.slot_of[resource.device]
        attached = self._attach(host, slot, resource.device, lease, resource.identifier)
        link = self.console_link(host, resource.device)
        try:
            if resource.kind == "uart":
                service = start_bridge(host, resource, lease, str(link), BAUD, in_thread=True)
            elif resource.kind == "ssh":
                port = attached.vm.launch.ssh_port
                assert port is not None
                if not sshd_answers(port, time.monotonic() + slot.config.boot_timeout):
                    raise ServiceError(f"the VM's sshd did not answer within {slot.config.boot_timeout:g}s")
                service = start_relay(host, resource, lease, f"127.0.0.1:{port}", command=SSH_COMMAND,
                                      protocol="ssh", role=EndpointRole.SSH)
                params: dict[str, Any] = {"user": slot.config.ssh_user,
                          **({"host_key": slot.config.ssh_host_key} if slot.config.ssh_host_key else {})}
                service.endpoints = [replace(e, params=params) for e in service.endpoints]
            elif resource.kind == "vnc":
                service = start_relay(host, resource, lease, f"unix:{attached.vm.launch.vnc_socket}",
                                      command=VNC_COMMAND, protocol="rfb", role=EndpointRole.RFB)
            else:
                raise ServiceError(f"a VM slot serves no {resource.kind!r} to a lease")
        except BaseException:
            self._detach(host, resource.device, lease.id, resource.identifier)
            raise
        service.data = {"device": resource.device, "lease": lease.id, "identifier": resource.identifier,
                        "vm": attached.vm.id}
        return service

    def _attach(self, host: HostContext, slot: Slot, device: str, lease: LeaseRef, identifier: str) -> Attached:
        """The VM of ``lease`` on ``device``: taken from the pool by the lease's first service."""
        with self.locks[device]:
            attached = self.attached.get(device)
            if attached is not None and attached.lease != lease.id:  # an earlier lease's, not stopped: never reused
                del self.attached[device]
                self._end(host, slot, device, attached)
                attached = None
            if attached is None:
                try:
                    vm = slot.pool.take()
                except (PoolRefused, VmError, OSError) as exc:
                    raise ServiceError(f"no VM for {device}: {exc}") from None
                attached = self.attached[device] = Attached(lease.id, vm)
                self._link(host, device, vm)
            attached.services.add(identifier)
            return attached

    def _detach(self, host: HostContext, device: str, lease: str, identifier: str) -> None:
        """A service of ``lease`` is gone: its last one ends the VM (the pool boots the next)."""
        with self.locks[device]:
            attached = self.attached.get(device)
            if attached is None or attached.lease != lease:
                return
            attached.services.discard(identifier)
            if not attached.services:
                del self.attached[device]
                self._end(host, self.slot_of[device], device, attached)

    def _end(self, host: HostContext, slot: Slot, device: str, attached: Attached) -> None:
        self.console_link(host, device).unlink(missing_ok=True)
        slot.pool.give_back(attached.vm)

    def _link(self, host: HostContext, device: str, vm: VM) -> None:
        """Point the device's console link at ``vm``'s pty (replaced at once, never missing in between)."""
        link = self.console_link(host, device)
        if vm.pty is None:
            link.unlink(missing_ok=True)
            return
        temporary = link.with_name(f".{link.name}.new")
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(vm.pty)
        os.replace(temporary, link)

    @hookimpl
    def devloop_stop(self, host: HostContext, service: Service) -> object:
        data = service.data
        if data.get("device") in self.locks:
            self._detach(host, data["device"], data["lease"], data["identifier"])
        return None  # the exporter stops the bridge or relay

    # ---- power and flash ---------------------------------------------------------------------

    @hookimpl
    def devloop_power(self, host: HostContext, resource: Resource, action: str) -> PowerReading | None:
        attached = self.attached.get(resource.device)
        if attached is None:  # between leases: nothing runs, and the next lease boots (or takes) a fresh VM
            return PowerReading("off" if action == "off" else "on",
                                "no VM between leases: the next lease gets a fresh one, powered on",
                                console_follows=False)
        vm = attached.vm
        with self.locks[resource.device]:
            if action == "off" and vm.alive():
                vm.power_off()
                self.console_link(host, resource.device).unlink(missing_ok=True)
                return PowerReading("on" if vm.alive() else "off", f"VM {vm.id} quit through QMP")
            if action == "on" and not vm.alive():
                try:
                    vm.start()
                except (VmError, OSError) as exc:
                    raise OperationError(f"the VM did not start: {exc}") from None
                self._link(host, resource.device, vm)
                return PowerReading("on" if vm.running() else "off", f"VM {vm.id} started again (same disk)")
        return PowerReading("on" if vm.running() else "off", f"VM {vm.id} " + ("runs" if vm.alive() else "is off"))

    @hookimpl
    def devloop_operations(self, host: HostContext, resource: Resource) -> Sequence[OperationKind] | None:
        return [FLASH] if resource.kind == FLASH.kind and resource.device in self.slot_of else None

    @hookimpl
    def devloop_operate(self, host: HostContext, resource: Resource, op: Operation) -> str | Mapping[str, Any] | None:
        if op.kind != FLASH.kind:
            raise OperationError(f"a VM slot's flash target runs {FLASH.kind!r} alone, not {op.kind!r}",
                                 changed=False)
        if op.image is None:
            raise OperationError("a flash writes an image, and none came with this one", changed=False)
        slot = self.slot_of[resource.device]
        target = slot.config.disk or slot.config.initrd
        if target is None:
            raise OperationError(f"slot {slot.name} has neither a disk nor an initrd to replace", changed=False)
        image, is_disk = op.image, bool(slot.config.disk)
        progress = lambda done: op.progress("writing", done, image.size, "bytes")  # noqa: E731
        try:
            if op.purpose == Purpose.LEASE:  # the holder's: their VM's own, gone with their lease
                return self._flash_lease(resource.device, image.path, image.sha256, is_disk, progress)
            assert self.images is not None
            # an admin's recovery or a step between leases: a known-good image (the coordinator's
            # rule), the slot's base for every VM booted from now on
            message = self.images.replace(Path(target), image.path, image.sha256, is_disk, progress)
        except OSError as exc:
            raise OperationError(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")) from None
        for other in self.slots.values():  # idle VMs booted from the old file: booted again
            if target in other.config.files().values():
                other.pool.flush()
        return message

    def _flash_lease(self, device: str, image: Path, sha256: str, is_disk: bool,
                     progress: Callable[[int], None]) -> str:
        """Write ``image`` into the folder of the VM of ``device``'s lease, as the disk (or the
        initramfs) it boots from its next power-on: the slot's base is not touched, and the
        folder goes with the VM at the lease's end."""
        attached = self.attached.get(device)
        if attached is None:
            raise OperationError(f"no VM of a lease runs on {device} now: a flash in a lease writes that lease's VM",
                                 changed=False)
        vm = attached.vm
        target = vm.launch.flashed_disk if is_disk else vm.launch.flashed_initrd
        install(target, image, sha256, is_disk, progress)  # (not under the device's lock: the lease may end meanwhile)
        with self.locks[device]:
            if self.attached.get(device) is not attached:
                raise OperationError(f"the lease of {device} ended while its VM's disk was written", changed=False)
            vm.flashed(target, is_disk)
        what = "disk" if is_disk else "initramfs"
        return (f"written as this lease's VM {what} (sha256 {sha256[:12]}), checked by read-back: booted from its next "
                f"power-on (device-loop power cycle); the slot's base is unchanged, and this is gone at release")
