"""What the coordinator answers, as types: the REST routes and MCP tools return these, the
OpenAPI document describes each route's answer from them (``coordinator/openapi.py``), and
the Python client (``client/lab.py``) hands them on, so a shape is written once, here.
Times are ISO 8601 text (``core.durations.iso``).
"""
from __future__ import annotations

from typing import Any

from typing_extensions import TypedDict  # (pydantic reads typing.TypedDict only from Python 3.12)

from .ab.jobs import CellReport, JobSpec, RunRecord
from .vocabulary import (Band, DeviceState, FaultKind, Fidelity, HealthStatus, JobState, LeaseState, Needs,
                         OperationState,
                         TicketKind, TicketState, TokenKind)


class FlashedImage(TypedDict):
    """The image a device's latest completed flash wrote."""
    name: str
    sha256: str


class HolderAnswer(TypedDict, total=False):
    """A process that holds a device node, for admins only (anyone else sees how many): its
    pid and program, its command line (secrets redacted) and cgroup."""
    pid: int
    program: str
    command: str
    cgroup: str


class RunningOperation(TypedDict):
    id: str
    kind: str


class QuarantineAnswer(TypedDict):
    """A device's quarantine as its exporter reports it (``protocol.Quarantine``; docs/architecture.md,
    "Health that heals")."""
    failures: int                  # how often its health turned failed within window_s
    window_s: float
    probe_s: float                 # the time to its next probe
    probes: int                    # probes so far
    good: int                      # good probes in a row
    needed: int                    # good probes in a row that re-admit it
    reason: str                    # why its last check failed (exporter paths hidden from the public)


class RunningStep(TypedDict):
    """The step between leases a device runs now."""
    index: int    # from 0
    of: int       # how many it has
    step: str     # its name (cooldown, reboot, ...)
    op: str | None
    detail: str   # where it stands: cooling down: 51.2 °C, waiting for < 45 °C


DeviceAnswer = TypedDict("DeviceAnswer", {
    "name": str,
    "class": str,
    "tags": list[str],
    "state": DeviceState,
    "state_since": str | None,
    "host": str | None,
    "holder": str | None,
    "expires_at": str | None,
    "health": HealthStatus,
    "health_reason": str,
    "conflict_hosts": list[str],   # its owner, then another host that reports it too
    "busy_count": int,             # how many processes besides the lab's own hold its node
    "busy_by": list[HolderAnswer],  # admins only: which they are
    "resources": list[dict[str, Any]],
    "needs_recovery": bool,
    "recovery_reason": str | None,
    "operation": RunningOperation | None,  # the exclusive operation running on it
    "flashing": str | None,        # the id of that operation, when it is a flash
    "lease": str | None,           # admins only: the id of its live lease
    "steps": list[str],            # what runs on it between two leases, in order
    "step": RunningStep | None,    # the one running now, while it is reclaimed
    "fault": str | None,           # why a step between leases failed, or who switched it off: faulty once unleased
    "fault_kind": FaultKind | None,  # what left that fault (step-failed, health-permanent ...)
    "quarantine": QuarantineAnswer | None,  # its quarantine as its exporter reports it
    "switched_off": str | None,    # that fault, when it is a person's power off (its holder may still hold it)
    "fidelity": Fidelity,          # what it is: a board, a simulation, a virtual machine or an emulator
    "reason": str,                 # why it is in its state, in words ("" when idle, or in use and on)
    "facts": dict[str, str],       # what its plugins add to its fingerprint (board revision, firmware)
    "image": FlashedImage | None,  # one device's answer: what its latest completed flash wrote
}, total=False)



# "from" is a keyword: the functional form
LogEntry = TypedDict("LogEntry", {"at": str | None, "from": DeviceState, "to": DeviceState, "cause": str,
                                  "actor": str})
LogEntry.__doc__ = "One state change of a device's ring log."


class EndpointAnswer(TypedDict, total=False):
    kind: str
    role: str
    host: str
    port: int
    url: str
    protocol: str
    params: dict[str, str | int]
    command: str
    env: dict[str, str]
    scope: str                     # the scope operation that shows it: uart, adb, camera, screen, ssh, a plugin's kind
    secret: str | None             # its gate's password while the lease lives (None: a lab without gates)


class LeaseAnswer(TypedDict):
    """A lease as its holder (or an admin) sees it."""
    id: str
    device: str
    holder: str
    state: LeaseState
    created_at: str | None
    expires_at: str | None         # when it ends unless renewed (a keepalive lease: kept alive)
    keepalive_s: float | None      # a keepalive lease: renew it without a ttl this often at least
    ends_at: str | None            # its own end, which no keep-alive passes
    budget_capped: bool            # its end is its token's budget's, not what was asked (whoami: what is left)
    ended_at: str | None
    end_reason: str | None
    device_state: DeviceState
    host: str | None
    endpoints: list[EndpointAnswer]
    withheld: list[str]            # the parts of its data plane its reader's scope does not show (uart, camera...)
    ready: bool
    reason: str
    needs_recovery: str | None
    switched_off: str | None       # a person switched it off: by whom, when, how to switch it on
    operation: RunningOperation | None
    flashing: str | None
    commands: list[str]            # how to use its endpoints, as their plugins said


class CdiAnswer(TypedDict):
    """A lease's CDI spec (docs/architecture.md, "Containers and CDI"), as its exporter writes it."""
    lease: str
    device: str
    host: str | None
    device_name: str               # what `podman run --device` takes: device-loop.dev/<class>=<device>
    cdi_version: str
    file: str                      # its file's name in the exporter's CDI folder (/var/run/cdi unless configured)
    spec: dict[str, Any]
    note: str | None               # a runtime that will not read it, said


class HostAnswer(TypedDict):
    name: str
    online: bool
    protocol: int
    version: str
    boot_id: str
    generation: int
    heartbeat_s: float
    heartbeat_age_s: float
    draining: bool
    last_seen: str | None
    plugins: dict[str, Any]
    link_lost: bool
    address: str | None
    devices: list[str]
    claims: list[str]


class ImageSummary(TypedDict):
    name: str | None
    sha256: str | None
    size: int | None


class TicketEstimate(TypedDict):
    """When a waiting ticket is likely granted (docs/architecture.md, "Shares of one lab"):
    reckoned from the leases on the devices that could serve it, the recent lease durations
    of their class and the tickets served before it."""
    earliest_at: str            # not before this, most likely (the 5th percentile of the replays)
    likely_at: str              # about half the time by this (their median)
    latest_at: str              # almost surely by this (their 95th percentile)
    devices: int                # the devices that could serve it, in service now
    ahead: int                  # tickets served before it
    lease_p50_s: float | None   # the recent leases' median and 90th percentile (None: no history yet:
    lease_p90_s: float | None   # ... the ticket's own ttl stands in)
    basis: str                  # the same, in words


class TicketAnswer(TypedDict):
    """A queue ticket as its requester (or an admin) sees it (docs/architecture.md, "Who
    gets the next lease")."""
    ticket: str                 # its id (tk-...)
    state: TicketState          # waiting, granted, claimed, cancelled, expired
    kind: TicketKind            # interactive (a person) or batch (an agent): who is served first
    band: Band                  # its priority band (its requester's token's, set by an admin): served first
    requester: str
    wants: str                  # what it waits for, in words
    device: str | None          # ... by name
    device_class: str | None    # ... or by class
    tags: list[str]             # ... and tags (all must match)
    needs: Needs | None         # what it may run on: real-hw, any (None: any device)
    fallback: Needs | None      # with needs any: real-hw, a real device after its wait ...
    fallback_at: str | None     # ... from this time on
    ttl_s: float                # the lease's length, from its grant
    keepalive_s: float | None   # it lapses unless read this often; its lease is a keepalive lease
    position: int | None        # while waiting: 1 is served next among tickets for the same thing
    estimate: TicketEstimate | None  # while waiting: when it is likely granted (None: no device could serve it now)
    created_at: str | None
    granted_at: str | None
    claim_by: str | None        # granted: see its lease before this, or it passes on
    ended_at: str | None
    lease: "LeaseAnswer | None"  # once granted (seeing it claims the ticket)
    reason: str                 # what happened to it, in words


class QueueEntry(TypedDict):
    """A waiting ticket as anyone sees it on the board: who, for what, how long, which kind;
    its id only for its requester and admins."""
    ticket: str | None
    requester: str
    kind: TicketKind
    band: Band
    wants: str
    device: str | None
    device_class: str | None
    tags: list[str]
    needs: Needs | None
    fallback: Needs | None
    waiting_s: float
    position: int
    estimate: TicketEstimate | None


class ProgressAnswer(TypedDict):
    done: int
    total: int | None
    unit: str
    detail: str  # where it stands, in words


class OperationAnswer(TypedDict, total=False):
    """An operation on a device; ``lease`` only for its requester, the lease's holder and admins."""
    id: str
    kind: str
    device: str
    host: str
    lease: str | None
    requester: str
    args: dict[str, Any]
    state: OperationState
    phase: str
    progress: ProgressAnswer
    message: str
    result: dict[str, Any] | None
    seconds: dict[str, float]
    created_at: str | None
    started_at: str | None
    ended_at: str | None
    # an operation that writes an image of the registry (a flash), as flashes always showed it
    purpose: str
    image: ImageSummary
    done_bytes: int
    total_bytes: int | None
    verified: bool                 # it ended done and read back the image's digest: what --image prefers


ImageAnswer = TypedDict("ImageAnswer", {
    "sha256": str,
    "ref": str,            # sha256: and 12 digits: what names it and nothing else
    "name": str,
    "size": int,
    "description": str,
    "for": str,            # device:NAME or class:NAME
    "uploader": str,
    "created_at": str | None,
    "last_used_at": str | None,
    "known_good_for": list[str],
})


class TokenAnswer(TypedDict, total=False):
    id: str
    user: str
    admin: bool
    host: str | None
    kind: TokenKind     # person or agent (an agent's queue tickets are batch)
    scope: dict[str, Any] | None  # a TokenScope (core/scopes.py) as JSON; None: unscoped
    band: Band          # its tickets' priority band
    created_at: str | None
    expires_at: str | None
    revoked_at: str | None
    token: str | None   # only in the answer that made it
    note: str


class BudgetAnswer(TypedDict):
    """A scoped token's budget now (docs/architecture.md, "Shares of one lab"): device-seconds
    held ahead by its live leases, used by its ended ones, and left, in the current period."""
    budget_s: float
    period: str              # day (UTC) or token (its life)
    held_s: float
    used_s: float
    left_s: float
    renews_at: str | None    # the end of the period (a day's: the next 00:00 UTC); None: never
    words: str               # "budget: 3 of 120 device-minutes left today; it renews at 00:00 UTC"


class WhoamiAnswer(TypedDict):
    """Who the coordinator takes the caller for, and what its token may still do."""
    name: str
    kind: str                # person, agent, trusted (the trust mode), ...
    admin: bool
    token_id: str | None
    band: Band
    scope: dict[str, Any] | None  # a TokenScope as JSON; None: unscoped
    live_leases: int | None  # leases counted against the scope's most leases at once (None: no such bound)
    budget: BudgetAnswer | None


class CandidateAnswer(TypedDict):
    identifier: str
    host: str
    kind: str
    plugin: str
    label: str
    last_seen: str | None
    adopted_as: str | None


class AuditEntry(TypedDict):
    at: str | None
    actor: str
    action: str
    device: str | None
    lease: str | None
    detail: dict[str, Any]


class HealthAnswer(TypedDict):
    ok: bool
    version: str
    protocol: int


class JobReservation(TypedDict):
    """A ticket or lease a job made for one of its cells, and where it stands."""
    cell: int
    ticket: str | None
    ticket_state: TicketState | None
    lease: str | None
    lease_state: LeaseState | None
    device: str | None


class JobAnswer(TypedDict):
    """A job as its owner, its worker and admins see it (docs/architecture.md, "Jobs and
    evidence"): ``core.ab.jobs.JobView``'s fields (times in seconds since the epoch, as there),
    then what the coordinator adds: the tickets and leases it made, and the analysis of its
    runs (null until it has some, or where the analysis is not installed)."""
    id: str
    owner: str
    kind: TicketKind
    state: JobState
    reason: str
    spec: JobSpec
    created_at: float
    started_at: float | None
    ended_at: float | None
    worker: str | None
    cells: list[CellReport]
    runs: list[RunRecord]          # its first runs (at most JOB_RUNS_SHOWN); empty when asked without them (runs=false)
    run_count: int                 # how many it has, asked with them or not
    runs_next: str | None          # where ``job_runs`` goes on after ``runs`` (None: they are all, or none asked)
    coordinator_version: str
    reservations: list[JobReservation]
    analysis: dict[str, Any] | None


MAX_RUNS_PAGE = 500  # runs a page of ``job_runs`` holds at most (and a job's answer: the rest are paged)


class JobRunsAnswer(TypedDict):
    """A page of a job's runs, in order (cell, attempt, seq), and where the next begins."""
    runs: list[RunRecord]
    run_count: int                 # how many the job has
    next: str | None               # the next page's ``after`` (None: this was the last)


class ClaimAnswer(TypedDict):
    """What a worker's claim took: a job, now running and the worker's, or null (none queued)."""
    job: JobAnswer | None


class ExecAnswer(TypedDict):
    """A command run on a device (docs/architecture.md, "Running a command on a device")."""
    stdout: str
    stderr: str
    status: int
    channel: str       # adb, ssh or console: how it reached the device
    elapsed_s: float
    truncated: bool    # stdout or stderr was cut at the coordinator's limit
