"""Flash targets, written only through the coordinator's mediated flash
(docs/architecture.md, "Operations").

Config: a ``[[devices.resources]]`` entry with ``plugin = "flash"`` and one of:

- ``target``: a block device (``/dev/disk/by-id/...``, an SD card behind a mux) or a
  file (a VM's disk image); the image is streamed onto it, synced, and read back to check.
  Its result says so: ``verified``, with the ``sha256`` read back (the others': not verified).
- ``fastboot``: a phone's serial number, with ``partition`` (default ``boot``): runs
  ``fastboot -s SERIAL flash PARTITION IMAGE`` (no read-back: fastboot cannot read).
- ``command``: a command template for anything else (a BMC's flash tool), run without a
  shell; ``{image}``, ``{sha256}``, ``{size}``, ``{device}`` and ``{name}`` are filled in.

``timeout`` (seconds or ``10m``; fastboot 10m, a command 30m) bounds a program's run: past
it, the program and everything it forked are killed and the flash fails. The backend is
chosen here, by the config, never by the request. The target is a resource of kind
``flash`` that serves no lease: it runs one operation, ``flash``, whose image the exporter
fetched and verified (``op.image``).
"""
from __future__ import annotations

from typing import Any
from collections.abc import Mapping, Sequence
import dataclasses
import os
from pathlib import Path

from device_loop.plugin import (Health, HostContext, Operation, OperationError, OperationKind, PluginConfig, Resource,
                                hookimpl, usb_devices)

from .backends import FlashConfig, flash_with


@hookimpl
def devloop_available(host: HostContext) -> str | None:
    return None


@hookimpl
def devloop_config_model() -> type[PluginConfig] | None:
    return FlashConfig


@hookimpl
def devloop_discover(host: HostContext) -> Sequence[Resource] | None:
    return [dataclasses.replace(entry.resource("flash", f"flash:{host.name}:{entry.device}"), serves_lease=False)
            for entry in host.entries]


@hookimpl
def devloop_health(host: HostContext, resource: Resource) -> Health | None:
    config = resource.config
    backend = config.backend
    if backend == "target":
        target = Path(config.target)
        if not target.exists():
            return Health("failed", f"flash target {target} does not exist")
        if not os.access(target, os.W_OK):
            return Health("failed", f"flash target {target} is not writable by the exporter")
    elif backend == "fastboot":
        serials = {usb.serial for usb in usb_devices(host.sysfs_root)}
        if config.fastboot not in serials:
            return Health("degraded", f"no USB device with serial {config.fastboot} (a flash waits for it, "
                                      f"up to its timeout)")
    return Health("ok")


FLASH = OperationKind("flash", "write an image of the registry to the device, and check it where it can be read "
                               "back", exclusive=True, destructive=True)


@hookimpl
def devloop_operations(host: HostContext, resource: Resource) -> Sequence[OperationKind] | None:
    return [FLASH] if resource.kind == "flash" else None


@hookimpl
def devloop_operate(host: HostContext, resource: Resource, op: Operation) -> str | Mapping[str, Any] | None:
    if op.kind != FLASH.kind:
        raise OperationError(f"a flash target runs {FLASH.kind!r} alone, not {op.kind!r}", changed=False)
    if op.image is None:
        raise OperationError("a flash writes an image, and none came with this one", changed=False)
    try:
        return flash_with(host, resource, op.image, lambda phase, done: op.progress(phase, done, op.image.size,
                                                                                    "bytes"))
    except OSError as exc:
        raise OperationError(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")) from None

