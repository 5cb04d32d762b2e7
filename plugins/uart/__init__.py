"""UART consoles, served per lease by ser2net (telnet with RFC 2217, and raw TCP if asked).

Discovery reads sysfs: every USB serial adapter (``/sys/class/tty/*/device`` on a USB
interface) is a resource whose identity is its USB vendor, product, serial number and
interface, the facts udev uses for ``/dev/serial/by-id`` (never ``/dev/ttyUSBn``, which
changes on replug). An adapter nobody named in the config becomes a device of its own,
``uart-SERIAL``. Static UARTs come from the config.

Config (``[[devices]]`` with ``plugin = "uart"``, or a ``[[devices.resources]]`` entry):
``path`` (a device node: ``/dev/serial/by-id/...``, a pty) or ``usb_serial`` (and
``usb_interface``, default ``"00"``) to name a discovered adapter; ``baud`` (115200),
``framing`` (``8N1``), ``raw`` (false; true adds a raw TCP endpoint), ``server``
(``auto``: ser2net where installed, else the built-in bridge; or ``ser2net``, ``bridge``).

Where ser2net is not installed, the built-in bridge (``start_bridge``)
serves the same RFC 2217 endpoint (but no raw one); the exporter log says which is used.
"""
from __future__ import annotations

import logging
import os
import re
import shutil

from device_loop.plugin import Health, Resource, UsbTty, hookimpl, parse_framing, start_bridge, usb_ttys

from .ser2net import start_ser2net

log = logging.getLogger(__name__)


def _ser2net() -> str | None:
    # Debian installs it in /usr/sbin, which is not on a normal user's PATH
    return shutil.which("ser2net", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")


def _settings(config: dict) -> tuple[int, str, bool, str]:
    """(baud, framing, raw, server) from the config entry; ValueError names what is wrong."""
    baud = config.get("baud", 115200)
    if not isinstance(baud, int) or isinstance(baud, bool) or not 50 <= baud <= 20_000_000:
        raise ValueError(f"baud must be a whole number of bits per second, not {baud!r}")
    framing = config.get("framing", "8N1")
    parse_framing(str(framing))
    raw = config.get("raw", False)
    if not isinstance(raw, bool):
        raise ValueError(f"raw must be true or false, not {raw!r}")
    server = config.get("server", "auto")
    if server not in ("auto", "ser2net", "bridge"):
        raise ValueError(f"server must be auto, ser2net or bridge, not {server!r}")
    if server == "ser2net" and not _ser2net():
        raise ValueError("server = ser2net, but ser2net is not installed")
    if server == "auto":
        server = "ser2net" if _ser2net() else "bridge"
    return baud, str(framing), raw, server


@hookimpl
def devloop_check_config(entry):
    settings = entry.settings
    try:
        _settings(settings)
    except ValueError as exc:
        return str(exc)
    if "path" in settings:
        return f"{settings['path']} does not exist (unplugged?)"
    if "usb_serial" in settings:
        return f"no USB serial adapter with serial number {settings['usb_serial']!r} is plugged in"
    return "give path (a device node) or usb_serial (a USB adapter's serial number)"


@hookimpl
def devloop_available(host):
    server = _ser2net()
    log.info("uart: serving with %s", f"ser2net ({server})" if server else
             "the built-in bridge (pyserial): ser2net is not installed")
    return None


def _identities(ttys: list[UsbTty]) -> dict[str, tuple[str, str]]:
    """tty name -> (identifier, automatic device name).

    The USB serial number where it tells adapters apart; where it does not (none at
    all, or cheap adapters that all say "0001"), the physical port the adapter is in.
    """
    out = {}
    for tty in ttys:
        d = tty.device
        where = f"if{tty.interface}" + (f"-port{tty.port}" if tty.port else "")
        if d.serial and len({t.device.path for t in ttys if t.device.serial == d.serial}) == 1:
            identifier, base = f"usb-serial:{d.vendor}:{d.product}:{d.serial}:{where}", d.serial
        else:
            identifier, base = f"usb-port:{d.path.name}:{where}", f"port-{d.path.name}"
        suffix = "" if where == "if00" else f"-{where}"
        out[tty.name] = identifier, re.sub(r"[^A-Za-z0-9._-]", "_", f"uart-{base}{suffix}")[:64]
    return out


def _interface(value) -> str:
    """``usb_interface`` as sysfs writes it: two hex digits (1 -> "01", "0A" -> "0a")."""
    return f"{value:02x}" if isinstance(value, int) else str(value).lower().zfill(2)


@hookimpl
def devloop_discover(host):
    ttys = usb_ttys(host.sysfs_root)
    by_name = {tty.name: tty for tty in ttys}
    identity = _identities(ttys)
    claimed: set[str] = set()
    resources = []
    for entry in host.configured("uart"):
        settings = entry.settings
        if "path" in settings:
            if not os.path.exists(settings["path"]):
                continue  # unplugged: a node on this host that is gone is really gone
            tty = by_name.get(os.path.basename(os.path.realpath(settings["path"])))
            identifier = identity[tty.name][0] if tty else f"uart:{host.name}:{settings['path']}"
            resources.append(entry.resource("uart", identifier, node=settings["path"]))
        elif "usb_serial" in settings:
            wanted = (str(settings["usb_serial"]), _interface(settings.get("usb_interface", 0)))
            tty = next((t for t in ttys if (t.device.serial, t.interface) == wanted and not t.port), None)
            if tty is None:
                continue
            resources.append(entry.resource("uart", identity[tty.name][0], node=f"/dev/{tty.name}"))
        else:
            continue  # neither: the exporter lists it among the devices it cannot serve
        if tty:
            claimed.add(tty.name)
    for tty in ttys:
        if tty.name not in claimed:
            identifier, name = identity[tty.name]
            resources.append(Resource(device=name, kind="uart", identifier=identifier,
                                      device_class="uart-adapter", tags=("usb",), node=f"/dev/{tty.name}"))
    return resources


@hookimpl
def devloop_health(resource):
    """Without opening the port (that toggles DTR and resets many boards)."""
    if not os.path.exists(resource.node):
        return Health("failed", f"{resource.node} is gone")
    if not os.access(resource.node, os.R_OK | os.W_OK):
        return Health("failed", f"the exporter may not read and write {resource.node}")
    try:
        _settings(resource.config)
    except ValueError as exc:
        return Health("failed", f"config: {exc}")
    return Health("ok")


@hookimpl
def devloop_start(host, resource, lease):
    baud, framing, raw, server = _settings(resource.config)
    if server == "ser2net":
        return start_ser2net(host, resource, lease, _ser2net(), resource.node, baud, framing, raw)
    if raw:
        # Two bridges would each open the device and split what the board prints
        # between them; ser2net lets one client at a time have it.
        log.warning("uart: %s asks for a raw endpoint too; the built-in bridge serves RFC 2217 only",
                    resource.device)
    return start_bridge(host, resource, lease, resource.node, baud, framing, rfc2217=True)
