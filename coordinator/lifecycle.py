"""The device lifecycle (docs/architecture.md, "Lifecycle"), which every service shares:
a device's state follows from its facts in one function, and every change of state goes to
the device's ring log. ``Lifecycle`` is what each service is handed to write with: the
store, the settings, the clock, the long-polls' notifier, the audit log and the metrics."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping

from device_loop.core.vocabulary import HELD_OFF, DeviceState, FaultKind, HealthStatus, LeaseState

from .metrics import LabMetrics
from .notify import BOARD_KEY, Notifier
from .quarantine import decoded, summary
from .rows import DeviceFacts
from .ssh_logins import SshLogins
from .store import Store
from .store.audit import AuditQueries
from .store.devices import DeviceQueries


@dataclass
class Settings:
    allocating_timeout_s: float = 30.0
    default_ttl_s: float = 1800.0
    max_ttl_s: float = 7 * 86400.0
    offline_after_periods: float = 3.0
    offline_after_min_s: float = 10.0
    reaper_interval_s: float = 1.0
    max_leases_per_user: int = 10  # 0: no limit
    gated: bool = True  # endpoints ask for the lease's secret (off in the single-user trust mode)
    image_dir: str | None = None  # where the image registry keeps its files
    max_image_bytes: int = 8 << 30
    image_quota_bytes: int | None = None  # of images one person may have uploaded (None: no quota)
    # who gets the next lease (docs/architecture.md, "Who gets the next lease")
    claim_window_s: float = 120.0     # a granted ticket's requester sees its lease within this, or it passes on
    batch_max_wait_s: float = 1800.0  # a batch ticket waiting longer is served among the interactive ones
    max_tickets_per_user: int = 20    # open tickets a person may have (0: no limit)
    # jobs (docs/architecture.md, "Jobs and evidence")
    job_worker_timeout_s: float = 30.0  # a running job whose worker is silent this long fails (worker lost)
    # what exporters report is data (docs/architecture.md, "What exporters report is data")
    ssh_logins: SshLogins = field(default_factory=SshLogins)  # how an MCP exec logs in to a board's sshd
    private_addresses: tuple[tuple[str, int], ...] = ()  # (host, port) it owns: no snapshot is fetched there
    # what is finite, shared (docs/architecture.md, "Shares of one lab")
    operation_retention_s: float | None = 30 * 86400.0  # operations that ended longer ago are pruned (None: kept)
    audit_retention_s: float | None = None              # audit entries older than this are pruned (None: kept)
    max_stored_runs: int = 20_000                       # job runs one person may have stored (0: no limit)


def fault(kind: FaultKind, words: str) -> dict[str, Any]:
    """The fields of a device that make it faulty: what the rules read (``kind``) and what
    people read (``words``), written together (docs/architecture.md, "Lifecycle")."""
    return {"fault": words[:500], "fault_kind": kind}


#: The fields of a device with no fault.
NO_FAULT: dict[str, Any] = {"fault": None, "fault_kind": None}


def switched_off(words: str | None, kind: str | None) -> str | None:
    """The fault a person's power off left (by whom, when, how to switch it on), else None."""
    return words if kind == FaultKind.SWITCHED_OFF else None


def held_off(kind: str | None) -> bool:
    """Whether a fault of ``kind`` says the device may be switched off: only a verified power
    on clears it (not its health turning ok, nor an admin while the last word was an off)."""
    return kind in HELD_OFF


def device_state(facts: Mapping[str, Any]) -> DeviceState:
    """The lifecycle state that follows from a device's facts: its row, ``host_online``
    and ``lease_state`` (of its live lease, if any); a ``fault`` (a failed step's, a
    person's, a permanent health failure's) and a ``quarantine`` its exporter reports make it
    faulty as failed health does (docs/architecture.md, "Health that heals"). Another host claiming the device
    (``conflict_host``) is not among them: its owner keeps serving it, so no exporter can
    lock another host's devices out by reporting their names."""
    if facts["retired"]:
        return DeviceState.RETIRED
    if not facts["host_online"] or not facts["present"]:
        return DeviceState.OFFLINE
    if facts["lease_state"] == LeaseState.PENDING:
        return DeviceState.ALLOCATING
    if facts["lease_state"] == LeaseState.ACTIVE:
        return DeviceState.IN_USE
    if facts["reclaim_lease"]:
        return DeviceState.RECLAIMING
    if facts["health"] == HealthStatus.FAILED or facts.get("fault") or facts.get("quarantine"):
        return DeviceState.FAULTY
    return DeviceState.IDLE


def logged_cause(facts: Mapping[str, Any], new_state: str, cause: str | None) -> str:
    """The cause a change of state is logged with: a device that turns faulty says why (its
    fault, else its failed health) where ``cause`` does not (a step that succeeded on a board
    whose console hung meanwhile)."""
    if new_state != DeviceState.FAULTY:
        return cause or ""
    quarantine = decoded(facts.get("quarantine"))
    why = facts.get("fault") or (summary(quarantine) if quarantine else None) or \
        f"health failed: {facts.get('health_reason') or 'no reason given'}"
    return why if not cause else cause if why in cause else f"{why} ({cause})"


def ring_entry(device: Mapping[str, Any], seq: int, new_state: str, at: float, cause: str, actor: str) -> dict:
    return {"device": device["name"], "seq": seq, "at": at, "from_state": device["state"], "to_state": new_state,
            "cause": cause, "actor": actor}


class Lifecycle:
    """What every service writes with: the store's transactions, the settings, the clock, the
    notifier of long-polls (in every coordinator process), the metrics, a device's state and
    its ring log, the audit log. Its statements (``devices_sql``, ``audit_sql``) are its own:
    a service is handed what it reads of those tables itself
    (docs/architecture.md, "A service reaches only its tables")."""

    def __init__(self, store: Store, metrics: LabMetrics, settings: Settings | None = None,
                 clock: Callable[[], float] = time.time, *, devices_sql: DeviceQueries, audit_sql: AuditQueries):
        self.store = store
        self.devices_sql, self.audit_sql = devices_sql, audit_sql
        self.settings = settings or Settings()
        self.clock = clock
        self.notifier = Notifier()
        store.subscribe(self.notifier.heard)
        self.metrics = metrics
        # hosts are silent only counting from here: after an outage of the coordinator they
        # get their heartbeat periods to report before they are taken for offline
        self.serving_since = 0.0

    async def change(self, device: DeviceFacts, cause: str, actor: str,
                     fields: dict[str, Any] | None = None) -> DeviceState:
        """Write ``fields`` of ``device`` (a row with its facts, as ``DeviceQueries.device`` reads it)
        and the state they lead to; a change of state goes to the ring log. Returns the state."""
        fields = fields or {}
        new = device_state({**device, **fields})
        if new == device["state"]:
            if fields:
                await self.devices_sql.update_device(device["name"], **fields)
                self.notify(BOARD_KEY)
            return new
        now = self.clock()
        seq = await self.devices_sql.update_device_logged(device["name"], state=new, updated_at=now, state_since=now,
                                                          **fields)
        cause = logged_cause({**device, **fields}, new, cause)
        await self.devices_sql.add_ring_entries([ring_entry(device, seq, new, now, cause, actor)])
        self.notify(BOARD_KEY)
        return new

    async def note(self, device: DeviceFacts, cause: str, actor: str, **fields: Any) -> None:
        """Write ``fields`` that are not facts of the state (``needs_recovery``), with a line in
        the device's ring log (its state stays)."""
        now = self.clock()
        seq = await self.devices_sql.update_device_logged(device["name"], updated_at=now, **fields)
        await self.devices_sql.add_ring_entries([ring_entry(device, seq, device["state"], now, cause, actor)])
        self.notify(BOARD_KEY)

    def notify(self, *keys: str) -> None:
        """Wake the long-polls watching ``keys``, in every process, once the current transaction commits."""
        self.store.changed(*keys)

    async def prune_audit(self, now: float, batch: int, batches: int) -> None:
        """Entries of the audit log older than the lab keeps them (``audit_retention_s``; None:
        kept, the default) go, ``batch`` a transaction, at most ``batches`` of them."""
        kept_s = self.settings.audit_retention_s
        if kept_s is not None:
            await self.prune_in_batches(self.audit_sql.prune_audit, now - kept_s, batch, batches)

    async def prune_in_batches(self, prune: Callable[[float, int], Awaitable[int]], before: float, batch: int,
                               batches: int) -> None:
        """What ``prune`` deletes of before ``before``, ``batch`` rows a transaction (the writer
        is not held for long), at most ``batches`` of them: the rest at the reaper's next pass."""
        for _ in range(batches):
            async with self.store.tx():
                if await prune(before, batch) < batch:
                    return

    async def audit(self, actor: str, action: str, device: str | None, lease_id: str | None,
                    detail: dict[str, Any]) -> int:
        """An entry of the audit log; its id."""
        return await self.audit_sql.add_audit({"at": self.clock(), "actor": actor, "action": action,
                                               "device": device, "lease_id": lease_id, "detail": detail})
