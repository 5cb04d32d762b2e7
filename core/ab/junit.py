"""Results as JUnit XML, where CI shows them (docs/architecture.md, "Results where CI shows
them"): a ``<testsuite>`` per cell, its device's fingerprint as ``<properties>``, and a
``<testcase>`` per cell (``run``), per metric of a cell and one for its runs (``ab``,
``matrix``), or per command (``with``).

A lab failure is an ``<error type="lab">``; a test failure, a timeout or a verdict that B is
slower or worse a ``<failure>``; an unknown verdict passes, its words in ``<system-out>``.
The document keeps to the JUnit schema Jenkins' xUnit plugin publishes (junit-10.xsd), which
Jenkins' JUnit plugin and GitLab read too: one ``<testsuites>`` of flat ``<testsuite>``
elements, the counts every suite must carry, a time of at most three decimals.

Everything in it that a user, a worker or an exporter wrote is text XML cannot refuse:
characters XML 1.0 does not allow (a terminal's escapes, NUL) are left out, and every text is
bounded.
"""
from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from device_loop.core.ab.jobs import CellReport, Fingerprint, JobView, RunRecord, Verdict
from device_loop.core.answers import DeviceAnswer
from device_loop.core.command_outcome import CommandOutcome
from device_loop.core.vocabulary import LAB_FAILURE_STATUS, FailureKind, JobState

if TYPE_CHECKING:  # (the analysis loads scipy: seconds a `with`'s report need not wait)
    from device_loop.core.ab.abstats import Analysis, CellAnalysis, MetricResult

#: What XML 1.0 cannot hold at all (its Char production): a document with one is refused whole.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
MAX_ATTRIBUTE_CHARS = 1000
MAX_OUTPUT_CHARS = 64_000       # of one testcase's system-out


class Outcome(StrEnum):
    """What a testcase says: JUnit's four results."""
    PASSED = "passed"
    FAILURE = "failure"         # the test's: it failed, timed out, or B is slower/worse
    ERROR = "error"             # the lab's (type "lab"), or a job that never completed
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Case:
    """One ``<testcase>``."""
    name: str
    classname: str
    time_s: float = 0.0
    outcome: Outcome = Outcome.PASSED
    kind: str = ""              # the failure's or error's type: lab, test, timeout, slower ...
    message: str = ""
    details: str = ""           # the failure's text (an output's tail)
    output: str = ""            # system-out: what a reader should see even when it passed


@dataclass(frozen=True)
class Suite:
    """One ``<testsuite>``: a cell (or a ``with`` command), its device's properties."""
    name: str
    cases: tuple[Case, ...]
    properties: tuple[tuple[str, str], ...] = ()
    timestamp: float | None = None
    hostname: str = ""
    output: str = ""


@dataclass
class _Tally:
    """A suite's (or the document's) counts, as the schema's attributes."""
    tests: int = 0
    time_s: float = 0.0
    results: dict[Outcome, int] = field(default_factory=dict)

    def add(self, case: Case) -> None:
        self.tests += 1
        self.time_s += case.time_s
        self.results[case.outcome] = self.results.get(case.outcome, 0) + 1

    def attributes(self) -> dict[str, str]:
        return {"tests": str(self.tests), "failures": str(self.results.get(Outcome.FAILURE, 0)),
                "errors": str(self.results.get(Outcome.ERROR, 0)), "skipped": str(self.results.get(Outcome.SKIPPED, 0)),
                "time": seconds(self.time_s)}


# --- text XML can hold ----------------------------------------------------------------------------

def xml_text(text: object, limit: int = MAX_ATTRIBUTE_CHARS) -> str:
    """``text`` as XML 1.0 can hold it, at most ``limit`` characters (cut with an ellipsis)."""
    clean = _NOT_XML.sub("", str(text))
    return clean if len(clean) <= limit else clean[:limit - 1] + "…"


def seconds(value: float) -> str:
    """A duration as the schema's time takes it: digits, a point and three decimals."""
    return f"{max(0.0, value) if math.isfinite(value) else 0.0:.3f}"


def iso_time(epoch: float) -> str:
    """An epoch time as ISO 8601 in UTC, as JUnit's timestamp attribute reads."""
    import time as _time

    return _time.strftime("%Y-%m-%dT%H:%M:%S", _time.gmtime(epoch))


# --- the document ---------------------------------------------------------------------------------

def document(suites: list[Suite], name: str = "device-loop") -> str:
    """The JUnit XML document of ``suites``: one ``<testsuites>`` with their totals."""
    total = _Tally()
    root = ET.Element("testsuites", {"name": xml_text(name)})
    for suite in suites:
        tally = _Tally()
        element = ET.SubElement(root, "testsuite", {"name": xml_text(suite.name)})
        if suite.timestamp is not None and math.isfinite(suite.timestamp) and 0 <= suite.timestamp < 1e11:
            element.set("timestamp", iso_time(suite.timestamp))
        if suite.hostname:
            element.set("hostname", xml_text(suite.hostname))
        if suite.properties:
            properties = ET.SubElement(element, "properties")
            for key, value in suite.properties:
                ET.SubElement(properties, "property", {"name": xml_text(key), "value": xml_text(value)})
        for case in suite.cases:
            tally.add(case)
            total.add(case)
            element.append(_case(case))
        if suite.output:
            ET.SubElement(element, "system-out").text = xml_text(suite.output, MAX_OUTPUT_CHARS)
        for key, value in tally.attributes().items():
            element.set(key, value)
    attributes = total.attributes()
    del attributes["skipped"]   # (the schema's testsuites takes no skipped count)
    for key, value in attributes.items():
        root.set(key, value)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _case(case: Case) -> ET.Element:
    element = ET.Element("testcase", {"name": xml_text(case.name), "classname": xml_text(case.classname),
                                      "time": seconds(case.time_s)})
    if case.outcome is not Outcome.PASSED:
        result = ET.SubElement(element, case.outcome.value, {"message": xml_text(case.message)})
        if case.kind:
            result.set("type", xml_text(case.kind))
        if case.details:
            result.text = xml_text(case.details, MAX_OUTPUT_CHARS)
    if case.output:
        ET.SubElement(element, "system-out").text = xml_text(case.output, MAX_OUTPUT_CHARS)
    return element


# --- a job's cells --------------------------------------------------------------------------------

def run_failure(run: RunRecord) -> FailureKind | None:
    """Whose failure a run was: what its worker recorded (docs/architecture.md, "Lab
    failures"); for a run stored before that was recorded, none when it exited 0, the lab's
    when it exited 75 (``LAB_FAILURE_STATUS``: the command said the lab failed it), else the
    test's."""
    if run.failure is not None or run.status == 0:
        return run.failure
    return FailureKind.LAB if run.status == LAB_FAILURE_STATUS else FailureKind.TEST


def fingerprint_properties(f: Fingerprint) -> list[tuple[str, str]]:
    """A device's fingerprint as JUnit properties: each field that says something."""
    items = [("device", f.device), ("device.class", f.device_class), ("device.host", f.host),
             ("device.channel", f.channel), ("device.kernel", f.kernel), ("device.cpu", f.cpu_model),
             ("device.isa", " ".join(f.isa)), ("device.cores", "" if f.cores is None else str(f.cores)),
             ("device.memory_kb", "" if f.memory_kb is None else str(f.memory_kb)), ("device.os_build", f.os_build),
             ("device.image", f.image), ("device.image_sha256", f.image_sha256),
             ("device.fidelity", f.timing_note or f.what), ("device-loop.version", f.device_loop_version)]
    items += [(f"device.fact.{key}", value) for key, value in f.extra.items()]
    return [(name, value) for name, value in items if value]


def _label(job: JobView) -> str:
    kind = "matrix" if job.spec.matrix is not None else "ab" if job.spec.ab is not None else "run"
    return job.spec.title or f"device-loop {kind}"


def _cell_key(cell: CellAnalysis, job: JobView) -> str:
    """What names a cell across runs of the same job: its group, else its number (never
    its device, which another run may get)."""
    return cell.group if job.spec.matrix is not None and cell.group else f"cell {cell.cell}"


def _duration(runs: list[RunRecord]) -> float:
    return sum(max(0.0, r.ended_at - r.started_at) for r in runs)


def _failed_runs(runs: list[RunRecord]) -> Case | None:
    """The failure (or error) the failed runs of a cell make, or None when none failed: a
    test's failure or a timeout before a lab's (a test that failed must be seen, whatever
    else happened)."""
    failed = [(r, kind) for r in runs if (kind := run_failure(r)) is not None]
    if not failed:
        return None
    worst = next((item for item in failed if item[1] is not FailureKind.LAB), failed[0])
    run, kind = worst
    outcome = Outcome.ERROR if kind is FailureKind.LAB else Outcome.FAILURE
    what = f"run {run.seq} ({run.arm.value})" + (" warmup" if run.warmup else "")
    said = {FailureKind.LAB: "failed in the lab", FailureKind.TIMEOUT: "outran its deadline"}
    message = f"{len(failed)} of {len(runs)} runs failed; {what} " + said.get(kind, f"exited {run.status}")
    details = "\n\n".join(f"run {r.seq} ({r.arm.value}) exited {r.status} [{k.value}]:\n{r.output_tail}"
                          for r, k in failed)
    return Case("", "", outcome=outcome, kind=kind.value, message=message, details=details)


def _not_run(cell: CellAnalysis, name: str, classname: str) -> Case:
    """A cell that never ran: the lab could not give it a device (or what it said)."""
    return Case(name, classname, outcome=Outcome.ERROR, kind=FailureKind.LAB.value,
                message=f"not run: {cell.not_run}")


def _attempt_failed(report: CellReport | None) -> Case | None:
    """The error of a cell's last attempt that the lab ended without a failed run to show it
    (its lease lost between runs, its settle failed)."""
    if report is None or report.failure is not FailureKind.LAB:
        return None
    return Case("", "", outcome=Outcome.ERROR, kind=FailureKind.LAB.value,
                message=f"attempt {report.attempt} on {report.device or '-'}: {report.reason or 'a lab failure'}")


def _attempts_text(reports: list[CellReport]) -> str:
    """Every attempt of a cell but its last, with its device and cause."""
    return "\n".join(f"attempt {r.attempt} on {r.device or '-'}: "
                     f"{r.failure.value if r.failure else 'ended'} failure: {r.reason or r.not_run or '-'}"
                     for r in reports)


def _with_failure(case: Case, failed: Case | None) -> Case:
    if failed is None:
        return case
    return Case(case.name, case.classname, case.time_s, failed.outcome, failed.kind, failed.message, failed.details,
                case.output)


def _metric_case(metric: MetricResult, classname: str) -> Case:
    """A metric of an A/B cell: a failure when B is slower or worse; its words either way."""
    c = metric.comparison
    if c is None:
        return Case(metric.name, classname, output=f"{metric.name}: no comparison ({metric.a.n} A runs, "
                                                   f"{metric.b.n if metric.b else 0} B runs with a value)")
    interval = (f" [{c.low:.4g}, {c.high:.4g}]" if c.low is not None and c.high is not None else "")
    said = (f"{c.verdict.value}: {c.words}" if c.verdict is not Verdict.SAME else c.words) + \
        f" ({'ratio B/A' if c.scale == 'ratio' else 'shift B - A'} {c.estimate:.4g}{interval}, p = {c.p_holm:.2g} Holm)"
    if c.regressed:
        return Case(metric.name, classname, outcome=Outcome.FAILURE, kind="regressed", message=said, output=said)
    return Case(metric.name, classname, output=said)


def _plain_output(cell: CellAnalysis) -> str:
    return "\n".join(f"{m.name}: median {m.a.median:.4g}{(' ' + m.unit) if m.unit else ''} of {m.a.n} runs"
                     for m in cell.metrics if m.a.median is not None)


def job_suites(job: JobView, analysis: Analysis, job_url: str = "") -> list[Suite]:
    """A job's results as test suites: one per cell, a testcase per cell (a plain job) or per
    metric and one for the runs (an A/B pair, a matrix). A job that ended otherwise than
    done (failed, cancelled) says so as an error of its own, with its reason."""
    label = _label(job)
    last_cells, last_runs = job.last_attempts()        # what the analysis read; earlier attempts are words
    reports: dict[int, CellReport] = {c.cell: c for c in last_cells}
    suites = []
    for cell in analysis.cells:
        key = _cell_key(cell, job)
        runs = sorted((r for r in last_runs if r.cell == cell.cell), key=lambda r: r.seq)
        report = reports.get(cell.cell)
        earlier = sorted((c for c in job.cells if c.cell == cell.cell and report is not None
                          and c.attempt < report.attempt), key=lambda c: c.attempt)
        properties = [("job", job.id)] + ([("job.url", job_url)] if job_url else [])
        if cell.group:
            properties.append(("cell.group", cell.group))
        if report is not None and report.lease_id:
            properties.append(("lease", report.lease_id))
        if report is not None and report.fingerprint is not None:
            properties += fingerprint_properties(report.fingerprint)
        elif cell.device:
            properties.append(("device", cell.device))
        classname = label if len(analysis.cells) == 1 else f"{label}.{key}"
        failed = _failed_runs(runs) or _attempt_failed(report)
        cases: list[Case]
        if cell.not_run:
            cases = [_not_run(cell, label if len(analysis.cells) == 1 else key, classname)]
        elif not analysis.ab:
            name = label if len(analysis.cells) == 1 else key
            cases = [_with_failure(Case(name, classname, _duration(runs), output=_plain_output(cell)), failed)]
        else:
            cases = [_with_failure(Case("runs", classname, _duration(runs),
                                        output=f"{cell.counted} runs counted, {cell.warmup} warmup, {cell.failed} "
                                               f"failed, {cell.unfit} marked unfit"), failed)]
            cases += [_metric_case(metric, classname) for metric in cell.metrics]
        suites.append(Suite(name=f"{label} [{key}]" if len(analysis.cells) > 1 else label, cases=tuple(cases),
                            properties=tuple(properties), timestamp=runs[0].started_at if runs else job.started_at,
                            hostname=report.fingerprint.host if report and report.fingerprint else "",
                            output="\n".join([_attempts_text(earlier)] * bool(earlier) +
                                              [f"warning: {w}" for w in cell.warnings])))
    if job.state is not JobState.DONE:
        suites.append(Suite(name=f"{label} [job]", cases=(Case(
            "job", label, outcome=Outcome.ERROR, kind=f"job-{job.state.value}",
            message=f"the job {job.id} is {job.state.value}" + (f": {job.reason}" if job.reason else "")),),
            properties=(("job", job.id),) + ((("job.url", job_url),) if job_url else ())))
    return suites


def job_junit(job: JobView, analysis: Analysis, job_url: str = "") -> str:
    """A job's JUnit XML (``--junit FILE`` of ``run``, ``ab`` and ``matrix``)."""
    return document(job_suites(job, analysis, job_url), name=_label(job))


# --- a command run with a lease (``device-loop with``) ------------------------------------------------

MAX_NAME_CHARS = 200            # of a testcase named by its command line


def command_line(command: tuple[str, ...] | list[str], limit: int = MAX_NAME_CHARS) -> str:
    """A command as a shell would take it, cut to ``limit`` characters."""
    import shlex

    line = shlex.join(command)
    return line if len(line) <= limit else line[:limit - 1] + "…"


def device_properties(device: DeviceAnswer) -> list[tuple[str, str]]:
    """What the coordinator knows of a device, as JUnit properties: its class, host, tags,
    fidelity, its plugins' facts and the image its last flash wrote."""
    image = device.get("image")
    items = [("device", device.get("name", "")), ("device.class", device.get("class", "")),
             ("device.host", device.get("host") or ""), ("device.tags", ",".join(device.get("tags", []))),
             ("device.fidelity", str(device.get("fidelity", ""))),
             ("device.image", image["name"] if image else ""),
             ("device.image_sha256", image["sha256"] if image else "")]
    items += [(f"device.fact.{key}", value) for key, value in (device.get("facts") or {}).items()]
    return [(name, str(value)) for name, value in items if value]


def _command_case(outcome: CommandOutcome) -> Case:
    name = command_line(outcome.command) or "(no command)"
    classname = "device-loop with"
    time_s = outcome.timings.run_s
    reason = outcome.reason or ""
    if outcome.failure is FailureKind.LAB:
        return Case(name, classname, time_s, Outcome.ERROR, FailureKind.LAB.value,
                    reason or f"the lab failed it (exit {outcome.status})")
    if outcome.failure is FailureKind.TIMEOUT:
        return Case(name, classname, time_s, Outcome.FAILURE, FailureKind.TIMEOUT.value,
                    reason or f"cut by --max-time (exit {outcome.status})")
    if outcome.cancelled:
        # neither a pass nor the test's verdict: CI shows a cancel as the error it is
        return Case(name, classname, time_s, Outcome.ERROR, "cancelled",
                    reason or f"cancelled by {outcome.cancelled} (exit {outcome.status})")
    if outcome.status != 0:
        return Case(name, classname, time_s, Outcome.FAILURE, (outcome.failure or FailureKind.TEST).value,
                    reason or f"exited {outcome.status}")
    return Case(name, classname, time_s)


def command_suites(outcome: CommandOutcome, device: DeviceAnswer | None = None) -> list[Suite]:
    """A ``with``'s outcome as one suite of one testcase (the command), the device's record
    and the lease as properties, the timings in ``<system-out>``."""
    t = outcome.timings
    properties = [("lease", outcome.lease or ""), ("image", outcome.image or ""),
                  ("image.flashed", "yes" if outcome.flashed else ""), ("exit_status", str(outcome.status))]
    properties += device_properties(device) if device else [("device", outcome.device or "")]
    case = _command_case(outcome)
    timings = (f"waited {t.wait_s:.3f} s for a ready device, flashed {t.flash_s:.3f} s, ran {t.run_s:.3f} s, "
               f"{t.total_s:.3f} s in all")
    case = Case(case.name, case.classname, case.time_s, case.outcome, case.kind, case.message, case.details, timings)
    return [Suite(name="device-loop with" + (f" on {outcome.device}" if outcome.device else ""), cases=(case,),
                  properties=tuple((k, v) for k, v in properties if v),
                  timestamp=outcome.started_at or None, hostname=(device.get("host") or "") if device else "")]


def command_junit(outcome: CommandOutcome, device: DeviceAnswer | None = None) -> str:
    """A ``with``'s JUnit XML (``device-loop with --junit FILE``)."""
    return document(command_suites(outcome, device), name="device-loop with")
