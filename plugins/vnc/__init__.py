"""Screens over VNC (RFB): a board's desktop, a VM's console, a local X display.

Config: a ``[[devices.resources]]`` entry with ``plugin = "vnc"`` and one of

- ``upstream = "host:port"``: a VNC server that is already there (the board's own, a VM's);
- ``display = ":N"``: an X display of this host (its socket ``/tmp/.X11-unix/XN`` is the
  proof it is this host's): x11vnc serves it, for the lease only.

A lease gets two endpoints: ``vnc`` (RFB, for any VNC viewer) and ``vnc-web``, an
``http://`` URL of noVNC, a viewer that runs in the browser, served by websockify with
Debian's noVNC files (``novnc`` and ``websockify`` packages; ``x11vnc`` for displays).

Behind a lease's gates (``host.private_socket``) x11vnc listens on a unix socket that only
the gate reaches. websockify can only listen on a port; there it bridges a websocket only to
a request that names the lease's secret as its ``token`` (its token file, in the lease's
private folder), so a local process that skips the gate gets noVNC's files and no screen.
"""
from __future__ import annotations

from collections.abc import Sequence
import re
import shutil
import socket
import urllib.parse
from pathlib import Path

from pydantic import Field, model_validator

from device_loop.plugin import (ConfiguredResource, Endpoint, EndpointRole, Health, HostContext, LeaseRef, PluginConfig,
                                Resource, Service, ServiceError, hookimpl, start_relay)

NOVNC = Path("/usr/share/novnc")
X_SOCKETS = Path("/tmp/.X11-unix")
COMMAND = "device-loop vnc {lease}"
DISPLAY = re.compile(r"^:(\d{1,4})$")
UPSTREAM = re.compile(r"^(.+):(\d{1,5})$")
REACH_TIMEOUT_S = 5.0


class VncConfig(PluginConfig):
    """A screen's entry: exactly one of ``upstream`` and ``display``."""

    upstream: str | None = Field(default=None, description="host:port of a VNC server that is there already")
    display: str | None = Field(default=None, description=":N, an X display of this host")

    @model_validator(mode="after")
    def _one_screen(self):
        self.exactly_one("upstream", "display")
        if self.display is not None and not DISPLAY.match(self.display):
            raise ValueError(f"display must look like :0, not {self.display!r}")
        if self.upstream is not None and not ((match := UPSTREAM.match(self.upstream))
                                              and 0 < int(match.group(2)) < 65536):
            raise ValueError(f"upstream must be host:port, not {self.upstream!r}")
        return self

    def screen(self) -> tuple[str, str]:
        """("upstream", "host:port") or ("display", "N")."""
        if self.display is not None:
            return ("display", self.display[1:])
        assert self.upstream is not None  # (exactly one of the two: _one_screen)
        return ("upstream", self.upstream)


@hookimpl
def devloop_config_model() -> type[PluginConfig] | None:
    return VncConfig


@hookimpl
def devloop_available(host: HostContext) -> str | None:
    if shutil.which("websockify") is None or not (NOVNC / "vnc.html").exists():
        return "websockify and noVNC are not installed (apt-get install novnc)"
    return None


@hookimpl
def devloop_check_config(host: HostContext, entry: ConfiguredResource) -> str | None:
    kind, value = entry.config.screen()
    if kind == "display":
        if shutil.which("x11vnc") is None:
            return "serving an X display needs x11vnc (apt-get install x11vnc)"
        return f"no X server has display :{value} on this host"
    return None


@hookimpl
def devloop_discover(host: HostContext) -> Sequence[Resource] | None:
    found = []
    for entry in host.entries:
        kind, value = entry.config.screen()
        if kind == "display":
            if shutil.which("x11vnc") is None or not (X_SOCKETS / f"X{value}").exists():
                continue
            found.append(entry.resource("vnc", f"x-display:{host.name}:{value}"))
        else:
            found.append(entry.resource("vnc", f"vnc:{host.name}:{entry.device}"))
    return found


@hookimpl
def devloop_health(host: HostContext, resource: Resource) -> Health | None:
    kind, value = resource.config.screen()
    if kind == "display" and not (X_SOCKETS / f"X{value}").exists():
        return Health("failed", f"display :{value} is gone (its X server stopped)")
    return Health("ok")


@hookimpl
def devloop_start(host: HostContext, resource: Resource, lease: LeaseRef) -> Service | None:
    kind, value = resource.config.screen()
    service = Service(endpoints=[])
    try:
        if kind == "display":
            private = host.private_socket("x11vnc")
            port = 0 if private else host.free_port()
            # (-rfbport 0 alone still listens on [::]:5900: its IPv6 listener has a port of its own;
            # and -localhost would refuse the unix socket's peer, which has no address)
            where = (["-unixsock", private, "-rfbport", "0", "-rfbportv6", "-1"] if private else
                     ["-rfbport", str(port), *(["-localhost"] if host.bind_address == "127.0.0.1"
                                               else ["-listen", host.bind_address])])
            server = host.processes.spawn(["x11vnc", "-display", f":{value}", *where,
                                           "-nopw", "-forever", "-shared", "-quiet", "-noxdamage"],
                                          name=f"x11vnc-{resource.device}-{lease.id}", lease=lease.id)
            service.processes.append(server)
            failed = server.wait_listening({port} - {0}, paths={private} if private else set())
            if failed:
                raise ServiceError(f"x11vnc did not start on display :{value}: {failed}")
            target = f"unix_socket:{private}" if private else f"127.0.0.1:{port}"
            service.endpoints.append(Endpoint(kind="vnc", host=host.advertise_address, port=port, protocol="rfb",
                                              command=COMMAND, role=EndpointRole.RFB, path=private))
        else:
            target = value
            _reachable(value)
            relay = start_relay(host, resource, lease, target, command=COMMAND, protocol="rfb", role=EndpointRole.RFB)
            service.endpoints += relay.endpoints
            service.processes += relay.processes
        service.endpoints.append(_web_viewer(host, resource, lease, target, service))
    except BaseException:
        for proc in service.processes:
            proc.stop()
        raise
    return service


def _reachable(target: str) -> None:
    """Refuse a lease's start when its VNC server does not answer (rather than publish a screen
    that is not there)."""
    where, _, port = target.rpartition(":")
    try:
        socket.create_connection((where, int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:
        raise ServiceError(f"cannot reach the VNC server {target}: {exc.strerror or exc}") from None


def _web_viewer(host, resource, lease, target: str, service: Service) -> Endpoint:
    """noVNC over websockify, bridging the browser's websocket to ``target`` (``host:port``, or
    ``unix_socket:PATH``); behind a gate, only for a request whose token is the lease's secret."""
    port = host.free_port()
    if host.private_dir is not None and lease.secret:
        tokens = host.private_dir / "websockify-tokens"
        tokens.touch(mode=0o600)
        tokens.write_text(f"{lease.secret}: {target}\n")
        towards = ["--token-plugin", "TokenFile", "--token-source", str(tokens)]
        # the websocket's path carries the capability for the gate, and the token for websockify
        socket_path = urllib.parse.quote(f"{lease.secret}/websockify?token={lease.secret}", safe="")
    else:
        towards, socket_path = [target], "websockify"
    bridge = host.processes.spawn(["websockify", "--web", str(NOVNC), f"{host.bind_address}:{port}", *towards],
                                  name=f"websockify-{resource.device}-{lease.id}", lease=lease.id)
    service.processes.append(bridge)
    failed = bridge.wait_listening({port})
    if failed:
        raise ServiceError(f"websockify did not start: {failed}")
    url = f"http://{host.advertise_address}:{port}/vnc.html?autoconnect=1&resize=scale&path={socket_path}"
    return Endpoint(kind="vnc-web", host=host.advertise_address, port=port, protocol="http", url=url,
                    command=COMMAND, role=EndpointRole.WEB_VIEWER)
