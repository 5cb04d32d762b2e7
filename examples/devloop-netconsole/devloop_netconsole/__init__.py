"""device-loop plugin ``netconsole``: a console that already speaks TCP.

Many labs reach board consoles through a console server (one TCP port per serial line)
or a BMC's serial-over-LAN. This plugin publishes such a console under a lease: each
lease gets its own port on the exporter, relayed to the console's address.

Exporter config::

    [[devices]]
    name = "bmc-7"
    class = "bmc"
    plugin = "netconsole"
    address = "console-server-3:7007"   # host:port of the console
    serial = "CS3-PORT7"                 # a stable identity (never the IP)
"""
import socket

from pydantic import Field

from device_loop.plugin import CONSOLE_COMMAND, EndpointRole, Health, PluginConfig, hookimpl, start_relay


class NetconsoleConfig(PluginConfig):
    """One console: the exporter refuses an entry with another key, or without these."""

    address: str = Field(pattern=r"^[^:\s]+:\d{1,5}$", description="host:port of the console")
    serial: str = Field(min_length=1, description="a stable identity (never the IP)")


@hookimpl
def devloop_config_model():
    return NetconsoleConfig


@hookimpl
def devloop_available(host):
    return None  # needs nothing but the network


@hookimpl
def devloop_discover(host):
    # Configured consoles only: this plugin never scans the network.
    return [entry.resource("uart", f"netconsole:{entry.config.serial}") for entry in host.entries]


@hookimpl
def devloop_health(resource):
    address, _, port = resource.config.address.rpartition(":")
    try:
        socket.getaddrinfo(address, int(port), type=socket.SOCK_STREAM)
    except OSError as exc:
        return Health("failed", f"cannot resolve {address}: {exc}")
    return Health("ok")


@hookimpl
def devloop_start(host, resource, lease):
    return start_relay(host, resource, lease, resource.config.address, command=CONSOLE_COMMAND,
                       role=EndpointRole.CONSOLE)
