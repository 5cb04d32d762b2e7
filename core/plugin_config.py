"""What a plugin's config entries are made of: each plugin declares its entry as a model
(``devloop_config_model``), and the exporter refuses an entry that does not fit it when it
loads its config, before it serves anything."""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

from .durations import parse_duration


def _seconds(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"a duration is a number of seconds or 90s, 10m, 1h30m, not {value!r}")
    try:
        return parse_duration(value)
    except (ValueError, TypeError):
        raise ValueError(f"a duration is a number of seconds or 90s, 10m, 1h30m, not {value!r}") from None


#: A config key that is a duration as people write it (``90s``, ``10m``, ``1h30m``, or
#: seconds): seconds, as a float, in the parsed entry (``timeout: Duration | None = None``).
Duration = Annotated[float, BeforeValidator(_seconds)]


class PluginConfig(BaseModel):
    """The base of a plugin's config model: the keys one of its ``[[devices.resources]]``
    entries may have (``plugin`` aside), with their types, defaults and checks.

    Unknown keys are refused (``extra="forbid"``: a plugin may not turn that off). Values are
    taken as TOML writes them (strict: ``"9600"`` is not a number, ``true`` is not 1). A
    parsed entry is frozen: the exporter hands the same object to every hook. A check a
    model cannot make without looking at the host (is that adapter plugged in?) belongs in
    ``devloop_check_config``. This class itself is the model of a plugin that takes no keys.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    def exactly_one(self, *keys: str) -> str:
        """The one of ``keys`` this entry gives (for a ``model_validator``: an entry names one
        source, one backend...); else ``ValueError`` saying which it found."""
        given = [key for key in keys if getattr(self, key) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(keys)} (found: {', '.join(given) or 'none'})")
        return given[0]
