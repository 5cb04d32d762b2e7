"""The coordinator's own ssh logins to boards (docs/architecture.md, "Running a command on a
device"): an MCP ``exec`` on a board reached through ssh logs in as the coordinator's own
configuration says, never as an exporter reports. An exporter's token can be stolen, and
the coordinator's key must go only to boards its own configuration names.

``device-loop coordinator --ssh-logins FILE``, a TOML file: a table per device, or per host
(every device that host's exporter serves, unless the device has its own), each with the
``user`` to log in as, the ``identity`` (the coordinator's private key file; a relative path
is taken from the file's folder) and the board's ``host_key``, pinned strictly::

    [devices.vm-1]
    user = "root"
    identity = "keys/lab_ed25519"
    host_key = "ssh-ed25519 AAAA..."

    [hosts.rack-3]
    user = "ci"
    identity = "/etc/device-loop/lab_ed25519"
    host_key = "ssh-ed25519 AAAA..."

A device with neither has no ssh channel from the coordinator: its console is taken if its
lease has one, else the exec is refused, saying what to configure.
"""
from __future__ import annotations

import os
import stat
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Mapping

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

from device_loop.core import NAME_PATTERN
from device_loop.core.device_exec import SshLogin
from device_loop.core.ssh_keys import LOGIN_NAME_PATTERN, public_host_key

OPTION = "--ssh-logins"
_NAME = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
_MAX_ENTRIES = 10_000


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: str = Field(pattern=LOGIN_NAME_PATTERN, description="whom to log in as")
    identity: str = Field(min_length=1, max_length=4096, description="the coordinator's private key file")
    host_key: str = Field(max_length=16384, description="the board's public host key (ssh-ed25519 AAAA...)")

    _a_public_key = field_validator("host_key")(public_host_key)


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")
    devices: dict[_NAME, _Entry] = Field(default_factory=dict, max_length=_MAX_ENTRIES)
    hosts: dict[_NAME, _Entry] = Field(default_factory=dict, max_length=_MAX_ENTRIES)


@dataclass(frozen=True)
class SshLogins:
    """The coordinator's ssh logins, by device and by host."""
    devices: Mapping[str, SshLogin] = field(default_factory=dict)
    hosts: Mapping[str, SshLogin] = field(default_factory=dict)

    def login_for(self, device: str, host: str | None) -> SshLogin | None:
        """How the coordinator logs in to ``device`` (served by ``host``): its own entry, else
        its host's, else None (no ssh from the coordinator)."""
        return self.devices.get(device) or (self.hosts.get(host) if host else None)


class SshLoginsError(Exception):
    """A logins file that cannot be used, and why (one sentence a person can act on)."""


def load_ssh_logins(path: str | os.PathLike) -> SshLogins:
    """The logins of the TOML file ``path``; ``SshLoginsError`` if it cannot be read, does not
    fit, or names a key file this process cannot use (missing, unreadable, or readable by
    others, which ssh refuses)."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise SshLoginsError(f"cannot read {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SshLoginsError(f"{path} is not valid TOML: {exc}") from None
    try:
        parsed = _File.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise SshLoginsError(f"{path}: {where}: {first['msg']}") from None
    folder = Path(path).resolve().parent

    def login(where: str, entry: _Entry) -> SshLogin:
        identity = (folder / Path(entry.identity).expanduser()).resolve()
        _check_key_file(path, where, identity)
        return SshLogin(entry.user, str(identity), entry.host_key)

    return SshLogins({name: login(f"devices.{name}", e) for name, e in parsed.devices.items()},
                     {name: login(f"hosts.{name}", e) for name, e in parsed.hosts.items()})


def _check_key_file(path: str | os.PathLike, where: str, identity: Path) -> None:
    try:
        found = identity.stat()
        with open(identity, "rb"):
            pass
    except OSError as exc:
        raise SshLoginsError(f"{path}: {where}.identity: cannot read {identity}: {exc.strerror}") from None
    if not stat.S_ISREG(found.st_mode):
        raise SshLoginsError(f"{path}: {where}.identity: {identity} is not a file")
    if found.st_mode & 0o077:
        raise SshLoginsError(f"{path}: {where}.identity: {identity} may be read by others than its owner, and ssh "
                             f"refuses such a key: chmod 600 {identity}")
