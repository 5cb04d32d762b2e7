"""The lowest ``cdiVersion`` a CDI spec's fields require (docs/architecture.md, "Containers
and CDI"), by the rules of the CDI reference library (its ``specs-go/version.go``): each
version names the fields it added, and a spec is written at the newest of those it uses, so
that a runtime that reads only older specs (podman 4.3: 0.3.0 to 0.5.0) still reads it.

The rules look at the spec as the JSON it is written as (a dict), so a field this lab does
not write (annotations, intelRdt) is still held to its version."""
from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping

Spec = Mapping[str, Any]

#: The earliest version the reference library still accepts; a spec that needs nothing newer is this.
EARLIEST = "0.3.0"
#: The newest version a podman 4.3 (Debian 12) reads; it ignores a newer spec without a word.
PODMAN_4_3_NEWEST = "0.5.0"


def _edits(spec: Spec) -> Iterator[Mapping[str, Any]]:
    """The spec's own containerEdits and each device's."""
    yield spec.get("containerEdits") or {}
    for device in spec.get("devices") or ():
        yield device.get("containerEdits") or {}


def _v110(spec: Spec) -> bool:  # netDevices; intelRdt's schemata and enableMonitoring
    return any(e.get("netDevices") or (e.get("intelRdt") or {}).get("schemata") is not None
               or (e.get("intelRdt") or {}).get("enableMonitoring") for e in _edits(spec))


def _v070(spec: Spec) -> bool:  # intelRdt at all; additionalGids
    return any(e.get("intelRdt") is not None or e.get("additionalGids") for e in _edits(spec))


def _v060(spec: Spec) -> bool:  # annotations (spec or device); a dot in the kind's class
    if spec.get("annotations") or any(d.get("annotations") for d in spec.get("devices") or ()):
        return True
    _, slash, device_class = str(spec.get("kind", "")).partition("/")
    return bool(slash) and "." in device_class


def _v050(spec: Spec) -> bool:  # a device name that begins with a digit; a device node's hostPath
    if any(str(d.get("name", ""))[:1].isdigit() for d in spec.get("devices") or ()):
        return True
    return any(node.get("hostPath") for e in _edits(spec) for node in e.get("deviceNodes") or ())


def _v040(spec: Spec) -> bool:  # a mount's type
    return any(mount.get("type") for e in _edits(spec) for mount in e.get("mounts") or ())


#: Newest first, as the reference library checks them; 1.0.0 and 0.8.0 added no field.
RULES: tuple[tuple[str, Callable[[Spec], bool]], ...] = (
    ("1.1.0", _v110), ("0.7.0", _v070), ("0.6.0", _v060), ("0.5.0", _v050), ("0.4.0", _v040),
)


def required_version(spec: Spec) -> str:
    """The lowest cdiVersion that holds every field ``spec`` uses."""
    for version, needs in RULES:
        if needs(spec):
            return version
    return EARLIEST


def version_key(version: str) -> tuple[int, ...]:
    """``"0.5.0"`` -> ``(0, 5, 0)``, to compare versions."""
    return tuple(int(part) for part in version.removeprefix("v").split("."))
