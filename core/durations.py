"""Durations as people type them (``90s``, ``30m``, ``2h``, ``1d``) and ISO times."""
import math
import re
import time
from collections.abc import Mapping
from typing import Any
from datetime import datetime, timezone

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = r"(\d+(?:\.\d+)?)([smhd])"
_PATTERN = re.compile(rf"^(?:{_PART})+$")


def parse_duration(text: str | int | float) -> float:
    """Seconds in ``text``: ``90s``, ``30m``, ``2h``, ``1d``, ``1h30m`` (what
    :func:`format_duration` prints), or a bare number of seconds."""
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        compact = text.strip().replace(" ", "")
        if re.fullmatch(r"\d+(?:\.\d+)?", compact):
            seconds = float(compact)
        elif _PATTERN.match(compact):
            seconds = sum(float(n) * _UNITS[unit] for n, unit in re.findall(_PART, compact))
        else:
            raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 30m, 2h, 1d, 1h30m)")
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
        hours, minutes = divmod(seconds // 60, 60)
        return f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"
    days, hours = divmod(seconds // 3600, 24)
    return f"{days}d{hours:02d}h" if hours else f"{days}d"


def iso(ts: float | None) -> str | None:
    """ISO 8601 UTC with a ``Z``, or None."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_iso(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


#: A keepalive's bounds, in seconds (docs/architecture.md, "Leases that live as long as their
#: client"): under 5 s a renewal every third of it is a request every second or more often; over an
#: hour a killed client holds its board as long as a lease's default ttl would.
KEEPALIVE_RANGE_S = (5.0, 3600.0)
#: The same in words, for help texts and errors.
KEEPALIVE_RANGE = f"{format_duration(KEEPALIVE_RANGE_S[0])} to {format_duration(KEEPALIVE_RANGE_S[1])}"


def keepalive_problem(seconds: object) -> str | None:
    """Why ``seconds`` is no keepalive (out of ``KEEPALIVE_RANGE_S``, not a finite number), in
    words, or None: what the coordinator's 422 and the command line's usage error say."""
    low, high = KEEPALIVE_RANGE_S
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and low <= seconds <= high:
        return None
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and 1 <= seconds < float("inf"):
        shown = format_duration(seconds)  # (as it was typed: 3650d, not 315360000.0)
    else:
        shown = f"{seconds!r}"[:40] if isinstance(seconds, (int, float, str)) else type(seconds).__name__
    return f"a keepalive is {low:g} to {high:g} seconds ({KEEPALIVE_RANGE}, e.g. 30s), not {shown}"


def when_granted(estimate: Mapping[str, Any]) -> str:
    """A waiting ticket's estimate in a few words: ``by 14:05Z (14:02Z to 14:31Z)`` (a time
    "by" is rounded up to its minute, the earliest down)."""
    def hm(at: str, later: bool = True) -> str:
        minute = parse_iso(at) / 60
        return time.strftime("%H:%MZ", time.gmtime(60 * (math.ceil(minute) if later else math.floor(minute))))
    return f"by {hm(estimate['likely_at'])} ({hm(estimate['earliest_at'], later=False)} to {hm(estimate['latest_at'])})"
