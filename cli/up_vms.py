"""The local lab's VM slots (``device-loop up``): one x86_64 slot and one aarch64 slot (SVE2:
``-cpu max,pauth-impdef=on``) of the qemu plugin, one VM of each booted ahead, where QEMU is
installed; else the lab starts as before and says why no slot is served.

The guests (a Debian kernel unpacked, never installed, and a busybox initramfs:
``plugins/qemu/guest.py``) are built in a cache folder, the lab's data folder's ``guests``
unless given, and their files put where a slot's files must lie: the exporter's state folder.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Callable

from device_loop.core.plugins import PluginSet
from device_loop.plugins.qemu.guest import ARCHES, PROMPT, GuestError, build_guest

VM_PLUGIN = "qemu"
VM_CLASS = "vm"
#: Each slot: its architecture, and what its VMs are (memory in MiB: the notes' sizes for an
#: initramfs guest under TCG, pointer authentication's cheap emulation for aarch64).
VM_SLOTS: dict[str, dict] = {
    "vm-x86_64": {"arch": "x86_64", "memory": 256},
    "vm-aarch64": {"arch": "aarch64", "cpu": "max,pauth-impdef=on", "memory": 512},
}
WARM = 1
QEMU_PACKAGES = {"x86_64": "qemu-system-x86", "aarch64": "qemu-system-arm"}
TOOLS = {"qemu-img": "qemu-utils"}  # an overlay per VM


def vm_slots(data_dir: Path, plugins: dict, cache: Path | None = None,
             say: Callable[[str], None] = lambda line: None) -> tuple[list[dict], str]:
    """The lab's VM slots as exporter config entries, and a line that says which are served
    (or why none is): QEMU missing, a guest that could not be built, the qemu plugin left out
    by ``--config``'s ``[plugins]``. ``say`` is told before the guests are built (the first
    build fetches Debian packages)."""
    if VM_PLUGIN in plugins.get("disable", []) or VM_PLUGIN not in plugins.get("enable", [VM_PLUGIN]):
        return [], "none (--config leaves the qemu plugin out)"
    missing = [package for tool, package in TOOLS.items() if shutil.which(tool) is None]
    notes: list[str] = []
    ready: dict[str, dict] = {}
    for name, slot in VM_SLOTS.items():
        absent = missing + ([QEMU_PACKAGES[slot["arch"]]] if shutil.which(ARCHES[slot["arch"]].qemu) is None else [])
        if absent:
            notes.append(f"{name}: QEMU is not installed (apt-get install {' '.join(absent)})")
        else:
            ready[name] = slot
    if ready:
        loaded = PluginSet(plugins.get("enable"), plugins.get("disable", []))
        if VM_PLUGIN not in loaded.names():
            why = next((s["reason"] for s in loaded.skipped if s["name"] == VM_PLUGIN), "it is not installed here")
            return [], "; ".join([f"none (the qemu plugin does not load: {why})", *notes])
        say("building the VM guests (the first time fetches Debian's kernels, some 90 MB)")
    entries: list[dict] = []
    for name, slot in ready.items():
        try:
            entries.append(_slot(name, slot, data_dir, cache or data_dir / "guests"))
        except (GuestError, OSError) as exc:
            notes.append(f"{name}: no guest to boot ({exc})")
    # (said as the lab starts, when its VMs begin to boot: `ls` shows a slot idle once one has)
    served = ", ".join(f"{e['name']} ({e['arch']}, {WARM} booting ahead: idle in ls once booted)" for e in entries)
    return entries, "; ".join([served or "none", *notes])


def _slot(name: str, slot: dict, data_dir: Path, cache: Path) -> dict:
    guest = build_guest(slot["arch"], cache)
    # a slot's files must lie in the exporter's state folder (the plugin refuses others)
    images = data_dir / "exporter" / "qemu" / "images" / slot["arch"]
    images.mkdir(parents=True, exist_ok=True)
    kernel, initrd = _place(guest.kernel, images / "vmlinuz"), _place(guest.initrd, images / "initrd.cpio.gz")
    append = " ".join(word for word in guest.append.split() if not word.startswith("console="))
    return {"name": name, "class": VM_CLASS, "plugin": VM_PLUGIN, **slot, "kernel": str(kernel),
            "initrd": str(initrd), "append": append, "warm": WARM, "prompt": re.escape(PROMPT.rstrip()) + " ?$"}


def _place(source: Path, target: Path) -> Path:
    """``source`` at ``target`` (a hard link where it can be: the same bytes, no copy), unless
    it is there already."""
    if target.exists() and os.path.samefile(source, target):
        return target
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    try:
        os.link(source, partial)
    except OSError:  # another file system
        shutil.copyfile(source, partial)
    os.replace(partial, target)
    return target
