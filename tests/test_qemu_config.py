"""A VM slot's config is the admin's and is checked at load (docs/architecture.md, "Virtual
devices"): files inside the state folder only, bounded memory and cores, no unknown key, a
kernel command line that is one line; and nothing but the config makes QEMU's command line."""
from __future__ import annotations

import inspect
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from device_loop.exporter.config import ConfigError, parse_config, parse_entries
from device_loop.plugins.qemu import vm
from device_loop.plugins.qemu.config import QemuConfig, host_memory_mib
from device_loop.plugins.qemu import kvm
from device_loop.plugins.qemu.isa import isa_tags
from device_loop.plugins.qemu.kvm import MARKER, boot_sector


def load(tmp_path, **keys):
    """The slot ``vm`` with ``keys``, as the exporter loads it: its parsed config, or ``ConfigError``."""
    config = parse_config({"exporter": {"name": "t", "state_dir": str(tmp_path / "state")},
                           "devices": [{"name": "vm", "plugin": "qemu", **keys}]})
    (entry,) = parse_entries(config, {"qemu": QemuConfig})
    return entry.config


def refusal(tmp_path, **keys) -> str:
    with pytest.raises(ConfigError) as refused:
        load(tmp_path, **keys)
    return str(refused.value)


def test_relative_files_are_in_the_images_folder_and_links_are_followed(tmp_path):
    images = tmp_path / "state" / "qemu" / "images"
    images.mkdir(parents=True)
    (images / "linked").symlink_to(images / "vmlinuz")
    config = load(tmp_path, kernel="vmlinuz", initrd=str(images / "initrd.gz"), disk="linked")
    assert config.kernel == str((images / "vmlinuz").resolve())
    assert config.initrd == str((images / "initrd.gz").resolve())
    assert config.disk == config.kernel


@pytest.mark.parametrize("key", ["kernel", "initrd", "disk"])
def test_a_file_outside_the_state_folder_is_refused_naming_its_key(tmp_path, key):
    images = tmp_path / "state" / "qemu" / "images"
    images.mkdir(parents=True)
    (images / "escape").symlink_to("/etc/shadow")
    for path in ("/etc/shadow", "../../../outside", "escape", str(tmp_path / "state")):
        keys = {"kernel": "vmlinuz", key: path}
        message = refusal(tmp_path, **keys)
        assert f"{key}: " in message and "outside the exporter's state folder" in message, message


def test_the_vms_own_folder_is_no_place_for_a_base(tmp_path):
    assert "where the VMs' own files come and go" in refusal(tmp_path, kernel="../run/x/disk.qcow2")


def test_absurd_memory_cores_and_counts_are_refused_naming_the_key(tmp_path):
    assert "memory: " in refusal(tmp_path, kernel="k", memory=16)
    assert "memory: " in refusal(tmp_path, kernel="k", memory=1 << 20)
    if host_memory_mib() // 2 < 16384:
        assert "more than half this host's RAM" in refusal(tmp_path, kernel="k", memory=16384)
    assert "cores: " in refusal(tmp_path, kernel="k", cores=(os.cpu_count() or 1) + 1)
    assert "instances: " in refusal(tmp_path, kernel="k", instances=17)
    assert "more than instances" in refusal(tmp_path, kernel="k", instances=1, warm=2)
    assert "boot_timeout: " in refusal(tmp_path, kernel="k", boot_timeout="2h")


def test_an_unknown_key_is_refused_with_the_closest_known_one(tmp_path):
    assert "unknown key 'memroy'; did you mean 'memory'?" in refusal(tmp_path, kernel="k", memroy=256)
    assert "unknown key 'qemu_args'" in refusal(tmp_path, kernel="k", qemu_args=["-device", "x"])


def test_nothing_in_a_key_becomes_a_qemu_option(tmp_path):
    assert "cpu: " in refusal(tmp_path, kernel="k", cpu="max -device foo")
    assert "cpu: " in refusal(tmp_path, kernel="k", cpu="-device")
    assert "machine: " in refusal(tmp_path, kernel="k", machine="pc,accel=kvm")
    assert "append: " in refusal(tmp_path, kernel="k", append="quiet\n-device foo")
    assert "append: " in refusal(tmp_path, kernel="k", append="x" * 1025)
    assert "prompt: not a regex" in refusal(tmp_path, kernel="k", prompt="[")
    assert "ssh_host_key: " in refusal(tmp_path, kernel="k", ssh=True, ssh_host_key="-oProxyCommand=x")
    assert "ssh_user: " in refusal(tmp_path, kernel="k", ssh=True, ssh_user="-oProxyCommand=x")


def test_qemu_s_command_line_is_made_of_the_config_alone(tmp_path):
    """``argv`` takes the config, where the VM lives, and the program: no lease, no operation,
    no argument of anyone's. Each config value is one argument, never split."""
    assert list(inspect.signature(vm.argv).parameters) == ["config", "launch", "program"]
    config = load(tmp_path, kernel="k", append="quiet init=/bin/sh -device x")
    line = vm.argv(config, vm.Launch(tmp_path / "run", "tcg"), "qemu-system-x86_64")
    assert line[line.index("-append") + 1] == "console=ttyS0 quiet init=/bin/sh -device x"
    assert line.count("-device") == 0 and line[line.index("-accel") + 1] == "tcg"


def test_the_cpu_model_and_machine_default_per_architecture_with_their_isa_tags(tmp_path):
    x86, arm = load(tmp_path, kernel="k"), load(tmp_path, kernel="k", arch="aarch64")
    assert (x86.cpu_model, x86.machine_name, x86.command_line()) == ("max", "pc", "console=ttyS0 quiet")
    assert (arm.cpu_model, arm.machine_name) == ("max,pauth-impdef=on", "virt")
    assert "sve2" in isa_tags("aarch64", arm.cpu_model) and "avx2" in isa_tags("x86_64", x86.cpu_model)
    assert "sve" not in isa_tags("aarch64", "cortex-a72") and isa_tags("x86_64", "qemu64") == ()


@pytest.mark.service  # (it runs as and ld)
def test_the_kvm_try_boots_the_sector_its_source_makes(tmp_path):
    """kvm.py's bytes are kvm_try.S assembled as its header says (binutils: ./lab test installs it)."""
    sector = boot_sector()
    assert len(sector) == 512 and sector.endswith(b"\x55\xaa") and MARKER in sector
    source = Path(kvm.__file__).with_name("kvm_try.S")
    assert shutil.which("as") and shutil.which("ld"), "binutils (as, ld) is not installed: ./lab test installs it"
    subprocess.run(["as", "--64", "-o", tmp_path / "t.o", source], check=True)
    subprocess.run(["ld", "-Ttext=0x7c00", "-e", "_start", "--oformat", "binary", "-o", tmp_path / "t.bin",
                    tmp_path / "t.o"], check=True)
    assert (tmp_path / "t.bin").read_bytes() == sector


def test_a_kvm_try_s_output_says_where_its_guest_stopped():
    assert kvm.stopped_at(b"rplc") == "at cmpxchg16b (after cpuid)"
    assert kvm.stopped_at(b"") == "at real mode (it printed nothing)"
    assert kvm.stopped_at(b"rpx") == "at long mode with paging (after protected mode)"
    assert kvm.stopped_at(b"rplcxis") == "before its marker"


def test_a_pinned_host_key_longer_than_an_endpoint_carries_is_refused_for_a_slot_and_a_board(tmp_path):
    """One bound for a key an endpoint carries (core/ssh_keys.py pinned_host_key), in both
    plugins that pin one."""
    from device_loop.plugins.ssh import SshConfig
    long_key = "ssh-rsa " + "A" * 600
    assert "more than an endpoint carries" in refusal(tmp_path, kernel="k", ssh=True, ssh_host_key=long_key)
    with pytest.raises(ValueError, match="more than an endpoint carries"):
        SshConfig.model_validate({"host_key": long_key})
