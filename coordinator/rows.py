"""The rows the store reads, as types: each table's columns, and the facts a query joins to
them, named once here (the store's SQL, the services and the views all go by these).

JSON columns come back decoded (``tags``, ``resources``...), booleans as ``bool``, states
as the vocabulary's values (``core/vocabulary.py``).
"""
from __future__ import annotations

from typing import Any

from typing_extensions import TypedDict  # (pydantic reads typing.TypedDict only from Python 3.12)

from device_loop.core.answers import FlashedImage as FlashedImage  # (read as it is answered: one type)
from device_loop.core.vocabulary import (Arm, Band, DeviceState, FailureKind, FaultKind, Fidelity, HealthStatus,
                                         JobState,
                                         LeaseState, Needs, OperationState, Purpose, TicketKind, TicketState, TokenKind)

# "class" is a keyword: the functional form
DeviceRow = TypedDict("DeviceRow", {
    "name": str,
    "class": str,
    "tags": list[str],
    "host": str | None,
    "state": DeviceState,
    "present": bool,
    "health": HealthStatus,
    "health_reason": str,
    "conflict_host": str | None,   # another host that reports it too (the owner keeps it)
    "reclaim_lease": str | None,   # the lease whose end its exporter has not confirmed yet
    "busy_by": list[dict[str, Any]],
    "retired": bool,
    "created_at": float,
    "updated_at": float,
    "resources": list[dict[str, Any]],
    "report_digest": str | None,
    "log_seq": int,
    "needs_recovery": str | None,  # why (a failed destructive operation), or None
    "state_since": float | None,
    "steps": list[dict[str, Any]],  # what runs between two leases, as its exporter reports them (StepReport)
    "reclaim_step": int | None,    # the one running now (its index), while it is reclaimed
    "reclaim_op": str | None,      # ... and its operation
    "fault": str | None,           # why a step between leases failed, or who switched it off: faulty until cleared
    "fault_kind": FaultKind | None,  # what left that fault, as the rules read it (its words are for people)
    "fidelity": Fidelity,          # what it is: a board, a simulation, a virtual machine, an emulator
    "facts": dict[str, str],       # what plugins add to its fingerprint (DeviceReport.facts)
    "auto_recovery": str | None,   # the automatic power cycle of its current failure (its op id), once each
    "auto_recovered_at": float | None,  # when the last automatic power cycle was asked for
    "quarantine": str | None,      # its quarantine as its exporter reports it (protocol.Quarantine's JSON), or None
    "lab_failures": int,           # jobs' lab failures on it in a row (two make it faulty: "Lab failures")
})


class DeviceFacts(DeviceRow):
    """A device with the facts its state follows from (``lifecycle.device_state``): its live
    lease, its host, and the exclusive operation running on it (each at most one)."""
    lease_id: str | None
    lease_state: LeaseState | None
    holder: str | None
    expires_at: float | None
    host_online: bool | None
    host_draining: bool | None
    op_id: str | None
    op_kind: str | None
    op_detail: str | None  # where that operation stands, in words (a step's "cooling down: ...")


class HostRow(TypedDict):
    name: str
    boot_id: str
    generation: int
    protocol: int
    version: str
    heartbeat_s: float
    plugins: dict[str, Any]
    services: list[dict[str, Any]]
    superseded_boots: list[str]
    last_seen: float
    online: bool
    draining: bool
    devices_digest: str | None
    link_lost: bool
    address: str | None


class LeaseRow(TypedDict):
    id: str
    device: str
    holder: str
    state: LeaseState
    created_at: float
    expires_at: float
    ended_at: float | None
    end_reason: str | None
    secret: str | None
    # (docs/architecture.md, "Leases that live as long as their client")
    keepalive_s: float | None  # a keep-alive moves expires_at to at most this far ahead; None: no keepalive
    ends_at: float | None      # its own end (grant or last renewal + its ttl): no keep-alive passes it
    # (docs/architecture.md, "Shares of one lab": a budget is held ahead, then settled)
    token_id: str | None       # the token it was reserved with (a ticket's grant: the ticket's)
    held_s: float | None       # what it holds of its token's budget (None: no budget) ...
    held_from: float | None    # ... from this time (its grant, or its last renewal with a ttl) ...
    held_period: str | None    # ... charged to this period of the budget (a UTC day, or "token")
    budget_capped: bool        # its end is its token's budget's: it expires there, and says so
    token_counted: bool        # counted against its token's most leases at once (token_counts)


class LeaseView(LeaseRow):
    """A lease with what its answer shows of its device and host."""
    device_state: DeviceState
    device_host: str | None
    resources: list[dict[str, Any]]
    needs_recovery: str | None
    device_fault: str | None
    device_fault_kind: FaultKind | None
    host_online: bool | None
    host_link_lost: bool | None
    host_services: list[dict[str, Any]] | None
    op_id: str | None
    op_kind: str | None
    token_scope: str | None  # the scope of the token it was reserved with, as stored (JSON)


class OperationRow(TypedDict):
    id: str
    kind: str
    device: str
    host: str
    lease_id: str | None
    requester: str
    identifier: str          # the resource it runs on
    plugin: str              # the plugin that serves that resource
    exclusive: bool
    destructive: bool
    args: dict[str, Any]
    image_sha256: str | None  # an image of the registry it writes
    image_name: str | None
    image_size: int | None
    state: OperationState
    phase: str
    progress_done: int
    progress_total: int | None
    progress_unit: str
    progress_detail: str
    message: str
    seconds: dict[str, float]
    result: dict[str, Any] | None
    verified: bool            # a flash that ended done and read back the image's digest (its result said so)
    boot_id: str | None       # the exporter start that ran it
    interrupted: bool         # its exporter's restart or stop cut it short (not a failure of its own)
    purpose: Purpose          # why it runs: in a lease, a step between leases, a settle, a recovery
    step: int | None          # a step's place in the device's steps (purpose step)
    audit_id: int | None      # the audit entry of its start
    created_at: float
    started_at: float | None
    ended_at: float | None


class OperationView(OperationRow):
    host_online: bool | None


class ImageRow(TypedDict):
    sha256: str
    name: str
    size: int
    description: str
    target: str  # device:NAME or class:NAME
    uploader: str
    created_at: float
    last_used_at: float


class ListedImage(ImageRow):
    known_good_for: list[str]


class KnownGoodImage(ImageRow):
    marked_at: float


class TokenRow(TypedDict):
    id: str
    hash: str
    username: str
    admin: bool
    host: str | None  # an exporter's token: the host it reports for
    kind: TokenKind   # a person's or an agent's (an agent's tickets are batch)
    scope: str | None  # a TokenScope as JSON (None: unscoped), read through identity.scope_of
    band: Band         # its tickets' priority band, set by an admin
    created_at: float
    expires_at: float | None
    revoked_at: float | None


class AuditRow(TypedDict):
    id: int
    at: float
    actor: str
    action: str
    device: str | None
    lease_id: str | None
    detail: dict[str, Any]


class RingRow(TypedDict):
    device: str
    slot: int
    seq: int
    at: float
    from_state: DeviceState
    to_state: DeviceState
    cause: str
    actor: str


class CandidateRow(TypedDict):
    identifier: str
    host: str
    kind: str
    plugin: str
    label: str
    last_seen: float
    adopted_as: str | None


AdoptionRow = TypedDict("AdoptionRow", {
    "identifier": str,
    "name": str,
    "class": str,
    "tags": list[str],
    "host": str,
    "adopted_by": str,
    "at": float,
})


class IdempotencyRow(TypedDict):
    caller: str
    key: str
    request: str
    status: int
    body: str
    created_at: float


class TicketRow(TypedDict):
    """A queue ticket (docs/architecture.md, "Who gets the next lease"): what it waits for (a
    device by name, or a class and tags), for whom, and what became of it."""
    id: str
    requester: str
    kind: TicketKind
    device: str | None
    device_class: str | None
    tags: list[str]
    ttl_s: float
    state: TicketState
    created_at: float
    granted_at: float | None
    ended_at: float | None
    lease_id: str | None
    granted_device: str | None
    reason: str
    needs: Needs | None            # what it may run on (None: any device; core/needs.py)
    fallback: Needs | None         # needs "any" that takes a real device too ...
    fallback_at: float | None      # ... from this time on (its creation and its fallback_after)
    keepalive_s: float | None      # it lapses unless its requester reads it this often (its lease's keepalive)
    lapses_at: float | None        # ... at this time (docs/architecture.md, "Leases that live as long as their client")
    band: Band                     # its requester's token's band when it was made (docs/architecture.md,
    turn: int                      # ... "Shares of one lab"), and its turn among its requester's tickets
    token_id: str | None           # a scoped token's (its grant holds that token's budget), else None


class CouldServe(TypedDict):
    """A device (not retired) that could serve a ticket, with the live lease on it if any
    (docs/architecture.md, "Shares of one lab": a ticket's estimate, and none_can_serve)."""
    name: str
    device_class: str
    state: DeviceState
    since: float | None   # its live lease's grant (None: unleased)
    until: float | None   # ... and its end (a keepalive lease's own end), renewals aside


class JobRow(TypedDict):
    """A job (docs/architecture.md, "Jobs and evidence"): its spec as submitted, whose it is,
    the kind of its tickets (its submitter's), and the worker that runs it."""
    id: str
    owner: str
    kind: TicketKind
    band: Band                   # its tickets' band (its submitter's token's, when it was submitted)
    token_id: str | None         # the token that submitted it: its leases are held to that token's scope as it is now
    state: JobState
    reason: str
    spec: dict[str, Any]         # a JobSpec, as JSON
    created_at: float
    started_at: float | None
    ended_at: float | None
    worker: str | None           # the worker's label (its host and process, as it says)
    worker_user: str | None      # who claimed it: only they (and admins) report for it
    beat_at: float | None        # its worker's last beat


class JobCellRow(TypedDict):
    """An attempt of a cell of a job (a CellReport) as its worker last reported it."""
    job: str
    cell: int
    attempt: int
    cell_group: str
    device: str | None
    lease_id: str | None
    fingerprint: dict[str, Any] | None
    not_run: str | None
    failure: FailureKind | None
    reason: str


class JobRunRow(TypedDict):
    """One run of a job (a RunRecord), append-only."""
    job: str
    cell: int
    attempt: int
    seq: int
    arm: Arm
    warmup: bool
    started_at: float
    ended_at: float
    status: int
    readings: dict[str, Any]
    samples: list[dict[str, Any]]
    output_tail: str
    failure: FailureKind | None


class JobLeaseRow(TypedDict):
    """A ticket or lease a job made for one of its cells, with where it stands now."""
    cell: int
    ticket_id: str | None
    ticket_state: TicketState | None
    lease_id: str | None         # the lease made at once, or the one its ticket was granted
    lease_state: LeaseState | None
    device: str | None
    host: str | None


class TokenUsageRow(TypedDict):
    """A token's budget in one period (docs/architecture.md, "Shares of one lab"): the
    device-seconds its live leases hold, and those its ended leases used."""
    token_id: str
    period: str
    held_s: float
    used_s: float

