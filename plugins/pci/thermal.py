"""A card's temperatures as its driver's hwmon shows them in sysfs (amdgpu, xe and others:
``hwmon/hwmonN/tempM_input`` in millidegrees, ``tempM_label`` its name), read-only."""
from __future__ import annotations

import re
from pathlib import Path

from .cards import devices_folder
from .sysfs import names_in, read_text

_HWMON = re.compile(r"hwmon\d{1,3}")
_INPUT = re.compile(r"temp\d{1,2}_input")


def hwmon_temperatures(sysfs_root: Path, address: str) -> dict[str, float]:
    """Each temperature the card's hwmon reports (its label, else ``tempN``) -> °C."""
    zones: dict[str, float] = {}
    folder = devices_folder(sysfs_root) / address / "hwmon"
    for hwmon in names_in(folder, _HWMON, limit=4):
        for name in names_in(folder / hwmon, _INPUT, limit=16):
            value = read_text(folder / hwmon / name)
            if not re.fullmatch(r"-?\d{1,7}", value):
                continue
            label = read_text(folder / hwmon / name.replace("_input", "_label"))
            label = label if re.fullmatch(r"[A-Za-z0-9 _.-]{1,32}", label) else name.removesuffix("_input")
            zones.setdefault(label.lower(), int(value) / 1000)
    return zones
