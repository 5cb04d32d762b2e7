"""A power switch's config entry: which backend, and that backend's keys alone."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from device_loop.plugin import Duration, PluginConfig

COMMON = ("backend", "off_time", "timeout", "console_timeout")


@dataclass(frozen=True)
class Backend:
    """The keys a backend takes (besides ``COMMON``), which of them it needs, their defaults,
    and its cycle's default off-time."""

    keys: tuple[str, ...]
    required: tuple[str, ...] = ()
    defaults: dict[str, Any] = field(default_factory=dict)
    off_time: float = 2.0


BACKENDS: dict[str, Backend] = {
    "pdudaemon": Backend(("host", "port", "pdu", "outlet"), ("pdu", "outlet"),
                         {"host": "127.0.0.1", "port": 16421}, off_time=5.0),
    "uhubctl": Backend(("location", "port"), ("location", "port")),
    "ipmi": Backend(("host", "port", "user", "password_file", "interface", "cipher_suite"),
                    ("host", "user", "password_file"), {"port": 623, "interface": "lanplus", "cipher_suite": 3},
                    off_time=5.0),
    "redfish": Backend(("url", "user", "password_file", "system", "on_reset_type", "off_reset_type", "verify_tls"),
                       ("url", "system"), {"on_reset_type": "On", "off_reset_type": "ForceOff", "verify_tls": True},
                       off_time=5.0),
    "command": Backend(("on", "off", "status"), ("on", "off")),
    "sim": Backend(("switch",)),
}
BackendName = Literal["pdudaemon", "uhubctl", "ipmi", "redfish", "command", "sim"]
TEMPLATE_FIELDS = ("device",)


class PowerConfig(PluginConfig):
    """A power switch's entry: ``backend`` and the keys of that backend (``BACKENDS``); a
    key of another backend is refused by name, as is an unknown one."""

    backend: BackendName = Field(description="how the device's power is switched")
    off_time: Duration = Field(default=2.0, ge=0, description="a cycle's default off-time (seconds)")
    timeout: Duration = Field(default=30.0, gt=0, description="how long one call of the switch may take")
    console_timeout: Duration = Field(default=20.0, gt=0,
                                      description="how long after power-on the console may stay silent")
    host: str | None = Field(default=None, min_length=1, description="pdudaemon's or the BMC's address")
    port: int | None = Field(default=None, ge=1, le=65535,
                             description="pdudaemon's or the BMC's port; uhubctl: the hub's port")
    pdu: str | None = Field(default=None, min_length=1, description="the PDU's name in pdudaemon's config")
    outlet: int | str | None = Field(default=None, description="the PDU's outlet")
    location: str | None = Field(default=None, description="the USB hub's location, as uhubctl names it (1-1)")
    user: str | None = Field(default=None, min_length=1, description="the BMC's user")
    password_file: str | None = Field(default=None, min_length=1, description="a file holding the BMC's password")
    interface: Literal["lanplus", "lan"] | None = Field(default=None, description="ipmitool's interface")
    cipher_suite: int | None = Field(default=None, ge=0, le=17, description="ipmitool's cipher suite (lanplus)")
    url: str | None = Field(default=None, description="the Redfish service's root, http(s)://HOST[:PORT]")
    system: str | None = Field(default=None, min_length=1,
                               description="the ComputerSystem: its id or name, or its path (/redfish/v1/Systems/ID)")
    on_reset_type: str | None = Field(default=None, min_length=1, description="the ResetType that switches on")
    off_reset_type: str | None = Field(default=None, min_length=1, description="the ResetType that switches off")
    verify_tls: bool | None = Field(default=None, description="check the BMC's TLS certificate")
    on: list[str] | None = Field(default=None, min_length=1, description="the command that switches on (an argv)")
    off: list[str] | None = Field(default=None, min_length=1, description="the command that switches off (an argv)")
    status: list[str] | None = Field(default=None, min_length=1,
                                     description="a command whose output's first word, on or off, is the state")
    switch: str | None = Field(default=None, min_length=1, description="the simulated board's switch file")

    @model_validator(mode="before")
    @classmethod
    def _keys_of_the_backend(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("backend") not in BACKENDS:
            return data  # not an entry, or no backend: the fields say what is wrong
        if any(key not in cls.model_fields for key in data):
            return data  # an unknown key: pydantic names it, with the closest known one
        name = data["backend"]
        backend = BACKENDS[name]
        for key in data:
            if key not in COMMON and key not in backend.keys:
                owners = [other for other, b in BACKENDS.items() if key in b.keys]
                raise ValueError(f"{key!r} is a key of backend {' and '.join(repr(o) for o in owners)}, not of "
                                 f"{name!r}; {name!r} takes {', '.join(backend.keys)} (and {', '.join(COMMON[1:])})")
        missing = [key for key in backend.required if key not in data]
        if missing:
            raise ValueError(f"backend {name!r} needs {' and '.join(repr(k) for k in missing)}")
        if name == "redfish" and ("user" in data) != ("password_file" in data):
            raise ValueError("'user' and 'password_file' go together (HTTP basic auth), or neither is given")
        return {"off_time": backend.off_time, **backend.defaults, **data}

    @field_validator("outlet")
    @classmethod
    def _outlet(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and value < 0:
            raise ValueError(f"an outlet is a number from 0 or a name, not {value}")
        if isinstance(value, str) and not value.strip():
            raise ValueError("an outlet's name must not be blank")
        return value

    @field_validator("location")
    @classmethod
    def _location(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9]+(-[0-9]+(\.[0-9]+)*)?", value):
            raise ValueError(f"a hub's location is as uhubctl names it (1-1, 2-1.4), not {value!r}")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        match = re.fullmatch(r"(https?)://([^/?#]+)/*", value)
        if not match:
            raise ValueError("the url is the Redfish service's root, http(s)://HOST[:PORT], not what was given")
        if "@" in match.group(2):
            # a password in a URL ends up in messages and logs
            raise ValueError("the url must not hold credentials: give 'user' and 'password_file'")
        return value.rstrip("/")

    @field_validator("on", "off", "status")
    @classmethod
    def _template(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not value[0].strip():
            raise ValueError("a command's program must not be blank")
        try:
            [arg.format(**{f: "" for f in TEMPLATE_FIELDS}) for arg in value]
        except (ValueError, KeyError, IndexError) as exc:
            raise ValueError(f"{value!r} is not a usable template ({exc}); fields: "
                             f"{', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)}") from None
        return value

    @field_validator("system")
    @classmethod
    def _system(cls, value: str | None) -> str | None:
        if value is not None and not value.strip("/").strip():
            raise ValueError("system must name a system")
        return value
