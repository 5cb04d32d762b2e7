"""A bootable guest for a VM slot, built without installing anything into the host.

``build_guest(arch, cache)`` -> ``Guest``: a Debian kernel fetched with ``apt-get download``
and unpacked with ``dpkg-deb -x`` (never installed), and an initramfs written here (cpio
"newc", gzip) around ``busybox-static``. Its ``/init`` mounts proc, sys and devtmpfs, loads
the virtio modules the kernel does not have built in (found by their ``.modinfo``
dependencies, in load order), mounts ``/dev/vda`` on ``/data`` when there is one, and keeps
a root shell with the prompt ``PROMPT`` on the serial console (a new one when it ends), with
the console as its controlling terminal so that Ctrl-C reaches the command (``exec`` sends
it). ``build_guest(..., authorized_key=...)`` adds dropbear listening on port 22.
``build_disk(folder, out)``: a base disk (ext4 of a folder, as qcow2) for ``/data``.

Everything lands in the caller's cache folder, reused by later builds (a file lock keeps two
builders from fetching the same package at once). ``fetch_guest(arch, cache)`` fetches and
unpacks a guest's packages alone, building nothing; ``build_guest(..., fetch=False)`` then
builds from the cache without apt or the network (``GuestNotFetched`` for what it lacks).
"""
from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import io
import lzma
import os
import re
import shutil
import stat
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from device_loop.plugin import find_program, last_lines, run

#: The guest shell's prompt, the same on every architecture and every boot.
PROMPT = "devloop-vm# "
#: The prompt at the end of what the console shows; busybox's line editing may follow it with
#: a question to the terminal (where is the cursor: ``ESC [6n``), which needs no answer.
PROMPT_PATTERN = re.compile(re.escape(PROMPT) + r"(?:\x1b\[[0-9;?]*[A-Za-z])*$")
HOSTNAME = "devloop-vm"
#: What QEMU's user networking gives a guest (its address, its gateway).
GUEST_ADDRESS, GATEWAY = "10.0.2.15/24", "10.0.2.2"
SSH_PORT = 22
#: The modules /init loads when the kernel has them as modules (and their dependencies first):
#: virtio over PCI (x86_64 ``pc``, aarch64 ``virt``) or MMIO, a disk, a network card, entropy for
#: dropbear, and ext4 for the disk's file system (crc32c for its checksums: ext4 asks the crypto API for it).
WANTED_MODULES = ("virtio_pci", "virtio_mmio", "virtio_blk", "virtio_net", "virtio_rng", "crc32c_generic", "ext4")
APT_TIMEOUT_S = 900.0
TOOL_TIMEOUT_S = 300.0


class GuestError(Exception):
    """A guest that could not be built, with the reason a lab admin can act on."""


class GuestNotFetched(GuestError):
    """A package a guest is built from is not in the cache, and the build may not fetch it."""


@dataclass(frozen=True)
class Arch:
    """What differs between the architectures a guest is built for."""
    name: str
    deb_arch: str
    kernel_meta: str  # the package that depends on the current kernel's package
    console: str
    elf_machine: int  # e_machine of its executables
    qemu: str  # the program that runs it

    def package(self, name: str) -> str:
        """``name`` qualified with this architecture, as apt-get takes it."""
        return f"{name}:{self.deb_arch}"


ARCHES = {
    "x86_64": Arch("x86_64", "amd64", "linux-image-cloud-amd64", "ttyS0", 62, "qemu-system-x86_64"),
    "aarch64": Arch("aarch64", "arm64", "linux-image-arm64", "ttyAMA0", 183, "qemu-system-aarch64"),
}


@dataclass(frozen=True)
class Guest:
    """A guest ready to boot: ``qemu -kernel KERNEL -initrd INITRD -append APPEND``.
    ``host_key``: the dropbear host key's public half (``ssh-ed25519 AAAA...``) when it has ssh."""
    arch: str
    kernel: Path
    initrd: Path
    append: str
    console: str
    kernel_version: str
    modules: tuple[str, ...] = ()
    host_key: str | None = None


def build_guest(arch: str, cache: Path, *, authorized_key: str | None = None, fetch: bool = True) -> Guest:
    """A guest for ``arch`` (``x86_64``, ``aarch64``) whose files live in ``cache`` (fetched
    and unpacked there on the first call, reused after); with ``authorized_key`` (an OpenSSH
    public key line), dropbear lets that key log in as root. ``GuestError`` otherwise. With
    ``fetch=False`` apt is not asked (the kernel is the one the last fetch chose): a package
    not in the cache is ``GuestNotFetched``."""
    spec = _arch(arch)
    cache = Path(cache)
    cache.mkdir(parents=True, exist_ok=True)
    with _locked(cache / ".lock"):
        kernel_root = _kernel_root(spec, cache, fetch)
        version, vmlinuz = _kernel_of(kernel_root)
        modules = load_order(_module_index(kernel_root / "lib/modules" / version), WANTED_MODULES,
                             _builtin(kernel_root / "lib/modules" / version))
        entries = _base_entries(spec, _busybox(spec, cache, fetch))
        entries += [Entry(f"lib/modules/{name}.ko", _module_bytes(path)) for name, path in modules]
        entries.append(Entry("etc/modules", "".join(f"{name}\n" for name, _ in modules).encode()))
        host_key = None
        if authorized_key is not None:
            ssh_entries, host_key = _dropbear(spec, cache, authorized_key, fetch)
            entries += ssh_entries
        entries.append(Entry("init", init_script(spec, ssh=authorized_key is not None).encode(), 0o755))
        initrd = _write_once(cache / arch, "initrd", ".cpio.gz", gzip_cpio(entries))
    append = f"console={spec.console} quiet panic=-1"
    return Guest(arch, vmlinuz, initrd, append, spec.console, version, tuple(name for name, _ in modules), host_key)


def fetch_guest(arch: str, cache: Path, *, ssh: bool = False, fetch: bool = True) -> None:
    """Every Debian package a guest for ``arch`` is built from (with ``ssh``, dropbear's, and
    its host key made) fetched and unpacked into ``cache``, as ``build_guest`` would, building
    nothing: ``build_guest(..., fetch=False)`` needs no apt after it. With ``fetch=False``, only
    checked: ``GuestNotFetched`` for the first one the cache lacks."""
    spec = _arch(arch)
    cache = Path(cache)
    cache.mkdir(parents=True, exist_ok=True)
    with _locked(cache / ".lock"):
        _kernel_of(_kernel_root(spec, cache, fetch))
        _busybox(spec, cache, fetch)
        if ssh:
            _dropbear_roots(spec, cache, fetch)
            _host_key(cache, cache / HOST_KEY_FILE, fetch)


def _arch(arch: str) -> Arch:
    spec = ARCHES.get(arch)
    if spec is None:
        raise GuestError(f"no guest for {arch!r}: {', '.join(ARCHES)}")
    return spec


# ---- the initramfs ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    """One file of an initramfs: a regular file (``data``), a folder (``kind="dir"``), a
    symlink (``data`` its target) or a character device (``device=(major, minor)``)."""
    path: str
    data: bytes = b""
    mode: int = 0o644
    kind: str = "file"
    device: tuple[int, int] = field(default=(0, 0))


_TYPES = {"file": stat.S_IFREG, "dir": stat.S_IFDIR, "symlink": stat.S_IFLNK, "char": stat.S_IFCHR}


def cpio_newc(entries: Iterable[Entry]) -> bytes:
    """The entries as a cpio archive in the "newc" format the kernel unpacks, with every
    folder on the way made first (owned by root, time 0: the same files give the same bytes)."""
    out = io.BytesIO()
    seen: set[str] = set()
    inode = 1

    def put(name: str, mode: int, data: bytes, rdev: tuple[int, int] = (0, 0)) -> None:
        nonlocal inode
        raw = name.encode() + b"\0"
        fields = (inode, mode, 0, 0, 2 if stat.S_ISDIR(mode) else 1, 0, len(data), 0, 0, rdev[0], rdev[1],
                  len(raw), 0)
        out.write(b"070701" + b"".join(b"%08X" % value for value in fields) + raw)
        out.write(b"\0" * (-out.tell() % 4) + data)
        out.write(b"\0" * (-out.tell() % 4))
        inode += 1

    for entry in entries:
        path = entry.path.strip("/")
        parts = path.split("/")
        for depth in range(1, len(parts)):
            folder = "/".join(parts[:depth])
            if folder not in seen:
                seen.add(folder)
                put(folder, stat.S_IFDIR | 0o755, b"")
        if path in seen:
            continue
        seen.add(path)
        put(path, _TYPES[entry.kind] | entry.mode, b"" if entry.kind in ("dir", "char") else entry.data,
            entry.device)
    put("TRAILER!!!", 0, b"")
    return out.getvalue()


def gzip_cpio(entries: Iterable[Entry]) -> bytes:
    """``cpio_newc`` of the entries, gzipped (time 0: the same files give the same bytes)."""
    return gzip.compress(cpio_newc(entries), compresslevel=6, mtime=0)


def init_script(spec: Arch, ssh: bool = False) -> str:
    """The guest's ``/init`` (busybox sh, as PID 1)."""
    network = (f"if [ -e /sys/class/net/eth0 ]; then\n"
               f"  ip link set lo up; ip link set eth0 up\n"
               f"  ip addr add {GUEST_ADDRESS} dev eth0; ip route add default via {GATEWAY}\n"
               f"fi\n")
    sshd = f"[ -e /sys/class/net/eth0 ] && dropbear -R -s -p {SSH_PORT} -r /etc/dropbear/host_key\n" if ssh else ""
    return ("#!/bin/busybox sh\n"
            "/bin/busybox --install -s\n"
            "export PATH=/sbin:/bin:/usr/sbin:/usr/bin HOME=/root\n"
            "mount -t proc proc /proc\n"
            "mount -t sysfs sysfs /sys\n"
            "mount -t devtmpfs devtmpfs /dev\n"
            "mkdir -p /dev/pts /data /tmp /root && mount -t devpts devpts /dev/pts\n"
            # the kernel's messages would land inside a command's output on the console
            "echo 1 > /proc/sys/kernel/printk\n"
            "while read -r module; do insmod /lib/modules/$module.ko; done < /etc/modules\n"
            "if [ -b /dev/vda ]; then mount -t ext4 /dev/vda /data 2>/dev/null || mount -t ext2 /dev/vda /data; fi\n"
            f"hostname {HOSTNAME}\n"
            + network + sshd +
            f"export PS1='{PROMPT}' PS2='> ' TERM=vt100\n"
            # the console as the shell's controlling terminal (Ctrl-C interrupts a command), and a
            # new shell when one ends: `exit` on the console never leaves it without a prompt
            f"while true; do setsid sh -c 'exec {CONSOLE_SHELL} </dev/{spec.console} >/dev/{spec.console} 2>&1'; "
            "done\n")


#: The console's shell. busybox's own line editor takes 1024 bytes of a line at most (a longer
#: one is cut, and the shell then waits for the rest of a quote that never comes), and a
#: console's exec sends up to 4090: the line is read by the terminal instead (the kernel's line
#: discipline: 4095 bytes, echoed as typed, erased with Backspace), checked, then run in this
#: shell (``cd`` and variables stay). A line that is not whole yet (an open quote, a ``do``
#: without its ``done``) takes the next with ``PS2``; Ctrl-C ends the command, never the shell.
CONSOLE_SHELL = "/bin/console-shell"
CONSOLE_SHELL_SCRIPT = r"""#!/bin/sh
trap 'printf "\n"' INT
while :; do
  printf '%s' "$PS1"
  IFS= read -r line || { printf '\n'; continue; }
  until said=$(sh -n -c "$line" 2>&1); do
    case $said in
      *"end of file"*|*nterminated*|*"unexpected EOF"*) ;;
      *) printf '%s\n' "$said"; line=; break ;;
    esac
    printf '%s' "$PS2"
    IFS= read -r more || { line=; printf '\n'; break; }
    line="$line
$more"
  done
  [ -n "$line" ] && eval "$line"
done
"""


def _base_entries(spec: Arch, busybox: bytes) -> list[Entry]:
    folders = ["bin", "sbin", "usr/bin", "usr/sbin", "proc", "sys", "dev", "data", "tmp", "root", "etc", "run"]
    return [*(Entry(name, kind="dir", mode=0o755) for name in folders),
            Entry("dev/console", kind="char", mode=0o600, device=(5, 1)),
            Entry("dev/null", kind="char", mode=0o666, device=(1, 3)),
            Entry("bin/busybox", busybox, 0o755),
            Entry("bin/sh", b"busybox", 0o777, kind="symlink"),
            Entry(CONSOLE_SHELL.lstrip("/"), CONSOLE_SHELL_SCRIPT.encode(), 0o755),
            Entry("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n"),
            Entry("etc/group", b"root:x:0:\n"),
            Entry("etc/shells", b"/bin/sh\n"),
            Entry("etc/hostname", f"{HOSTNAME}\n".encode())]


# ---- kernel modules ------------------------------------------------------------------------

def modinfo(data: bytes) -> dict[str, str]:
    """The ``.modinfo`` section of a kernel module (an ELF64 little-endian object): its
    ``key=value`` strings (``depends``, ``name``...)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise GuestError("not a 64-bit little-endian ELF module")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQ", data, shoff + index * shentsize) for index in range(shnum)]
    names_at = sections[shstrndx][4]
    for name_offset, _type, _flags, _addr, offset, size in sections:
        end = data.index(b"\0", names_at + name_offset)
        if data[names_at + name_offset:end] == b".modinfo":
            pairs = (item.split(b"=", 1) for item in data[offset:offset + size].split(b"\0") if b"=" in item)
            return {key.decode(): value.decode(errors="replace") for key, value in pairs}
    return {}


def _module_name(path: Path) -> str:
    return path.name.split(".ko", 1)[0].replace("-", "_")


def _module_index(modules: Path) -> dict[str, Path]:
    """Each module of an unpacked kernel by name (``virtio-rng`` as ``virtio_rng``)."""
    return {_module_name(path): path for path in (modules / "kernel").rglob("*.ko*")}


def _builtin(modules: Path) -> set[str]:
    try:
        return {_module_name(Path(line.strip())) for line in (modules / "modules.builtin").read_text().splitlines()
                if line.strip()}
    except OSError:
        return set()


def _module_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    if path.name.endswith(".ko.xz"):  # (insmod of a busybox takes a plain object)
        return lzma.decompress(data)
    if not path.name.endswith(".ko"):
        raise GuestError(f"{path.name}: a module compressed in a way this builder does not read")
    return data


def load_order(index: dict[str, Path], wanted: Iterable[str], builtin: set[str]) -> list[tuple[str, Path]]:
    """The modules among ``wanted`` that the kernel has as modules (``index``: name -> file),
    each after the modules it depends on; built-in and absent ones are left out."""
    order: list[tuple[str, Path]] = []
    placed: set[str] = set()

    def place(name: str, path: list[str]) -> None:
        if name in placed or name in builtin or name not in index:
            return
        if name in path:
            raise GuestError(f"the modules depend on each other in a circle: {' -> '.join([*path, name])}")
        depends = modinfo(_module_bytes(index[name])).get("depends", "")
        for dependency in filter(None, depends.split(",")):
            place(dependency.replace("-", "_"), [*path, name])
        placed.add(name)
        order.append((name, index[name]))

    for name in wanted:
        place(name, [])
    return order


# ---- Debian packages, fetched and unpacked into the cache ----------------------------------

def _apt(argv: list[str], cwd: Path | None = None) -> str:
    program = find_program(argv[0])
    if program is None:
        raise GuestError(f"{argv[0]} is missing: a guest is built from Debian packages (on Debian or Ubuntu)")
    # apt-get download writes into the current folder: env -C gives it one without changing the
    # exporter's own (its threads share it)
    status, output = run([*(["env", "-C", str(cwd)] if cwd else []), program, *argv[1:]], timeout=APT_TIMEOUT_S)
    if status != 0:
        raise GuestError(f"{' '.join(argv)} failed: {last_lines(output)}")
    return output


def _ensure_architecture(spec: Arch) -> None:
    """dpkg knows ``spec``'s packages (arm64 on an amd64 host: added once, then apt-get update)."""
    native = _apt(["dpkg", "--print-architecture"]).strip()
    if spec.deb_arch == native or spec.deb_arch in _apt(["dpkg", "--print-foreign-architectures"]).split():
        return
    if os.geteuid() != 0:
        raise GuestError(f"apt does not know {spec.deb_arch} packages here: run "
                         f"'sudo dpkg --add-architecture {spec.deb_arch} && sudo apt-get update' once")
    _apt(["dpkg", "--add-architecture", spec.deb_arch])
    _apt(["apt-get", "update", "-qq"])


def _kernel_root(spec: Arch, cache: Path, fetch: bool) -> Path:
    """The kernel package apt names today, unpacked in the cache (its name kept in
    ``cache/ARCH/kernel-package``); with ``fetch=False``, the one kept there."""
    record = cache / spec.name / "kernel-package"
    if not fetch:
        try:
            package = record.read_text().strip()
        except FileNotFoundError:
            raise GuestNotFetched(f"no {spec.deb_arch} kernel has been fetched into {cache}") from None
        return _unpacked(cache, spec, package, fetch=False)
    package = _current_kernel(spec, cache)
    root = _unpacked(cache, spec, package)
    if not record.exists() or record.read_text().strip() != package:
        partial = record.with_name(f"{record.name}.{os.getpid()}.partial")
        partial.write_text(package + "\n")
        os.replace(partial, record)
    return root


def _current_kernel(spec: Arch, cache: Path) -> str:
    """The name of the kernel package ``spec.kernel_meta`` depends on today
    (``linux-image-6.1.0-57-cloud-amd64``); the one already unpacked in the cache if apt
    cannot say."""
    try:
        _ensure_architecture(spec)
        output = _apt(["apt-cache", "depends", "--no-recommends", spec.package(spec.kernel_meta)])
        for line in output.splitlines():
            if line.strip().startswith("Depends:"):
                return line.split(":", 1)[1].strip().split(":", 1)[0]
        raise GuestError(f"apt-cache names no kernel package that {spec.package(spec.kernel_meta)} depends on "
                         "(apt's package lists may be missing: apt-get update)")
    except GuestError:
        cached = sorted((cache / "debs").glob(f"linux-image-*_{spec.deb_arch}.deb"))
        if not cached:
            raise
        return cached[-1].name.split("_", 1)[0]


def _deb(cache: Path, spec: Arch, package: str, fetch: bool = True) -> Path:
    """The ``.deb`` of ``package`` for ``spec``, downloaded once into ``cache/debs`` (with
    ``fetch=False``, ``GuestNotFetched`` if it is not there)."""
    debs = cache / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    found = sorted(debs.glob(f"{package}_*_{spec.deb_arch}.deb")) or sorted(debs.glob(f"{package}_*_all.deb"))
    if found:
        return found[-1]
    if not fetch:
        raise GuestNotFetched(f"{spec.package(package)} has not been fetched into {debs}")
    _ensure_architecture(spec)
    with tempfile.TemporaryDirectory(dir=debs) as folder:
        _apt(["apt-get", "download", "-q=2", spec.package(package)], cwd=Path(folder))
        got = list(Path(folder).glob("*.deb"))
        if len(got) != 1:
            raise GuestError(f"apt-get download {spec.package(package)} gave no package file")
        target = debs / got[0].name
        os.replace(got[0], target)
    return target


def _unpacked(cache: Path, spec: Arch, package: str, fetch: bool = True) -> Path:
    """``package`` unpacked (``dpkg-deb -x``, nothing installed) in the cache (with
    ``fetch=False``, ``GuestNotFetched`` unless it is there already)."""
    deb = _deb(cache, spec, package, fetch)
    root = cache / spec.name / deb.name.removesuffix(".deb")
    if (root / ".unpacked").exists():
        return root
    if not fetch:
        raise GuestNotFetched(f"{deb.name} has not been unpacked into {root.parent}")
    shutil.rmtree(root, ignore_errors=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent) as folder:
        status, output = run(["dpkg-deb", "-x", str(deb), folder], timeout=TOOL_TIMEOUT_S)
        if status != 0:
            raise GuestError(f"dpkg-deb -x {deb.name} failed: {last_lines(output)}")
        (Path(folder) / ".unpacked").write_text(deb.name + "\n")
        os.rename(folder, root)
        os.mkdir(folder)  # (for TemporaryDirectory's own clean-up)
    return root


def _kernel_of(root: Path) -> tuple[str, Path]:
    kernels = sorted((root / "boot").glob("vmlinuz-*"))
    if not kernels:
        raise GuestError(f"{root.name} holds no boot/vmlinuz-*")
    version = kernels[-1].name.removeprefix("vmlinuz-")
    if not (root / "lib/modules" / version).is_dir():
        raise GuestError(f"{root.name} holds no modules for {version}")
    return version, kernels[-1]


def _elf_machine(data: bytes) -> int | None:
    return struct.unpack_from("<H", data, 0x12)[0] if data[:4] == b"\x7fELF" else None


def is_static(data: bytes) -> bool:
    """An ELF64 executable that asks for no program interpreter (runs without libraries)."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return False
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return all(struct.unpack_from("<I", data, phoff + index * phentsize)[0] != 3 for index in range(phnum))  # PT_INTERP


def _busybox(spec: Arch, cache: Path, fetch: bool = True) -> bytes:
    """A static busybox for ``spec``: the host's when it is one (busybox-static), else the
    ``busybox-static`` package of that architecture, unpacked in the cache."""
    host = find_program("busybox")
    if host is not None:
        data = Path(host).read_bytes()
        if _elf_machine(data) == spec.elf_machine and is_static(data):
            return data
    data = (_unpacked(cache, spec, "busybox-static", fetch) / "bin/busybox").read_bytes()
    if _elf_machine(data) != spec.elf_machine or not is_static(data):
        raise GuestError(f"busybox-static for {spec.deb_arch} is not a static {spec.name} program")
    return data


#: The packages dropbear and the libraries it loads come from, for the guest's architecture.
DROPBEAR_PACKAGES = ("dropbear-bin", "libtomcrypt1", "libtommath1", "libgmp10", "zlib1g", "libcrypt1", "libc6")
HOST_KEY_FILE = "dropbear_ed25519_host_key"


def _dropbear_roots(spec: Arch, cache: Path, fetch: bool = True) -> list[Path]:
    return [_unpacked(cache, spec, name, fetch) for name in DROPBEAR_PACKAGES]


def _dropbear(spec: Arch, cache: Path, authorized_key: str, fetch: bool = True) -> tuple[list[Entry], str]:
    """dropbear (Debian's dropbear-bin, dynamic) with the libraries it loads (the guest
    architecture's packages, found by the names its ELF files ask for), a host key made here,
    and root's authorized key: the initramfs entries and the host key's public half."""
    key = authorized_key.strip()
    if not re.fullmatch(r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp\d+) [A-Za-z0-9+/=]{16,8192}( [^\n]{0,200})?", key):
        raise GuestError("authorized_key must be one OpenSSH public key line (ssh-ed25519 AAAA...)")
    roots = _dropbear_roots(spec, cache, fetch)
    dropbear = roots[0] / "usr/sbin/dropbear"
    host_key_file = cache / HOST_KEY_FILE
    public = _host_key(cache, host_key_file, fetch)
    entries = [Entry("usr/sbin/dropbear", dropbear.read_bytes(), 0o755),
               Entry("etc/dropbear/host_key", host_key_file.read_bytes(), 0o600),
               Entry("root/.ssh", kind="dir", mode=0o700),
               Entry("root/.ssh/authorized_keys", (key + "\n").encode(), 0o600)]
    interpreter, libraries = library_closure(dropbear.read_bytes(), roots)
    # the loader where the program asks for it (/lib/ld-linux-aarch64.so.1); libraries in /lib, where it looks
    entries.append(Entry(interpreter.lstrip("/"), _in_roots(roots, interpreter).read_bytes(), 0o755))
    entries += [Entry(f"lib/{name}", path.read_bytes(), 0o755) for name, path in libraries.items()]
    return entries, public


def _host_key(cache: Path, host_key_file: Path, fetch: bool = True) -> str:
    """The guests' dropbear host key (made once with dropbearkey of this host's own
    architecture: a key is the same bytes on every one), and its public half."""
    native = _apt(["dpkg", "--print-architecture"]).strip()
    spec = next((arch for arch in ARCHES.values() if arch.deb_arch == native), None)
    if spec is None:
        raise GuestError(f"an ssh guest's host key is made with dropbearkey, and this host ({native}) runs none here")
    roots = [_unpacked(cache, spec, name, fetch)
             for name in ("dropbear-bin", "libtomcrypt1", "libtommath1", "libgmp10")]
    env = {"PATH": os.environ.get("PATH", os.defpath), "LD_LIBRARY_PATH": ":".join(map(str, _library_folders(roots)))}
    dropbearkey = str(roots[0] / "usr/bin/dropbearkey")
    if not host_key_file.exists():
        status, output = run([dropbearkey, "-t", "ed25519", "-f", str(host_key_file)], TOOL_TIMEOUT_S, env)
        if status != 0:
            raise GuestError(f"dropbearkey failed: {last_lines(output)}")
    status, output = run([dropbearkey, "-y", "-f", str(host_key_file)], TOOL_TIMEOUT_S, env)
    public = next((line for line in output.splitlines() if line.startswith("ssh-")), None)
    if status != 0 or public is None:
        raise GuestError(f"dropbearkey -y failed: {last_lines(output)}")
    return " ".join(public.split()[:2])


def _library_folders(roots: list[Path]) -> list[Path]:
    return [folder for root in roots for folder in sorted(root.glob("lib/*-linux-gnu")) +
            sorted(root.glob("usr/lib/*-linux-gnu"))]


def _in_roots(roots: list[Path], path: str) -> Path:
    """``path`` (as the guest names it) in the first unpacked package that has it, links followed
    inside that package (Debian's ``/lib/ld-linux-aarch64.so.1`` is a link to its real file)."""
    for root in roots:
        found = root / path.lstrip("/")
        for _ in range(8):
            if not found.is_symlink():
                break
            target = os.readlink(found)
            found = (root / target.lstrip("/")) if target.startswith("/") else found.parent / target
        if found.is_file():
            return found
    raise GuestError(f"no package of the guest's has {path}")


def dynamic_needs(data: bytes) -> tuple[str | None, list[str]]:
    """An ELF64 little-endian program's interpreter (``PT_INTERP``) and the libraries its
    ``.dynamic`` section names (``DT_NEEDED``)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise GuestError("not a 64-bit little-endian ELF file")
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    interpreter = None
    for index in range(phnum):
        kind, _flags, offset, _vaddr, _paddr, size = struct.unpack_from("<IIQQQQ", data, phoff + index * phentsize)
        if kind == 3:  # PT_INTERP
            interpreter = data[offset:offset + size].rstrip(b"\0").decode()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQII", data, shoff + index * shentsize) for index in range(shnum)]
    needed = []
    for _name, kind, _flags, _addr, offset, size, link, _info in sections:
        if kind != 6:  # SHT_DYNAMIC; its link is the string table it names things in
            continue
        strings = sections[link][4]
        for at in range(offset, offset + size, 16):
            tag, value = struct.unpack_from("<qQ", data, at)
            if tag == 0:
                break
            if tag == 1:  # DT_NEEDED
                needed.append(data[strings + value:data.index(b"\0", strings + value)].decode())
    return interpreter, needed


def library_closure(program: bytes, roots: list[Path]) -> tuple[str, dict[str, Path]]:
    """The interpreter ``program`` asks for, and every library it loads, directly or through
    another (name -> its file in the library folders of the unpacked packages ``roots``, links
    followed inside them); ``GuestError`` for one none of them has."""
    folders = _library_folders(roots)
    interpreter, wanted = dynamic_needs(program)
    if interpreter is None:
        raise GuestError("the program names no interpreter (it is static: it needs no libraries)")
    found: dict[str, Path] = {}
    while wanted:
        name = wanted.pop()
        if name in found:
            continue
        path = next((folder / name for folder in folders if (folder / name).exists()), None)
        if path is None:
            raise GuestError(f"no package of the guest's has the library {name}")
        found[name] = path.resolve()
        if not any(found[name].is_relative_to(root.resolve()) for root in roots):  # (a link to the host's own)
            raise GuestError(f"{path} leads out of its package, to {found[name]}")
        wanted += dynamic_needs(found[name].read_bytes())[1]
    return interpreter, found


# ---- files in the cache --------------------------------------------------------------------

@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_once(folder: Path, stem: str, suffix: str, data: bytes) -> Path:
    """``data`` in ``folder/STEM-DIGEST.SUFFIX`` (written whole, then renamed), unless there."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{stem}-{hashlib.sha256(data).hexdigest()[:16]}{suffix}"
    if not target.exists():
        partial = target.with_name(target.name + ".partial")
        partial.write_bytes(data)
        os.replace(partial, target)
    return target


# ---- a base disk ---------------------------------------------------------------------------

def build_disk(folder: Path | None, out: Path, size_mib: int = 64) -> Path:
    """A base disk for ``/data``: an ext4 file system holding ``folder``'s files (empty
    without one), as the qcow2 image ``out``; ``GuestError`` if a tool is missing or fails."""
    if not 1 <= size_mib <= 1 << 20:
        raise GuestError(f"a disk of {size_mib} MiB: give 1 MiB to 1 TiB")
    mke2fs, qemu_img = find_program("mke2fs"), find_program("qemu-img")
    if mke2fs is None or qemu_img is None:
        raise GuestError("a disk is made with mke2fs and qemu-img (Debian: apt-get install e2fsprogs qemu-utils)")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as work:
        raw = Path(work) / "disk.raw"
        argv = [mke2fs, "-q", "-F", "-t", "ext4", "-L", "data", "-E", "root_owner=0:0"]
        argv += ["-d", str(folder)] if folder is not None else []
        status, output = run([*argv, str(raw), f"{size_mib}M"], timeout=TOOL_TIMEOUT_S)
        if status != 0:
            raise GuestError(f"mke2fs failed: {last_lines(output)}")
        partial = Path(work) / "disk.qcow2"
        status, output = run([qemu_img, "convert", "-q", "-f", "raw", "-O", "qcow2", str(raw), str(partial)],
                             timeout=TOOL_TIMEOUT_S)
        if status != 0:
            raise GuestError(f"qemu-img convert failed: {last_lines(output)}")
        os.replace(partial, out)
    return out
