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

A container gets the tty (``devloop_environment``) at ``/dev/device-loop/console``
(``DEVICE_LOOP_CONSOLE`` names it): a real tty as a device node, a pty as a bind mount.
"""
from __future__ import annotations

from collections.abc import Sequence
import logging
import os
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from device_loop.plugin import (ConfiguredResource, ContainerEnvironment, Health, HostContext, LeaseRef, PluginConfig,
                                Resource, Service, ServiceError, UsbTty, find_program, hookimpl, parse_framing,
                                start_bridge, tty_environment, usb_ttys)

from .ser2net import start_ser2net

log = logging.getLogger(__name__)


def _ser2net() -> str | None:
    return find_program("ser2net")  # (Debian installs it in /usr/sbin, off a normal user's PATH)


class UartConfig(PluginConfig):
    """A UART's entry: which one (``path`` or ``usb_serial``), and how it is served."""

    path: str | None = Field(default=None, min_length=1, description="its device node: /dev/serial/by-id/..., a pty")
    usb_serial: str | None = Field(default=None, min_length=1, description="the serial number of a USB adapter")
    usb_interface: str = Field(default="00", description="the adapter's interface: a number, or two hex digits")
    baud: int = Field(default=115200, ge=50, le=20_000_000, description="bits per second")
    framing: str = Field(default="8N1", description="data bits, parity, stop bits")
    raw: bool = Field(default=False, description="a raw TCP endpoint too, beside the RFC 2217 one (ser2net)")
    server: Literal["auto", "ser2net", "bridge"] = Field(
        default="auto", description="auto: ser2net where installed, else the built-in bridge")

    @field_validator("usb_interface", mode="before")
    @classmethod
    def _as_sysfs_writes_it(cls, value):
        """1 -> "01", "0A" -> "0a": two hex digits, as sysfs names an interface."""
        if isinstance(value, int) and not isinstance(value, bool):
            if not 0 <= value <= 255:
                raise ValueError(f"usb_interface must be a number from 0 to 255, not {value}")
            return f"{value:02x}"
        if isinstance(value, str):
            if not re.fullmatch(r"[0-9A-Fa-f]{1,2}", value):
                raise ValueError(
                    f"usb_interface must be a number, or two hex digits as sysfs writes them, not {value!r}")
            return value.lower().zfill(2)
        return value

    @field_validator("framing")
    @classmethod
    def _framing(cls, value: str) -> str:
        parse_framing(value)  # its ValueError says what a framing looks like
        return value

    @model_validator(mode="after")
    def _one_uart(self):
        if (self.path is None) == (self.usb_serial is None):
            raise ValueError("give path (a device node) or usb_serial (a USB adapter's serial number): one of them")
        if self.path is not None and "usb_interface" in self.model_fields_set:
            raise ValueError("usb_interface goes with usb_serial, not with path")
        return self


#: How an adapter that no entry names is served.
UNNAMED = UartConfig.model_construct()


def _server(config: UartConfig) -> str:
    """What serves the UART here, ``ser2net`` or ``bridge``; ValueError when the config asks
    for ser2net and this host has none."""
    if config.server == "ser2net" and not _ser2net():
        raise ValueError("server = ser2net, but ser2net is not installed")
    if config.server == "auto":
        return "ser2net" if _ser2net() else "bridge"
    return config.server


@hookimpl
def devloop_config_model() -> type[PluginConfig] | None:
    return UartConfig


@hookimpl
def devloop_check_config(entry: ConfiguredResource) -> str | None:
    config = entry.config
    if config.path is not None:
        return f"{config.path} does not exist (unplugged?)"
    return f"no USB serial adapter with serial number {config.usb_serial!r} is plugged in"


@hookimpl
def devloop_available(host: HostContext) -> str | None:
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


@hookimpl
def devloop_discover(host: HostContext) -> Sequence[Resource] | None:
    ttys = usb_ttys(host.sysfs_root)
    by_name = {tty.name: tty for tty in ttys}
    identity = _identities(ttys)
    claimed: set[str] = set()
    resources = []
    for entry in host.entries:
        config = entry.config
        if config.path is not None:
            if not os.path.exists(config.path):
                continue  # unplugged: a node on this host that is gone is really gone
            tty = by_name.get(os.path.basename(os.path.realpath(config.path)))
            identifier = identity[tty.name][0] if tty else f"uart:{host.name}:{config.path}"
            resources.append(entry.resource("uart", identifier, node=config.path))
        else:
            wanted = (config.usb_serial, config.usb_interface)
            tty = next((t for t in ttys if (t.device.serial, t.interface) == wanted and not t.port), None)
            if tty is None:
                continue
            resources.append(entry.resource("uart", identity[tty.name][0], node=f"/dev/{tty.name}"))
        if tty:
            claimed.add(tty.name)
    for tty in ttys:
        if tty.name not in claimed:
            identifier, name = identity[tty.name]
            resources.append(Resource(device=name, kind="uart", identifier=identifier, device_class="uart-adapter",
                                      tags=("usb",), node=f"/dev/{tty.name}", config=UNNAMED))
    return resources


@hookimpl
def devloop_health(resource: Resource) -> Health | None:
    """Without opening the port (that toggles DTR and resets many boards)."""
    if resource.node is None or not os.path.exists(resource.node):
        return Health("failed", f"{resource.node} is gone")
    if not os.access(resource.node, os.R_OK | os.W_OK):
        return Health("failed", f"the exporter may not read and write {resource.node}")
    try:
        _server(resource.config)
    except ValueError as exc:
        return Health("failed", f"config: {exc}")
    return Health("ok")


@hookimpl
def devloop_start(host: HostContext, resource: Resource, lease: LeaseRef) -> Service | None:
    config, node = resource.config, resource.node
    assert node is not None  # (discovery gives each uart resource its node)
    baud, framing, raw = config.baud, config.framing, config.raw
    try:
        server = _server(config)
    except ValueError as exc:
        raise ServiceError(str(exc)) from None
    if server == "ser2net":
        ser2net = _ser2net()
        if ser2net is None:  # (it was there a moment ago, for _server)
            raise ServiceError("ser2net is not installed")
        return start_ser2net(host, resource, lease, ser2net, node, baud, framing, raw)
    if raw:
        # Two bridges would each open the device and split what the board prints
        # between them; ser2net lets one client at a time have it.
        log.warning("uart: %s asks for a raw endpoint too; the built-in bridge serves RFC 2217 only",
                    resource.device)
    return start_bridge(host, resource, lease, node, baud, framing, rfc2217=True)


@hookimpl
def devloop_environment(host: HostContext, resource: Resource, service: Service | None) -> ContainerEnvironment | None:
    """The tty the lease serves, as discovery found it (never a path from the request)."""
    if resource.node is None or not os.path.exists(resource.node):
        return None
    return tty_environment(resource.node)
