"""`device-loop up`'s VM slots (cli/up_vms.py): one x86_64 and one aarch64 (SVE2) slot, warm
1, where QEMU is installed; without QEMU the lab starts as before and says why none is served."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import wait_for
from device_loop.cli import up_vms
from device_loop.core.ports import free_port
from helpers import pid_alive, recorded_pids, run_cli


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
    """``device-loop up`` in a folder of its own: (process, coordinator URL, log), once it says it is up."""
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
        wait_for(lambda: {"sim-board-0", "sim-board-1"} <= {
            line.split()[0] for line in run_cli(env, url, "ls").stdout.splitlines()[1:] if "idle" in line},
            30, what="the simulated boards idle")
        names = {line.split()[0] for line in run_cli(env, url, "ls").stdout.splitlines()[1:]}
        assert not names & set(up_vms.VM_SLOTS), names
    finally:
        stop_up(proc, tmp_path / "lab")
