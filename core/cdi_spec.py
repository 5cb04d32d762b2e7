"""A lease's CDI spec (docs/architecture.md, "Containers and CDI"): kind
``device-loop.dev/<class>``, one device named as the leased device, its ``containerEdits`` the
union of its resources' environments, at the lowest ``cdiVersion`` its fields require
(``cdi_version.py``). The exporter writes it (exporter/cdi.py); the coordinator answers the
same spec, made here from what the exporter reported, to ``device-loop cdi``. Pure: no file,
no process."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

from . import LEASE_PREFIX
from .cdi_version import PODMAN_4_3_NEWEST, required_version, version_key
from .protocol import EnvironmentReport

VENDOR = "device-loop.dev"
FILE_PREFIX, FILE_SUFFIX = "device-loop_", ".json"
# the reference library's name rules (its pkg/parser): a class begins with a letter, a device
# name with a letter or digit, both end with one, and take '_', '-', '.' (a device ':' too) between
_CLASS = re.compile(r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?")
_DEVICE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?")
#: A lease id as it may be part of a file's name: the coordinator's are LEASE_PREFIX and hex
#: digits; anything else (a '/', a '_', a '..') names no spec file, whoever sent it.
LEASE_ID = re.compile(re.escape(LEASE_PREFIX) + r"[A-Za-z0-9-]{1,58}")


def spec_file_name(host: str, lease: str) -> str:
    """The name of ``lease``'s spec file in the CDI folder of exporter ``host``: a lease id
    has no '_', so the host's name is what lies between the prefix and the last '_'.
    ``ValueError`` for a lease id or host name that would not stay one name in the folder."""
    if not LEASE_ID.fullmatch(lease) or "/" in host or "\0" in host:
        raise ValueError(f"no CDI spec file is named for lease {lease[:80]!r} of host {host[:80]!r}")
    return f"{FILE_PREFIX}{host}_{lease}{FILE_SUFFIX}"


class CdiRefused(ValueError):
    """No CDI spec can name this device; the message says why, in words."""


def cdi_class_problem(device_class: str) -> str | None:
    """Why ``device_class`` cannot be a CDI kind's class, or None. A one-letter class is
    valid CDI, but podman 4.3 panics on it: refused, never renamed (a renamed class would be
    a ``--device`` name nobody can guess)."""
    if not _CLASS.fullmatch(device_class):
        return (f"class {device_class!r} cannot name a CDI kind: it begins with a letter, ends with a letter or "
                "digit, and has only letters, digits, '_', '-' and '.'")
    if len(device_class) < 2:
        return f"class {device_class!r} cannot name a CDI kind: podman 4.3 fails on a one-letter class"
    return None


def cdi_device_problem(device: str) -> str | None:
    """Why ``device`` cannot be a CDI device name, or None."""
    if not _DEVICE.fullmatch(device):
        return (f"device {device!r} cannot be a CDI device name: it begins and ends with a letter or digit, "
                "with only letters, digits, '_', '-', '.' and ':' between")
    return None


@dataclass(frozen=True)
class CdiSpec:
    """A lease's spec: ``spec`` (the JSON document), ``qualified`` (what ``podman run
    --device`` takes: ``device-loop.dev/<class>=<device>``) and its ``version``."""

    spec: dict[str, Any]
    qualified: str
    version: str

    def text(self) -> str:
        """The spec as its file holds it."""
        return json.dumps(self.spec, indent=2) + "\n"

    @property
    def old_runtimes_read_it(self) -> bool:
        """Whether podman 4.3 (Debian 12), which reads up to cdiVersion 0.5.0, reads it."""
        return version_key(self.version) <= version_key(PODMAN_4_3_NEWEST)

    def note(self) -> str | None:
        """What to know before using it, in words, or None."""
        if self.old_runtimes_read_it:
            return None
        return (f"cdiVersion {self.version}: podman 4.3 (Debian 12) reads up to {PODMAN_4_3_NEWEST} and ignores this "
                "spec without a word (a '.' in the class needs 0.6.0)")


def _edits(environments: Sequence[EnvironmentReport]) -> dict[str, Any]:
    """The union of ``environments``: the first to name a container path or a variable keeps it."""
    nodes: dict[str, dict[str, Any]] = {}
    mounts: dict[str, dict[str, Any]] = {}
    env: dict[str, str] = {}
    for environment in environments:
        for n in environment.nodes:
            node = {"path": n.path, "type": n.node_type, "major": n.major, "minor": n.minor, "fileMode": n.file_mode,
                    "permissions": n.permissions}
            if n.host_path != n.path:  # (hostPath needs cdiVersion 0.5.0: written only when it says something)
                node["hostPath"] = n.host_path
            nodes.setdefault(n.path, node)
        for m in environment.mounts:
            mounts.setdefault(m.container_path, {"hostPath": m.host_path, "containerPath": m.container_path,
                                                 "options": list(m.options)})
        for name, value in environment.env.items():
            env.setdefault(name, value)
    edits: dict[str, Any] = {}
    if env:
        edits["env"] = [f"{name}={value}" for name, value in env.items()]
    if nodes:
        edits["deviceNodes"] = list(nodes.values())
    if mounts:
        edits["mounts"] = list(mounts.values())
    return edits


def cdi_spec(device_class: str, device: str, environments: Sequence[EnvironmentReport]) -> CdiSpec | None:
    """The CDI spec of a lease of ``device`` (of ``device_class``) whose resources need
    ``environments``; None when none needs anything (no container can use it). Raises
    :class:`CdiRefused` when the class or the device's name cannot be CDI's."""
    problem = cdi_class_problem(device_class) or cdi_device_problem(device)
    if problem:
        raise CdiRefused(problem)
    edits = _edits(environments)
    if not edits:
        return None
    spec: dict[str, Any] = {"cdiVersion": "", "kind": f"{VENDOR}/{device_class}",
                            "devices": [{"name": device, "containerEdits": edits}]}
    spec["cdiVersion"] = version = required_version(spec)
    return CdiSpec(spec=spec, qualified=f"{VENDOR}/{device_class}={device}", version=version)
