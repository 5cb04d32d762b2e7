"""A board's (or a VM's) sshd, relayed for a lease: the ``ssh`` resource kind.

Config: a ``[[devices.resources]]`` entry (or a ``[[devices]]`` one) with ``plugin = "ssh"``:
``host`` (where the board's sshd is, as this exporter reaches it; default ``127.0.0.1``),
``port`` (default 22), ``user`` (whom to log in as; default ``root``) and optionally
``host_key``, the board's public host key as its ``/etc/ssh/ssh_host_ed25519_key.pub`` says
it (``ssh-ed25519 AAAA...``, the comment left out), which clients then pin: ``device-loop
exec`` refuses a board that shows another key (unless its user pins keys of their own). The
coordinator's MCP ``exec`` takes neither ``user`` nor ``host_key`` from here: it logs in only
as its own ``--ssh-logins`` says.

A lease gets one endpoint, role ``ssh``: a TCP relay to the sshd (behind the lease gate in a
lab with tokens), with ``params`` ``user`` and ``host_key``. The exporter takes no part in
logging in: the client authenticates with its own key (``device-loop exec --identity FILE``,
``$DEVICE_LOOP_SSH_IDENTITY``, else ssh's own keys and agent), which the board's
``authorized_keys`` must hold: that is the lab admin's business, as the board's image is.
"""
from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import re

from pydantic import Field, field_validator

from device_loop.plugin import (LOGIN_NAME_PATTERN, EndpointRole, HostContext, LeaseRef, PluginConfig, Resource,
                                Service, hookimpl, pinned_host_key, start_relay)

COMMAND = "ssh -p {port} {user}@{host}"
_HOST = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9.-]{0,252}|[0-9A-Fa-f:.]{2,45})$")


class SshConfig(PluginConfig):
    """A board's sshd: where it is, whom to log in as, and its host key to pin."""

    host: str = Field(default="127.0.0.1", description="the sshd's address, as this exporter reaches it")
    port: int = Field(default=22, ge=1, le=65535, description="the sshd's port")
    user: str = Field(default="root", pattern=LOGIN_NAME_PATTERN, description="whom to log in as")
    host_key: str | None = Field(default=None, description="the board's public host key (ssh-ed25519 AAAA...), "
                                                           "which clients pin")

    @field_validator("host")
    @classmethod
    def _an_address(cls, host: str) -> str:
        if not _HOST.match(host):
            raise ValueError(f"host must be a DNS name or an IP address, not {host!r}")
        return host

    @field_validator("host_key")
    @classmethod
    def _a_public_key(cls, key: str | None) -> str | None:
        if key is None:
            return None
        return pinned_host_key(key)


@hookimpl
def devloop_config_model() -> type[PluginConfig] | None:
    return SshConfig


@hookimpl
def devloop_discover(host: HostContext) -> Sequence[Resource] | None:
    return [entry.resource("ssh", f"ssh:{host.name}:{entry.device}") for entry in host.entries]


@hookimpl
def devloop_start(host: HostContext, resource: Resource, lease: LeaseRef) -> Service | None:
    config = resource.config
    service = start_relay(host, resource, lease, f"{config.host}:{config.port}", command=COMMAND, protocol="ssh",
                          role=EndpointRole.SSH)
    params = {"user": config.user, **({"host_key": config.host_key} if config.host_key else {})}
    service.endpoints = [dataclasses.replace(endpoint, params=params) for endpoint in service.endpoints]
    return service
