"""A VM slot in an exporter of this process (docs/architecture.md, "Virtual devices"): the
devices it is, their resources, tags, fidelity and health, KVM tried, the base files'
digests, a flash of the base, and the pool's limits. No VM boots here (test_qemu_lab.py
boots them)."""
from __future__ import annotations

import hashlib
import os
import re
import threading
import time

import pytest

from device_loop.core.model import FlashImage, Operation, OperationError
from device_loop.core.vocabulary import Purpose
from device_loop.core.plugins import LOAD_ENV
from device_loop.exporter.config import parse_config
from device_loop.exporter.daemon import Exporter as InProcessExporter
from device_loop.plugins.qemu.config import QemuConfig
from device_loop.plugins.qemu.kvm import MARKER, STEPS, try_kvm
from device_loop.plugins.qemu.pool import Pool, PoolRefused
from conftest import WAIT_S, wait_for
from qemu_lab import ENTRY_POINT, with_qemu

pytestmark = pytest.mark.service  # the exporter's start tries KVM: a QEMU run


@pytest.fixture
def exporter(tmp_path, short_tmp, monkeypatch):
    folder = tmp_path / "entry-point"
    monkeypatch.setenv(LOAD_ENV, with_qemu(dict(os.environ), folder)[LOAD_ENV])
    monkeypatch.syspath_prepend(str(folder))  # (entry points are read from sys.path)
    state = short_tmp / "state"
    images = state / "qemu" / "images"
    images.mkdir(parents=True)
    (images / "vmlinuz").write_bytes(b"kernel")
    (images / "initrd.gz").write_bytes(b"initrd one")
    config = parse_config({"exporter": {"name": "host-a", "state_dir": str(state),
                                        "coordinator": "http://127.0.0.1:9"},
                           "plugins": {"enable": ["qemu"]},
                           "devices": [{"name": "vm", "plugin": "qemu", "class": "vm-x86", "tags": ["lab"],
                                        "kernel": "vmlinuz", "initrd": "initrd.gz", "instances": 2}]})
    exporter = InProcessExporter(config)
    exporter.setup()
    yield exporter
    exporter.shutdown()


def test_a_slot_is_its_instances_each_with_console_power_and_flash(exporter):
    assert ENTRY_POINT.startswith("qemu =") and exporter.loaded == ["qemu"]
    resources = exporter.discover()
    assert sorted((r.device, r.kind) for r in resources) == [
        (device, kind) for device in ("vm-0", "vm-1") for kind in ("flash", "power", "uart")]
    uart = next(r for r in resources if r.kind == "uart" and r.device == "vm-0")
    assert uart.identifier == "qemu:host-a:vm-0" and uart.device_class == "vm-x86"
    assert uart.tags[:3] == ("lab", "virtual", "x86_64") and "avx2" in uart.tags
    assert uart.fidelity == "emulated" and uart.node.endswith("qemu/consoles/vm-0")
    assert exporter.unserved(resources) == [], "the entry is found though no device is called 'vm'"
    assert exporter.health(uart).status == "ok"
    facts = exporter.plugins.call("qemu", "devloop_fingerprint", host=exporter.host, resource=uart)
    assert facts["fidelity.detail"] == "TCG" and facts["qemu.cpu"] == "max" and facts["qemu.machine"] == "pc"
    assert facts["qemu.version"].startswith("QEMU emulator version")
    metrics = exporter.plugins.call("qemu", "devloop_metrics", host=exporter.host)
    assert metrics["vm_ready"] == 0 and metrics["slot_vm_boots"] == 0 and metrics["vm_waits"] == 0
    assert all(re.fullmatch(r"[a-z][a-z0-9_]{0,63}", name) for name in metrics) and len(metrics) <= 64


def test_a_base_file_that_changed_behind_the_exporter_fails_until_a_flash_records_it(exporter, tmp_path):
    uart = next(r for r in exporter.discover() if r.kind == "uart")
    initrd = exporter.host.state_dir / "qemu" / "images" / "initrd.gz"
    initrd.write_bytes(b"initrd two, written by someone")
    health = exporter.health(uart)
    assert health.status == "failed" and "changed since it was hashed" in health.reason, health

    image = tmp_path / "new-initrd"
    image.write_bytes(b"initrd three")
    digest = hashlib.sha256(image.read_bytes()).hexdigest()
    flash = next(r for r in exporter.discover() if r.kind == "flash" and r.device == uart.device)
    (kind,) = exporter.plugins.call("qemu", "devloop_operations", host=exporter.host, resource=flash)
    assert kind.destructive and kind.exclusive
    # an admin's recovery (a known-good image) replaces the slot's base
    said = exporter.plugins.call("qemu", "devloop_operate", host=exporter.host, resource=flash,
                                 op=Operation("op-1", kind.kind, uart.device, "admin", {},
                                              image=FlashImage(image, digest, image.stat().st_size, "initrd"),
                                              purpose=Purpose.RECOVERY))
    assert "checked by read-back" in said and initrd.read_bytes() == b"initrd three"
    assert exporter.health(uart).status == "ok"


def test_a_flash_in_a_lease_never_touches_the_slot_s_base(exporter, tmp_path):
    """A holder's flash writes their lease's VM alone: with no VM of a lease on the device there
    is nothing it may write, and the base stays as it is (test_qemu_lab.py: with a VM)."""
    flash = next(r for r in exporter.discover() if r.kind == "flash" and r.device == "vm-0")
    image = tmp_path / "planted"
    image.write_bytes(b"planted by the last user")
    digest = hashlib.sha256(image.read_bytes()).hexdigest()
    initrd = exporter.host.state_dir / "qemu" / "images" / "initrd.gz"
    with pytest.raises(OperationError, match="no VM of a lease runs on vm-0") as refused:
        exporter.plugins.call("qemu", "devloop_operate", host=exporter.host, resource=flash,
                              op=Operation("op-2", "flash", "vm-0", "mallory", {},
                                           image=FlashImage(image, digest, image.stat().st_size, "planted")))
    assert refused.value.changed is False and initrd.read_bytes() == b"initrd one"


def test_a_base_disk_that_names_a_host_file_fails_its_slot_and_is_never_flashed_in(exporter, tmp_path):
    """The slot's configured disk is held to the same check as a user's image: a qcow2 over a
    backing file (or with an external data file) would have QEMU open that file of the host."""
    import subprocess

    images = exporter.host.state_dir / "qemu" / "images"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(images / "whole.qcow2"), "1M"], check=True,
                   timeout=60)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(images / "whole.qcow2"), "-F", "qcow2",
                    str(images / "over.qcow2")], check=True, timeout=60)
    config = QemuConfig.model_validate({"kernel": "vmlinuz", "disk": "over.qcow2"},
                                       context={"state_dir": exporter.host.state_dir})
    plugin = exporter.plugins.pm.get_plugin("qemu")
    plugin.images.check_base(config.disk)
    assert "over a backing file" in plugin.images.problem(config.files())

    flash = next(r for r in exporter.discover() if r.kind == "flash" and r.device == "vm-1")
    disk, whole = images / "over.qcow2", images / "whole.qcow2"
    digest, before = hashlib.sha256(disk.read_bytes()).hexdigest(), whole.read_bytes()
    slot = plugin.slot_of["vm-1"]
    slot.config = slot.config.model_copy(update={"disk": str(whole)})  # (a slot with a disk: the flash writes one)
    with pytest.raises(OperationError, match="may not be booted: it is a qcow2 over a backing file"):
        exporter.plugins.call("qemu", "devloop_operate", host=exporter.host, resource=flash,
                              op=Operation("op-3", "flash", "vm-1", "admin", {},
                                           image=FlashImage(disk, digest, disk.stat().st_size, "over"),
                                           purpose=Purpose.RECOVERY))
    assert whole.read_bytes() == before and not list(images.glob(".*.flash"))


def test_a_missing_base_fails_the_slot(exporter, tmp_path):
    uart = next(r for r in exporter.discover() if r.kind == "uart")
    (exporter.host.state_dir / "qemu" / "images" / "vmlinuz").unlink()
    assert exporter.health(uart).reason.startswith("its kernel ") and exporter.health(uart).status == "failed"


def test_the_kvm_try_reaches_its_marker_when_the_accelerator_works(tmp_path):
    from device_loop.core.host import HostContext

    host = HostContext(name="t", state_dir=tmp_path)
    assert try_kvm(host, "tcg").works, "TCG runs the try's guest: the try itself is sound"
    letters = "".join(letter for letter, _ in STEPS).encode()
    assert (tmp_path / "qemu" / "tcg-try" / "serial.out").read_bytes().startswith(letters + MARKER), \
        "the guest prints kvm.py's STEPS in their order (kvm_try.S and kvm.py say the same steps)"
    verdict = try_kvm(host, "kvm")
    assert verdict.works or verdict.reason == "no /dev/kvm" or (
        "did not run: it stopped at " in verdict.reason), verdict


def test_the_pool_boots_nothing_without_the_memory_or_past_its_limit():
    config = QemuConfig.model_validate({"kernel": "/s/k", "instances": 1, "warm": 1, "memory": 256},
                                       context={"state_dir": "/s"})
    pool = Pool("vm", config, make=lambda: pytest.fail("nothing may boot"), memory=lambda: 700)
    with pytest.raises(PoolRefused, match="700 MiB of memory available.*needs 256 MiB and 512 MiB"):
        pool.take()
    pool = Pool("vm", config, make=lambda: pytest.fail("nothing may boot"), memory=lambda: 1 << 20)
    pool.in_use, pool.booting = 1, 1
    with pytest.raises(PoolRefused, match="has its 2 VMs"):
        pool.take()


def test_a_boot_that_breaks_is_counted_and_the_pool_keeps_trying():
    config = QemuConfig.model_validate({"kernel": "/s/k", "instances": 1, "warm": 1}, context={"state_dir": "/s"})

    class Broken:
        id = "broken"

        def boot(self, stop=None):
            raise RuntimeError("a bug, not a VmError")

    pool = Pool("vm", config, make=Broken, memory=lambda: 1 << 20)
    pool.start()
    try:
        wait_for(lambda: pool.counts().boot_failures >= 1, what="the failed boot counted")
        counts = pool.counts()
        assert (counts.booting, counts.ready) == (0, 0) and "a bug, not a VmError" in pool.last_error
        assert pool._thread is not None and pool._thread.is_alive()
    finally:
        pool.stop()


def test_a_state_folder_too_deep_for_a_qmp_socket_fails_the_slot_before_any_lease(exporter):
    """A VM's QMP socket lives in the state folder: where its path would pass the 107 bytes a
    unix socket holds, every boot would fail, so the slot's devices say so and are not offered."""
    resources = exporter.discover()
    uart = next(r for r in resources if r.kind == "uart" and r.device == "vm-0")
    assert exporter.health(uart).status == "ok"
    exporter.host.state_dir = exporter.host.state_dir / ("d" * 60) / ("e" * 60)
    health = exporter.health(uart)
    assert health.status == "failed" and "too long for a VM's QMP socket" in health.reason


def test_the_pool_s_stop_ends_a_vm_a_lease_holds_and_one_being_given_back():
    """The exporter's shutdown may come while a lease holds a VM or while its stop ends one in
    another thread: the pool ends every VM it made and has not ended, and a second end waits
    for the first (vm.py's power lock), so no QEMU outlives the exporter."""
    config = QemuConfig.model_validate({"kernel": "/s/k", "instances": 2, "warm": 0}, context={"state_dir": "/s"})
    ended = []

    class Recorded:
        def boot(self, stop=None):
            return 0.1

        def end(self):
            ended.append(self)

    pool = Pool("vm", config, make=Recorded, memory=lambda: 1 << 20)
    held, given_back = pool.take(), pool.take()
    pool.give_back(given_back)
    assert ended == [given_back]
    pool.stop()
    assert ended == [given_back, held], "the VM a lease held is ended with the pool"


def _idle_pool(probe):
    """A pool of one slot with one VM ready (booted by ``take``, given back to ``ready`` as the
    warm thread would leave it) whose console answers as ``probe(vm, timeout)`` says."""
    config = QemuConfig.model_validate({"kernel": "/s/k", "instances": 1, "warm": 1}, context={"state_dir": "/s"})
    made, ended = [], []

    class Stand:
        id = "stand-in"

        def boot(self, stop=None):
            return 0.1

        def probe(self, timeout):
            return probe(self, timeout)

        def end(self):
            ended.append(self)

    def make():
        made.append(Stand())
        return made[-1]

    pool = Pool("vm", config, make=make, memory=lambda: 1 << 20)
    with pool._changed:
        pool.booting += 1  # (as the warm thread counts a boot before it)
    assert pool._boot_one() and pool.counts().ready == 1
    return pool, made, ended


def test_a_lease_that_comes_while_the_warm_vm_is_probed_waits_for_it_and_boots_nothing():
    """The idle probe takes the warm VM out of ``ready`` while its console answers (under load,
    seconds): a lease that comes then gets that VM once it answers, not a cold boot."""
    probed, answer = threading.Event(), threading.Event()

    def probe(vm, timeout):
        if not probed.is_set():  # (the idle probe's; the lease's own probe answers at once)
            probed.set()
            return answer.wait(timeout)
        return True

    pool, made, ended = _idle_pool(probe)
    prober = threading.Thread(target=pool._probe_idle)
    prober.start()
    probed.wait(WAIT_S)
    taken: list = []
    taker = threading.Thread(target=lambda: taken.append(pool.take()))
    taker.start()
    # (the Condition's own waiters: the lease's take is in its wait, else it booted one cold)
    wait_for(lambda: len(made) > 1 or len(pool._changed._waiters) == 1,  # type: ignore[attr-defined]
             what="the lease waiting for the probe")
    assert len(made) == 1 and not taken
    answer.set()
    prober.join(WAIT_S)
    taker.join(WAIT_S)
    assert taken == made == [made[0]] and pool.counts().waits == 0, "the probed VM, and no cold boot"
    assert ended == []


def test_an_idle_vm_is_replaced_only_when_two_probes_in_a_row_go_unanswered():
    answers = iter([False, True, False, False])
    pool, made, ended = _idle_pool(lambda vm, timeout: next(answers))
    for expected_ready in (1, 1, 1, 0):
        pool._probe_idle()
        assert pool.counts().ready == expected_ready
    assert ended == made and pool.counts().replaced == 1, "a miss, an answer, then two misses"


@pytest.mark.timeout(180)
def test_a_boot_s_budget_is_the_time_qemu_runs_so_a_loaded_host_does_not_fail_it(short_tmp):
    """A boot's ``boot_timeout`` counts QEMU's own CPU time: starved to a sixth of the clock
    (stopped half a second in each 0.6 s, as a loaded host's scheduler would), a guest that
    boots in some 2.3 s of its own time on a quiet host (4 s and more beside the whole suite:
    a busy host's caches cost it too) boots within an 8 s budget though it takes far longer
    on the clock; a budget smaller than what the boot needs still ends it, saying so."""
    import signal

    from device_loop.core.host import HostContext
    from device_loop.plugins.qemu.vm import VM, VmError
    from qemu_guests import prepared_guest
    from qemu_lab import slot_files

    host = HostContext(name="host-a", state_dir=short_tmp / "state")  # (a QMP socket's path: 107 bytes at most)
    keys = slot_files(host.state_dir, prepared_guest("x86_64"), disk=False)

    def boot(budget_s: float) -> tuple[float, float, str]:
        """(seconds on the clock, QEMU's CPU seconds, why it failed or "")."""
        config = QemuConfig.model_validate({**keys, "boot_timeout": budget_s}, context={"state_dir": host.state_dir})
        vm, done, said = VM(host, config, "slot-0", "tcg"), threading.Event(), [""]

        def starve() -> None:  # (SIGSTOP and SIGCONT: no CPU spent to make the host busy)
            while not done.is_set():
                pid = vm.proc.pid if vm.proc is not None else None
                if pid is not None:
                    os.kill(pid, signal.SIGSTOP)
                    done.wait(0.5)
                    os.kill(pid, signal.SIGCONT)
                done.wait(0.1)
        starver = threading.Thread(target=starve, daemon=True)
        starver.start()
        began = time.monotonic()
        try:
            vm.boot()
        except VmError as exc:
            said[0] = str(exc)
        finally:
            done.set()
            starver.join(10)
        took, ran = time.monotonic() - began, vm.ran_s()
        vm.end()
        return took, ran, said[0]

    took, ran, failed = boot(8.0)
    assert not failed, failed
    assert ran <= 8.0 < took, f"{took:.1f}s on the clock, {ran:.1f}s of QEMU's: not starved as meant"
    took, ran, failed = boot(0.5)
    assert "no prompt on the console after QEMU ran" in failed and "boot_timeout (0.5s" in failed, failed
