"""The exporter's TOML config (every key is documented in docs/exporter-config.md)."""
from __future__ import annotations

import difflib
import os
import socket
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from device_loop.core import NAME_PATTERN
from device_loop.core.model import ConfiguredResource
from device_loop.core.plugin_config import PluginConfig
from device_loop.core.protocol import HOST_PATTERN, MAX_TAGS, Tag, check_device_name, check_host

from .hook_deadlines import DEFAULT_TIMEOUT_S as DEFAULT_HOOK_TIMEOUT_S

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
    hook_timeout_s: float = Field(default=DEFAULT_HOOK_TIMEOUT_S, gt=0, le=600)  # discovery and health checks

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

    def entries(self) -> list[Entry]:
        """Its resource entries as written: the shorthand's one, or each [[devices.resources]]."""
        device_class, tags = self.device_class or "generic", tuple(self.tags)
        if self.plugin:
            return [Entry(self.name, device_class, tags, self.plugin, dict(self.model_extra or {}),
                          f"device {self.name!r}", shorthand=True)]
        return [Entry(self.name, device_class, tags, r.plugin, dict(r.model_extra or {}),
                      f"device {self.name!r}, resource {number}") for number, r in enumerate(self.resources, 1)]


@dataclass(frozen=True)
class Entry:
    """One resource entry of the config as written, before its plugin's model parses it:
    ``settings`` are its keys (``plugin`` aside), ``where`` says which entry it is (the
    device, and which of its ``[[devices.resources]]``, counted from 1)."""

    device: str
    device_class: str
    tags: tuple[str, ...]
    plugin: str
    settings: dict[str, Any]
    where: str
    shorthand: bool = False  # written in its [[devices]] table (plugin = ...), beside name, class and tags


class ExporterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    exporter: ExporterSection = Field(default_factory=ExporterSection)
    plugins: PluginsSection = Field(default_factory=PluginsSection)
    devices: list[DeviceEntry] = Field(default_factory=list)
    _source: str = PrivateAttr(default="config")

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

    @property
    def source(self) -> str:
        """Where it was read from (its file): what its errors name."""
        return self._source

    def entries(self) -> list[Entry]:
        """Every resource entry of every device, in the order of the file."""
        return [entry for device in self.devices for entry in device.entries()]


# The tables of a config as TOML writes them, and the models of those whose keys are fixed.
TABLES = {"exporter": "[exporter]", "plugins": "[plugins]", "devices": "[[devices]]"}
_FIXED_KEYS: dict[str, type[BaseModel]] = {"exporter": ExporterSection, "plugins": PluginsSection}


def parse_config(data: dict, source: str = "config") -> ExporterConfig:
    """Validate a config's data; a ``ConfigError`` names every problem, one a line."""
    try:
        config = ExporterConfig.model_validate(data)
    except ValidationError as exc:
        problems = "\n".join(f"  {'.'.join(map(str, e['loc'])) or 'config'}: {_problem(e)}" for e in exc.errors())
        raise ConfigError(f"{source} is not a valid exporter config:\n{problems}") from None
    config._source = source
    return config


def _problem(error: ErrorDetails) -> str:
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


# The keys a shorthand entry has beside its plugin's: a misspelt one is matched against them too.
_DEVICE_KEYS = [field.alias or name for name, field in DeviceEntry.model_fields.items()
                if name not in ("plugin", "resources")]


def parse_entries(config: ExporterConfig, models: dict[str, type[PluginConfig]]) -> list[ConfiguredResource | None]:
    """Each resource entry of ``config``, in its order, parsed by its plugin's model
    (``models``: those of the plugins loaded here); None where its plugin has no model here
    (not installed, left out, broken: its entries are reported as unserved). A ``ConfigError``
    names each entry that does not fit: the file, the device and which of its resources,
    the key, and for an unknown key the closest known one."""
    parsed: list[ConfiguredResource | None] = []
    problems: list[str] = []
    for entry in config.entries():
        model = models.get(entry.plugin)
        if model is None:
            parsed.append(None)
            continue
        where = f"  {entry.where} (plugin {entry.plugin!r})"
        try:
            parsed.append(ConfiguredResource(entry.device, entry.device_class, entry.tags, entry.plugin,
                                             model.model_validate(entry.settings)))
        except ValidationError as exc:
            problems += [f"{where}: {_entry_problem(e, model, entry)}" for e in exc.errors()]
        except Exception as exc:  # a validator of the plugin's raised what pydantic does not catch
            problems.append(f"{where}: its plugin's model broke on this entry ({exc!r})")
    if problems:
        raise ConfigError(f"{config.source} is not a valid exporter config:\n" + "\n".join(problems))
    return parsed


def _entry_problem(error: ErrorDetails, model: type[PluginConfig], entry: Entry) -> str:
    key = ".".join(map(str, error["loc"]))
    if error["type"] == "extra_forbidden" and len(error["loc"]) == 1:
        known = [field.alias or name for name, field in model.model_fields.items()]
        close = difflib.get_close_matches(key, known + (_DEVICE_KEYS if entry.shorthand else []), n=1)
        hint = (f"did you mean {close[0]!r}?" if close else f"its keys are {', '.join(known)}" if known else
                f"plugin {entry.plugin!r} takes no keys")
        return f"unknown key {key!r}; {hint}"
    message = error["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    return f"{key}: {message}" if key else message
