"""A slot's VMs (docs/architecture.md, "Virtual devices"): those booted ahead (``warm``),
handed out at a lease's start, and the thread that boots the next one.

A lease takes a warm VM whose console still answers (tens of milliseconds), else boots one
cold in its own start. A VM comes back only to be ended: the pool then boots a fresh one in
the background. Limits: never more VMs than ``instances + warm`` for the slot, and never a
boot while the host has less than the VM's memory and ``HEADROOM_MIB`` available, so a pool
cannot starve the exporter. An idle VM whose console stops answering two probes in a row is
ended and replaced (one missed answer is a guest starved of CPU as often as a dead one). A lease
that comes while the only warm VM is out for its probe waits for the probe (milliseconds), never
for a cold boot (seconds).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .config import QemuConfig
from .vm import VM

log = logging.getLogger("device_loop.plugins.qemu")
HEADROOM_MIB = 512  # what the host keeps beside a new VM's memory
PROBE_S = 10.0  # how often an idle VM's console is asked whether it still answers
# how long a console may take to answer before its VM counts as dead: an answer takes tens of
# milliseconds, but a TCG guest on a host whose cores are all busy can take seconds
TAKE_PROBE_S = 10.0
IDLE_PROBE_S = 5.0
IDLE_MISSES = 2  # probes in a row an idle VM's console may leave unanswered before it is replaced
RETRY_S = (2.0, 60.0)  # a failed background boot is tried again after this, doubling up to the second


def available_memory_mib() -> int:
    """The host's MemAvailable, in MiB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


class PoolRefused(Exception):
    """No VM can be had now; the message says why (the host's memory, the slot's limit)."""


@dataclass(frozen=True)
class PoolCounts:
    """What a slot's pool did and holds, for metrics: VMs ready, booting and in leases; boots
    (and their seconds) in all, failed boots, leases that waited for a cold boot, idle VMs
    replaced because their console stopped answering."""

    ready: int
    booting: int
    in_use: int
    boots: int
    boot_seconds: float
    boot_failures: int
    waits: int
    replaced: int


class Pool:
    """The VMs of one slot: ``make()`` a new VM (not started), ``warm`` of them kept booted."""

    def __init__(self, name: str, config: QemuConfig, make: Callable[[], VM], memory: Callable[[], int] | None = None):
        self.name, self.config, self.make = name, config, make
        self.memory = memory or available_memory_mib
        self.ready: list[VM] = []
        self.probing = 0  # idle VMs out of ``ready`` for their probe: a lease waits for them
        self._missed: dict[VM, int] = {}  # idle VMs whose last probes went unanswered: how many
        self.booting = 0
        self.in_use = 0
        self.boots = self.boot_failures = self.waits = self.replaced = 0
        self.boot_seconds = 0.0
        self.flushes = 0  # a VM out for its probe when the base changed is ended on its return
        self.last_error = ""  # why the last background boot failed ("" once one succeeded)
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # every VM made and not yet ended, wherever it is (booting for a lease, leased, being
        # ended): stop() ends them all, so a shutdown in the middle of a hand-out or a give-back
        # leaves no QEMU behind
        self._live: set[VM] = set()

    @property
    def limit(self) -> int:
        return self.config.instances + self.config.warm

    def counts(self) -> PoolCounts:
        with self._changed:
            return PoolCounts(len(self.ready), self.booting, self.in_use, self.boots, round(self.boot_seconds, 3),
                              self.boot_failures, self.waits, self.replaced)

    # ---- the thread that keeps it warm -------------------------------------------------------

    def start(self) -> None:
        if self.config.warm and self._thread is None:
            self._thread = threading.Thread(target=self._keep_warm, name=f"qemu-pool-{self.name}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """End the thread (a boot under way is cut) and every idle VM."""
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=self.config.boot_timeout + 15)
        with self._changed:
            idle, self.ready = self.ready, []
        for vm in idle:
            self._ended(vm)
        with self._changed:
            left = list(self._live)
        for vm in left:  # (a boot for a lease, a leased VM, one being given back)
            self._ended(vm)

    def flush(self) -> None:
        """End the idle VMs (booted from a base that just changed): the thread boots new ones."""
        with self._changed:
            idle, self.ready = self.ready, []
            self.flushes += 1
            self._changed.notify_all()
        for vm in idle:
            self._ended(vm)

    def _new(self) -> VM:
        vm = self.make()
        with self._changed:
            self._live.add(vm)
        return vm

    def _ended(self, vm: VM) -> None:
        vm.end()
        with self._changed:
            self._live.discard(vm)
            self._missed.pop(vm, None)

    def _room(self) -> str:
        """Why one more VM may not boot now ("" when it may). Called with the lock held."""
        if self.booting + len(self.ready) + self.probing + self.in_use >= self.limit:
            return f"slot {self.name} has its {self.limit} VMs (instances + warm) already"
        available = self.memory()
        if available < self.config.memory + HEADROOM_MIB:
            return (f"the host has {available} MiB of memory available; a VM of slot {self.name} needs "
                    f"{self.config.memory} MiB and {HEADROOM_MIB} MiB are kept for the host")
        return ""

    def _keep_warm(self) -> None:
        while not self._stop.is_set():
            try:
                self._warm_loop()
            except Exception:  # a bug must not leave the slot cold for good: logged, tried again
                log.exception("the pool of slot %s broke; going on in %g s", self.name, RETRY_S[1])
                self._stop.wait(RETRY_S[1])

    def _warm_loop(self) -> None:
        retry = RETRY_S[0]
        probed = time.monotonic()
        while not self._stop.is_set():
            with self._changed:
                want = len(self.ready) + self.probing + self.booting < self.config.warm
                room = self._room() if want else ""
                if not want or room:
                    if room:
                        self.last_error = room
                    self._changed.wait(min(PROBE_S, retry) if room else PROBE_S)
                    if self._stop.is_set():
                        return
                else:
                    self.booting += 1
            if want and not room:
                if self._boot_one():
                    retry = RETRY_S[0]
                else:
                    self._stop.wait(retry)
                    retry = min(retry * 2, RETRY_S[1])
            if time.monotonic() - probed >= PROBE_S:
                self._probe_idle()
                probed = time.monotonic()

    def _boot_one(self) -> bool:
        """Boot a VM into ``ready`` (``booting`` was counted for it)."""
        vm = self._new()
        try:
            seconds = vm.boot(self._stop)
        except Exception as exc:  # (VmError, OSError; anything else counted the same, never a count left high)
            with self._changed:  # (boot ended it)
                self._live.discard(vm)
                self.booting -= 1
                self.boot_failures += 1
                self.last_error = f"a VM of slot {self.name} did not boot: {exc}"
                self._changed.notify_all()
            if not self._stop.is_set():
                log.warning("%s", self.last_error)
            return False
        with self._changed:
            self.booting -= 1
            self.boots += 1
            self.boot_seconds += seconds
            self.last_error = ""
            stopped = self._stop.is_set()
            if not stopped:
                self.ready.append(vm)
            self._changed.notify_all()
        if stopped:
            self._ended(vm)
        else:
            log.info("VM %s of slot %s ready at its prompt, booted in %.1f s", vm.id, self.name, seconds)
        return True

    def _probe_idle(self) -> None:
        """End the idle VMs whose console left ``IDLE_MISSES`` probes in a row unanswered (the
        thread boots others)."""
        with self._changed:
            idle = list(self.ready)
        for vm in idle:
            with self._changed:
                if vm not in self.ready:  # handed out meanwhile
                    continue
                self.ready.remove(vm)
                self.probing += 1
                flushes = self.flushes
            answered = vm.probe(IDLE_PROBE_S)
            with self._changed:
                self.probing -= 1
                flushed = self.flushes != flushes  # (booted from the base that changed meanwhile)
                before = self._missed.pop(vm, 0)
                missed = 0 if answered else before + 1
                keep = not flushed and missed < IDLE_MISSES
                if keep:
                    if missed:
                        self._missed[vm] = missed
                    self.ready.append(vm)
                self._changed.notify_all()
            if keep:
                if missed:
                    log.info("a VM of slot %s left its console's probe unanswered; probed again in %g s",
                             self.name, PROBE_S)
                continue
            if not flushed:
                log.warning("a VM of slot %s stopped answering its console; replacing it", self.name)
            self._ended(vm)
            if not flushed:
                with self._changed:
                    self.replaced += 1
                    self._changed.notify_all()

    # ---- leases ------------------------------------------------------------------------------

    def take(self) -> VM:
        """A VM at its prompt for a lease: a warm one whose console answers, else one booted now.
        ``PoolRefused`` when none may boot (memory, the slot's limit); ``VmError`` when it did not boot."""
        while True:
            with self._changed:
                while not self.ready and self.probing:  # (a probe answers within IDLE_PROBE_S)
                    self._changed.wait(IDLE_PROBE_S)
                vm = self.ready.pop(0) if self.ready else None
                if vm is not None:
                    self._missed.pop(vm, None)
                if vm is None:
                    room = self._room()
                    if room:
                        raise PoolRefused(room)
                    self.in_use += 1
                    self.waits += 1
                    break
                self.in_use += 1
                self._changed.notify_all()  # the thread boots the next
            if vm.probe(TAKE_PROBE_S):
                return vm
            log.warning("a warm VM of slot %s did not answer its console; ending it", self.name)
            self._ended(vm)
            with self._changed:
                self.in_use -= 1
                self.replaced += 1
        vm = self._new()
        try:
            seconds = vm.boot()
        except BaseException:
            with self._changed:  # (boot ended it)
                self._live.discard(vm)
                self.in_use -= 1
                self.boot_failures += 1
                self._changed.notify_all()
            raise
        with self._changed:
            self.boots += 1
            self.boot_seconds += seconds
        return vm

    def give_back(self, vm: VM) -> None:
        """End a VM a lease used (its overlay goes with it); the thread boots the next."""
        try:
            self._ended(vm)
        finally:
            with self._changed:
                self.in_use -= 1
                self._changed.notify_all()
