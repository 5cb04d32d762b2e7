"""Durations as people type them (``90s``, ``30m``, ``2h``, ``1d``) and ISO times."""
import re
from datetime import datetime, timezone

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_duration(text: str | int | float) -> float:
    """Seconds in ``text``: ``90s``, ``30m``, ``2h``, ``1d`` or a bare number of seconds."""
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        match = _PATTERN.match(text)
        if not match:
            raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 30m, 2h, 1d)")
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if seconds <= 0:
        raise ValueError(f"duration must be positive, not {text!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """Short human form: ``45s``, ``12m``, ``3h05m``, ``2d04h``."""
    seconds = int(max(0, seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def iso(ts: float | None) -> str | None:
    """ISO 8601 UTC with a ``Z``, or None."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_iso(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
