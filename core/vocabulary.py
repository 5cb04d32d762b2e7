"""The lab's vocabulary, written once: the states of leases, devices, health,
operations, tickets and jobs, a run's arm, and what an endpoint is for. The protocol's
models, the coordinator's rules, its SQL (``CHECK`` constraints made from these values,
``sql_list``) and the clients all take them from here; a ``StrEnum`` is its value, so JSON
and the database see plain text. The migrations restate some of them as they were when
each was written (tests/test_vocabulary.py holds them to these).
"""
from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class LeaseState(StrEnum):
    PENDING = "pending"    # granted; its services are starting
    ACTIVE = "active"      # its services are up
    RELEASED = "released"
    EXPIRED = "expired"
    FAILED = "failed"      # its services never came up
    REVOKED = "revoked"    # an admin took it back


#: A lease in these states is live (it holds its device); every other state is final.
LIVE_LEASE_STATES = (LeaseState.PENDING, LeaseState.ACTIVE)


class DeviceState(StrEnum):
    UNREGISTERED = "unregistered"
    IDLE = "idle"
    ALLOCATING = "allocating"
    IN_USE = "in_use"
    RECLAIMING = "reclaiming"
    FAULTY = "faulty"
    OFFLINE = "offline"
    RETIRED = "retired"


class HealthStatus(StrEnum):
    OK = "ok"
    DEGRADED = "degraded"
    FAILED = "failed"


class HealthKind(StrEnum):
    """What a health check's ``degraded`` or ``failed`` says of the fault (docs/architecture.md,
    "Health that heals"): ``transient`` may pass by itself (a link that retrains, a card put
    back), so the exporter re-probes it and re-admits the device; ``permanent`` will not (AER
    fatal errors, a burnt-out part), so the device stays faulty until a person clears it."""
    TRANSIENT = "transient"
    PERMANENT = "permanent"


class OperationState(StrEnum):
    QUEUED = "queued"      # in its host's desired state, not begun
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


#: The phases of an operation before it touched the device (queued, or fetching its image):
#: one that stopped in one of them changed nothing.
FIRST_PHASES = ("queued", "fetching")

#: An operation in these states is live; then it is done or failed.
LIVE_OP_STATES = (OperationState.QUEUED, OperationState.RUNNING)


class EndpointRole(StrEnum):
    """What an endpoint is for, whatever plugin serves it: clients find an endpoint by its
    role (``device-loop console`` takes the ``console`` one), never by a plugin's kind."""
    CONSOLE = "console"          # a serial console: raw TCP or telnet with RFC 2217
    ADB = "adb"                  # an adb server
    HTTP_STREAM = "http-stream"  # a camera: a page, an MJPEG stream and a snapshot (params stream, snapshot)
    RFB = "rfb"                  # a VNC server
    WEB_VIEWER = "web-viewer"    # a page a browser opens (noVNC)
    SSH = "ssh"                  # a board's sshd (params user, host_key)


class Purpose(StrEnum):
    """Why an operation runs (docs/architecture.md, "Operations"): what the exporter's
    executor dispatches on, with the operation's kind, never on its arguments."""
    LEASE = "lease"        # asked for inside a lease, by its holder or an admin
    STEP = "step"          # a step between two leases (DesiredOperation.step: its place in the device's steps)
    SETTLE = "settle"      # the device's steps that settle, inside a lease
    RECOVERY = "recovery"  # the coordinator's or an admin's, on a device no lease holds (a power cycle, a recover)


class PowerAction(StrEnum):
    """What a ``power`` operation asks of a device's power switch (docs/architecture.md, "Power")."""
    ON = "on"
    OFF = "off"
    CYCLE = "cycle"    # off, the off-time, on: the exporter's, watching the console between
    STATUS = "status"  # read the switch, change nothing


class PowerState(StrEnum):
    """What a power switch reads back."""
    ON = "on"
    OFF = "off"


class PowerVerdict(StrEnum):
    """What a power operation observed: ``verified`` when the switch's read-back or the
    device's console showed the change, else ``unverified`` (never reported as done)."""
    VERIFIED = "verified"
    UNVERIFIED = "unverified"


class AutoRecover(StrEnum):
    """What the coordinator may do on its own to a device whose health failed (its config's
    ``auto_recover``)."""
    POWER_CYCLE = "power-cycle"


class FaultKind(StrEnum):
    """What left a device faulty (docs/architecture.md, "Lifecycle"): the coordinator decides
    by this, never by the fault's words, which are for people."""
    STEP_FAILED = "step-failed"      # a step between leases failed: an admin clears it (never its health recovering)
    HEALTH_PERMANENT = "health-permanent"  # its health failed for good (HealthKind.PERMANENT): an admin clears it
    MARKED_FAULTY = "marked-faulty"  # an admin marked it faulty by hand: an admin clears it
    SWITCHED_OFF = "switched-off"    # a person's power off (or an off that failed part-way): a verified on clears it
    UNVERIFIED_ON = "unverified-on"  # an on nothing showed: a verified on, or an admin who saw it run, clears it
    LAB_FAILURES = "lab-failures"    # two lab failures of jobs' runs in a row on it: an admin clears it


#: The faults that say the board may be off: only a verified power on clears them
#: (docs/architecture.md, "Power").
HELD_OFF = (FaultKind.SWITCHED_OFF, FaultKind.UNVERIFIED_ON)


class Fidelity(StrEnum):
    """What a device is (docs/architecture.md, "Lifecycle"): a plugin says it of the
    resources it serves (``Resource.fidelity``), never a tag or a fact's words."""
    HARDWARE = "hardware"    # a board on the bench: its numbers are measured
    SIMULATED = "simulated"  # a model of a board (the sim plugin's): its numbers are modelled
    VIRTUAL = "virtual"      # a virtual machine: real silicon, shared
    EMULATED = "emulated"    # an emulator (QEMU's TCG): another ISA, modelled


#: The fidelities whose numbers are not for timing (an A/B on them warns).
NOT_FOR_TIMING = (Fidelity.SIMULATED, Fidelity.EMULATED)


class TicketState(StrEnum):
    """A queue ticket (docs/architecture.md, "Who gets the next lease")."""
    WAITING = "waiting"      # nothing matching was free yet
    GRANTED = "granted"      # a lease was made for it; its requester has not seen it yet
    CLAIMED = "claimed"      # its requester saw the lease: the ticket's work is done
    CANCELLED = "cancelled"  # by its requester or an admin
    EXPIRED = "expired"      # granted, and not claimed within the claim window


#: A ticket in these states is open: its requester may cancel it (a granted one gives its lease back).
OPEN_TICKET_STATES = (TicketState.WAITING, TicketState.GRANTED)


class TicketKind(StrEnum):
    """Who a ticket is served for first: a person at their desk before an agent's batch."""
    INTERACTIVE = "interactive"
    BATCH = "batch"


class Band(StrEnum):
    """A token's priority band (docs/architecture.md, "Shares of one lab"): its tickets are
    served band by band, urgent first; set by an admin, never by the request."""
    URGENT = "urgent"
    NORMAL = "normal"
    BACKGROUND = "background"


#: The order bands are served in (lower first), as the queue's SQL orders them.
BAND_RANK = {Band.URGENT: 0, Band.NORMAL: 1, Band.BACKGROUND: 2}


class BudgetPeriod(StrEnum):
    """What a token's budget of device-minutes is for: each UTC day, or the token's whole life."""
    DAY = "day"
    TOKEN = "token"


class TokenKind(StrEnum):
    """What a person's token is for (set by the admin who makes it): an agent's tickets are batch."""
    PERSON = "person"
    AGENT = "agent"


class JobState(StrEnum):
    """A job's life: queued until a worker claims it; then running; then one of the ends."""
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"          # every run it asked for ran (a verdict may still be "unknown")
    FAILED = "failed"      # a command failed, the device went faulty, the lease ended, the worker was lost
    CANCELLED = "cancelled"


OPEN_JOB_STATES = (JobState.QUEUED, JobState.RUNNING)


class Needs(StrEnum):
    """What a reserve, a ticket or a job may run on (docs/architecture.md, "Who gets the next
    lease"; ``core/needs.py`` reads it against a device's ``Fidelity``): ``real-hw`` a board or a
    simulated one, ``any`` a virtual or emulated device first."""
    REAL_HW = "real-hw"
    ANY = "any"


class Arm(StrEnum):
    """Which command a run ran: A (baseline), B (patch), or a plain job's only command."""
    A = "A"
    B = "B"
    RUN = "run"


class FailureKind(StrEnum):
    """Whose fault a failed run, cell or ``device-loop with`` was (docs/architecture.md, "Lab
    failures"): the test's (the command said so), the lab's (no device, the lease lost, the
    exporter gone, the device faulty or switched off, a flash that failed), or the command's
    deadline."""
    TEST = "test"
    LAB = "lab"
    TIMEOUT = "timeout"


#: The exit status of a command the lab failed (EX_TEMPFAIL of sysexits.h: "try again"): what
#: ``device-loop with`` exits with, and what a job's command may exit with to say the lab
#: failed it (docs/architecture.md, "Lab failures").
LAB_FAILURE_STATUS = 75

#: Every enum of the vocabulary.
VOCABULARY = (LeaseState, DeviceState, HealthStatus, OperationState, EndpointRole, PowerAction, PowerState,
              PowerVerdict, AutoRecover, Purpose, FaultKind, Fidelity, TicketState, TicketKind, TokenKind,
              JobState, Needs, Arm, FailureKind, Band, BudgetPeriod)


def sql_list(values: Iterable[str]) -> str:
    """``('a', 'b')``: the values of an enum (or some of them) for SQL's ``IN``."""
    return "(" + ", ".join(f"'{value}'" for value in values) + ")"
