"""`device-loop up`'s VM slots (cli/up_vms.py): one x86_64 and one aarch64 (SVE2) slot, warm
1, where QEMU is installed; without QEMU the lab starts as before and says why none is served."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import wait_for
from device_loop.cli import up_vms
from device_loop.core.ports import free_port
from helpers import pid_alive, recorded_pids, run_cli
from qemu_guests import guest_cache, need_qemu
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
    wait_for(lambda: "Ctrl-C stops the lab" in log.read_text() or proc.poll() is not None, 60, what="lab up")
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
            30, what="the simulated boards idle")
        names = {line.split()[0] for line in run_cli(env, url, "ls").stdout.splitlines()[1:]}
        assert not names & set(up_vms.VM_SLOTS), names
    finally:
        stop_up(proc, tmp_path / "lab")


@pytest.mark.service
@pytest.mark.timeout(600)
def test_up_with_qemu_serves_an_x86_64_and_an_sve2_aarch64_slot_booted_ahead(short_tmp, tmp_path_factory, env):
    for arch in ("x86_64", "aarch64"):
        need_qemu(arch)
    tmp_path = short_tmp
    lab_env = with_qemu(env, tmp_path / "entry-point")
    proc, url, log = start_up(tmp_path, lab_env, "--guest-cache", str(guest_cache(tmp_path_factory)))
    try:
        said = log.read_text()
        assert "VMs          vm-x86_64 (x86_64, 1 booted ahead), vm-aarch64 (aarch64, 1 booted ahead)" in said, said
        assert "device-loop reserve --needs any --wait  (a fresh VM, booted ahead: vm-x86_64 or vm-aarch64)" in said
        for name in up_vms.VM_SLOTS:  # the guests' files are where a slot's must be: the exporter's state folder
            assert (tmp_path / "lab" / "exporter" / "qemu" / "images" / name.removeprefix("vm-") / "vmlinuz").exists()

        def devices() -> dict:
            return {d["name"]: d for d in json.loads(run_cli(env, url, "ls", "--json").stdout)}
        wait_for(lambda: all(devices().get(name, {}).get("state") == "idle" for name in up_vms.VM_SLOTS), 300,
                 what="both VM slots idle")
        vms = devices()
        assert {vms[name]["fidelity"] for name in up_vms.VM_SLOTS} == {"emulated"}
        assert "sve2" in vms["vm-aarch64"]["tags"] and "x86_64" in vms["vm-x86_64"]["tags"]
        # what needs SVE2 and any fidelity lands on the VM; what needs real hardware, on the board with SVE2
        virtual, real = (json.loads(run_cli(env, url, "reserve", "--needs", needs, "--tags", "sve2", "--wait",
                                            "--json").stdout) for needs in ("any", "real-hw"))
        assert (virtual["device"], real["device"]) == ("vm-aarch64", "sim-board-1")
        ran = run_cli(env, url, "exec", "vm-aarch64", "--", "uname -m; grep -o -w -m1 sve2 /proc/cpuinfo").stdout
        assert ran.split() == ["aarch64", "sve2"]
        run_cli(env, url, "release", "vm-aarch64")
        run_cli(env, url, "release", "sim-board-1")
    finally:
        stop_up(proc, tmp_path / "lab")
    assert recorded_pids(tmp_path / "lab" / "exporter") == {}, "a VM outlived the lab"
