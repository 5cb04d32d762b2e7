"""The exporter's CDI folder (docs/architecture.md, "Containers and CDI"): one spec a lease,
``device-loop_<host>_<lease>.json``, written atomically while the lease's services run and
removed when they stop; each pass removes this host's specs of leases no longer served
(reconcile, not push), so a crash leaves none behind past the next start. The host's name in
the file's name keeps two exporters of one machine off each other's specs; the list of the
leases whose specs it wrote, kept in its state folder, keeps two exporters of one *name* off
them too (two labs on one machine both take its host name).

Also what a plugin says a container needs (``devloop_environment``), asked within the hook
deadline and held to the protocol's bounds: an answer that breaks them is dropped and
logged, never the lease."""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Mapping

from device_loop.core.cdi_spec import FILE_PREFIX, FILE_SUFFIX, LEASE_ID, CdiSpec, spec_file_name
from device_loop.core.container_env import ContainerEnvironment
from device_loop.core.files import write_atomically
from device_loop.core.host import HostContext
from device_loop.core.model import Resource, Service
from device_loop.core.plugins import PluginSet
from device_loop.core.protocol import EnvironmentReport

from .hook_deadlines import HookDeadlines

log = logging.getLogger("device_loop.exporter")
DEFAULT_CDI_DIR = Path("/var/run/cdi")
LEDGER_LIMIT = 1 << 20  # bytes of the written-specs list read at the start (some 40 000 leases)


def environment_report(answer: object) -> EnvironmentReport:
    """A plugin's ``devloop_environment`` answer as the protocol carries it; ``ValueError``
    (a ``ValidationError`` too) when it is not a ``ContainerEnvironment`` or breaks its bounds
    (checked again here: a frozen dataclass can still be altered after it was made)."""
    if not isinstance(answer, ContainerEnvironment):
        raise ValueError(f"a ContainerEnvironment, not {type(answer).__name__}")
    if not isinstance(answer.env, Mapping):
        raise ValueError("env is a mapping of name -> value")
    return EnvironmentReport.model_validate({
        "nodes": [{"path": n.path, "host_path": n.host_path, "node_type": n.type, "major": n.major, "minor": n.minor,
                   "file_mode": n.file_mode, "permissions": n.permissions} for n in answer.nodes],
        "mounts": [{"host_path": m.host_path, "container_path": m.container_path, "options": list(m.options)}
                   for m in answer.mounts],
        "env": dict(answer.env)})


def ask_environment(plugins: PluginSet, deadlines: HookDeadlines, host: HostContext, resource: Resource,
                    service: Service) -> EnvironmentReport | None:
    """What ``resource``'s plugin says a container needs of it while ``service`` serves it,
    or None: none, or an answer that raised, took past the hook deadline or broke the
    bounds (logged, with why)."""
    key = ("devloop_environment", resource.plugin, resource.identifier)
    outcome = deadlines.run({key: lambda: plugins.call(resource.plugin, "devloop_environment", host=host,
                                                       resource=resource, service=service)})[key]
    try:
        answer = outcome.result()
        return None if answer is None else environment_report(answer)
    except (ValueError, TypeError) as exc:
        log.error("plugin %s's container environment for %s dropped: %s", resource.plugin, resource.identifier,
                  str(exc).replace("\n", " "))
    except Exception as exc:
        log.error("plugin %s's devloop_environment for %s failed: %s", resource.plugin, resource.identifier, exc)
    return None


class CdiFolder:
    """The specs this exporter (``host``) keeps in ``folder``. With a ``ledger`` (a file of
    its state folder) it removes only the specs it wrote, as that file lists them (written
    before each spec, so a crash forgets none); without one, every spec of ``host``'s name."""

    def __init__(self, folder: Path, host: str, ledger: Path | None = None):
        self.folder, self.host, self.ledger = folder, host, ledger
        self._lock = threading.Lock()
        self._written: dict[str, str] = {}  # lease -> the text last written
        self._warned: str | None = None  # the last write error logged (not again each pass)
        self._mine = self._read_ledger()  # the leases whose specs it wrote and did not remove yet

    def path(self, lease: str) -> Path:
        """The spec file of ``lease``."""
        return self.folder / spec_file_name(self.host, lease)

    def leases(self) -> set[str]:
        """The leases whose spec files of this host are in the folder (another host's never)."""
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return set()
        except OSError as exc:
            self._warn(f"cannot read the CDI folder {self.folder}: {exc}")
            return set()
        ours = set()
        for name in names:
            if not (name.startswith(FILE_PREFIX) and name.endswith(FILE_SUFFIX)):
                continue
            # a lease id has no '_': the host's name is what is left, whatever it holds
            host, _, lease = name[len(FILE_PREFIX):-len(FILE_SUFFIX)].rpartition("_")
            if host == self.host and LEASE_ID.fullmatch(lease) and (self._mine is None or lease in self._mine):
                ours.add(lease)
        return ours

    def _read_ledger(self) -> set[str] | None:
        if self.ledger is None:
            return None
        try:
            with open(self.ledger, "rb") as ledger:
                text = ledger.read(LEDGER_LIMIT).decode("ascii", "replace")
        except FileNotFoundError:
            return set()
        except OSError as exc:
            self._warn(f"cannot read {self.ledger}, the list of the CDI specs written: {exc}")
            return set()
        return {line for line in text.splitlines() if LEASE_ID.fullmatch(line)}

    def _remember(self, leases: set[str]) -> None:
        """Make the ledger list exactly ``leases`` (before their specs are written)."""
        if self._mine is None or self.ledger is None or leases == self._mine:
            return
        try:
            self.ledger.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.ledger, "".join(f"{lease}\n" for lease in sorted(leases)))
            self._mine = set(leases)
        except OSError as exc:
            self._warn(f"cannot write {self.ledger}, the list of the CDI specs written: {exc}")
            self._mine |= leases  # (this run still knows them: its next pass removes them)

    def sync(self, specs: Mapping[str, CdiSpec]) -> None:
        """Make the folder hold exactly ``specs`` (lease -> spec) of this host: write what is
        new or changed, remove the rest. A folder that cannot be written is logged, once."""
        with self._lock:
            named = {lease: spec for lease, spec in specs.items() if LEASE_ID.fullmatch(lease)}
            for lease in set(specs) - set(named):
                self._warn(f"no CDI spec for lease {lease[:80]!r}: not a lease id a file may be named by")
            kept = set(named)
            for lease in self.leases() - kept:
                try:
                    self.path(lease).unlink()
                    log.info("CDI spec of %s removed", lease)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    self._warn(f"cannot remove the CDI spec of {lease}: {exc}")
                    kept.add(lease)  # (still there: still ours to remove)
                self._written.pop(lease, None)
            self._remember(kept)
            for lease, spec in named.items():
                text = spec.text()
                if self._written.get(lease) == text and self.path(lease).exists():
                    continue
                try:
                    self.folder.mkdir(parents=True, exist_ok=True)
                    write_atomically(self.path(lease), text)
                except OSError as exc:
                    self._warn(f"cannot write the CDI spec of {lease} in {self.folder}: {exc}")
                    continue
                self._written[lease] = text
                log.info("CDI spec of %s written: %s (cdiVersion %s)", lease, spec.qualified, spec.version)

    def _warn(self, message: str) -> None:
        if message != self._warned:
            log.error("%s", message)
            self._warned = message
