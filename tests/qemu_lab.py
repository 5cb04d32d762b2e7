"""A lab with VM slots for the qemu plugin's tests: the guest's files put in an exporter's
state folder, and the plugin's entry point made visible to exporter processes started from
a checkout whose virtualenv was installed before the plugin existed."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from conftest import BUILT_IN_PLUGINS
from device_loop.core.plugins import LOAD_ENV
from device_loop.plugins.qemu.guest import Guest, build_disk

ENTRY_POINT = "qemu = device_loop.plugins.qemu:QemuPlugin"


def with_qemu(env: dict, folder: Path) -> dict:
    """``env`` for an exporter that loads the qemu plugin: its entry point in a distribution of
    its own on ``PYTHONPATH`` (a second claim of the name, if the venv has one, is ignored)."""
    info = folder / "devloop_qemu_tests-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: devloop-qemu-tests\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[device_loop]\n{ENTRY_POINT}\n")
    path = [str(folder), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    plugins = ",".join(dict.fromkeys([*BUILT_IN_PLUGINS.split(","), "qemu"]))
    return {**env, "PYTHONPATH": os.pathsep.join(path), LOAD_ENV: plugins}


def slot_files(state_dir: Path, guest: Guest, disk: bool = True, folder: str | None = None) -> dict:
    """The guest's kernel and initramfs (and an empty ext4 disk) in ``STATE_DIR/qemu/images/FOLDER``
    (default: its architecture): a slot's keys naming them."""
    folder = folder or guest.arch
    images = state_dir / "qemu" / "images" / folder
    images.mkdir(parents=True, exist_ok=True)
    shutil.copy(guest.kernel, images / "vmlinuz")
    shutil.copy(guest.initrd, images / "initrd.cpio.gz")
    keys = {"arch": guest.arch, "kernel": f"{folder}/vmlinuz", "initrd": f"{folder}/initrd.cpio.gz",
            "append": guest.append.split(" ", 1)[1] if guest.append.startswith("console=") else guest.append}
    if disk:
        build_disk(None, images / "disk.qcow2", size_mib=16)
        keys["disk"] = f"{folder}/disk.qcow2"
    return keys
