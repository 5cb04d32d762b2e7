"""The job runner (docs/architecture.md, "Jobs and evidence"): runs one job its worker has
claimed, cell by cell, and reports each run as soon as it has ended.

Per cell: a lease through the job's own reserve route (a queue ticket, held by the job's
owner), the device's fingerprint, the setup commands once, then the runs in the order
``client/schedule.py`` fixed before the first one (warmup first), each after ``settle``
(the device's cool-down steps) and with the device's readings at its start. Commands run on
this machine with the lease's environment (``client/local_run.py``). A thread beats the job
meanwhile. A failing command, a lease that ended, a faulty device or a stop (the worker's
SIGTERM, a cancel) fails or ends the job with its runs kept; the leases are released
however it ends. Each failure says whose it was (docs/architecture.md, "Lab failures"): a
cell's attempt the lab failed starts again on another device, up to the spec's ``retry``.
The job's commands run in a cgroup of the job's, killed whole when it ends
(``client/job_cgroups.py``), and, on a worker that serves others, under the account of the
job's owner (``client/accounts.py``).

The runner is given its collaborators: the lab's ``Jobs``, the function that runs a
command on a device (``exec``), and a clock.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from device_loop.core.device_exec import exec_on_lease
from device_loop.core.durations import format_duration, parse_iso
from device_loop.core.ab.fingerprint import gather, readings, unfit
from device_loop.core.ab.jobs import (MAX_TEXT_CHARS, CellReport, Fingerprint, JobSpec, JobView, MatrixSpec, Readings,
                                     RunRecord)
from device_loop.core.vocabulary import LAB_FAILURE_STATUS, Arm, FailureKind, JobState
from device_loop.core.usage import LEASE_ANSWER_ENV, environment
from device_loop.core.errors import ErrorCode

from .accounts import Account
from .http import CoordinatorError
from .job_cgroups import JobCgroup, JobCgroups
from .lab_trouble import lab_trouble, lost_reason, wrong_request
from .jobs_api import Jobs
from .lab import Lease, Ticket, TicketEnded
from .local_run import LocalCommand, LocalResult, read_metrics
from .schedule import Cell, cells, measured_arms, warmup_arms

#: ``exec(lease_answer, command, timeout_s)``: a command on the device (``core/device_exec.py``)
DeviceExec = Callable[[Mapping[str, Any], str, float], Any]
Say = Callable[[str], None]

BEAT_S = 5.0             # how often the worker says it is alive
TICKET_POLL_S = 5.0      # a ticket's wait is cut this often to see a stop
READY_TIMEOUT_S = 120.0  # a granted lease's services up
RETRY_POLL_S = 1.0       # how often a retry asks again for a device the job's other cells hold
#: A retry's reserve refused so: no other device serves the cell (now), the last failure stands.
NO_RETRY = (ErrorCode.NO_OTHER_DEVICE, ErrorCode.BUSY)
EXEC_TIMEOUT_S = 20.0    # a reading at a run's start
NO_DEVICE = "no device"
#: The reserve refusals that mean a matrix group has no device (anything else fails the job).
NO_SUCH_DEVICE = (ErrorCode.NO_SUCH_DEVICES, ErrorCode.UNKNOWN_DEVICE, ErrorCode.NONE_FREE)
#: Of those, the ones whose message says "no device ..." itself.
SAYS_NO_DEVICE = (ErrorCode.NO_SUCH_DEVICES, ErrorCode.NONE_FREE)
OWN_BIN = Path(sys.executable).parent  # where this Python's device-loop script is


class JobStopped(Exception):
    """The job stops before its end: the worker stops, the job was cancelled or taken from it."""


class CellFailed(Exception):
    """A cell's attempt cannot go on: a command failed, the lease ended, the device went
    faulty; ``failure`` says whose failure it was (docs/architecture.md, "Lab failures")."""

    def __init__(self, reason: str, failure: FailureKind = FailureKind.TEST):
        super().__init__(reason)
        self.failure = failure


class Stopper:
    """Why a job stops early (the first reason given counts), and what to kill then: the
    commands running at that moment, in every cell."""

    def __init__(self):
        self._lock = threading.RLock()  # (stop is called from signal handlers, on the main thread too)
        self._event = threading.Event()
        self._kills: dict[int, Callable[[], None]] = {}
        self.reason: str | None = None
        self.cancelled = False   # the job ended on the coordinator's side: not ours to finish

    def stop(self, reason: str, cancelled: bool = False) -> None:
        """Stop the job (once: a later reason is ignored) and kill what runs."""
        with self._lock:
            if self.reason is None:
                self.reason, self.cancelled = reason, cancelled
            kills = list(self._kills.values())
        self._event.set()
        for kill in kills:
            kill()

    @property
    def stopped(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        """Raise ``JobStopped`` once the job was stopped."""
        if self._event.is_set():
            raise JobStopped(self.reason or "stopped")

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a stop; whether it came."""
        return self._event.wait(seconds)

    @contextlib.contextmanager
    def killing(self, kill: Callable[[], None]) -> Iterator[None]:
        """While inside, a stop calls ``kill`` (at once if stopped already)."""
        with self._lock:
            self._kills[id(kill)] = kill
            stopped = self._event.is_set()
        if stopped:
            kill()
        try:
            yield
        finally:
            with self._lock:
                self._kills.pop(id(kill), None)


@dataclass(frozen=True)
class Placement:
    """Where a job's commands run: in its cgroup (None: each in a process group) and as
    whom (None: the worker's account)."""
    cgroup: JobCgroup | None = None
    account: Account | None = None


@dataclass(frozen=True)
class CellOutcome:
    cell: int
    failed: str | None = None     # why the cell, and so the job, failed
    not_run: str | None = None    # why it never began (a matrix cell without a device)
    failure: FailureKind | None = None  # whose failure ended its last attempt


class Runner:
    """Runs claimed jobs (``run``), one at a time."""

    def __init__(self, jobs: Jobs, *, exec: DeviceExec | None = None, clock: Callable[[], float] = time.time,
                 beat_s: float = BEAT_S, say: Say | None = None, base_env: Mapping[str, str] | None = None,
                 share_token: bool = True, cgroups: JobCgroups | None = None,
                 accounts: Mapping[str, Account] | None = None):
        """``share_token``: give the commands this worker's token. Only for its own jobs: a
        shared worker's token (an admin's) must not reach its users' commands. ``cgroups``:
        where each job gets a cgroup (None: its commands run in process groups).
        ``accounts``: whose account each person's commands run as (a worker that serves
        others); a job of anyone else is not run."""
        self.jobs = jobs
        self.share_token = share_token
        self.cgroups = cgroups
        self.accounts = accounts
        self.exec: DeviceExec = exec if exec is not None else exec_on_lease
        self.clock = clock
        self.beat_s = beat_s
        self.say = say or (lambda text: None)
        self.base_env = dict(os.environ if base_env is None else base_env)

    def run(self, job: JobView, stopper: Stopper | None = None) -> JobView:
        """Run ``job`` (claimed by this worker) to its end, and finish it on the coordinator;
        the job as it ended there."""
        stopper = stopper or Stopper()
        if self.accounts is not None and job.owner not in self.accounts:
            return self._finish(job, stopper, f"this worker has no Unix account for {job.owner}: it runs each "
                                              "person's commands under their own")
        coordinator_version = str(self.jobs.api.get("/health").get("version", ""))
        placement = Placement(self.cgroups.job() if self.cgroups is not None else None,
                              self.accounts[job.owner] if self.accounts is not None else None)
        beating = threading.Event()
        beater = threading.Thread(target=self._beat, args=(job.id, stopper, beating), daemon=True,
                                  name=f"beat-{job.id}")
        beater.start()
        try:
            outcomes = self._cells(job, stopper, coordinator_version, placement)
        finally:
            if placement.cgroup is not None:
                placement.cgroup.close()  # whatever of the job still runs
            beating.set()
            beater.join(10)
        failures = [o.failed for o in outcomes if o.failed]
        return self._finish(job, stopper, failures[0] if failures else None)

    def _finish(self, job: JobView, stopper: Stopper, failure: str | None) -> JobView:
        reason = stopper.reason or failure
        if stopper.cancelled:
            self.say(f"{job.id}: {reason}")
            return self.jobs.get(job.id)
        state = JobState.FAILED if reason else JobState.DONE
        self.say(f"{job.id}: {state}" + (f": {reason}" if reason else ""))
        try:
            return self.jobs.finish(job.id, state, (reason or "")[:MAX_TEXT_CHARS])
        except CoordinatorError as exc:
            if exc.status in (404, 409):   # ended meanwhile (cancelled, or the reaper's "worker lost")
                return self.jobs.get(job.id)
            raise

    def _beat(self, job_id: str, stopper: Stopper, done: threading.Event) -> None:
        jobs = self.jobs.apart()
        try:
            while not done.wait(self.beat_s):
                try:
                    state = jobs.beat(job_id)
                except CoordinatorError as exc:
                    if exc.status in (403, 404, 409):
                        stopper.stop(f"the coordinator took the job from this worker: {exc.message}", cancelled=True)
                        return
                    continue  # unreachable for now: the next beat may get through
                if state != JobState.RUNNING:
                    stopper.stop(f"the job is {state}", cancelled=True)
                    return
        finally:
            jobs.api.close()

    def _cells(self, job: JobView, stopper: Stopper, coordinator_version: str,
               placement: Placement) -> list[CellOutcome]:
        todo = cells(job.spec)
        if len(todo) == 1:
            return [self._cell(self.jobs, job, todo[0], stopper, coordinator_version, placement)]
        outcomes: dict[int, CellOutcome] = {}

        def run(cell: Cell) -> None:
            jobs = self.jobs.apart()  # (a connection a thread)
            try:
                outcomes[cell.index] = self._cell(jobs, job, cell, stopper, coordinator_version, placement)
            finally:
                jobs.api.close()

        threads = [threading.Thread(target=run, args=(cell,), name=f"{job.id}-cell-{cell.index}") for cell in todo]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():  # (in steps: the main thread takes its signals meanwhile)
                thread.join(0.5)
        return [outcomes[cell.index] for cell in todo]

    def _cell(self, jobs: Jobs, job: JobView, cell: Cell, stopper: Stopper, coordinator_version: str,
              placement: Placement) -> CellOutcome:
        """A cell, attempt after attempt: one that ends in a lab failure starts again on
        another matching device, the failing ones left out, up to the spec's ``retry``
        (docs/architecture.md, "Lab failures")."""
        excluded: list[str] = []
        attempt, previous = 0, ""
        while True:
            run = CellRun(self, jobs, job, cell, stopper, coordinator_version, placement, attempt, excluded)
            ended = self._attempt(run, cell, stopper, previous)
            if isinstance(ended, CellOutcome):
                return ended
            failure, reason = ended
            if failure is FailureKind.LAB and attempt < job.spec.retry and run.device and not stopper.stopped:
                excluded.append(run.device)
                attempt += 1
                run.say(f"a lab failure on {run.device} ({reason.splitlines()[0]}): attempt {attempt} of "
                        f"{job.spec.retry + 1} on another device")
                previous = reason
                continue
            return self._failed(cell, stopper, failure, reason)

    def _attempt(self, run: CellRun, cell: Cell, stopper: Stopper,
                 previous: str) -> CellOutcome | tuple[FailureKind | None, str]:
        """One attempt of a cell: how the cell ended (``CellOutcome``), or whose failure ended
        the attempt and why (reported before its lease is given back: the coordinator reads
        how that lease stands)."""
        ended: tuple[FailureKind | None, str]
        try:
            try:
                run.run()
            except CellFailed as exc:
                ended = exc.failure, str(exc)
            except CoordinatorError as exc:
                if exc.code in NO_RETRY and previous:  # (no attempt began: the last one's failure stands)
                    return self._failed(cell, stopper, FailureKind.LAB, f"{previous}; no retry: {exc.message}")
                # the coordinator refused what the cell needed: the lab's, unless the spec asked for what
                # no wait gives (no such devices, a fidelity none has): then no one's but the spec's
                ended = (None if wrong_request(exc) else FailureKind.LAB), exc.message
            except JobStopped as exc:
                return CellOutcome(cell.index, failed=str(exc))
            except Exception as exc:  # noqa: BLE001 (the worker goes on to its next job; the reason says what)
                reason = f"the worker failed: {type(exc).__name__}: {exc}"
                stopper.stop(reason)
                return CellOutcome(cell.index, failed=reason)
            else:
                return CellOutcome(cell.index, not_run=run.not_run)
            run.report_end(*ended)
            return ended
        finally:
            run.close()

    @staticmethod
    def _failed(cell: Cell, stopper: Stopper, failure: FailureKind | None, reason: str) -> CellOutcome:
        reason = f"{cell.group}: {reason}" if cell.group else reason
        stopper.stop(reason)   # the other cells stop too: the job has failed
        return CellOutcome(cell.index, failed=reason, failure=failure)


class CellRun:
    """One cell of a job, on its own lease."""

    def __init__(self, runner: Runner, jobs: Jobs, job: JobView, cell: Cell, stopper: Stopper,
                 coordinator_version: str, placement: Placement, attempt: int = 0, exclude: Sequence[str] = ()):
        """``attempt`` of the cell (from 0), leaving out the devices of ``exclude``."""
        self.runner, self.jobs, self.job, self.cell, self.stopper = runner, jobs, job, cell, stopper
        self.attempt, self.exclude = attempt, list(exclude)
        self.placement = placement
        self.spec: JobSpec = job.spec
        self.coordinator_version = coordinator_version
        self.lease: Lease | None = None
        self.ticket: Ticket | None = None
        self.report: CellReport | None = None
        self.not_run: str | None = None
        self.runs: list[RunRecord] = []
        self.env: dict[str, str] = {}
        self._forwards: list = []
        self._seq = 0
        self._where = f"{job.id} cell {cell.index}" + (f" ({cell.group})" if cell.group else "") \
            + (f" attempt {attempt}" if attempt else "")

    def say(self, text: str) -> None:
        self.runner.say(f"{self._where}: {text}")

    # --- the cell's life ----------------------------------------------------------------------

    @property
    def device(self) -> str | None:
        """The device the attempt was given, if it was given one."""
        return self.lease.data["device"] if self.lease is not None else None

    def run(self) -> None:
        self.lease = self._take_lease()
        if self.lease is None:
            self.jobs.report_cell(self.job.id, CellReport(cell=self.cell.index, attempt=self.attempt,
                                                          group=self.cell.group, not_run=self.not_run))
            self.say(f"not run: {self.not_run}")
            return
        self.env = self._environment(self.lease)
        self.report = CellReport(cell=self.cell.index, attempt=self.attempt, group=self.cell.group,
                                 device=self.lease.data["device"], lease_id=self.lease.id,
                                 fingerprint=self._fingerprint(self.lease))
        self.jobs.report_cell(self.job.id, self.report)
        for command in self.spec.setup:
            self.stopper.check()
            result = self._local(command)
            if result.status != 0:
                failure, trouble = self._whose(result)
                what = f"setup command {command!r}"
                raise CellFailed(f"{trouble} ({what} exited {result.status}){_tail_text(result)}" if trouble
                                 else self._failure(what, result), failure)
        if self.spec.ab is None:
            for _ in range(self.spec.rounds):
                self._run(Arm.RUN, warmup=False)
            return
        from device_loop.core.ab import abstats  # (numpy and scipy: an A/B's alone, 0.9 CPU-s to import)

        ab = self.spec.ab
        for arm in warmup_arms(ab):
            self._run(arm, warmup=True)
        done = 0
        looks = abstats.looks(ab)  # fixed before the first run: [rounds] unless until_decided
        for n, look in enumerate(looks):
            for arm in measured_arms(ab, done, look):
                self._run(arm, warmup=False)
            done = look
            if n < len(looks) - 1 and self._decided():
                self.say(f"decided at {look} rounds (look {n + 1} of {len(looks)})")
                return

    def report_end(self, failure: FailureKind | None, reason: str) -> None:
        """Say how the attempt ended: whose failure, and why (the coordinator counts a lab
        failure before the attempt's first run against its device)."""
        report = self.report or CellReport(cell=self.cell.index, attempt=self.attempt, group=self.cell.group,
                                           device=self.device, lease_id=self.lease.id if self.lease else None)
        with contextlib.suppress(CoordinatorError):
            self.jobs.report_cell(self.job.id, report.model_copy(update={"failure": failure,
                                                                         "reason": reason[:MAX_TEXT_CHARS]}))

    def close(self) -> None:
        """Give back what the cell holds (a ticket, a lease, local forwards), whatever happened."""
        for forward in self._forwards:
            with contextlib.suppress(Exception):
                forward.close()
        if self.ticket is not None and self.lease is None:
            with contextlib.suppress(CoordinatorError):
                self.ticket.cancel()
        if self.lease is not None:
            with contextlib.suppress(CoordinatorError):
                self.lease.release()
                self.say(f"released {self.lease.id}")

    # --- the lease ----------------------------------------------------------------------------

    def _take_lease(self) -> Lease | None:
        matrix = self.spec.matrix
        try:
            got = self._reserve(matrix.wait_s if matrix is not None else MatrixSpec.model_fields["wait_s"].default)
        except CoordinatorError as exc:
            if matrix is not None and exc.code in NO_SUCH_DEVICE:
                self.not_run = exc.message if exc.code in SAYS_NO_DEVICE else f"{NO_DEVICE} ({exc.message})"
                return None
            raise
        if isinstance(got, Ticket):
            self.ticket = got
            self.say(f"waiting for a device ({got.id}, position {got.position})")
            lease = self._wait_ticket(got, None if matrix is None else matrix.wait_s)
            if lease is None:
                return None
            got = lease
        self.lease = got
        self.say(f"{got.data['device']}: {got.id}")
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            self.stopper.check()
            try:
                return got.wait_ready(timeout=min(TICKET_POLL_S, max(0.1, deadline - time.monotonic())))
            except CoordinatorError as exc:
                if exc.code != ErrorCode.TIMEOUT or time.monotonic() > deadline:
                    raise CellFailed(f"{got.id} on {got.data['device']} did not get ready: {exc.message}",
                                     FailureKind.LAB) from None

    def _reserve(self, wait_s: float) -> Lease | Ticket:
        """The cell's reserve; a retry's, while the other devices are the job's own (its other
        cells hold them: no ticket can wait for those), asked again until one is given back or
        ``wait_s`` ran out."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return self.jobs.reserve(self.job.id, self.cell.index, self.cell.target, self.exclude)
            except CoordinatorError as exc:
                if not (self.exclude and exc.code == ErrorCode.BUSY) or time.monotonic() > deadline:
                    raise
            if self.stopper.wait(RETRY_POLL_S):
                self.stopper.check()

    def _wait_ticket(self, ticket: Ticket, wait_s: float | None) -> Lease | None:
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while True:
            self.stopper.check()
            left = TICKET_POLL_S if deadline is None else min(TICKET_POLL_S, deadline - time.monotonic())
            if left <= 0:
                self.not_run = NO_DEVICE
                return None
            try:
                return ticket.wait(timeout=left)
            except TicketEnded as exc:
                raise CellFailed(f"the job's ticket ended: {exc.message}", FailureKind.LAB) from None
            except CoordinatorError as exc:
                if exc.code != ErrorCode.TIMEOUT:
                    raise

    def _check_lease(self) -> None:
        """The lease still serves the cell (refreshed; renewed when half its time is gone)."""
        assert self.lease is not None
        lease = self.lease.refresh()
        if (lost := self._lost(lease)) is not None:
            raise CellFailed(lost, FailureKind.LAB)
        expires = lease.data.get("expires_at")
        if expires and parse_iso(expires) - self.runner.clock() < self.spec.lease_ttl_s / 2:
            with contextlib.suppress(CoordinatorError):  # (refused past the lab's --max-ttl: it runs out)
                lease.renew(self.spec.lease_ttl_s)

    def _lost(self, lease: Lease) -> str | None:
        return lost_reason(lease.data, self._device)

    def _device(self, name: str) -> Mapping[str, Any]:
        return self.jobs.api.get(f"/devices/{name}")

    def _whose(self, result: LocalResult) -> tuple[FailureKind, str | None]:
        """Whose failure a failed command was (``whose_failure``), the lease read again."""
        assert self.lease is not None
        lease = self.lease

        def trouble() -> str | None:
            try:
                return lab_trouble(lease.refresh().data, self._device)
            except CoordinatorError as exc:
                return f"the lease {lease.id} could not be read: {exc.message}"
        return whose_failure(result, trouble)

    def _environment(self, lease: Lease) -> dict[str, str]:
        """What a command sees: the worker's environment (under another account, only its
        path and locale: ``Account.environment``), what ``device-loop env`` exports (through
        local forwards in a lab with gates), the lease, and who to be to the lab."""
        endpoints: list[Any] = [e for e in lease.endpoints if e.get("env")]
        if endpoints:
            from device_loop.core.gate import local_forwards

            self._forwards, endpoints = local_forwards(endpoints)
        account = self.placement.account
        base = self.runner.base_env if account is None else account.environment(self.runner.base_env)
        env = {**base, **environment(lease.data, endpoints),
               "DEVICE_LOOP_LEASE": lease.id, "DEVICE_LOOP_COORDINATOR": self.jobs.api.url,
               # the lease itself (its endpoints, their secrets): `device-loop exec $DEVICE_LOOP_LEASE` needs no token
               LEASE_ANSWER_ENV: json.dumps(lease.data)}
        if (OWN_BIN / "device-loop").exists():  # this worker's device-loop first, even from an inactive venv
            env["PATH"] = os.pathsep.join([str(OWN_BIN), *filter(None, env.get("PATH", os.defpath).split(os.pathsep))])
        env.pop("DEVICE_LOOP_TOKEN", None)
        authorization = self.jobs.api.headers.get("Authorization", "")
        if not authorization.startswith("Bearer "):  # a lab without tokens: be the lease's holder
            env["DEVICE_LOOP_USER"] = self.job.owner
        elif self.runner.share_token:
            env["DEVICE_LOOP_TOKEN"] = authorization.removeprefix("Bearer ")
        return env

    # --- the device ---------------------------------------------------------------------------

    def _exec(self, command: str, timeout_s: float) -> Any:
        assert self.lease is not None
        return self.runner.exec(self.lease.data, command, timeout_s)

    def _fingerprint(self, lease: Lease) -> Fingerprint | None:
        try:
            device = self.jobs.api.get(f"/devices/{lease.data['device']}")
            return gather(self._exec, lease.data, device, self.coordinator_version)
        except Exception as exc:  # noqa: BLE001 (a device that cannot say: the evidence says so)
            self.say(f"no fingerprint: {_message(exc)}")
            return None

    def _readings(self, settle_problem: str | None) -> Readings:
        try:
            read = readings(self._exec, timeout_s=EXEC_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 (a run whose start could not be read is marked)
            return Readings(unfit=f"no readings: {_message(exc)}"[:MAX_TEXT_CHARS])
        ab = self.spec.ab
        reasons = [r for r in (settle_problem, unfit(read, max_temp_c=None, governor=ab.governor if ab else None))
                   if r]
        return read.model_copy(update={"unfit": "; ".join(reasons)[:MAX_TEXT_CHARS] or None})

    def _settle(self) -> str | None:
        """Run the device's settle steps; why the device may still not be fit, if they failed
        (a zone above the cool-down threshold when the step timed out)."""
        assert self.lease is not None
        op = self.lease.settle(timeout=self.spec.command_timeout_s)
        if op.state != "done":
            return f"settle {op.state}: {op.message or 'no reason given'}"
        return None

    # --- runs ---------------------------------------------------------------------------------

    def _run(self, arm: Arm, warmup: bool) -> None:
        self.stopper.check()
        self._check_lease()
        ab = self.spec.ab
        settle_problem = self._settle() if ab is not None and ab.settle else None
        read = self._readings(settle_problem)
        commands: Sequence[str] = {Arm.A: ab.baseline, Arm.B: ab.patch}[arm] if ab is not None else self.spec.run
        started = self.runner.clock()
        results: list[LocalResult] = []
        for command in commands:
            results.append(self._local(command))
            if results[-1].status != 0:
                break
        ended = self.runner.clock()
        last = results[-1]
        merged = LocalResult(status=last.status, stdout="".join(r.stdout for r in results),
                             stderr="".join(r.stderr for r in results), started_at=started, ended_at=ended,
                             timed_out=last.timed_out)
        metrics_read = read_metrics(merged, self.spec.metrics)
        found = metrics_read.samples
        failure, trouble = self._whose(last) if last.status != 0 else (None, None)
        record = RunRecord(cell=self.cell.index, attempt=self.attempt, seq=self._seq, arm=arm, warmup=warmup,
                           started_at=started, ended_at=ended, status=last.status, readings=read, samples=found,
                           output_tail=merged.tail(), failure=failure)
        self.jobs.report_run(self.job.id, record)
        self.runs.append(record)
        self._seq += 1
        label = "warmup " if warmup else ""
        values = ", ".join(f"{s.metric}={s.value:g}{s.unit}" for s in found)
        self.say(f"run {record.seq} {label}{arm}: status {last.status} in {ended - started:.2f}s"
                 + (f" ({values})" if values else "") + (f" [unfit: {read.unfit}]" if read.unfit else "")
                 + (f" [{failure} failure]" if failure else ""))
        if failure is not None:  # (a lease that ended is the cause to name)
            what = f"run {record.seq} ({arm}) {commands[len(results) - 1]!r}"
            raise CellFailed(f"{trouble} ({what} exited {last.status}){_tail_text(last)}" if trouble
                             else self._failure(what, last), failure)
        if metrics_read.unread:
            raise CellFailed(f"run {record.seq} ({arm}): {'; '.join(metrics_read.unread)}" + _tail_text(merged))
        missing = [m.name for m in self.spec.metrics if m.name not in {s.metric for s in found}]
        if missing:
            raise CellFailed(f"run {record.seq} ({arm}) printed no value for {', '.join(missing)}"
                             + _tail_text(merged))
        if ab is not None and not found:
            raise CellFailed(f"run {record.seq} ({arm}) printed no metric: print JSON lines "
                             '{"metric": NAME, "value": V, "unit": U} or declare a metric with a regex'
                             + _tail_text(merged))

    def _local(self, command: str) -> LocalResult:
        """A command on this machine, with the lease's environment; a stop kills it."""
        started = LocalCommand(command, self.env, clock=self.runner.clock, job=self.placement.cgroup,
                               account=self.placement.account)
        with self.stopper.killing(started.kill):
            result = started.wait(self.spec.command_timeout_s)
        if result.killed:
            raise JobStopped(self.stopper.reason or "stopped")
        return result

    def _failure(self, what: str, result: LocalResult) -> str:
        if result.timed_out:
            said = (f"{what} did not finish within {format_duration(self.spec.command_timeout_s)}: "
                    "killed it and all it started")
        elif result.status == LAB_FAILURE_STATUS:
            said = f"{what} exited {LAB_FAILURE_STATUS}: it says the lab failed it"
        else:
            said = f"{what} failed (exit status {result.status})"
        return said + _tail_text(result)

    def _decided(self) -> bool:
        """Whether this cell's runs so far decide every metric, at α split over the looks and,
        in a matrix, over its cells too: the other cells' runs are not here, and the evidence
        adjusts across all of them (docs/architecture.md, "The A/B analysis")."""
        from device_loop.core.ab import abstats

        assert self.report is not None and self.spec.ab is not None
        cells = len(self.spec.matrix.over) if self.spec.matrix else 1
        alpha = abstats.alpha_per_look(self.spec.ab) / cells
        return abstats.decided(abstats.analyse(self.spec, self.runs, [self.report], alpha=alpha))


def whose_failure(result: LocalResult, trouble: Callable[[], str | None]) -> tuple[FailureKind, str | None]:
    """Whose failure a failed command was, and why when it was the lab's: the lab was in
    ``trouble()`` (that reason), or it exited 75 (it says the lab failed it); then its
    deadline; else the test's (docs/architecture.md, "Lab failures")."""
    why = trouble()  # (asked first: what the lab knows says more than a command's "75")
    if why is not None:
        return FailureKind.LAB, why
    if result.status == LAB_FAILURE_STATUS:
        return FailureKind.LAB, None
    return (FailureKind.TIMEOUT if result.timed_out else FailureKind.TEST), None


def _tail_text(result: LocalResult) -> str:
    tail = result.tail(1500).strip()
    return f"; its output ended with:\n{tail}" if tail else ""


def _message(exc: BaseException) -> str:
    return str(getattr(exc, "message", None) or exc or type(exc).__name__)
