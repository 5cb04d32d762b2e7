"""VM slots through a real coordinator and exporter (docs/architecture.md, "Virtual devices"):
a lease gets a fresh VM (warm from the pool), exec runs on its console, nothing survives into
the next lease, power cycles it through QMP, and a killed exporter leaves no QEMU behind.

A VM boots under TCG here (no KVM: CPU-bound, seconds each), so the module's tests that only
read from a leased VM, or power-cycle it, share one lease per device (``Lab.held``); a test
about a lease's own start or end (the warm hand-out, a VM that dies, a holder's power-off, a
killed exporter) makes and ends its own."""
from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import httpx2
import pytest

from conftest import WAIT_S, Coordinator, Exporter, wait_for
from helpers import reserve, run_cli, wait_state
from qemu_guests import BOOT_WAIT_S, aarch64_guest, guest_identity, ssh_guest, x86_64_guest  # noqa: F401 (fixtures)
from qemu_lab import slot_files, with_qemu
from device_loop.core.process import start_ticks
from device_loop.exporter.config import load_config, parse_entries
from device_loop.plugins.qemu.config import QemuConfig
from device_loop.plugins.qemu.guest import build_disk
from device_loop.plugins.qemu.isa import isa_tags
from device_loop.plugins.qemu.vm import Launch, argv

pytestmark = [pytest.mark.service, pytest.mark.timeout(240)]


def qemu_processes(state_dir: Path) -> dict[int, list[str]]:
    """The live QEMUs whose command line names a folder of ``state_dir``: pid -> argv."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            line = (proc / "cmdline").read_bytes().split(b"\0")[:-1]
        except OSError:
            continue
        words = [w.decode(errors="replace") for w in line]
        if words and "qemu-system" in words[0] and any(str(state_dir) in w for w in words) and \
                start_ticks(int(proc.name)) is not None:
            found[int(proc.name)] = words
    return found


def vm_folders(state_dir: Path) -> set[str]:
    """The VMs' folders of the moment (none while an exporter's start removes the last run's)."""
    try:
        return set(os.listdir(state_dir / "qemu" / "run"))
    except FileNotFoundError:  # (between a check that it exists and the listing, it may go)
        return set()


class Lab:
    def __init__(self, folder: Path, env: dict, guest, arm_guest, ssh_guest):
        self.folder, self.env = folder, with_qemu(env, folder / "entry-point")
        self.leases: dict[str, dict] = {}  # device -> the lease the tests share (held)
        # a lease that boots a VM is pending for as long as the boot takes: only the suite's
        # safety net fails it (the coordinator's own default, 30 s, is a TCG boot on a busy machine)
        self.coordinator = Coordinator(folder, self.env,
                                       extra=("--single-user", "--allocating-timeout", f"{WAIT_S:g}s"))
        self.state_dir = folder / "state-host-a"
        boot = {"boot_timeout": BOOT_WAIT_S}  # (the plugin's default, 25 s, is one on an idle machine)
        self.slots = [{"name": "vm", "plugin": "qemu", "instances": 2, "warm": 1, **boot,
                       **slot_files(self.state_dir, guest)},
                      {"name": "arm", "plugin": "qemu", "memory": 512, **boot,
                       **slot_files(self.state_dir, arm_guest, disk=False)},
                      {"name": "sshvm", "plugin": "qemu", "ssh": True, "ssh_host_key": ssh_guest.host_key,
                       "display": True, **boot, **slot_files(self.state_dir, ssh_guest, disk=False, folder="ssh")}]
        self.exporter = self.start_exporter()

    def start_exporter(self) -> Exporter:
        return Exporter(self.folder, self.env, self.coordinator.url, self.slots)

    def cli(self, *args, check=True):
        return run_cli(self.env, self.coordinator.url, *args, check=check)

    def warm_ready(self, count: int = 1) -> None:
        wait_for(lambda: self.exporter.output().count("ready at its prompt") >= count,
                 what=f"{count} VMs booted ahead")

    def active(self, lease_id: str) -> dict:
        """Wait for a lease whose VM may boot cold (longer than a board's start)."""
        def ready():
            lease = self.coordinator.api(f"/leases/{lease_id}", params={"wait": 5, "unless": "pending"}).json()
            assert lease["state"] in ("pending", "active"), lease
            return lease if lease["ready"] else None
        return wait_for(ready, what=f"{lease_id} ready")

    def held(self, device: str) -> dict:
        """The active lease on ``device`` that the tests share, reserved (its VM booted, or
        taken warm) only when none is held or the one held has ended."""
        lease = self.leases.get(device)
        if lease is not None:
            now = self.coordinator.api(f"/leases/{lease['id']}").json()
            if now.get("state") == "active" and now.get("ready"):
                return now
            self.leases.pop(device)
        wait_state(self.coordinator, device, "idle")
        self.leases[device] = self.active(reserve(self.coordinator, device)["id"])
        return self.leases[device]

    def give_back(self, device: str, then: str = "idle") -> None:
        """Release the lease held on ``device``; wait for the device's state ``then``."""
        lease = self.leases.pop(device)
        self.coordinator.api(f"/leases/{lease['id']}/release", "POST").raise_for_status()
        wait_state(self.coordinator, device, then)

    def stop(self):
        for lease in self.leases.values():  # (best effort: the exporter's stop ends their VMs anyway)
            self.coordinator.api(f"/leases/{lease['id']}/release", "POST")
        self.exporter.stop()
        self.coordinator.stop()


@pytest.fixture(scope="module")
def lab(tmp_path_factory, x86_64_guest, aarch64_guest, guest_identity):  # noqa: F811 (the fixtures)
    folder = tmp_path_factory.mktemp("qlab", numbered=True)
    home = folder / "home"
    home.mkdir()
    from conftest import DEFAULT_COORDINATOR_GUARD, HEARTBEAT_S  # noqa: F401
    from device_loop.core.plugins import LOAD_ENV
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVICE_LOOP_")}
    env.update(HOME=str(home), XDG_DATA_HOME=str(home / "data"), XDG_STATE_HOME=str(home / "state"),
               DEVICE_LOOP_USER="alice", DEVICE_LOOP_COORDINATOR=DEFAULT_COORDINATOR_GUARD.url,
               PYTHONUNBUFFERED="1", **{LOAD_ENV: ""})
    lab = Lab(folder, env, x86_64_guest, aarch64_guest, ssh_guest("x86_64", guest_identity))
    lab.identity = guest_identity
    yield lab
    lab.stop()
    assert qemu_processes(lab.state_dir) == {}, "the exporter's stop ends every VM"


def test_a_lease_gets_a_warm_vm_and_the_next_lease_sees_nothing_of_it(lab):
    wait_state(lab.coordinator, "vm-0", "idle")
    lab.warm_ready()
    (warm,) = vm_folders(lab.state_dir)

    began = time.monotonic()
    lease = lab.active(reserve(lab.coordinator, "vm-0")["id"])
    granted_s = time.monotonic() - began
    assert warm in vm_folders(lab.state_dir), "the lease took the VM booted ahead"
    wait_for(lambda: len(vm_folders(lab.state_dir)) == 2, what="the next VM booting")
    said = lab.cli("exec", lease["id"], "uname -m; echo kept > /data/mark; sync; cat /data/mark")
    assert said.stdout.split() == ["x86_64", "kept"], said.stdout

    lab.coordinator.api(f"/leases/{lease['id']}/release", "POST").raise_for_status()
    wait_state(lab.coordinator, "vm-0", "idle")
    assert warm not in vm_folders(lab.state_dir), "the used VM's folder (its overlay) is gone"

    lease = lab.active(reserve(lab.coordinator, "vm-0")["id"])
    said = lab.cli("exec", lease["id"], "test -e /data/mark && echo there || echo absent")
    assert said.stdout.split() == ["absent"], said.stdout
    lab.coordinator.api(f"/leases/{lease['id']}/release", "POST").raise_for_status()
    wait_state(lab.coordinator, "vm-0", "idle")
    print(f"warm lease active in {granted_s:.2f}s")

    def boots() -> float:
        text = httpx2.get(f"{lab.coordinator.url}/metrics", timeout=10).text
        line = next((line for line in text.splitlines() if line.startswith("device_loop_plugin_vm_boots{")), "")
        assert 'plugin="qemu"' in line or not line, line
        return float(line.rsplit(" ", 1)[1]) if line else 0.0
    wait_for(lambda: boots() >= 2, what="the pool's boots on /metrics")


def test_the_vm_s_command_line_is_the_slot_s_alone(lab):
    """A lease, and an operation's arguments, never reach QEMU's command line."""
    lease = lab.held("vm-1")
    refused = lab.coordinator.api(f"/leases/{lease['id']}/operations", "POST",
                                  json={"kind": "power", "args": {"action": "cycle", "qemu": "-device foo"}})
    assert refused.status_code == 422, refused.text
    config = load_config(lab.exporter.config_path)
    entry = parse_entries(config, {"qemu": QemuConfig})[0]

    def same() -> bool:  # (between a VM's folder and its QEMU, a boot or an end may be under way)
        expected = [argv(entry.config, Launch(lab.state_dir / "qemu" / "run" / folder, "tcg"),
                         "qemu-system-x86_64")[1:] for folder in vm_folders(lab.state_dir) if folder.startswith("vm-")]
        running = [words[1:] for words in qemu_processes(lab.state_dir).values()
                   if any("/qemu/run/vm-" in word for word in words)]
        return sorted(running) == sorted(expected)
    wait_for(same, what="each QEMU's command line to be its slot's")


def test_a_power_cycle_is_a_fresh_boot_seen_on_the_console(lab):
    lease = lab.held("vm-1")
    before = set(qemu_processes(lab.state_dir))
    said = lab.cli("power", "cycle", lease["id"], "--json", check=False)
    result = json.loads(said.stdout)
    assert said.returncode == 0, said.stdout + said.stderr
    assert result["result"]["verdict"] == "verified", result
    assert set(qemu_processes(lab.state_dir)) - before, "a new QEMU runs the device"
    wait_for(lambda: lab.cli("exec", lease["id"], "uname -m", check=False).stdout.strip() == "x86_64",
             interval=1, what="the console after the cycle")


def test_a_slot_whose_guest_runs_sshd_serves_it_and_exec_takes_it(lab):
    """The guest's port 22 forwarded by QEMU to a loopback port, relayed like a board's sshd, its
    host key pinned; exec prefers ssh to the console. Its screen (display = true) is QEMU's VNC
    server, relayed as a vnc endpoint."""
    wait_state(lab.coordinator, "sshvm", "idle")
    lease = lab.active(reserve(lab.coordinator, "sshvm")["id"])
    ssh = next(e for e in lease["endpoints"] if e["kind"] == "ssh")
    assert ssh["params"] == {"user": "root", "host_key": lab.slots[2]["ssh_host_key"]}
    screen = next(e for e in lease["endpoints"] if e["kind"] == "vnc")
    assert screen["role"] == "rfb"
    with socket.create_connection((screen["host"], screen["port"]), timeout=10) as sock:
        sock.settimeout(10)
        assert sock.recv(12).startswith(b"RFB 003."), "QEMU's VNC server, relayed"
    said = lab.cli("exec", "--identity", str(lab.identity), "--json", lease["id"], "uname -m; id -u")
    answer = json.loads(said.stdout)
    assert (answer["channel"], answer["stdout"].split()) == ("ssh", ["x86_64", "0"]), answer
    lab.coordinator.api(f"/leases/{lease['id']}/release", "POST").raise_for_status()
    wait_state(lab.coordinator, "sshvm", "idle")


@pytest.mark.parametrize("device", ["vm-1", "arm"])
def test_the_isa_tags_are_what_the_guest_s_cpuinfo_says(lab, device):
    """The table of a CPU model's features (isa.py) against the guest's own /proc/cpuinfo."""
    tags = lab.coordinator.api(f"/devices/{device}").json()["tags"]
    arch = "aarch64" if device == "arm" else "x86_64"
    cpu = "max,pauth-impdef=on" if arch == "aarch64" else "max"
    assert {"virtual", arch, *isa_tags(arch, cpu)} <= set(tags), tags
    assert ("sve2" in tags) == (arch == "aarch64")
    lease = lab.held(device)  # (for arm a cold boot: no VM kept ahead)
    said = lab.cli("exec", lease["id"], "grep -m1 -E '^(flags|Features)' /proc/cpuinfo")
    features = set(said.stdout.split(":", 1)[1].split())
    assert {"asimd" if tag == "neon" else tag for tag in isa_tags(arch, cpu)} <= features, said.stdout


def test_a_leased_vm_that_dies_fails_its_device_and_the_next_lease_gets_a_fresh_one(lab):
    lab.held("arm")
    (pid,) = [pid for pid, words in qemu_processes(lab.state_dir).items() if "qemu-system-aarch64" in words[0]]
    os.kill(pid, signal.SIGKILL)
    dead = wait_for(lambda: (d := lab.coordinator.api("/devices/arm").json())["health"] == "failed" and d,
                    what="the device failed")
    assert "its VM exited" in dead["health_reason"], dead
    lab.give_back("arm")
    lease = lab.held("arm")  # (kept for the next test that needs an aarch64 VM)
    assert lab.cli("exec", lease["id"], "uname -m").stdout.strip() == "aarch64"


def test_a_flash_in_a_lease_is_that_lease_s_and_only_an_admin_s_recovery_changes_the_base(lab):
    """Through the registry and the image cache, as a board's flash: a holder's flash writes
    their lease's VM disk, booted at its next power-on and gone at release (the next user never
    boots what the last one planted); the slot's base changes only by an admin's recovery, a
    known-good image."""
    content = lab.folder / "new-base"
    content.mkdir()
    (content / "hello").write_text("from the registry\n")
    image = build_disk(content, lab.folder / "base-2.qcow2", size_mib=16)
    lab.cli("images", "upload", str(image), "--name", "base-2", "--for", "vm-1")
    base = lab.state_dir / "qemu" / "images" / lab.slots[0]["disk"]
    before = base.read_bytes()
    lease = lab.held("vm-1")
    said = lab.cli("flash", lease["id"], "base-2", "--json", check=False)
    assert said.returncode == 0, said.stdout + said.stderr
    assert "this lease's VM disk" in json.loads(said.stdout)["message"], said.stdout
    assert base.read_bytes() == before, "the slot's base is not the holder's to change"
    lab.cli("power", "cycle", lease["id"], check=False)
    wait_for(lambda: lab.cli("exec", lease["id"], "cat /data/hello", check=False).stdout.strip()
             == "from the registry", interval=1, what="the flashed disk after a power cycle")

    lab.give_back("vm-1")
    lease = lab.held("vm-1")
    said = lab.cli("exec", lease["id"], "cat /data/hello 2>/dev/null || echo absent")
    assert said.stdout.split() == ["absent"], "what the last lease flashed is gone with it"

    lab.cli("images", "mark-good", "base-2", "--for", "vm-1")
    lab.give_back("vm-1")
    said = lab.cli("recover", "vm-1", "--json", check=False)  # an admin's, on a device nobody holds
    assert said.returncode == 0, said.stdout + said.stderr
    assert base.read_bytes() == image.read_bytes(), "an admin's recovery writes the slot's base"
    lease = lab.held("vm-1")
    assert lab.cli("exec", lease["id"], "cat /data/hello").stdout.strip() == "from the registry"


def test_a_guest_reaches_nothing_of_its_host_but_what_its_slot_forwards(lab):
    """From inside a real guest with a network (QEMU's user networking, restrict=on): the host's
    loopback services at 10.0.2.2 (the coordinator, another lease's VM console, any service a
    gate fronts) and the world beyond are out of reach; its own ssh forward still works."""
    wait_state(lab.coordinator, "sshvm", "idle")
    lease = lab.active(reserve(lab.coordinator, "sshvm")["id"])
    other = lab.held("vm-1")
    console = next(e for e in other["endpoints"] if e["role"] == "console")
    bystander = socket.create_server(("127.0.0.1", 0))  # a loopback service of the host, as a gate's inner one
    bystander.settimeout(0.1)
    ports = {"the coordinator": lab.coordinator.port, "vm-1's console": console["port"],
             "a loopback service": bystander.getsockname()[1]}
    try:
        for what, port in ports.items():
            said = lab.cli("exec", "--identity", str(lab.identity), "--json", lease["id"],
                           f"nc -w 3 10.0.2.2 {port} </dev/null >/dev/null 2>&1 && echo reached || echo refused")
            answer = json.loads(said.stdout)
            assert answer["channel"] == "ssh", answer  # (its own forward: what the slot gives it)
            assert answer["stdout"].split() == ["refused"], f"the guest reached {what}: {answer}"
        with pytest.raises(TimeoutError):
            bystander.accept()
    finally:
        bystander.close()
        lab.coordinator.api(f"/leases/{lease['id']}/release", "POST").raise_for_status()
    wait_state(lab.coordinator, "sshvm", "idle")


def test_a_vm_switched_off_by_its_holder_is_switched_on_by_an_admin_after_the_lease(lab):
    """The lab's rule for a device a person switched off holds for a VM slot too (faulty once
    the lease ends); between leases there is no VM, and an admin's on clears it."""
    lease = lab.held("arm")
    said = json.loads(lab.cli("power", "off", lease["id"], "--json", check=False).stdout)
    assert said["result"]["state_after_off"] == "off", said
    assert not [pid for pid, words in qemu_processes(lab.state_dir).items() if "qemu-system-aarch64" in words[0]]
    lab.give_back("arm", then="faulty")
    said = lab.cli("power", "on", "arm", "--json", check=False)
    assert said.returncode == 0, said.stdout + said.stderr
    # no VM runs between leases: no console could print, so none is waited for
    result = json.loads(said.stdout)["result"]
    assert result["verdict"] == "verified" and "first_byte_s" not in result, result
    wait_state(lab.coordinator, "arm", "idle")


def test_an_exporter_killed_with_vms_running_leaves_none_running(lab):
    for device in list(lab.leases):  # (the exporter started again would boot a VM for each live lease)
        lab.give_back(device)
    wait_state(lab.coordinator, "vm-0", "idle")
    lease = lab.active(reserve(lab.coordinator, "vm-0")["id"])
    running = qemu_processes(lab.state_dir)
    assert running, "a VM for the lease (and one booted ahead)"
    folders = vm_folders(lab.state_dir)
    lab.exporter.stop(signal.SIGKILL)
    wait_for(lambda: not set(qemu_processes(lab.state_dir)) & set(running),
             what="the QEMUs ended with their exporter, killed outright")

    lab.exporter = lab.start_exporter()
    wait_for(lambda: not vm_folders(lab.state_dir) & folders, what="their folders removed")
    lab.coordinator.api(f"/leases/{lease['id']}/release", "POST")
    wait_state(lab.coordinator, "vm-0", "idle")
