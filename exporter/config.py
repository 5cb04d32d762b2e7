"""The exporter's TOML config (every key is documented in docs/exporter-config.md)."""
from __future__ import annotations

import difflib
import os
import socket
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from device_loop.core import NAME_PATTERN
from device_loop.core.model import ConfiguredResource
from device_loop.core.protocol import HOST_PATTERN, MAX_TAGS, Tag, check_device_name, check_host

DEFAULT_COORDINATOR = "http://127.0.0.1:7420"


class ConfigError(Exception):
    """The config file cannot be used; the message says where and why."""


def default_state_dir(name: str) -> Path:
    base = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state"))
    return base / "device-loop" / f"exporter-{name}"


class ExporterSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(default_factory=socket.gethostname, pattern=NAME_PATTERN)
    coordinator: str = Field(default_factory=lambda: os.environ.get("DEVICE_LOOP_COORDINATOR", DEFAULT_COORDINATOR))
    heartbeat_s: float = Field(default=5.0, gt=0, le=3600)
    sysfs_root: Path = Path("/sys")
    state_dir: Path | None = None
    bind_address: str = Field(default="127.0.0.1", pattern=HOST_PATTERN)
    # what endpoints say and heartbeats report as this host's own address: the coordinator
    # refuses an endpoint anywhere else, so it is checked here, where it is written
    advertise_address: str | None = Field(default=None, pattern=HOST_PATTERN)
    token_file: Path | None = None
    image_cache_gib: float = Field(default=20.0, gt=0)

    _addresses = field_validator("bind_address", "advertise_address")(check_host)


class PluginsSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enable: list[str] | None = None
    disable: list[str] = Field(default_factory=list)


class ResourceEntry(BaseModel):
    model_config = ConfigDict(extra="allow")
    plugin: str = Field(min_length=1)


class DeviceEntry(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: str = Field(pattern=NAME_PATTERN)
    device_class: str | None = Field(default=None, alias="class", min_length=1, max_length=64)
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS)
    plugin: str | None = None
    resources: list[ResourceEntry] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_form(self):
        check_device_name(self.name)
        if self.plugin and self.resources:
            raise ValueError("give either 'plugin' (one resource) or [[devices.resources]], not both")
        if not self.plugin and not self.resources:
            raise ValueError("a device needs 'plugin' or at least one [[devices.resources]] entry")
        return self

    def resource_settings(self) -> list[dict[str, Any]]:
        if self.plugin:
            extra = dict(self.model_extra or {})
            return [{"plugin": self.plugin, **extra}]
        return [r.model_dump() for r in self.resources]


class ExporterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    exporter: ExporterSection = Field(default_factory=ExporterSection)
    plugins: PluginsSection = Field(default_factory=PluginsSection)
    devices: list[DeviceEntry] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_names(self):
        names = [d.name for d in self.devices]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"device names appear twice: {', '.join(dupes)}")
        return self

    @property
    def state_dir(self) -> Path:
        return (self.exporter.state_dir or default_state_dir(self.exporter.name)).expanduser()

    def configured_resources(self) -> list[ConfiguredResource]:
        out = []
        for device in self.devices:
            default_class = device.device_class or "generic"
            for settings in device.resource_settings():
                out.append(ConfiguredResource(device=device.name, device_class=default_class,
                                              tags=tuple(device.tags), settings=settings))
        return out


# The tables of a config as TOML writes them, and the models of those whose keys are fixed.
TABLES = {"exporter": "[exporter]", "plugins": "[plugins]", "devices": "[[devices]]"}
_FIXED_KEYS = {"exporter": ExporterSection, "plugins": PluginsSection}


def parse_config(data: dict, source: str = "config") -> ExporterConfig:
    """Validate a config's data; a ``ConfigError`` names every problem, one a line."""
    try:
        return ExporterConfig.model_validate(data)
    except ValidationError as exc:
        problems = "\n".join(f"  {'.'.join(map(str, e['loc'])) or 'config'}: {_problem(e)}" for e in exc.errors())
        raise ConfigError(f"{source} is not a valid exporter config:\n{problems}") from None


def _problem(error: dict) -> str:
    if error["type"] == "extra_forbidden" and (len(error["loc"]) == 1 or error["loc"][0] in _FIXED_KEYS):
        return _unknown_key(error["loc"], error["input"])
    return error["msg"].removeprefix("Value error, ")


def _unknown_key(loc: tuple, value: Any) -> str:
    """An unknown key named with its table and the closest known one (a typo is the usual cause)."""
    *table, key = map(str, loc)
    if not table:
        home = next((t for t, model in _FIXED_KEYS.items() if key in model.model_fields), None)
        if home and not isinstance(value, (list, dict)):
            return f"{key!r} belongs in the table [{home}]: put it below a line [{home}]"
        written = f"[[{key}]]" if isinstance(value, list) else f"[{key}]" if isinstance(value, dict) else repr(key)
        close = difflib.get_close_matches(key, TABLES, n=1)
        hint = f"did you mean {TABLES[close[0]]}?" if close else f"its tables are {', '.join(TABLES.values())}"
        return f"an exporter config has no {written}; {hint}"
    known = list(_FIXED_KEYS[table[0]].model_fields)
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"its keys are {', '.join(known)}"
    return f"unknown key {key!r} in [{table[0]}]; {hint}"


def load_config(path: str | os.PathLike) -> ExporterConfig:
    """Read and check a config file: the one loader of ``device-loop exporter`` and ``device-loop up --config``."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    return parse_config(data, str(path))
