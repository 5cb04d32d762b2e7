"""The guest a VM slot boots (plugins/qemu/guest.py): its initramfs and module order from
their bytes, and both architectures' guests booted by hand under TCG to a prompt that
``exec`` drives."""
from __future__ import annotations

import gzip
import json
import subprocess
import socket
import stat
import struct
from pathlib import Path
from typing import NamedTuple

import pytest

from device_loop.core.device_exec import ExecError, exec_on_lease
from device_loop.core.errors import ErrorCode
from device_loop.plugins.qemu import guest
from device_loop.plugins.qemu.guest import (ARCHES, PROMPT, PROMPT_PATTERN, Entry, Guest, GuestError,
                                            GuestNotFetched, build_disk, build_guest, cpio_newc, fetch_guest,
                                            gzip_cpio, init_script, is_static, load_order, modinfo)
import prepare
from conftest import wait_for
from device_loop.core.ports import free_port
from qemu_guests import booted, guest_identity, prepared_guest, ssh_guest  # noqa: F401 (fixtures)


# ---- bytes ---------------------------------------------------------------------------------

def read_cpio(data: bytes) -> dict[str, tuple[int, bytes, tuple[int, int]]]:
    """A newc archive read back: path -> (mode, data, (rdev major, minor)), up to its trailer."""
    files, at = {}, 0
    while True:
        assert data[at:at + 6] == b"070701", f"no newc header at {at}"
        fields = [int(data[at + 6 + 8 * n:at + 14 + 8 * n], 16) for n in range(13)]
        mode, size, name_size = fields[1], fields[6], fields[11]
        name = data[at + 110:at + 110 + name_size - 1].decode()
        at += 110 + name_size
        at += -at % 4
        body = data[at:at + size]
        at += size
        at += -at % 4
        if name == "TRAILER!!!":
            assert data[at:].strip(b"\0") == b""
            return files
        assert name not in files, f"{name} twice"
        files[name] = (mode, body, (fields[9], fields[10]))


def test_the_initramfs_is_newc_with_every_folder_made_first():
    archive = cpio_newc([Entry("bin/busybox", b"\x7fELF...", 0o755), Entry("bin/sh", b"busybox", 0o777, "symlink"),
                         Entry("dev/console", kind="char", mode=0o600, device=(5, 1)),
                         Entry("lib/modules/virtio.ko", b"x" * 5), Entry("init", b"#!/bin/sh\n", 0o755)])
    files = read_cpio(archive)
    assert list(files)[:2] == ["bin", "bin/busybox"]  # a folder before what it holds
    assert stat.S_ISDIR(files["lib"][0]) and stat.S_ISDIR(files["lib/modules"][0])
    assert files["bin/busybox"][0] == stat.S_IFREG | 0o755 and files["bin/busybox"][1] == b"\x7fELF..."
    assert stat.S_ISLNK(files["bin/sh"][0]) and files["bin/sh"][1] == b"busybox"
    assert stat.S_ISCHR(files["dev/console"][0]) and files["dev/console"][2] == (5, 1)
    assert files["lib/modules/virtio.ko"][1] == b"xxxxx"


def test_the_same_files_give_the_same_initramfs():
    entries = [Entry("init", b"#!/bin/sh\n", 0o755), Entry("etc/modules", b"virtio\n")]
    assert gzip_cpio(entries) == gzip_cpio(entries)
    assert read_cpio(gzip.decompress(gzip_cpio(entries)))["init"][1] == b"#!/bin/sh\n"


def elf(sections: dict[str, bytes] = {}, interpreter: bool = False) -> bytes:  # noqa: B006 (read only)
    """A minimal ELF64 little-endian file with these sections (and a PT_INTERP header if asked)."""
    names = b"\0" + b"".join(name.encode() + b"\0" for name in [*sections, ".shstrtab"])
    body, offsets = b"", []
    for content in [*sections.values(), names]:
        offsets.append(64 + 56 + len(body))
        body += content
    shoff = 64 + 56 + len(body)
    header = b"\x7fELF\x02\x01\x01" + b"\0" * 9 + struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 64, shoff, 0, 64, 56, 1,
                                                              64, len(sections) + 2, len(sections) + 1)
    program = struct.pack("<IIQQQQQQ", 3 if interpreter else 1, 0, 0, 0, 0, 0, 0, 0)
    headers = struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    name_at = 1
    for (name, content), offset in zip([*sections.items(), (".shstrtab", names)], offsets):
        headers += struct.pack("<IIQQQQIIQQ", name_at, 1, 0, 0, offset, len(content), 0, 0, 1, 0)
        name_at += len(name) + 1
    return header + program + body + headers


def module(depends: str) -> bytes:
    return elf({".text": b"\x90" * 8, ".modinfo": b"license=GPL\0depends=" + depends.encode() + b"\0name=m\0"})


def test_a_modules_dependencies_are_read_from_its_modinfo():
    assert modinfo(module("virtio,virtio_ring"))["depends"] == "virtio,virtio_ring"
    assert modinfo(elf({".text": b""})) == {}
    with pytest.raises(GuestError):
        modinfo(b"not an elf file at all, long enough to read")


def test_modules_load_after_what_they_depend_on_and_built_in_ones_are_left_out(tmp_path):
    files = {"virtio_ring": "", "virtio": "virtio_ring", "virtio_pci": "virtio,virtio_ring,virtio_pci_modern_dev",
             "virtio_pci_modern_dev": "", "virtio_blk": "virtio,virtio_ring", "ext4": "jbd2,mbcache", "jbd2": "",
             "mbcache": ""}
    index = {}
    for name, depends in files.items():
        index[name] = tmp_path / f"{name}.ko"
        index[name].write_bytes(module(depends))
    order = [name for name, _ in load_order(index, ["virtio_pci", "virtio_blk", "ext4", "absent"], {"jbd2"})]
    assert order == ["virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci", "virtio_blk", "mbcache", "ext4"]
    index["virtio_ring"].write_bytes(module("virtio_blk"))  # a circle is refused, not followed forever
    with pytest.raises(GuestError, match="circle"):
        load_order(index, ["virtio_blk"], set())


def test_only_a_program_without_an_interpreter_is_static():
    assert is_static(elf({".text": b""}))
    assert not is_static(elf({".text": b""}, interpreter=True))
    assert not is_static(b"#!/bin/sh\n" + b"\0" * 64)


@pytest.mark.parametrize("arch", list(ARCHES))
def test_init_keeps_a_shell_on_the_serial_console_with_the_fixed_prompt(arch):
    script = init_script(ARCHES[arch])
    console = ARCHES[arch].console
    assert f"/dev/{console}" in script and f"PS1='{PROMPT}'" in script
    # the modules load before the disk is looked for; the shell is started again when it ends
    assert script.index("insmod") < script.index("/dev/vda")
    assert "while true; do setsid" in script.splitlines()[-1]
    assert "dropbear" not in script and "dropbear" in init_script(ARCHES[arch], ssh=True)


def test_the_console_shell_reads_whole_lines_and_asks_for_the_rest_of_one():
    script = guest.CONSOLE_SHELL_SCRIPT
    assert "read -r line" in script and "sh -n -c" in script and "PS2" in script and "trap" in script
    assert guest.CONSOLE_SHELL in init_script(ARCHES["x86_64"])
    names = {entry.path for entry in guest._base_entries(ARCHES["x86_64"], b"busybox")}
    assert guest.CONSOLE_SHELL.lstrip("/") in names


def test_the_prompt_pattern_takes_the_prompt_and_busyboxs_cursor_question():
    assert PROMPT_PATTERN.search(f"\r\n{PROMPT}")
    assert PROMPT_PATTERN.search(f"\r\n{PROMPT}\x1b[6n")
    assert not PROMPT_PATTERN.search(f"{PROMPT}uname -m\r\n")


def test_a_guest_for_an_unknown_architecture_or_a_bad_key_is_refused(tmp_path):
    with pytest.raises(GuestError, match="riscv64"):
        build_guest("riscv64", tmp_path)
    with pytest.raises(GuestError, match="one OpenSSH public key"):
        guest._dropbear(ARCHES["x86_64"], tmp_path, "ssh-ed25519 AAAA\ncommand=\"rm -rf /\" ssh-rsa AAAA")


def test_a_disk_of_an_absurd_size_is_refused(tmp_path):
    for size in (0, 1 << 30):
        with pytest.raises(GuestError, match="1 MiB to 1 TiB"):
            build_disk(None, tmp_path / "disk.qcow2", size)


# ---- booted by hand under TCG ----------------------------------------------------------------

@pytest.fixture(scope="module")
def data_disk(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("data-files")
    (folder / "hello.txt").write_text("hello from the base disk\n")
    return build_disk(folder, tmp_path_factory.mktemp("data-disk") / "data.qcow2", 16)


class HandBooted(NamedTuple):
    arch: str
    guest: Guest
    lease: dict  # lease-like: its console endpoint, as exec_on_lease takes it
    ssh_port: int
    identity: Path  # the private key the guest's dropbear lets in


@pytest.fixture(scope="module", params=list(ARCHES))
def hand_booted(request, data_disk, guest_identity):  # noqa: F811 (the fixture)
    """Each architecture's guest with sshd, booted by hand once for the tests of this module
    (a TCG boot is CPU-bound: the console's tests and the ssh login share it, each on a
    shell of its own)."""
    vm = ssh_guest(request.param, guest_identity)
    port = free_port()
    with booted(vm, disk=data_disk, ssh_port=port) as lease:
        yield HandBooted(request.param, vm, lease, port, guest_identity)


@pytest.mark.service
@pytest.mark.timeout(900)  # the first build fetches some 90 MB of Debian packages
def test_each_guest_boots_to_its_prompt_and_exec_runs_over_its_console(hand_booted):
    arch, lease = hand_booted.arch, hand_booted.lease
    assert exec_on_lease(lease, "uname -m", 120).stdout.strip() == arch
    said = exec_on_lease(lease, "cat /data/hello.txt; mount | grep ' /data '", 120)
    assert said.status == 0 and "hello from the base disk" in said.stdout and "ext4" in said.stdout
    assert exec_on_lease(lease, "false", 60).status == 1
    # the console's shell outlives an `exit` (a new one takes its place) and a command cut by its deadline
    with socket.create_connection((lease["endpoints"][0]["host"], lease["endpoints"][0]["port"])) as console:
        console.sendall(b"exit\r")
    assert exec_on_lease(lease, "echo again", 60).stdout.strip() == "again"
    with pytest.raises(ExecError) as cut:
        exec_on_lease(lease, "sleep 600", 2)
    assert cut.value.code == ErrorCode.TIMEOUT
    assert exec_on_lease(lease, "tty", 60).stdout.strip() == f"/dev/{ARCHES[arch].console}"
    # a console line as long as exec sends (busybox's line editor would cut it at 1024 bytes)
    long = exec_on_lease(lease, f"echo {'x' * 3800} | wc -c", 60)
    assert long.status == 0 and long.stdout.strip() == "3801"
    exec_on_lease(lease, "cd /data", 60)  # (a command's own shell: the console's stays where it was)
    with socket.create_connection((lease["endpoints"][0]["host"], lease["endpoints"][0]["port"])) as console:
        console.settimeout(60)  # a person's loop over two lines: the second is asked for, then it runs
        console.sendall(b"for n in 1 2; do\r")
        console.sendall(b"echo n=$n; done; cd /proc; pwd\r")
        seen = b""
        while b"/proc\r\n" not in seen:
            seen += console.recv(4096)
        assert b"n=1\r\nn=2\r\n" in seen
    if arch == "aarch64":
        assert "sve2" in exec_on_lease(lease, "cat /proc/cpuinfo", 60).stdout.split()


def test_the_cli_prints_the_guests_paths_or_why_it_could_not_build(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from device_loop.cli import qemu_guest as command

    built = guest.Guest("x86_64", tmp_path / "vmlinuz", tmp_path / "initrd.cpio.gz", "console=ttyS0", "ttyS0", "6.1")
    monkeypatch.setattr(command, "build_guest", lambda arch, out, authorized_key: built)
    said = CliRunner().invoke(command.qemu_guest_command, ["--arch", "x86_64", "--out", str(tmp_path), "--json"])
    assert said.exit_code == 0 and json.loads(said.output)["initrd"] == str(tmp_path / "initrd.cpio.gz")

    def refuse(arch, out, authorized_key):
        raise GuestError("apt-get download linux-image-6.1.0-57-cloud-amd64 failed: no network")
    monkeypatch.setattr(command, "build_guest", refuse)
    said = CliRunner().invoke(command.qemu_guest_command, ["--arch", "x86_64", "--out", str(tmp_path)])
    assert said.exit_code == 1 and "no network" in said.output


@pytest.mark.service
def test_the_lab_scripts_foreign_architecture_step_is_quiet_once_done():
    """./lab test lets apt fetch arm64 packages; run again it says nothing and changes nothing."""
    lab = Path(__file__).resolve().parent.parent / "lab"
    native = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True).stdout.strip()
    done = subprocess.run(["bash", "-c", f". {lab} && need_foreign_architecture {native} && echo ok"],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok\n", "")


@pytest.mark.service
@pytest.mark.timeout(900)
def test_an_ssh_guest_lets_the_authorized_key_in_with_the_host_key_it_was_built_with(hand_booted):
    arch, vm, port = hand_booted.arch, hand_booted.guest, hand_booted.ssh_port
    assert vm.host_key and vm.host_key.startswith("ssh-ed25519 ")
    # QEMU accepts the connection before the guest listens: wait for dropbear's banner
    wait_for(lambda: ssh_banner(port).startswith(b"SSH-"), what="dropbear's banner")
    lease = {"device": "hand-ssh", "ready": True, "endpoints": [
        {"kind": "ssh", "role": "ssh", "protocol": "raw", "host": "127.0.0.1", "port": port,
         "params": {"user": "root", "host_key": vm.host_key}}]}
    said = exec_on_lease(lease, "uname -m; id -u", 60, identity_file=str(hand_booted.identity))
    assert (said.channel, said.stdout.split()) == ("ssh", [arch, "0"])


def ssh_banner(port: int) -> bytes:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.settimeout(2)
            return sock.recv(64)
    except OSError:
        return b""


def test_a_programs_interpreter_and_libraries_are_read_from_its_elf_file():
    interpreter, needed = guest.dynamic_needs(Path("/bin/ls").read_bytes())
    assert interpreter and interpreter.startswith("/lib") and "ld-linux" in interpreter
    assert "libc.so.6" in needed
    with pytest.raises(GuestError):
        guest.dynamic_needs(b"#!/bin/sh\n" + b"\0" * 64)


def test_the_kernel_cached_stands_in_when_apt_names_none(tmp_path, monkeypatch):
    said = []

    def apt(argv, cwd=None):
        said.append(argv[0])
        return "" if argv[0] == "apt-cache" else "amd64\n"  # no package lists: no Depends line
    monkeypatch.setattr(guest, "_apt", apt)
    monkeypatch.setattr(guest, "_ensure_architecture", lambda spec: None)
    with pytest.raises(GuestError, match="apt-get update"):
        guest._current_kernel(ARCHES["x86_64"], tmp_path)
    (tmp_path / "debs").mkdir()
    (tmp_path / "debs" / "linux-image-6.1.0-57-cloud-amd64_6.1.192-3_amd64.deb").write_bytes(b"")
    assert guest._current_kernel(ARCHES["x86_64"], tmp_path) == "linux-image-6.1.0-57-cloud-amd64"
    assert said == ["apt-cache", "apt-cache"]


def no_apt(argv, cwd=None):
    raise AssertionError(f"apt was asked: {argv}")


def test_a_build_that_may_not_fetch_asks_no_apt_and_says_what_the_cache_lacks(tmp_path, monkeypatch):
    monkeypatch.setattr(guest, "_apt", no_apt)
    monkeypatch.setattr(guest, "run", lambda argv, *args, **kwargs: pytest.fail(f"{argv} was run"))
    with pytest.raises(GuestNotFetched, match="no amd64 kernel has been fetched"):
        build_guest("x86_64", tmp_path, fetch=False)
    (tmp_path / "x86_64").mkdir()
    (tmp_path / "x86_64" / "kernel-package").write_text("linux-image-6.1.0-57-cloud-amd64\n")
    with pytest.raises(GuestNotFetched, match="linux-image-6.1.0-57-cloud-amd64:amd64 has not been fetched"):
        build_guest("x86_64", tmp_path, fetch=False)
    (tmp_path / "debs" / "linux-image-6.1.0-57-cloud-amd64_6.1.192-3_amd64.deb").write_bytes(b"")
    with pytest.raises(GuestNotFetched, match="has not been unpacked"):  # (nor unpacked: dpkg-deb is not run)
        fetch_guest("x86_64", tmp_path, ssh=True, fetch=False)


def test_a_vm_test_whose_guest_is_not_prepared_fails_saying_to_run_lab_test(tmp_path, monkeypatch):
    monkeypatch.setenv(prepare.GUEST_CACHE_ENV, str(tmp_path / "empty"))
    monkeypatch.setattr(guest, "_apt", no_apt)
    with pytest.raises(pytest.fail.Exception, match=r"not prepared: the aarch64 VM guest's Debian packages "
                                                    r"\(no arm64 kernel .*\)\. \./lab test fetches"):
        prepared_guest("aarch64")


@pytest.mark.service
@pytest.mark.timeout(120)
def test_a_second_preparation_finds_every_guests_packages_and_fetches_nothing(monkeypatch):
    """What ./lab test does before pytest when it has prepared once (and apt's lists are as
    they were then): it checks, and asks apt nothing."""
    cache = prepare.guest_cache()
    stamp = cache / "apt-lists"
    if not stamp.is_file():
        prepare.not_prepared("the VM guests' Debian packages", f"there is no {stamp}")
    real_apt, real_run = guest._apt, guest.run

    def apt(argv, cwd=None):  # (the host key's architecture: dpkg says which it is)
        assert argv == ["dpkg", "--print-architecture"], f"apt was asked: {argv}"
        return real_apt(argv, cwd)

    def run(argv, *args, **kwargs):  # (that dpkg, and dropbearkey -y: the host key's public half)
        assert (Path(argv[0]).name, argv[1]) in {("dpkg", "--print-architecture"), ("dropbearkey", "-y")}, argv
        return real_run(argv, *args, **kwargs)
    monkeypatch.setattr(guest, "_apt", apt)
    monkeypatch.setattr(guest, "run", run)
    monkeypatch.setattr(prepare, "apt_lists_state", lambda: stamp.read_text().strip())
    assert prepare.prepare_guests(cache) is False
