"""A device's quarantine in words (docs/architecture.md, "Health that heals"): the line of its
ring log for each step its exporter reports (entering it, each probe, the re-admission), and
what its page, the board and ``device-loop ls`` say of it. The exporter decides every step;
the coordinator only reads its reports."""
from __future__ import annotations

from typing import Callable

from pydantic import ValidationError

from device_loop.core.answers import QuarantineAnswer
from device_loop.core.durations import format_duration
from device_loop.core.protocol import Quarantine


def decoded(column: str | None) -> Quarantine | None:
    """The quarantine a device's ``quarantine`` column holds (JSON), None when none (or
    when what it holds cannot be read: the next report writes it anew)."""
    if not column:
        return None
    try:
        return Quarantine.model_validate_json(column)
    except ValidationError:
        return None


def span(seconds: float) -> str:
    """``20 s``, ``1.5 s``, ``30 min``, ``2h``: a probe's interval or a window, as people say it
    (the ring log, ``device-loop ls`` and the device's page alike)."""
    if seconds < 60:
        return f"{seconds:.3g} s"
    if seconds < 3600 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return format_duration(seconds)


def step(before: Quarantine | None, after: Quarantine | None, failed_for_good: bool = False) -> str | None:
    """The ring log's line for what changed between two reports of a device's quarantine,
    None when nothing did (a new reason, the same probe); ``failed_for_good``: the report
    that ends it says its health failed permanently (no re-admission, then)."""
    if before is None and after is None:
        return None
    if before is None:
        assert after is not None
        return (f"quarantine: failed {after.failures} times in {span(after.window_s)}; next probe in "
                f"{span(after.probe_s)}")
    if after is None:
        if failed_for_good:
            return "quarantine ended: its health failed for good (a person clears the fault)"
        if before.good + 1 >= before.needed:
            return f"re-admitted after {before.needed} good probes"
        return "quarantine ended by its exporter (restarted, or its health failed for good)"
    if after.probes == before.probes:
        return None
    if after.good:
        return f"quarantine: probe {after.good} of {after.needed} good"
    return f"quarantine: probe failed ({after.reason or 'no reason given'}); next probe in {span(after.probe_s)}"


def quarantine_answer(quarantine: Quarantine, shown: Callable[[str], str]) -> QuarantineAnswer:
    """The quarantine as a device's answer carries it, its reason as ``shown`` lets the caller see it."""
    return {"failures": quarantine.failures, "window_s": quarantine.window_s, "probe_s": quarantine.probe_s,
            "probes": quarantine.probes, "good": quarantine.good, "needed": quarantine.needed,
            "reason": shown(quarantine.reason)}


def summary(quarantine: Quarantine) -> str:
    """Where a quarantine stands, for the device's page and ``device-loop ls``."""
    said = f"quarantined: failed {quarantine.failures} times in {span(quarantine.window_s)}"
    if quarantine.probes:
        said = f"quarantined: {quarantine.good} of {quarantine.needed} good probes"
    return f"{said}; next probe in {span(quarantine.probe_s)}" + (f" ({quarantine.reason})" if quarantine.reason
                                                                   else "")
