"""Flash targets, written only through the coordinator's mediated flash (DESIGN §6).

Config: a ``[[devices.resources]]`` entry with ``plugin = "flash"`` and one of:

- ``target``: a block device (``/dev/disk/by-id/...``, an SD card behind a mux) or a
  file (a VM's disk image); the image is streamed onto it, synced, and read back to check.
- ``fastboot``: a phone's serial number, with ``partition`` (default ``boot``): runs
  ``fastboot -s SERIAL flash PARTITION IMAGE`` (no read-back: fastboot cannot read).
- ``command``: a command template for anything else (a BMC's flash tool), run without a
  shell; ``{image}``, ``{sha256}``, ``{size}``, ``{device}`` and ``{name}`` are filled in.

``timeout`` (seconds or ``10m``; fastboot 10m, a command 30m) bounds a program's run: past
it, the program and everything it forked are killed and the flash fails. The backend is
chosen here, by the config, never by the request. The target is a resource of kind
``flash``: the coordinator never serves it to a lease holder.
"""
from __future__ import annotations

import os
from pathlib import Path

from device_loop.plugin import FlashError, Health, hookimpl, usb_devices

from .backends import KEYS, backend_of, flash_with


@hookimpl
def devloop_available(host):
    return None


@hookimpl
def devloop_check_config(entry):
    return entry.problem(KEYS, backend_of)


@hookimpl
def devloop_discover(host):
    return [entry.resource("flash", f"flash:{host.name}:{entry.device}")
            for entry, _ in host.usable("flash", KEYS, backend_of)]


@hookimpl
def devloop_health(host, resource):
    backend, settings = backend_of(resource.config)
    if backend == "target":
        target = Path(settings["target"])
        if not target.exists():
            return Health("failed", f"flash target {target} does not exist")
        if not os.access(target, os.W_OK):
            return Health("failed", f"flash target {target} is not writable by the exporter")
    elif backend == "fastboot":
        serials = {usb.serial for usb in usb_devices(host.sysfs_root)}
        if settings["fastboot"] not in serials:
            return Health("degraded", f"no USB device with serial {settings['fastboot']} (a flash waits for it, "
                                      f"up to its timeout)")
    return Health("ok")


@hookimpl
def devloop_flash(host, resource, image, progress):
    try:
        return flash_with(host, resource, image, progress)
    except OSError as exc:
        raise FlashError(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")) from None

