"""A power switch's config entry (docs/architecture.md, "Power"): ``backend`` and that
backend's keys alone. Each backend is one entry of ``BACKENDS`` (its module: its ``Keys``
model and its ``power``); the entry is the union of the backends' models, told apart by
``backend`` (a pydantic discriminated union), so a key of another backend, or none's, is
refused for the backend named."""
from __future__ import annotations

import difflib
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import Field, model_validator

from device_loop.plugin import PluginConfig

from . import command, ipmi, pdudaemon, redfish, sim, uhubctl
from .keys import BackendKeys

#: The backends, one entry each: name -> its module (``Keys``, ``power``).
BACKENDS: dict[str, ModuleType] = {module.Keys.name(): module
                                   for module in (pdudaemon, uhubctl, ipmi, redfish, command, sim)}
#: The keys every backend takes.
COMMON = tuple(BackendKeys.model_fields)
if TYPE_CHECKING:  # (a union built from the registry: a type checker sees the base every member is)
    Settings = BackendKeys
else:
    Settings = Annotated[Union[tuple(module.Keys for module in BACKENDS.values())], Field(discriminator="backend")]


class PowerConfig(PluginConfig):
    """A power switch's entry: ``backend`` and that backend's keys, as its model (``settings``)
    parses them; a key of another backend is refused by name, as is an unknown one."""

    settings: Settings

    @property
    def backend(self) -> str:
        return self.settings.backend

    @property
    def off_time(self) -> float:
        return self.settings.off_time

    @property
    def timeout(self) -> float:
        return self.settings.timeout

    @property
    def console_timeout(self) -> float:
        return self.settings.console_timeout

    @model_validator(mode="before")
    @classmethod
    def _the_backend_s_model(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "settings" in data:
            return data
        name = data.get("backend")
        if name not in BACKENDS:
            raise ValueError(f"backend: one of {', '.join(BACKENDS)}, not {name!r}" if name is not None else
                             f"give the switch's backend: one of {', '.join(BACKENDS)}")
        model = BACKENDS[name].Keys
        for key in data:
            if key not in model.model_fields:
                owners = [other for other, module in BACKENDS.items() if key in module.Keys.model_fields]
                takes = ", ".join(k for k in model.model_fields if k not in COMMON)
                if owners:
                    raise ValueError(f"{key!r} is a key of backend {' and '.join(repr(o) for o in owners)}, not of "
                                     f"{name!r}; {name!r} takes {takes} (and {', '.join(COMMON[1:])})")
                close = difflib.get_close_matches(key, list(model.model_fields), n=1)
                raise ValueError(f"unknown key {key!r} of backend {name!r}; "
                                 + (f"did you mean {close[0]!r}?" if close else f"it takes {takes}"))
        missing = [key for key, field in model.model_fields.items() if field.is_required() and key not in data]
        if missing:
            raise ValueError(f"backend {name!r} needs {' and '.join(repr(k) for k in missing)}")
        return {"settings": {"off_time": model.OFF_TIME, **data}}
