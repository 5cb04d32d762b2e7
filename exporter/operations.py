"""Running the operations the coordinator hands this host (docs/architecture.md, "Operations"): a flash, any
other kind a plugin declares (``devloop_operations``), and the steps a device runs between two leases
(``steps.py``), through one executor.

Each operation runs in a thread of its own, beside the report loop (heartbeats keep
flowing during a long one): its image, if it writes one, is fetched into the cache
(verified), then the plugin that serves its resource runs it (``devloop_operate``). Every
report says how each goes, until a report carrying its result was answered.

An operation is begun once per start of the exporter and never again, whatever desired
states say later. Once its plugin is called (from then on the device may have been
changed) a marker is left on disk, and kept until its result was acknowledged: if the
exporter dies meanwhile, its next start reports the operation as interrupted, and the
coordinator decides what that means for the device (a destructive kind: needs recovery).
"""
from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from pydantic import TypeAdapter, ValidationError

from device_loop.core import FLASH_KIND, POWER_KIND
from device_loop.core.files import write_atomically
from device_loop.core.host import HostContext
from device_loop.core.model import FlashImage, Operation, OperationError, Resource, StepKind
from device_loop.core.plugins import PluginSet
from device_loop.core.protocol import (MAX_DETAIL_CHARS, MAX_REASON_CHARS, MAX_RESULT_BYTES, DesiredOperation,
                                       ImageRef, OperationKindReport, OperationReport, Progress, ReportedState, Word)
from device_loop.core.vocabulary import OperationState

from .image_cache import ImageCache
from .interrupted import Interrupted
from .power import PowerRunner
from .steps import StepRun, StepRunner

log = logging.getLogger("device_loop.exporter")
PROGRESS_EVERY_S = 0.5  # a report for progress alone, at most this often
MARKERS = "operations"  # the state folder's markers of operations whose result is not acknowledged yet
LEGACY_MARKERS = "flashing"  # where exporters before protocol 2 left them (flashes only)
# The phases the exporter names; a plugin names the others (op.progress).
FETCHING = "fetching"  # its image comes into the cache
WRITING = "writing"    # the plugin has the image (an operation that carries one writes it), until it says more
RUNNING = "running"    # the plugin runs an operation that carries no image, until it says more
_WORD = TypeAdapter(Word)
#: Who runs an operation of one kind: (its job, what was asked, its resource as last scanned or None, the host's
#: resources, the kinds its plugin declared) -> what it said.
Handler = Callable[["Job", DesiredOperation, "Resource | None", list[Resource], set[str]], Any]
#: The most phases a report's ``seconds`` holds: a plugin's further phases are not entered.
MAX_PHASES = next(m.max_length for m in OperationReport.model_fields["seconds"].metadata if hasattr(m, "max_length"))


class Job:
    """One operation as this exporter runs it: what its reports say."""

    def __init__(self, op: str, device: str, kind: str, phase: str):
        self.op, self.device, self.kind = op, device, kind
        self.state: ReportedState = OperationState.RUNNING
        self.phase = phase
        self.progress = Progress()
        self.message = ""
        self.result: dict | None = None
        self.changed = False  # its plugin was called: the device may have been changed
        self.interrupted = False  # the exporter's stop cut it short (its report says so; never read from words)
        self.thread: threading.Thread | None = None
        self.last_report = 0.0  # (time.monotonic) when its progress last woke the report loop
        self._spent: dict[str, float] = {}  # phase -> seconds in it, the current one's excepted
        self._since = time.monotonic()  # when the current phase began

    @classmethod
    def left(cls, report: OperationReport) -> "Job":
        """A job an earlier start of the exporter left, as its marker says it ended."""
        job = cls(report.op, report.device, report.kind, report.phase)
        job.state, job.progress, job.message = report.state, report.progress, report.message
        job.result, job.changed, job._spent = report.result, report.changed, dict(report.seconds)
        job.interrupted = report.interrupted
        return job

    def phases(self) -> set[str]:
        """The phases it has been in."""
        return {*self._spent, self.phase}

    def enter(self, phase: str) -> None:
        self._clock()
        self.phase = phase

    def end(self, state: ReportedState, message: str, result: dict | None = None) -> None:
        self._clock()
        self.state, self.message, self.result = state, message[:MAX_REASON_CHARS], result

    def _clock(self) -> None:
        now = time.monotonic()
        self._spent[self.phase] = self._spent.get(self.phase, 0.0) + now - self._since
        self._since = now

    def report(self) -> OperationReport:
        seconds = dict(self._spent)
        if self.state == OperationState.RUNNING:
            seconds[self.phase] = seconds.get(self.phase, 0.0) + time.monotonic() - self._since
        return OperationReport(op=self.op, device=self.device, kind=self.kind, state=self.state, phase=self.phase,
                               progress=self.progress, message=self.message, seconds=seconds, result=self.result,
                               changed=self.changed, interrupted=self.interrupted)


class Operations:
    """The executor: begins the desired operations, reports them until acknowledged."""

    def __init__(self, host: HostContext, plugins: PluginSet, cache: ImageCache,
                 fetch: Callable[[str], Iterator[bytes]], on_change: Callable[[], None],
                 steps: StepRunner | None = None, power: PowerRunner | None = None):
        self.host, self.plugins, self.cache, self.fetch = host, plugins, cache, fetch
        self.on_change = on_change
        self.steps = steps  # the devices' steps between leases; None: this executor runs none
        self.power = power  # power operations; None: this executor runs none
        # kind -> who runs an operation of that kind (docs/architecture.md, "Operations"): a kind the exporter
        # mediates is registered here once; any other kind is its resource's plugin's (devloop_operate)
        self.handlers: dict[str, Handler] = {}
        if power is not None:
            self.handlers[POWER_KIND] = self._operate_power
        self.markers = host.state_dir / MARKERS
        self.jobs: dict[str, Job] = {}
        self._begun: set[str] = set()
        self._lock = threading.Lock()  # jobs and their fields: their threads write, the report loop reads
        for job in self._left_by_the_last_start():
            self.jobs[job.op] = job
            self._begun.add(job.op)

    # ---- what the exporter's loops call -----------------------------------------------------

    def converge(self, desired: list[DesiredOperation], resources: list[Resource],
                 kinds: dict[str, list[OperationKindReport]],
                 offered: dict[str, list[StepKind]] | None = None) -> None:
        """Begin the operations not begun yet (each once per start of the exporter), on
        ``resources`` as last scanned, whose plugins declared ``kinds`` (identifier -> kinds)
        and offer the steps ``offered`` (identifier -> steps)."""
        by_identifier = {r.identifier: r for r in resources}
        scanned = list(resources)
        began = False
        with self._lock:
            for want in desired:
                if want.op in self._begun:
                    continue
                self._begun.add(want.op)
                job = self.jobs[want.op] = Job(want.op, want.device, want.kind, FETCHING if want.image else RUNNING)
                resource = by_identifier.get(want.identifier)
                declared = {k.kind for k in kinds.get(want.identifier, ())}
                job.thread = threading.Thread(target=self._run, args=(job, want, resource, declared, scanned,
                                                                      offered or {}),
                                              name=f"op-{want.kind}-{want.device}", daemon=True)
                job.thread.start()
                began = True
        if began:
            self.on_change()

    def reports(self) -> list[OperationReport]:
        with self._lock:
            return [job.report() for job in self.jobs.values()]

    def acknowledged(self, sent: list[OperationReport]) -> None:
        """A report carrying ``sent`` was answered: the results in it are the coordinator's now."""
        with self._lock:
            for report in sent:
                if report.state != OperationState.RUNNING and report.op in self.jobs:
                    del self.jobs[report.op]
                    (self.markers / f"{report.op}.json").unlink(missing_ok=True)

    def running(self) -> list[Job]:
        with self._lock:
            return [job for job in self.jobs.values() if job.state == OperationState.RUNNING]

    def wait(self, timeout: float) -> bool:
        """Wait until no operation runs; False if one still does after ``timeout``."""
        deadline = time.monotonic() + timeout
        for job in self.running():
            if job.thread is not None:
                job.thread.join(max(0.0, deadline - time.monotonic()))
        return not self.running()

    # ---- one operation ------------------------------------------------------------------------

    def _run(self, job: Job, want: DesiredOperation, resource: Resource | None, declared: set[str],
             resources: list[Resource], offered: dict[str, list[StepKind]]) -> None:
        try:
            # by its purpose first: a step or a settle is the step runner's (but a step that is an
            # operation of a kind, a reflash, is that kind's); then by its kind: a registered
            # handler's, else its resource's plugin's
            step = self.steps.match(want, resources, offered) if self.steps is not None else None
            if step is not None:
                said = self._operate_step(job, step)
            else:
                handler = self.handlers.get(want.kind, self._operate_plugin)
                said = handler(job, want, resource, resources, declared)
            self._finish(job, said)
        except OperationError as exc:
            with self._lock:
                job.changed = job.changed and exc.changed
                job.interrupted = isinstance(exc, Interrupted)
                job.end(OperationState.FAILED, str(exc))
            log.error("%s %s of %s failed while %s: %s", job.kind, job.op, job.device, job.phase, exc)
        except Exception as exc:  # a plugin's bug is this operation's failure, not the exporter's
            log.exception("%s %s of %s crashed", job.kind, job.op, job.device)
            with self._lock:
                job.end(OperationState.FAILED, f"the plugin crashed: {exc!r}" if job.changed else
                        f"the exporter could not begin it: {exc!r}")
        if job.changed:
            self._mark(job)
        self.on_change()

    def _check(self, want: DesiredOperation, resource: Resource | None, declared: set[str]) -> None:
        """Refuse, before anything is touched, an operation this host cannot run."""
        if resource is None or resource.plugin != want.plugin:
            raise OperationError(f"{want.identifier} is not on host {self.host.name} any more", changed=False)
        if not self.plugins.implements(resource.plugin, "devloop_operate"):
            raise OperationError(f"plugin {resource.plugin!r} runs no operations here (it is not loaded, or has no "
                                 "devloop_operate hook)", changed=False)
        if want.kind not in declared:
            raise OperationError(f"plugin {resource.plugin!r} does not run {want.kind!r} on {want.identifier} (its "
                                 f"devloop_operations declares {', '.join(sorted(declared)) or 'nothing'})",
                                 changed=False)

    def _fetched(self, job: Job, ref: ImageRef) -> FlashImage:
        """The image, verified in the cache (fetched there first if it is not)."""
        path = self.cache.get(ref.sha256, ref.size, lambda: self.fetch(ref.sha256),
                              lambda done: self._progress(job, FETCHING, done, ref.size, "bytes"))
        return FlashImage(path=Path(path), sha256=ref.sha256, size=ref.size, name=ref.name)

    def _operate_plugin(self, job: Job, want: DesiredOperation, resource: Resource | None, resources: list[Resource],
                        declared: set[str]):
        """An operation of its resource's plugin (``devloop_operate``), its image fetched first."""
        with contextlib.ExitStack() as images:
            image = None
            self._check(want, resource, declared)
            assert resource is not None  # (_check refused an operation on what is not here)
            if want.image is not None:
                images.enter_context(self.cache.use(want.image.sha256))  # not dropped while in use
                image = self._fetched(job, want.image)
            return self._operate(job, want, resource, image)

    def _operate(self, job: Job, want: DesiredOperation, resource: Resource, image: FlashImage | None):
        """Hand the operation to its plugin; what the plugin returned."""
        self._begin(job, image)
        op = Operation(id=want.op, kind=want.kind, device=want.device, requester=want.requester, args=dict(want.args),
                       image=image, purpose=want.purpose, report_progress=lambda *said: self._progress(job, *said))
        try:
            return self.plugins.call(resource.plugin, "devloop_operate", host=self.host, resource=resource, op=op)
        except Interrupted as exc:  # (a plugin's failure, whatever it raised: only the exporter's runners interrupt)
            raise OperationError(str(exc)) from None

    def _operate_step(self, job: Job, step: StepRun):
        """Hand a step to the step runner (which runs it, or hands it to its plugin); what it returned."""
        assert self.steps is not None  # (only a runner matches steps)
        self._begin(job, None)
        return self.steps.run(step, lambda *said, **more: self._progress(job, *said, **more))

    def _operate_power(self, job: Job, want: DesiredOperation, switch: Resource | None, resources: list[Resource],
                       declared: set[str]):
        """Hand a power operation to the power runner, on the device's switch (``switch``)."""
        assert self.power is not None  # (only then is a power operation the runner's)
        if switch is None or switch.plugin != want.plugin or switch.kind != POWER_KIND:
            raise OperationError(f"{want.identifier} is not a power switch on host {self.host.name} (any more)",
                                 changed=False)
        if not self.plugins.implements(switch.plugin, "devloop_power"):
            raise OperationError(f"plugin {switch.plugin!r} switches no power here (it is not loaded, or has no "
                                 "devloop_power hook)", changed=False)
        self._begin(job, None)
        return self.power.run(dict(want.args), switch, [r for r in resources if r.device == want.device],
                              lambda *said, **more: self._progress(job, *said, **more))

    def _begin(self, job: Job, image: FlashImage | None) -> None:
        """The device may be changed from here on: the operation is marked, and a crash now
        is an interruption."""
        with self._lock:
            job.changed = True
            first = WRITING if image is not None else RUNNING
            if first != job.phase:
                job.enter(first)
            job.progress = Progress(total=image.size, unit="bytes") if image is not None else Progress()
        self._mark(job)
        self.on_change()

    def _finish(self, job: Job, said) -> None:
        """The plugin returned ``said``: a sentence, a dict (its ``message`` the sentence), or None."""
        if isinstance(said, dict):
            result = dict(said)
            message = result.pop("message", None)
            message = message if isinstance(message, str) else "done"
        elif isinstance(said, str) or said is None:
            result, message = None, said or "done"
        else:
            raise OperationError(f"the plugin returned {type(said).__name__}, not a sentence or a dict: its result is "
                                 "lost")
        problem = _result_problem(result)
        if problem:
            raise OperationError(problem)
        with self._lock:
            job.end(OperationState.DONE, message, result)
        log.info("%s %s of %s: done (%s); %s", job.kind, job.op, job.device, job.message,
                 ", ".join(f"{phase} {seconds:.2f}s" for phase, seconds in job.report().seconds.items()))

    def _progress(self, job: Job, phase: str, done=None, total=None, unit: str = "", detail: str = "") -> None:
        """Where an operation stands, in the protocol's bounds whatever a plugin passes."""
        with self._lock:
            if job.state != OperationState.RUNNING:
                return  # (a plugin's thread that outlived its operation)
            try:
                phase = _WORD.validate_python(phase)
            except ValidationError:
                phase = job.phase  # not a word a report may carry: the progress counts, the name does not
            entered = phase != job.phase and (phase in job.phases() or len(job.phases()) < MAX_PHASES)
            if entered:
                job.enter(phase)
            job.progress = _progress(done, total, unit, detail, job.progress)
            now = time.monotonic()
            woke = entered or now - job.last_report >= PROGRESS_EVERY_S
            if woke:
                job.last_report = now
        if entered and job.changed:
            self._mark(job)
        if woke:
            self.on_change()

    # ---- the markers ----------------------------------------------------------------------------

    def _mark(self, job: Job) -> None:
        """Where an operation whose plugin was called stands, on disk until its result was
        acknowledged: a next start reports it (as interrupted, if it was still running)."""
        with self._lock:
            report = job.report()
        self.markers.mkdir(parents=True, exist_ok=True)
        write_atomically(self.markers / f"{job.op}.json", report.model_dump_json())

    def _left_by_the_last_start(self) -> list[Job]:
        """The operations an earlier start of this exporter ran and had not had acknowledged:
        finished, or interrupted (it was running when it died)."""
        self._adopt_legacy_markers()
        jobs = []
        for path in sorted(self.markers.glob("*.json")):
            try:
                report = OperationReport.model_validate_json(path.read_text())
            except (OSError, ValueError):
                log.warning("marker %s cannot be read; dropping it", path)
                path.unlink(missing_ok=True)
                continue
            if report.state == OperationState.RUNNING:
                log.error("%s %s of %s was interrupted while %s: the exporter stopped", report.kind, report.op,
                          report.device, report.phase)
                report = report.model_copy(update={"state": OperationState.FAILED, "interrupted": True,
                                                   "message": f"interrupted while {report.phase}: the exporter "
                                                              "stopped"})
                write_atomically(path, report.model_dump_json())
            jobs.append(Job.left(report))
        return jobs

    def _adopt_legacy_markers(self) -> None:
        """The flashes an exporter before protocol 2 left marked, as operations of kind ``flash``."""
        for path in sorted((self.host.state_dir / LEGACY_MARKERS).glob("*.json")):
            try:
                mark = json.loads(path.read_text())
                report = OperationReport(op=mark["op"], device=mark["device"], kind=FLASH_KIND, state=mark["state"],
                                         phase=mark["phase"], message=mark.get("message", ""),
                                         changed=mark.get("changed", True))
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("flash marker %s cannot be read; dropping it", path)
            else:
                self.markers.mkdir(parents=True, exist_ok=True)
                write_atomically(self.markers / path.name, report.model_dump_json())
            path.unlink(missing_ok=True)


def _progress(done, total, unit, detail, last: Progress) -> Progress:
    """A plugin's progress as a report carries it; what cannot be carried keeps its last value."""
    try:
        return Progress(done=max(0, int(done or 0)), total=None if total is None else max(0, int(total)),
                        unit=str(unit or ""), detail=str(detail or "")[:MAX_DETAIL_CHARS])
    except (TypeError, ValueError, OverflowError):
        return last


def _result_problem(result: dict | None) -> str | None:
    """Why a plugin's result cannot be reported (its report would be refused), or None."""
    if result is None:
        return None
    try:
        if len(json.dumps(result)) > MAX_RESULT_BYTES:  # (said first: it is what a big log runs into)
            return f"a result may take {MAX_RESULT_BYTES} bytes of JSON at most; it is lost"
    except (TypeError, ValueError):
        pass  # not JSON at all: the model says what is wrong
    try:
        OperationReport(op="op", device="d", kind="k", state=OperationState.DONE, phase="p", result=result)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        return f"the plugin's result cannot be reported ({where}: {first['msg']}); it is lost"
    return None
