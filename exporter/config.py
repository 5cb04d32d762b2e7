"""The exporter's TOML config (every key is documented in docs/exporter-config.md)."""
from __future__ import annotations

import difflib
import os
import re
import shlex
import socket
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Mapping, Sequence, get_args

from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, TypeAdapter, ValidationError, field_validator,
                      model_validator)
from pydantic_core import ErrorDetails

from device_loop.core import NAME_PATTERN
from device_loop.core.durations import parse_duration
from device_loop.core.model import ConfiguredResource, StepKind
from device_loop.core.plugin_config import Duration, PluginConfig
from device_loop.core.process import DEFAULT_START_TIMEOUT_S
from device_loop.core.vocabulary import AutoRecover
from device_loop.core.protocol import (HOST_PATTERN, MAX_STEPS, MAX_TAGS, Tag, Word, check_device_name,
                                       check_host)

from .cdi import DEFAULT_CDI_DIR
from .health_schedule import HealthRules
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
    # how long a program a service starts gets to listen (a loaded host starts them many times slower)
    service_start_timeout_s: float = Field(default=DEFAULT_START_TIMEOUT_S, gt=0, le=3600)
    # the TCP ports endpoints take, "40000-40999", so that a firewall rule can name them (None: any)
    port_range: str | None = Field(default=None, pattern=r"^\d{1,5}-\d{1,5}$")
    cdi_dir: Path = DEFAULT_CDI_DIR  # where the leases' CDI specs go (docs/architecture.md, "Containers and CDI")
    # each resource's health schedule and quarantine (docs/architecture.md, "Health that heals")
    health_period: Duration = Field(default=HealthRules.period_s, ge=0.1, le=3600)
    health_recheck: Duration = Field(default=HealthRules.recheck_s, ge=0.05, le=60)
    quarantine_failures: int = Field(default=HealthRules.quarantine_failures, ge=2, le=100)
    quarantine_window: Duration = Field(default=HealthRules.quarantine_window_s, ge=1, le=7 * 86400)
    quarantine_ceiling: Duration = Field(default=HealthRules.quarantine_ceiling_s, ge=0.1, le=86400)
    quarantine_good_probes: int = Field(default=HealthRules.good_probes, ge=1, le=100)

    _addresses = field_validator("bind_address", "advertise_address")(check_host)

    @property
    def ports(self) -> tuple[int, int] | None:
        """``port_range`` as (first, last)."""
        if self.port_range is None:
            return None
        first, last = self.port_range.split("-")
        return int(first), int(last)

    @model_validator(mode="after")
    def _port_range_in_order(self) -> "ExporterSection":
        if self.ports is not None and not 1024 <= self.ports[0] <= self.ports[1] <= 65535:
            raise ValueError(f"port_range {self.port_range!r}: FIRST-LAST, 1024 <= FIRST <= LAST <= 65535")
        return self

    @model_validator(mode="after")
    def _health_times_in_order(self) -> "ExporterSection":
        if self.health_recheck > self.health_period:
            raise ValueError(f"health_recheck ({self.health_recheck:g} s) must not be longer than health_period "
                             f"({self.health_period:g} s): a re-check comes sooner than the next check")
        if self.quarantine_ceiling < self.health_period:
            raise ValueError(f"quarantine_ceiling ({self.quarantine_ceiling:g} s) must not be shorter than "
                             f"health_period ({self.health_period:g} s): probes only grow apart from it")
        return self

    def health_rules(self) -> HealthRules:
        """The health schedule's settings these keys make."""
        return HealthRules(period_s=self.health_period, recheck_s=self.health_recheck,
                           quarantine_failures=self.quarantine_failures, quarantine_window_s=self.quarantine_window,
                           quarantine_ceiling_s=self.quarantine_ceiling, good_probes=self.quarantine_good_probes)


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
    # what runs between two leases, as written: parsed by parse_steps, which names each problem
    steps: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_STEPS)
    # (docs/architecture.md, "Power"): power-cycled once when its health turns failed, nobody holding it
    auto_recover: AutoRecover | None = None

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


# ---- steps between leases (docs/architecture.md, "Steps between leases") ----------------------

#: What a console prints once it has booted: a shell's prompt (``root@x:~# ``, ``$ ``) ending the output.
DEFAULT_PROMPT = r"[#$] ?$"
LINE_ENDINGS = {"\r": "CR", "\n": "LF", "\r\n": "CR LF"}
MAX_STEP_TIMEOUT_S = 7 * 86400  # (what a report carries)
_TEMPERATURE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(?:°\s*)?[Cc]?\s*$")
_WORD = TypeAdapter(Word)


def parse_temperature(value: Any) -> float:
    """Degrees Celsius as a config writes them: ``45``, ``45.5``, ``"45C"``, ``"45 °C"``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        degrees = float(value)
    elif isinstance(value, str) and (match := _TEMPERATURE.match(value)):
        degrees = float(match.group(1))
    else:
        raise ValueError(f"not a temperature: {value!r} (write 45C, \"45 °C\" or 45)")
    if not -50 <= degrees <= 200:
        raise ValueError(f"{degrees:g} °C is not a temperature a device cools below")
    return degrees


def _step_timeout(value: Any) -> float | None:
    if value is None:
        return None
    try:
        if isinstance(value, bool):
            raise ValueError(value)
        seconds = parse_duration(value)
    except (ValueError, TypeError):
        raise ValueError(f"not a duration: {value!r} (write 90s, 10m, 1h30m, or seconds)") from None
    if seconds > MAX_STEP_TIMEOUT_S:
        raise ValueError(f"a step may take {MAX_STEP_TIMEOUT_S // 86400} days at most, not {value!r}")
    return seconds


class StepConfig(BaseModel):
    """One ``[[devices.steps]]`` (or ``[[classes.NAME.steps]]``) entry: the keys every step
    has; each built-in step's model adds its own, and a plugin's step takes those its
    ``StepKind`` declares (checked at the exporter's start: ``check_steps``)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    DEFAULT_TIMEOUT_S: ClassVar[float] = 600.0
    SETTLES: ClassVar[bool] = False  # run by a settle inside a lease, unless the entry says
    DESCRIPTION: ClassVar[str] = ""  # what it does, as device-loop hosts lists the exporter's own steps
    step: str
    timeout: float | None = None
    settle: bool | None = None

    _timeout = field_validator("timeout", mode="before")(_step_timeout)

    @classmethod
    def kind(cls) -> str:
        """A built-in step's name: the one its model's ``step`` takes (``Literal["cooldown"]``)."""
        return get_args(cls.model_fields["step"].annotation)[0]

    @property
    def settles(self) -> bool:
        return self.SETTLES if self.settle is None else self.settle

    def timeout_for(self, kind: StepKind | None = None) -> float:
        """How long it may take: its ``timeout``, else its kind's default (a plugin step's
        ``StepKind.timeout_s``)."""
        if self.timeout is not None:
            return self.timeout
        return kind.timeout_s if kind is not None else self.DEFAULT_TIMEOUT_S


class CooldownStep(StepConfig):
    """Wait until every thermal zone of the device reads below ``below`` (°C)."""
    DEFAULT_TIMEOUT_S: ClassVar[float] = 600.0
    SETTLES: ClassVar[bool] = True
    DESCRIPTION: ClassVar[str] = "wait until every thermal zone of the device reads below a threshold (below = \"45C\")"
    step: Literal["cooldown"]
    below: float

    _below = field_validator("below", mode="before")(parse_temperature)


class CommandStep(StepConfig):
    """Run an admin's program (no shell); ``{device}`` in its arguments is the device's name."""
    DEFAULT_TIMEOUT_S: ClassVar[float] = 600.0
    DESCRIPTION: ClassVar[str] = ("run a program (command = [...]; no shell), killed at its timeout; a non-zero exit "
                                  "fails")
    step: Literal["command"]
    command: list[str] = Field(min_length=1)

    @field_validator("command", mode="before")
    @classmethod
    def _argv(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = shlex.split(value)
            except ValueError as exc:
                raise ValueError(f"cannot be split into arguments ({exc}): {value!r}") from None
        if isinstance(value, list) and not value:
            raise ValueError("give the program to run (a list of its arguments, or a string split as a shell "
                             "would, though none runs it)")
        return value

    def argv(self, device: str) -> list[str]:
        """The program's arguments with ``{device}`` filled in (plain substitution, never a format string)."""
        return [arg.replace("{device}", device) for arg in self.command]


class RebootStep(StepConfig):
    """Reboot through the device's console: ``command`` and ``line_ending`` sent on its UART,
    done once ``prompt`` (a regular expression) ends what the console printed after it."""
    DEFAULT_TIMEOUT_S: ClassVar[float] = 300.0
    DESCRIPTION: ClassVar[str] = ("send reboot on the device's console and wait for its prompt (command, prompt, "
                                  "line_ending)")
    step: Literal["reboot"]
    command: str = Field(default="reboot", min_length=1)
    prompt: str = DEFAULT_PROMPT
    line_ending: str = "\r"

    @field_validator("prompt")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression ({exc}): {value!r}") from None
        return value

    @field_validator("line_ending")
    @classmethod
    def _line_ending(cls, value: str) -> str:
        if value not in LINE_ENDINGS:
            raise ValueError(f"one of \"\\r\" (CR), \"\\n\" (LF) or \"\\r\\n\", not {value!r}")
        return value


class ReflashStep(StepConfig):
    """Flash the device's latest known-good image: the coordinator asks for the flash, on the
    device's flash resource, as for any flash."""
    DEFAULT_TIMEOUT_S: ClassVar[float] = 1800.0
    DESCRIPTION: ClassVar[str] = "flash the device's latest known-good image through its flash resource"
    step: Literal["reflash"]

    @model_validator(mode="after")
    def _not_inside_a_lease(self):
        if self.settle:
            raise ValueError("settle: a reflash cannot settle a device inside a lease (it writes the image the "
                             "lease's holder may be using)")
        return self


class PowerCycleStep(StepConfig):
    """Switch the device off for ``off_time`` (its switch's default without one) and on again
    through its power resource (docs/architecture.md, "Power"); a cycle nobody could observe
    fails the step unless ``verify = false``."""
    DEFAULT_TIMEOUT_S: ClassVar[float] = 120.0
    DESCRIPTION: ClassVar[str] = ("switch the device off and on through its power resource, verified by its read-back "
                                  "or console (off_time, verify)")
    step: Literal["power-cycle"]
    off_time: float | None = None
    verify: bool = True

    _off_time = field_validator("off_time", mode="before")(_step_timeout)

    @field_validator("off_time")
    @classmethod
    def _off_time_bound(cls, value: float | None) -> float | None:
        if value is not None and not 0 <= value <= 600:
            raise ValueError("a power cycle's off_time is 0 to 10 minutes")
        return value

    @model_validator(mode="after")
    def _not_inside_a_lease(self):
        if self.settle:
            raise ValueError("settle: a power cycle cannot settle a device inside a lease (it would take the board "
                             "from under its holder)")
        if self.off_time is not None and self.off_time >= self.timeout_for() / 2:
            raise ValueError(f"off_time: {self.off_time:g} s off leaves too little of the step's "
                             f"{self.timeout_for():g} s timeout to switch it off and on again (give it a timeout "
                             "of more than twice the off-time)")
        return self


class PluginStepConfig(StepConfig):
    """A step a plugin offers (``devloop_steps``); its other keys are the step's settings,
    handed to the plugin's ``devloop_operate`` as ``op.args``."""
    model_config = ConfigDict(extra="allow", strict=True, frozen=True)

    @model_validator(mode="after")
    def _scalar_settings(self):
        for key, value in (self.model_extra or {}).items():
            if not isinstance(value, (str, int, float, bool)):
                raise ValueError(f"{key}: a step's setting is a text, a number or true/false, not {value!r}")
        return self

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


#: The steps the exporter knows itself, one entry each (docs/architecture.md, "Steps between leases"): a step's
#: model is its name (``step: Literal[...]``), keys, checks, default timeout and description; its runner is
#: ``steps.RUNNERS``. Any other name is a plugin's (``devloop_steps``).
STEP_MODELS: dict[str, type[StepConfig]] = {model.kind(): model for model in (
    CooldownStep, CommandStep, RebootStep, ReflashStep, PowerCycleStep)}
BUILT_IN_STEPS = tuple(STEP_MODELS)


class ClassEntry(BaseModel):
    """``[classes.NAME]``: what every device of class NAME shares (its steps, unless a
    device lists steps of its own)."""
    model_config = ConfigDict(extra="forbid")
    steps: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_STEPS)


class ExporterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    exporter: ExporterSection = Field(default_factory=ExporterSection)
    plugins: PluginsSection = Field(default_factory=PluginsSection)
    devices: list[DeviceEntry] = Field(default_factory=list)
    classes: dict[str, ClassEntry] = Field(default_factory=dict)
    _source: str = PrivateAttr(default="config")
    _steps: dict[tuple[str, str], list[StepConfig]] | None = PrivateAttr(default=None)

    @field_validator("classes")
    @classmethod
    def _class_names(cls, classes: dict[str, ClassEntry]) -> dict[str, ClassEntry]:
        for name in classes:
            if not 1 <= len(name) <= 64:
                raise ValueError(f"a class name takes 1 to 64 characters, not {name!r}")
        return classes

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

    def steps_of(self, device: str, device_class: str) -> list[StepConfig]:
        """What runs on ``device`` (of ``device_class``) between two leases, in order: its own
        ``[[devices.steps]]`` if it has any, else its class's (``[[classes.NAME.steps]]``;
        a device that discovery found, not the config, gets its class's too)."""
        steps = self.parsed_steps()
        return steps.get(("device", device)) or steps.get(("class", device_class)) or []

    def auto_recovery(self) -> dict[str, str]:
        """Device -> what the coordinator may do on its own when its health turns failed."""
        return {d.name: d.auto_recover for d in self.devices if d.auto_recover}

    def parsed_steps(self) -> dict[tuple[str, str], list[StepConfig]]:
        """The step lists of the config: ``("device", NAME)`` and ``("class", NAME)`` -> its
        steps, parsed (a ``ConfigError`` names every one that does not fit)."""
        if self._steps is None:
            self._steps = parse_steps(self)
        return self._steps


# The tables of a config as TOML writes them, and the models of those whose keys are fixed.
TABLES = {"exporter": "[exporter]", "plugins": "[plugins]", "devices": "[[devices]]"}
# what a device class shares (its steps): a table too, named by the class, which a misspelt name is matched against
_CLASS_TABLES = {"classes": "[classes.NAME]"}
_FIXED_KEYS: dict[str, type[BaseModel]] = {"exporter": ExporterSection, "plugins": PluginsSection}


def parse_config(data: dict, source: str = "config") -> ExporterConfig:
    """Validate a config's data; a ``ConfigError`` names every problem, one a line."""
    try:
        config = ExporterConfig.model_validate(data)
    except ValidationError as exc:
        problems = "\n".join(f"  {'.'.join(map(str, e['loc'])) or 'config'}: {_problem(e)}" for e in exc.errors())
        raise ConfigError(f"{source} is not a valid exporter config:\n{problems}") from None
    config._source = source
    config.parsed_steps()  # refused now, not when a lease ends
    return config


def _problem(error: ErrorDetails) -> str:
    if error["type"] == "extra_forbidden" and (len(error["loc"]) == 1 or error["loc"][0] in _FIXED_KEYS):
        return _unknown_key(error["loc"], error["input"])
    if error["type"] == "extra_forbidden" and error["loc"][0] == "classes" and len(error["loc"]) == 3:
        key, known = str(error["loc"][2]), list(ClassEntry.model_fields)
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"its keys are {', '.join(known)}"
        return f"unknown key {key!r} in [classes.{error['loc'][1]}]; {hint}"
    return error["msg"].removeprefix("Value error, ")


def _unknown_key(loc: tuple, value: Any) -> str:
    """An unknown key named with its table and the closest known one (a typo is the usual cause)."""
    *table, key = map(str, loc)
    if not table:
        home = next((t for t, model in _FIXED_KEYS.items() if key in model.model_fields), None)
        if home and not isinstance(value, (list, dict)):
            return f"{key!r} belongs in the table [{home}]: put it below a line [{home}]"
        written = f"[[{key}]]" if isinstance(value, list) else f"[{key}]" if isinstance(value, dict) else repr(key)
        tables = TABLES | _CLASS_TABLES
        close = difflib.get_close_matches(key, tables, n=1)
        hint = f"did you mean {tables[close[0]]}?" if close else f"its tables are {', '.join(TABLES.values())}"
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
            # a model may check paths against the state folder (a VM slot's images must lie inside it)
            parsed.append(ConfiguredResource(entry.device, entry.device_class, entry.tags, entry.plugin,
                                             model.model_validate(entry.settings,
                                                                  context={"state_dir": config.state_dir})))
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


# ---- step lists: parsed when the config is loaded, checked against the plugins at the start -----------------

def _step_lists(config: ExporterConfig) -> list[tuple[tuple[str, str], str, list[dict[str, Any]]]]:
    """Each step list of the config as written: its key, who it is for (in words), its entries."""
    return ([(("device", d.name), f"device {d.name!r}", d.steps) for d in config.devices if d.steps]
            + [(("class", name), f"class {name!r}", c.steps) for name, c in config.classes.items() if c.steps])


def parse_steps(config: ExporterConfig) -> dict[tuple[str, str], list[StepConfig]]:
    """Each step list of ``config`` (``("device", NAME)`` or ``("class", NAME)`` -> its steps),
    every entry parsed by the model of its step; a ``ConfigError`` names each that does not
    fit: the file, the device or class, which step (counted from 1), the key. Which resource a
    step needs (a reflash a flash target, a power-cycle a switch) is found by its kind where the
    step runs, whichever plugin serves it: no plugin's name is asked for here."""
    parsed: dict[tuple[str, str], list[StepConfig]] = {}
    problems: list[str] = []
    for key, owner, entries in _step_lists(config):
        steps = []
        for number, data in enumerate(entries, 1):
            step, said = _parsed_step(data)
            name = f" ({data['step']})" if isinstance(data.get("step"), str) else ""
            problems += [f"  {owner}, step {number}{name}: {problem}" for problem in said]
            if step is not None:
                steps.append(step)
        parsed[key] = steps
    if problems:
        raise ConfigError(f"{config.source} is not a valid exporter config:\n" + "\n".join(problems))
    return parsed


def _parsed_step(data: dict[str, Any]) -> tuple[StepConfig | None, list[str]]:
    """One step entry parsed by its model, or None and what is wrong with it."""
    name = data.get("step")
    if name is None:
        return None, ["say which step it is: step = \"cooldown\", \"command\", \"reboot\", \"reflash\" or a "
                      "plugin's step"]
    try:
        _WORD.validate_python(name)
    except ValidationError:
        return None, [f"step {name!r} is not a step's name (a word: lowercase letters, digits and -)"]
    model = STEP_MODELS.get(name, PluginStepConfig)
    try:
        return model.model_validate(data), []
    except ValidationError as exc:
        return None, [_step_problem(error, model) for error in exc.errors()]


def _step_problem(error: ErrorDetails, model: type[StepConfig]) -> str:
    key = ".".join(map(str, error["loc"]))
    if error["type"] == "extra_forbidden" and len(error["loc"]) == 1:
        known = [name for name in model.model_fields if name != "step"]
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"its keys are {', '.join(known)}"
        return f"unknown key {key!r}; {hint}"
    message = error["msg"].removeprefix("Value error, ")
    return f"{key}: {message}" if key else message


def offered_steps(offered: Mapping[str, Sequence[StepKind]]) -> list[str]:
    """Every step this exporter can run, in words: the built-in ones, then each plugin's."""
    return [*BUILT_IN_STEPS, *(f"{kind.name} ({plugin})" for plugin, kinds in offered.items() for kind in kinds)]


def check_steps(config: ExporterConfig, offered: Mapping[str, Sequence[StepKind]]) -> None:
    """Hold the config's plugin steps to what the plugins loaded here offer (``offered``:
    plugin -> its ``StepKind``s): a step nobody offers, a key its kind does not declare, a
    device with no resource of the plugins that offer its step are refused, each named
    (``ConfigError``), before anything is served."""
    problems: list[str] = []
    steps = config.parsed_steps()
    for key, owner, _ in _step_lists(config):
        for number, step in enumerate(steps.get(key, ()), 1):
            if not isinstance(step, PluginStepConfig):
                continue
            where = f"  {owner}, step {number} ({step.step})"
            kinds = [(plugin, kind) for plugin, ks in offered.items() for kind in ks if kind.name == step.step]
            if not kinds:
                names = [*BUILT_IN_STEPS, *(k.name for ks in offered.values() for k in ks)]
                close = difflib.get_close_matches(step.step, names, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                problems.append(f"{where}: no built-in step and no plugin loaded here is called {step.step!r}; "
                                f"{hint}(the steps here: {', '.join(offered_steps(offered))})")
                continue
            known = sorted({name for _, kind in kinds for name in kind.settings})
            plugins = ", ".join(sorted({plugin for plugin, _ in kinds}))
            for unknown in sorted(set(step.settings) - set(known)):
                close = difflib.get_close_matches(unknown, known, n=1)
                hint = (f"did you mean {close[0]!r}?" if close else f"its keys are {', '.join(known)}" if known else
                        "it takes no keys")
                problems.append(f"{where}: unknown key {unknown!r} of step {step.step!r} (plugin {plugins}); {hint}")
    for device in config.devices:
        for number, step in enumerate(config.steps_of(device.name, device.device_class or "generic"), 1):
            if not isinstance(step, PluginStepConfig):
                continue
            offering = {plugin for plugin, ks in offered.items() if any(k.name == step.step for k in ks)}
            if offering and not offering & {entry.plugin for entry in device.entries()}:
                problems.append(f"  device {device.name!r}: step {number} ({step.step}) is plugin "
                                f"{', '.join(sorted(offering))}'s, and the device has no resource of it")
    if problems:
        raise ConfigError(f"{config.source} is not a valid exporter config:\n" + "\n".join(problems))
