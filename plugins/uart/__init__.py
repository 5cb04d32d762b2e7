"""UART consoles, served per lease by ser2net (telnet with RFC 2217, and raw TCP if asked).

Discovery reads sysfs: every USB serial adapter (``/sys/class/tty/*/device`` on a USB
interface) is a resource whose identity is its USB vendor, product, serial number and
interface, the facts udev uses for ``/dev/serial/by-id`` (never ``/dev/ttyUSBn``, which
changes on replug). An adapter nobody named in the config becomes a device of its own,
``uart-SERIAL``. Static UARTs come from the config.

Config (``[[devices]]`` with ``plugin = "uart"``, or a ``[[devices.resources]]`` entry):
``path`` (a device node: ``/dev/serial/by-id/...``, a pty) or ``usb_serial`` (and
``usb_interface``, default ``"00"``) to name a discovered adapter; ``baud`` (115200),
``framing`` (``8N1``), ``raw`` (false; true adds a raw TCP endpoint).

Where ser2net is not installed, the built-in bridge (``device_loop.core.serial_bridge``)
serves the same RFC 2217 endpoint; the exporter log says which one is used.
"""
from __future__ import annotations

import logging
import os
import re
import shutil

from device_loop.core.hookspecs import hookimpl
from device_loop.core.model import Health, Resource
from device_loop.core.serial_bridge import parse_framing, start_bridge
from device_loop.core.usb import UsbTty, usb_ttys

from .ser2net import start_ser2net

log = logging.getLogger(__name__)


def _ser2net() -> str | None:
    return shutil.which("ser2net")


@hookimpl
def devloop_available(host):
    server = _ser2net()
    log.info("uart: serving with %s", f"ser2net ({server})" if server else
             "the built-in bridge (pyserial): ser2net is not installed")
    return None


def _usb_identifier(tty: UsbTty) -> str:
    d = tty.device
    if d.serial:
        return f"usb-serial:{d.vendor}:{d.product}:{d.serial}:if{tty.interface}"
    return f"usb-port:{d.path.name}:if{tty.interface}"  # no serial number: the physical port it sits in


def _auto_name(tty: UsbTty) -> str:
    base = tty.device.serial or f"port-{tty.device.path.name}"
    suffix = "" if tty.interface == "00" else f"-if{tty.interface}"
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"uart-{base}{suffix}")[:64]


@hookimpl
def devloop_discover(host):
    ttys = {tty.name: tty for tty in usb_ttys(host.sysfs_root)}
    claimed: set[str] = set()
    resources = []
    for entry in host.configured("uart"):
        settings = entry.settings
        if "path" in settings:
            if not os.path.exists(settings["path"]):
                continue  # unplugged: a node on this host that is gone is really gone
            tty = ttys.get(os.path.basename(os.path.realpath(settings["path"])))
            identifier = _usb_identifier(tty) if tty else f"uart:{host.name}:{settings['path']}"
            resources.append(entry.resource("uart", identifier, node=settings["path"]))
        else:
            wanted = (str(settings.get("usb_serial", "")), str(settings.get("usb_interface", "00")))
            tty = next((t for t in ttys.values() if (t.device.serial, t.interface) == wanted), None)
            if tty is None:
                continue
            resources.append(entry.resource("uart", _usb_identifier(tty), node=f"/dev/{tty.name}"))
        if tty:
            claimed.add(tty.name)
    for name, tty in ttys.items():
        if name not in claimed:
            resources.append(Resource(device=_auto_name(tty), kind="uart", identifier=_usb_identifier(tty),
                                      device_class="uart-adapter", tags=("usb",), node=f"/dev/{name}"))
    return resources


@hookimpl
def devloop_health(resource):
    """Without opening the port (that toggles DTR and resets many boards)."""
    if not os.path.exists(resource.node):
        return Health("failed", f"{resource.node} is gone")
    if not os.access(resource.node, os.R_OK | os.W_OK):
        return Health("failed", f"the exporter may not read and write {resource.node}")
    try:
        parse_framing(str(resource.config.get("framing", "8N1")))
    except ValueError as exc:
        return Health("failed", str(exc))
    return Health("ok")


@hookimpl
def devloop_start(host, resource, lease):
    baud = int(resource.config.get("baud", 115200))
    framing = str(resource.config.get("framing", "8N1"))
    raw = bool(resource.config.get("raw", False))
    if _ser2net():
        return start_ser2net(host, resource, lease, resource.node, baud, framing, raw)
    service = start_bridge(host, resource, lease, resource.node, baud, framing, rfc2217=True)
    if raw:
        extra = start_bridge(host, resource, lease, resource.node, baud, framing)
        service.endpoints += extra.endpoints
        service.processes += extra.processes
    return service
