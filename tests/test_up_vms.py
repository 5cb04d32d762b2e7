"""`device-loop up`'s VM slots (cli/up_vms.py): one x86_64 and one aarch64 (SVE2) slot, warm
1, where QEMU is installed; without QEMU the lab starts as before and says why none is served."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import wait_for
from device_loop.cli import up_vms
from device_loop.cli.up import lab_config
from device_loop.exporter.config import parse_config, parse_entries
from device_loop.plugins.qemu.config import QemuConfig
from device_loop.plugins.qemu.isa import isa_tags
from device_loop.core.ports import free_port
from helpers import pid_alive, recorded_pids, run_cli
from prepare import guest_cache
from qemu_guests import BOOT_WAIT_S, aarch64_guest, x86_64_guest  # noqa: F401 (fixtures)
from qemu_lab import with_qemu


def test_without_qemu_no_slot_is_made_and_the_line_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-programs-here"))
    told = []
    entries, line = up_vms.vm_slots(tmp_path / "lab", {}, tmp_path / "cache", say=told.append)
    assert entries == [] and told == [], "nothing is built, nothing fetched"
    assert line.startswith("none; vm-x86_64: QEMU is not installed (apt-get install qemu-utils qemu-system-x86)")
    assert "vm-aarch64: QEMU is not installed (apt-get install qemu-utils qemu-system-arm)" in line
    assert not (tmp_path / "cache").exists()


def test_a_config_that_leaves_the_qemu_plugin_out_gets_no_slot(tmp_path):
    for plugins in ({"disable": ["qemu"]}, {"enable": ["sim", "uart"]}):
        assert up_vms.vm_slots(tmp_path, plugins, tmp_path / "cache") == (
            [], "none (--config leaves the qemu plugin out)")


def start_up(tmp_path: Path, env: dict, *args: str) -> tuple[subprocess.Popen, str, Path]:
    """``device-loop up`` with its data in ``tmp_path/lab``: (process, coordinator URL, log), once it says it is up."""
    port, log = free_port(), tmp_path / "up.log"
    proc = subprocess.Popen([sys.executable, "-m", "device_loop.cli", "up", "--data-dir", str(tmp_path / "lab"),
                             "--port", str(port), *args], env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    wait_for(lambda: "Ctrl-C stops the lab" in log.read_text() or proc.poll() is not None, what="lab up")
    assert proc.poll() is None, log.read_text()
    return proc, f"http://127.0.0.1:{port}", log


def stop_up(proc: subprocess.Popen, data_dir: Path) -> None:
    children = recorded_pids(data_dir / "up")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0
    assert not any(pid_alive(pid) for pid in children), "something outlived the lab"


@pytest.mark.service
@pytest.mark.timeout(120)
def test_up_without_qemu_on_path_starts_the_lab_as_before_and_says_why_no_vm(tmp_path, env):
    bare = tmp_path / "bin"  # a PATH without QEMU (nor anything else: the lab runs on its Python alone)
    bare.mkdir()
    proc, url, log = start_up(tmp_path, {**env, "PATH": str(bare)})
    try:
        said = log.read_text()
        assert "VMs          none; vm-x86_64: QEMU is not installed (apt-get install" in said, said
        assert "building the VM guests" not in said
        assert "--needs any" not in said
        wait_for(lambda: {"sim-board-0", "sim-board-1"} <= {
            line.split()[0] for line in run_cli(env, url, "ls").stdout.splitlines()[1:] if "idle" in line},
            what="the simulated boards idle")
        names = {line.split()[0] for line in run_cli(env, url, "ls").stdout.splitlines()[1:]}
        assert not names & set(up_vms.VM_SLOTS), names
    finally:
        stop_up(proc, tmp_path / "lab")


def path_without(folder: Path, *programs: str) -> str:
    """A PATH whose one folder, ``folder``, links every program of this PATH but ``programs``:
    this machine as it would be without them."""
    folder.mkdir(parents=True, exist_ok=True)
    for place in os.environ.get("PATH", os.defpath).split(os.pathsep):
        with contextlib.suppress(OSError):
            for program in Path(place).iterdir():
                link = folder / program.name
                if program.name not in programs and not link.exists() and os.access(program, os.X_OK):
                    link.symlink_to(program)
    return str(folder)


@pytest.mark.service
@pytest.mark.timeout(600)
def test_up_with_qemu_serves_an_x86_64_and_an_sve2_aarch64_slot_booted_ahead(
        short_tmp, env, monkeypatch, x86_64_guest, aarch64_guest):  # noqa: F811 (the fixtures)
    """Both slots as ``up`` makes them, checked as the exporter loads them; then a lab up on a
    machine with QEMU for x86_64 alone, whose slot (booted ahead) a ``--needs any`` reserve
    takes, end to end. (A VM boots under TCG, CPU-bound: the aarch64 slot's VM, SVE2 in its
    /proc/cpuinfo, boots in test_qemu_lab.py, with the same CPU model.)"""
    made = short_tmp / "made"
    with monkeypatch.context() as built:  # (the session's guests: the same build, not made again here)
        built.setattr(up_vms, "build_guest", {"x86_64": x86_64_guest, "aarch64": aarch64_guest}.get)
        entries, line = up_vms.vm_slots(made, {}, guest_cache())
    assert line == "vm-x86_64 (x86_64, 1 booting ahead: idle in ls once booted), vm-aarch64 (aarch64, 1 booting ahead: idle in ls once booted)"
    config = parse_config(lab_config(made, "http://127.0.0.1:9", None, entries))
    slots = {entry.device: entry.config for entry in parse_entries(config, {"qemu": QemuConfig}) if entry}
    assert {name: (slot.arch, slot.warm) for name, slot in slots.items()} == {
        "vm-x86_64": ("x86_64", 1), "vm-aarch64": ("aarch64", 1)}
    assert "sve2" in isa_tags("aarch64", slots["vm-aarch64"].cpu)  # (x86_64's: read from its VM below)
    for name in up_vms.VM_SLOTS:  # the guests' files are where a slot's must be: the exporter's state folder
        assert (made / "exporter" / "qemu" / "images" / name.removeprefix("vm-") / "vmlinuz").exists()

    tmp_path = short_tmp
    lab_env = {**with_qemu(env, tmp_path / "entry-point"),
               "PATH": path_without(tmp_path / "bin", "qemu-system-aarch64")}
    proc, url, log = start_up(tmp_path, lab_env, "--guest-cache", str(guest_cache()))
    try:
        said = log.read_text()
        assert ("VMs          vm-x86_64 (x86_64, 1 booting ahead: idle in ls once booted); vm-aarch64: QEMU is not installed "
                "(apt-get install qemu-system-arm)") in said, said
        assert "device-loop reserve --needs any --wait  (a fresh VM, booted ahead: vm-x86_64)" in said

        def devices() -> dict:
            return {d["name"]: d for d in json.loads(run_cli(env, url, "ls", "--json").stdout)}
        wait_for(lambda: devices().get("vm-x86_64", {}).get("state") == "idle", BOOT_WAIT_S,
                 what="the VM slot idle (its VM booted ahead)")
        vm = devices()["vm-x86_64"]
        assert vm["fidelity"] == "emulated" and {"x86_64", "avx2"} <= set(vm["tags"]), vm
        # what needs any fidelity lands on the VM; what needs real hardware, on a board
        virtual, real = (json.loads(run_cli(env, url, "reserve", "--needs", needs, "--tags", tag, "--wait",
                                            "--json").stdout) for needs, tag in (("any", "avx2"), ("real-hw", "sve2")))
        assert (virtual["device"], real["device"]) == ("vm-x86_64", "sim-board-1")
        ran = run_cli(env, url, "exec", "vm-x86_64", "--", "uname -m; grep -o -w -m1 avx2 /proc/cpuinfo").stdout
        assert ran.split() == ["x86_64", "avx2"]
        run_cli(env, url, "release", "vm-x86_64")
        run_cli(env, url, "release", "sim-board-1")
    finally:
        stop_up(proc, tmp_path / "lab")
    assert recorded_pids(tmp_path / "lab" / "exporter") == {}, "a VM outlived the lab"
