"""Jobs (docs/architecture.md, "Jobs and evidence"): the coordinator stores a job, its cells,
its runs and the tickets and leases it made; a worker runs it.

Who may do what with a job:

- its **owner** (who submitted it) reads it, its evidence, and cancels it;
- its **worker** (who claimed it: the owner, or an admin's shared worker) reads it, beats,
  reserves for it, reports its cells and runs, and finishes it;
- **admins** do all of it; anyone else is told the job does not exist.

A job's tickets are held by its owner and are of its kind, the kind of whoever submitted it
(never what the request says). When a job ends (finished, cancelled, its worker lost) its
open tickets are cancelled and its live leases released in the transaction that ends it.
Each transaction that changes a job locks its row first, then its devices' hosts (then
their leases, as everywhere: docs/architecture.md, "Leases"), so two never cross.
"""
from __future__ import annotations

import asyncio
import functools
import math
import secrets
from collections import OrderedDict
from typing import Any, Awaitable, Callable

from device_loop.core.durations import format_duration
from device_loop.core.ab.jobs import (COLDEST_C, HOTTEST_C, LATEST_TIME_S, MAX_MEASURE, CellReport, JobSpec, JobView,
                                   RunRecord, runs_per_cell, shown_title)
from device_loop.core.vocabulary import (LIVE_LEASE_STATES, OPEN_JOB_STATES, OPEN_TICKET_STATES, Band, FailureKind,
                                         FaultKind, JobState, LeaseState, TicketKind, TicketState)

from device_loop.core.answers import (MAX_RUNS_PAGE, ClaimAnswer, JobAnswer, JobReservation, JobRunsAnswer,
                                      LeaseAnswer, TicketAnswer)
from device_loop.core.errors import ErrorCode
from .errors import APIError, conflict, not_found
from .leases import Leases
from .lifecycle import Lifecycle, fault
from .notify import ticket_key
from .rows import JobCellRow, JobLeaseRow, JobRow, JobRunRow
from .scheduler import Scheduler
from .store import Store
from .who import COORDINATOR, Who, lab_actor
from .store.devices import DeviceQueries
from .store.jobs import JobQueries
from .store.leases import LeaseQueries
from .store.tickets import TicketQueries

JOB_PREFIX = "job-"
MAX_LISTED = 200           # jobs a listing shows
SILENT_PER_PASS = 20       # jobs whose worker was lost, ended by one reaper pass

QUEUED_KEY = "jobs:queued"  # a job was queued: claims long-polling wake up
ANALYSES_KEPT = 32
JOB_RUNS_SHOWN = MAX_RUNS_PAGE  # runs a job's answer holds: job_runs pages through the rest
RUNS_READ_AT_ONCE = 100        # runs one statement reads (other requests are served in between)
MAX_OPEN_JOBS = 50            # queued or running jobs one person may have (admins are counted, not limited)
RESERVATIONS_PER_CELL = 4     # tickets and leases a job may make for one attempt of a cell (a lease that ended, again)
LAB_FAILURES_FAULTY = 2       # lab failures in a row that take a device out of service ("Lab failures")
#: How a lease ended that says a lab failure on it was not its device's: a person (an admin's
#: revoke, a release) or its time ended it ("Lab failures").
NOT_THE_DEVICES = (LeaseState.REVOKED, LeaseState.RELEASED, LeaseState.EXPIRED)


def job_key(job_id: str) -> str:
    return f"job:{job_id}"


def cell_count(spec: JobSpec) -> int:
    """How many cells a job has: a matrix's groups, else one."""
    return len(spec.matrix.over) if spec.matrix is not None else 1


@functools.cache
def _version() -> str:
    from device_loop.core import __version__  # (looked up once: importlib.metadata)
    return __version__


def _summary(row: JobRow) -> dict[str, Any]:
    """A ``core.ab.jobs.JobSummary``, as JSON."""
    return {"id": row["id"], "owner": row["owner"], "kind": row["kind"], "state": row["state"],
            "reason": row["reason"], "title": shown_title(row["spec"]),
            "needs": row["spec"].get("needs"),
            "fallback": row["spec"].get("fallback"), "created_at": row["created_at"],
            "started_at": row["started_at"], "ended_at": row["ended_at"], "worker": row["worker"]}


def _cell(row: JobCellRow) -> dict[str, Any]:
    return {"cell": row["cell"], "attempt": row["attempt"], "group": row["cell_group"], "device": row["device"],
            "lease_id": row["lease_id"],
            "fingerprint": row["fingerprint"] and {**row["fingerprint"],  # (as _run: stored before bounds)
                                                   "thermal": _temperatures(row["fingerprint"].get("thermal", {}))},
            "not_run": row["not_run"], "failure": row["failure"], "reason": row["reason"]}


def _run(row: JobRunRow) -> dict[str, Any]:
    """A run as stored, its numbers within RunRecord's bounds: a run stored before they were
    bounded reads as one that was (the job's views do not fail on it)."""
    run: dict[str, Any] = {k: v for k, v in row.items() if k != "job"}
    for key in ("started_at", "ended_at"):
        run[key] = _within(row[key], 0.0, LATEST_TIME_S)
    readings = dict(run.get("readings") or {})
    readings["temperatures"] = _temperatures(readings.get("temperatures"))
    run["readings"] = readings
    run["samples"] = [{**s, "value": _within(s.get("value"), -MAX_MEASURE, MAX_MEASURE)}
                      for s in run.get("samples") or []]
    return run


def runs_cursor(run: dict[str, Any]) -> str:
    """Where a page of runs that ends at ``run`` goes on (``job_schemas.RUNS_CURSOR``)."""
    return f"{run['cell']}.{run['attempt']}.{run['seq']}"


def _within(value: Any, low: float, high: float) -> Any:
    return min(max(value, low), high) if isinstance(value, (int, float)) else value


def _temperatures(zones: Any) -> Any:
    return {k: _within(v, COLDEST_C, HOTTEST_C) for k, v in zones.items()} if isinstance(zones, dict) else zones


def _reservation(row: JobLeaseRow) -> JobReservation:
    return {"cell": row["cell"], "ticket": row["ticket_id"], "ticket_state": row["ticket_state"],
            "lease": row["lease_id"], "lease_state": row["lease_state"], "device": row["device"]}


def _jsonable(value: Any) -> Any:
    """An analysis as JSON: a pydantic model's dump, a dataclass's fields."""
    import dataclasses

    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", by_alias=True)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):  # NaN and infinity are no JSON
        return None
    return value


class Jobs:
    """Jobs, their cells and runs, and the leases they hold."""

    def __init__(self, life: Lifecycle, scheduler: Scheduler, leases: Leases, *, jobs_sql: JobQueries,
                 leases_sql: LeaseQueries, tickets_sql: TicketQueries, devices_sql: DeviceQueries):
        self.life, self.scheduler, self.leases = life, scheduler, leases
        self.store: Store = life.store
        self.jobs_sql = jobs_sql
        self.devices_sql = devices_sql
        self.leases_sql = leases_sql
        self.tickets_sql = tickets_sql
        self._analyses: OrderedDict[tuple, Any] = OrderedDict()  # what the last few jobs' runs came to

    # ---- submit, list, read -----------------------------------------------------------------

    async def submit(self, spec: JobSpec, claim: bool, worker: str | None, who: Who, kind: TicketKind) -> JobAnswer:
        """Store a new job, queued for a worker (or, with ``claim``, running with the caller as
        its worker). ``kind`` is the submitter's, as a ticket's is (``calls.ticket_kind``). The
        open jobs of a person are counted by the database (``MAX_OPEN_JOBS``)."""
        self.leases.check_ttl(spec.lease_ttl_s)  # its leases' length: refused now rather than at its first reserve
        now = self.life.clock()
        row: JobRow = {"id": JOB_PREFIX + secrets.token_hex(8), "owner": who.name, "kind": kind, "band": who.band,
                       "token_id": who.token_id,
                       "state": JobState.RUNNING if claim else JobState.QUEUED, "reason": "",
                       "spec": spec.model_dump(mode="json", by_alias=True), "created_at": now,
                       "started_at": now if claim else None, "ended_at": None,
                       "worker": (worker or who.name) if claim else None, "worker_user": who.name if claim else None,
                       "beat_at": now if claim else None}
        async with self.store.tx():
            if not await self.jobs_sql.count_job(who.name, MAX_OPEN_JOBS if who.limited else None):
                raise conflict(ErrorCode.TOO_MANY_JOBS, f"you have {MAX_OPEN_JOBS} queued or running jobs, this lab's "
                                                        f"limit per person; cancel one or wait for one to end")
            if await self.jobs_sql.stored_runs_full(who.name, self._stored_runs_limit()):
                raise self._runs_full(who.name)
            await self.jobs_sql.insert_job(row)
            await self.life.audit(who.name, "job_submit", None, None, {"job": row["id"], "kind": kind,
                                                                    "title": spec.title})
            if claim:
                await self.life.audit(who.name, "job_claim", None, None, {"job": row["id"], "worker": row["worker"]})
            self.life.notify(job_key(row["id"]), *(() if claim else (QUEUED_KEY,)))
        return await self.view(row, JOB_RUNS_SHOWN)

    def _stored_runs_limit(self) -> int | None:
        return self.life.settings.max_stored_runs or None

    def _runs_full(self, owner: str) -> APIError:
        most = self.life.settings.max_stored_runs
        return conflict(ErrorCode.TOO_MANY_STORED_RUNS,
                        f"{owner} has {most} job runs stored, this lab's limit per person (a finished job's runs count "
                        f"until it is deleted): delete jobs you no longer need (device-loop jobs, then device-loop job "
                        f"rm ID)")

    async def _readable(self, job_id: str, who: Who, for_update: bool = False) -> JobRow:
        """The job, if ``who`` may act on its owner or its worker (docs/architecture.md, "Who may act
        on what"); anyone else is told it does not exist."""
        row = await self.jobs_sql.job(job_id, for_update)
        if row is None or not who.may_act_on(row["owner"], row["worker_user"]):
            raise not_found("job", job_id)
        return row

    async def _worked(self, job_id: str, who: Who, doing: str) -> JobRow:
        """The running job ``who`` is the worker of (or an admin acts on), its row locked."""
        row = await self._readable(job_id, who, for_update=True)
        if not who.may_act_on(row["worker_user"]):
            worked = f"run by {row['worker_user']}'s worker" if row["worker_user"] else "not claimed by a worker yet"
            raise APIError(403, ErrorCode.NOT_THE_WORKER, f"{job_id} is {worked}: only its worker (or an admin) "
                                                          f"{doing}")
        if row["state"] != JobState.RUNNING:
            why = f" ({row['reason']})" if row["reason"] else ""
            raise conflict(ErrorCode.JOB_NOT_RUNNING, f"{job_id} is {row['state']}{why}: only a running job's worker "
                                                      f"{doing}")
        return row

    async def status(self, job_id: str, who: Who, wait_s: float = 0, unless: str | None = None,
                     gone: Callable[[], Awaitable[None]] | None = None) -> JobAnswer:
        """A job with its cells, runs, reservations and analysis. With ``wait_s``, once its
        state is not ``unless`` (default: the state it has now; an ended job answers at once)."""
        row = await self._readable(job_id, who)
        if wait_s and gone is not None:
            seen = unless if unless is not None else row["state"]
            if unless is not None or seen in OPEN_JOB_STATES:
                row = await self.life.notifier.long_poll(job_key(job_id), lambda: self._readable(job_id, who),
                                                         lambda r: r["state"] != seen, wait_s, gone)
        return await self.view(row, JOB_RUNS_SHOWN)

    async def runs_page(self, job_id: str, who: Who, after: str | None, limit: int) -> JobRunsAnswer:
        """A page of the job's runs: at most ``limit``, after the run ``after`` names (``runs_cursor``)."""
        row = await self._readable(job_id, who)
        at = None if after is None else tuple(int(part) for part in after.split("."))
        runs = await self._runs(row["id"], limit, at)  # type: ignore[arg-type]
        return {"runs": runs, "run_count": await self.jobs_sql.job_run_count(row["id"]),  # type: ignore[typeddict-item]
                "next": runs_cursor(runs[-1]) if len(runs) == limit else None}

    async def delete(self, job_id: str, who: Who) -> dict[str, Any]:
        """Its owner (or an admin) deletes an ended job, its cells and runs: they no longer count
        against the owner's stored runs (docs/architecture.md, "Shares of one lab")."""
        async with self.store.tx():
            row = await self._readable(job_id, who, for_update=True)
            if not who.may_act_on(row["owner"]):
                raise APIError(403, ErrorCode.NOT_THE_OWNER, f"{job_id} is {row['owner']}'s: only they (or an admin) "
                                                             f"delete it")
            if row["state"] in OPEN_JOB_STATES:
                raise conflict(ErrorCode.JOB_OPEN, f"{job_id} is {row['state']}: cancel it first (device-loop job "
                                                   f"cancel {job_id})")
            runs = await self.jobs_sql.delete_job(job_id, row["owner"])
            await self.life.audit(who.name, "job_delete", None, None, {"job": job_id, "owner": row["owner"],
                                                                       "runs": runs})
            self.life.notify(job_key(job_id))
        return {"deleted": job_id, "runs": runs}

    async def view(self, row: JobRow, shown: int | None = None) -> JobAnswer:
        """What ``GET /api/v1/jobs/{id}`` answers of a job: its first ``shown`` runs (None: all),
        and where ``job_runs`` goes on; the analysis is of all of them."""
        cells = [_cell(c) for c in await self.jobs_sql.job_cells(row["id"])]
        count = await self.jobs_sql.job_run_count(row["id"])
        runs = await self._runs(row["id"], count if shown is None else min(shown, count))
        answer: JobAnswer = {
            "id": row["id"], "owner": row["owner"], "kind": row["kind"], "state": row["state"],
            "reason": row["reason"], "spec": row["spec"],  # type: ignore[typeddict-item]  # (its JSON, checked at submit)
            "created_at": row["created_at"], "started_at": row["started_at"], "ended_at": row["ended_at"],
            "worker": row["worker"], "cells": cells, "runs": runs,  # type: ignore[typeddict-item]
            "run_count": count, "runs_next": runs_cursor(runs[-1]) if runs and len(runs) < count else None,
            "coordinator_version": _version(),
            "reservations": [_reservation(r) for r in await self.jobs_sql.job_leases(row["id"])],
            "analysis": None,
        }
        if count:
            answer["analysis"] = _jsonable(await self._analysis(answer))
        return answer

    async def _runs(self, job_id: str, most: int, after: tuple[int, int, int] | None = None) -> list[dict[str, Any]]:
        """The job's first ``most`` runs (after the run ``after``), read ``RUNS_READ_AT_ONCE``
        at a time: other requests are served between two reads (a job may have 7,040 runs of
        10 KB; SQLite reads on the event loop's thread: docs/architecture.md, "Shares of one lab")."""
        runs: list[dict[str, Any]] = []
        while len(runs) < most:
            page = await self.jobs_sql.job_runs_page(job_id, after, min(RUNS_READ_AT_ONCE, most - len(runs)))
            runs += [_run(r) for r in page]
            if not page:
                break
            after = (page[-1]["cell"], page[-1]["attempt"], page[-1]["seq"])
            await asyncio.sleep(0)  # (a turn for the other requests, not a wait for anything)
        return runs

    @staticmethod
    def as_view(answer: JobAnswer) -> JobView:
        """An answer as the analysis and the evidence read it: its runs validated one by one,
        so that in a thread the event loop gets its turns between them (one validation of
        thousands holds the interpreter until it ends)."""
        runs = [RunRecord.model_validate(run) for run in answer["runs"]]
        job = JobView.model_validate({k: answer[k] for k in JobView.model_fields  # type: ignore[literal-required]
                                      if k != "runs"})
        job.runs = runs
        return job

    async def _analysis(self, answer: JobAnswer) -> Any:
        """``core.ab.abstats.analyse`` of all the job's runs (read again where ``answer`` holds
        only the first), off the event loop; None where it is not installed (imported at the
        first job read, in the thread: scipy is slow to import)."""
        key = (answer["id"], answer["state"], answer["run_count"], len(answer["cells"]))
        if key in self._analyses:
            self._analyses.move_to_end(key)
            return self._analyses[key]
        whole = answer
        if len(answer["runs"]) < answer["run_count"]:
            whole = {**answer, "runs": await self._runs(answer["id"], answer["run_count"])}  # type: ignore[typeddict-item]

        def analyse() -> Any:
            try:  # (in the thread too: importing scipy takes seconds)
                from device_loop.core.ab import abstats
            except ImportError:
                return None
            view = self.as_view(whole)
            return abstats.analyse(view.spec, view.runs, view.cells)

        analysis = await asyncio.to_thread(analyse)
        self._analyses[key] = analysis
        while len(self._analyses) > ANALYSES_KEPT:
            self._analyses.popitem(last=False)
        return analysis

    async def analysed(self, job_id: str, who: Who) -> tuple[JobView, Any]:
        """A job as the evidence and charts read it, and the analysis of its runs (None where
        the analysis is not installed)."""
        answer = await self.view(await self._readable(job_id, who))
        return await asyncio.to_thread(self.as_view, answer), await self._analysis(answer)

    async def jobs(self, caller: str, everyone: bool) -> list[dict[str, Any]]:
        """The jobs the caller owns or works on (an admin's ``everyone``: all), open ones first."""
        return [_summary(r) for r in await self.jobs_sql.jobs_of(None if everyone else caller, MAX_LISTED)]

    # ---- the worker ---------------------------------------------------------------------------

    def served(self, users: list[str], who: Who) -> list[str]:
        """Whose jobs a worker of ``who`` serves: ``users`` (default: the caller). A
        person's token serves only that person's jobs."""
        served = sorted(set(users)) or [who.name]
        if not all(who.may_act_on(user) for user in served):
            name = who.name
            raise APIError(403, ErrorCode.FORBIDDEN, f"a worker of {name}'s token serves only {name}'s jobs; an "
                                                     f"admin's token serves other people's (users)")
        return served

    async def wait_queued(self, users: list[str], wait_s: float, who: Who,
                          gone: Callable[[], Awaitable[None]]) -> None:
        """Return once a job of ``users`` is queued, or ``wait_s`` ran out: what a claim waits
        for, holding nothing (docs/architecture.md, "Nothing that waits holds the lab")."""
        served = self.served(users, who)
        if wait_s > 0:
            await self.life.notifier.long_poll(QUEUED_KEY, lambda: self.jobs_sql.queued_job_of(served), bool, wait_s,
                                                  gone)

    async def claim(self, users: list[str], worker: str | None, who: Who) -> ClaimAnswer:
        """The oldest queued job of ``users`` (default: the caller), now running with the
        caller as its worker; ``job`` is None when none is queued (``wait_queued`` waits)."""
        served, label = self.served(users, who), worker or who.name
        async with self.store.tx():
            row = await self.jobs_sql.claim_job(served, label, who.name, self.life.clock())
            if row is not None:
                await self.life.audit(who.name, "job_claim", None, None, {"job": row["id"], "worker": label,
                                                                      "owner": row["owner"]})
                self.life.notify(job_key(row["id"]))
        return {"job": await self.view(row, JOB_RUNS_SHOWN) if row is not None else None}

    async def beat(self, job_id: str, who: Who) -> dict[str, Any]:
        """The worker is alive. Grants its tickets were given are claimed by this (the
        worker may be an admin's shared one, not the tickets' holder)."""
        async with self.store.tx():
            row = await self._worked(job_id, who, "beats for it")
            now = self.life.clock()
            await self.jobs_sql.beat_job(job_id, now)
            for held in await self.jobs_sql.job_leases(job_id):
                if held["ticket_id"] and held["ticket_state"] == TicketState.GRANTED \
                        and await self.tickets_sql.claim_ticket(held["ticket_id"], now):
                    await self.life.audit(who.name, "ticket_claim", held["device"], held["lease_id"],
                                          {"ticket": held["ticket_id"], "job": job_id})
                    self.life.notify(ticket_key(held["ticket_id"]))
        return _summary(row)

    async def reserve(self, job_id: str, cell: int, device: str | None, device_class: str | None, tags: list[str],
                      who: Who, exclude: list[str] | None = None) -> LeaseAnswer | TicketAnswer:
        """A lease for one cell of a running job, held by the job's owner, or a queue ticket
        of the job's kind when nothing that matches is free (``Scheduler.reserve``); recorded
        on the job, which ends it when it ends. ``exclude``: devices a retry leaves out (the
        ones its cell's lab failures were on; docs/architecture.md, "Lab failures")."""
        async with self.store.tx():
            row = await self._worked(job_id, who, "reserves for it")
            spec = JobSpec.model_validate(row["spec"])
            self._check_cell(spec, cell)
            most = RESERVATIONS_PER_CELL * cell_count(spec) * (spec.retry + 1)
            if await self.jobs_sql.job_lease_count(job_id) >= most:
                raise conflict(ErrorCode.TOO_MANY_RESERVATIONS, f"{job_id} has made {most} tickets and leases, the "
                                                                f"most a job of {cell_count(spec)} cell(s) makes")
            if exclude:
                device = await self._other_device(device, device_class, tags, spec, exclude, row["owner"])
                device_class, tags = None, []
            # the job's leases are its owner's, counted and limited as theirs; its tickets of its submitter's
            # band; held to its submitting token's scope and budget as they are now ("Shares of one lab")
            spender = await self.leases.budgets.spender_of_ticket(row["token_id"])
            owner = Who(row["owner"], band=Band(row["band"]), token_id=row["token_id"],
                        scope=None if spender is None else spender.scope)
            answer = await self.scheduler.reserve(device, device_class, tags, row["spec"]["lease_ttl_s"], True,
                                                  owner, TicketKind(row["kind"]), spec.need)
            made: dict[str, Any] = dict(answer)  # a lease, or a ticket (which has a key of that name)
            ticket = made.get("ticket")
            await self.jobs_sql.add_job_lease(job_id, cell, ticket, None if ticket else made["id"], self.life.clock())
            self.life.notify(job_key(job_id))
            return answer

    async def _other_device(self, device: str | None, device_class: str | None, tags: list[str], spec: JobSpec,
                            exclude: list[str], owner: str) -> str:
        """The device a retry takes, by name: a free one that matches, else the first that may
        serve soon and ``owner`` does not hold (its ticket waits for that one: a ticket has no
        devices to leave out), never one of ``exclude``; 409 ``no_other_device`` when only
        those match, 409 ``busy`` while the others are the owner's (the job's other cells:
        no ticket waits for what its own holder holds)."""
        left_out = set(exclude)
        if device is not None:
            names = [device]
        else:
            takes = spec.need.fidelities(spec.need.falls_back_at_once)
            free = await self.devices_sql.free_devices(device_class, tags, len(left_out) + 4, takes)
            names = [d["name"] for d in free]
            names += await self.devices_sql.matching_devices(device_class, tags, takes)
        others = [name for name in dict.fromkeys(names) if name not in left_out]
        if not others:
            raise conflict(ErrorCode.NO_OTHER_DEVICE, f"no device but {', '.join(sorted(left_out))} matches this cell: "
                                                      "a retry runs on another")
        for name in others:
            found = await self.devices_sql.device(name)
            if found is not None and found["holder"] != owner:
                return name
        raise conflict(ErrorCode.BUSY, f"{', '.join(others)}, the other devices that match this cell, are held by "
                                       f"{owner} (this job's other cells): a retry waits for one to be given back")

    @staticmethod
    def _check_cell(spec: JobSpec, cell: int) -> None:
        cells = cell_count(spec)
        if cell >= cells:
            raise APIError(422, ErrorCode.NO_SUCH_CELL, f"cell {cell} is not one of this job's: it has {cells} "
                                                        f"(0 to {cells - 1})")

    @staticmethod
    def _check_attempt(spec: JobSpec, attempt: int) -> None:
        if attempt > spec.retry:
            raise APIError(422, ErrorCode.NO_SUCH_CELL, f"attempt {attempt} is past this job's retry = {spec.retry}: "
                                                        f"a cell has attempts 0 to {spec.retry}")

    async def report_cell(self, job_id: str, report: CellReport, who: Who) -> dict[str, Any]:
        """An attempt of a cell as its worker saw it (its device, lease, fingerprint, or why
        it never ran, and whose failure ended it): the last report of an attempt is what it
        is. An attempt the lab failed before any run counts against its device (``_count``)."""
        async with self.store.tx():
            row = await self._worked(job_id, who, "reports its cells")
            spec = JobSpec.model_validate(row["spec"])
            self._check_cell(spec, report.cell)
            self._check_attempt(spec, report.attempt)
            dumped = report.model_dump(mode="json", by_alias=True)
            before = await self.jobs_sql.job_cell(job_id, report.cell, report.attempt)
            await self.jobs_sql.save_job_cell({"job": job_id, "cell": report.cell, "attempt": report.attempt,
                                               "cell_group": report.group, "device": report.device,
                                               "lease_id": report.lease_id, "fingerprint": dumped["fingerprint"],
                                               "not_run": report.not_run, "failure": report.failure,
                                               "reason": report.reason})
            if report.failure == FailureKind.LAB and report.device and (before is None or before["failure"] is None):
                last = await self.jobs_sql.last_run(job_id, report.cell, report.attempt)
                if last is None or last["failure"] != FailureKind.LAB:  # (a run's lab failure counted already)
                    await self._count(job_id, report.device, report.lease_id, True, report.reason or "no reason given")
            self.life.notify(job_key(job_id))
        return dumped

    async def add_run(self, job_id: str, run: RunRecord, who: Who) -> dict[str, Any]:
        """Append one run of a running job. Runs are never changed: the same (cell, seq) twice is
        refused, and so is a seq past what the job's spec asks a cell for (``runs_per_cell``)."""
        async with self.store.tx():
            row = await self._worked(job_id, who, "reports its runs")
            spec = JobSpec.model_validate(row["spec"])
            self._check_cell(spec, run.cell)
            self._check_attempt(spec, run.attempt)
            most = runs_per_cell(spec)
            if run.seq >= most:
                raise APIError(409, ErrorCode.TOO_MANY_RUNS, f"a cell of {job_id} has at most {most} runs (its spec's "
                                                             f"rounds): seq {run.seq} is past them")
            dumped = run.model_dump(mode="json", by_alias=True)
            if not await self.jobs_sql.count_stored_run(row["owner"], self._stored_runs_limit()):
                raise self._runs_full(row["owner"])
            if not await self.jobs_sql.insert_job_run({"job": job_id, **dumped}):  # type: ignore[typeddict-item]
                raise conflict(ErrorCode.DUPLICATE_RUN, f"{job_id} has run {run.seq} of cell {run.cell} (attempt "
                                                        f"{run.attempt}) already: runs are never changed")
            where = await self.jobs_sql.job_cell(job_id, run.cell, run.attempt)
            if where is not None and where["device"]:
                lab = run.failure == FailureKind.LAB
                why = f"run {run.seq} of cell {run.cell} (attempt {run.attempt}) failed, exit status {run.status}"
                await self._count(job_id, where["device"], where["lease_id"], lab, why if lab else "")
            self.life.notify(job_key(job_id))
        return dumped

    async def _count(self, job_id: str, name: str, lease_id: str | None, lab: bool, why: str) -> None:
        """Count a lab failure on device ``name`` (``lab``), or set its count back to 0 (in the
        caller's transaction, the job's row locked): at ``LAB_FAILURES_FAULTY`` in a row it
        becomes faulty, with a line of its ring log, until an admin clears it
        (docs/architecture.md, "Lab failures"). A fault it has already stays, kind and all; a
        lab failure whose lease a person or its time ended (``NOT_THE_DEVICES``), or on a lease
        that is not this job's on that device, is not counted."""
        if lab:
            # a worker's word is checked: only a lease this job made, on that device, counts
            # (a stolen worker token must not put another board out of service)
            lease = await self.leases_sql.lease(lease_id) if lease_id is not None else None
            made = {h["lease_id"] for h in await self.jobs_sql.job_leases(job_id)}
            if lease is None or lease["device"] != name or lease_id not in made or lease["state"] in NOT_THE_DEVICES:
                return
            await self.leases_sql.lock_host_of_device(name)  # (the lock order: the job, then its devices' hosts)
        count = await self.devices_sql.count_lab_failure(name, lab)
        if not lab or count is None or count < LAB_FAILURES_FAULTY:
            return
        device = await self.devices_sql.device(name)
        if device is None or device["fault"]:
            return
        words = f"{count} lab failures in a row, the last in {job_id}: {why}"[:500]
        state = await self.life.change(device, words, COORDINATOR, fault(FaultKind.LAB_FAILURES, words))
        if state == device["state"]:  # still leased: the ring log says so now, not when the lease ends
            await self.life.note(device, words, COORDINATOR)
        await self.life.audit(COORDINATOR, "lab_failures", name, None, {"job": job_id, "count": count,
                                                                        "reason": why[:500]})

    async def finish(self, job_id: str, state: JobState, reason: str, who: Who) -> JobAnswer:
        """The worker says the job ended (done or failed): its leases are released."""
        async with self.store.tx():
            row = await self._worked(job_id, who, "finishes it")
            ended = await self._end(row, state, reason or ("every run it asked for ran" if state == JobState.DONE
                                                           else "its worker said it failed"), who.name, "job_finish")
        return await self.view(ended, JOB_RUNS_SHOWN)

    async def cancel(self, job_id: str, who: Who) -> JobAnswer:
        """Its owner (or an admin) cancels a queued or running job: its leases are released."""
        async with self.store.tx():
            row = await self._readable(job_id, who, for_update=True)
            if not who.may_act_on(row["owner"]):
                raise APIError(403, ErrorCode.NOT_THE_OWNER, f"{job_id} is {row['owner']}'s: only they (or an admin) "
                                                             f"cancel it")
            if row["state"] not in OPEN_JOB_STATES:
                raise conflict(ErrorCode.JOB_ENDED, f"{job_id} is {row['state']} already")
            ended = await self._end(row, JobState.CANCELLED, f"cancelled by {who.name}", who.name, "job_cancel")
        return await self.view(ended, JOB_RUNS_SHOWN)

    async def _end(self, row: JobRow, state: JobState, reason: str, actor: str, action: str) -> JobRow:
        """End a job (in the caller's transaction, its row locked): its open tickets cancelled,
        its live leases released, their devices' hosts locked first."""
        job_id = row["id"]
        held = await self.jobs_sql.job_leases(job_id)
        await self.leases_sql.lock_hosts([h["host"] for h in held if h["host"] and (
            h["lease_state"] in LIVE_LEASE_STATES or h["ticket_state"] in OPEN_TICKET_STATES)])
        ended = await self.jobs_sql.end_job(job_id, state, reason, self.life.clock(), OPEN_JOB_STATES)
        if ended is None:
            raise conflict(ErrorCode.JOB_CHANGED, f"{job_id} changed just now; look at it again")
        await self.jobs_sql.uncount_job(ended["owner"])
        for ticket in {h["ticket_id"] for h in held if h["ticket_id"] and h["ticket_state"] in OPEN_TICKET_STATES}:
            await self.scheduler.cancel(ticket, lab_actor(actor))  # a granted one gives its lease back
        for lease_id in {h["lease_id"] for h in await self.jobs_sql.job_leases(job_id)
                            if h["lease_id"] and h["lease_state"] in LIVE_LEASE_STATES}:
               lease = await self.leases_sql.lease(lease_id)
               if lease is not None and await self.leases.end(lease, LeaseState.RELEASED,
                                                              f"its job {job_id} ended ({state})", actor):
                   await self.life.audit(actor, "release", lease["device"], lease_id, {"job": job_id})
        await self.life.audit(actor, action, None, None, {"job": job_id, "state": state, "reason": reason})
        self.life.notify(job_key(job_id))
        return ended

    async def end_silent(self, now: float, actor: str) -> None:
        """The reaper's pass: running jobs whose worker did not beat within the worker timeout
        end ``failed`` ("worker lost"), their runs kept and their leases released. Silence
        counts from when this coordinator began serving, at the earliest (workers could not
        beat while it was down)."""
        timeout = self.life.settings.job_worker_timeout_s
        before = now - timeout
        if self.life.serving_since > before:
            return
        for row in await self.jobs_sql.jobs_silent_before(before, SILENT_PER_PASS):
            async with self.store.tx():
                locked = await self.jobs_sql.job(row["id"], for_update=True)
                if locked is None or locked["state"] != JobState.RUNNING or (locked["beat_at"] or 0) >= before:
                    continue  # it beat, or ended, in another process meanwhile
                await self._end(locked, JobState.FAILED, f"worker lost: {locked['worker']} did not beat within "
                                                         f"{format_duration(timeout)}", actor, "job_worker_lost")
