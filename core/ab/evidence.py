"""A job's evidence (docs/architecture.md, "Jobs and evidence"): one self-contained markdown
a reviewer can check, and the same numbers as a terminal table.

The markdown renders on GitHub and reads as plain text in Gerrit: aligned tables, bullet
lists, fenced blocks. Everything in it that a user, an agent, a worker or an exporter wrote
(titles, device names, fingerprint fields, commands, metric names, reasons) is escaped where
it lands: in text, so it cannot open a tag, a link, a code span or a table cell, nor become a
link or a notification on a forge (a bare URL, an ``@mention``, an ``#12`` go in a code span);
in a fenced block, behind a fence longer than any run of backticks it holds.
"""
from __future__ import annotations

import math
import re
import time
from typing import TYPE_CHECKING, Callable
from collections.abc import Iterable

import tomli_w

from device_loop.core.ab.fingerprint import notable_isa
from device_loop.core.ab.jobs import CellReport, Fingerprint, JobSpec, JobView, RunRecord, Verdict
from device_loop.core.vocabulary import Arm

if TYPE_CHECKING:  # (the analysis loads scipy: seconds that a `with`'s report, escaped here, need not wait)
    from device_loop.core.ab.abstats import Analysis, CellAnalysis, Comparison, MetricResult, Summary

# C0/C1 controls (a terminal's escapes), line separators, lone surrogates, XML's non-characters,
# and the invisible and bidirectional marks that make text read otherwise than it runs
# ("Trojan source": a command in a fenced block)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2028\u2029\u2066-\u2069"
                      "\ud800-\udfff\ufeff\ufffe\uffff]")
_MARKUP = re.compile(r"([\\`*\[\]~|#!])|(?<!\w)_|_(?!\w)")
#: What a forge turns into a link or a notification however it is backslash-escaped (it reads
#: the rendered text): a URL or an address (``https://…``, ``www.…``, ``user@host``), a mention
#: (``@alice``, ``@org/team``), an issue reference (``#12``). In a code span it means only itself.
_URL_CHARS = r"[\w.~:/?#@!$%&'+,;=-]"
_LINKABLE = re.compile(rf"{_URL_CHARS}*(?:://|@|(?<![A-Za-z0-9.])www\.|#\d){_URL_CHARS}*", re.IGNORECASE)


# --- escaping -------------------------------------------------------------------------------

def plain(text: object) -> str:
    """``text`` on one line, without control characters (a terminal's escapes included)."""
    return _CONTROL.sub("", re.sub(r"\s*[\r\n]+\s*", " ", str(text)))


def md(text: object) -> str:
    """``text`` as inline markdown that means only itself: on one line, markup characters
    backslash-escaped (``|`` too, so a table cell stays one cell), ``<`` and ``&`` as entities,
    and what a forge would link or notify (``_LINKABLE``) in a code span."""
    flat, parts, at = plain(text), [], 0
    for found in _LINKABLE.finditer(flat):
        parts += [_escaped(flat[at:found.start()]), f"`{found.group()}`"]
        at = found.end()
    return "".join(parts + [_escaped(flat[at:])])


def _escaped(text: str) -> str:
    entities = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MARKUP.sub(lambda m: "\\" + m.group(0), entities)


def fence(content: str, info: str = "") -> str:
    """A fenced block holding ``content`` verbatim: its fence is longer than any run of
    backticks inside."""
    longest = max((len(run) for run in re.findall(r"`+", content)), default=0)
    marks = "`" * max(3, longest + 1)
    return f"{marks}{info}\n{_CONTROL.sub('', content.replace(chr(13), ''))}\n{marks}"


def table(header: list[str], rows: Iterable[list[str]]) -> str:
    """A markdown table whose columns line up in plain text too (cells already escaped)."""
    body = [list(r) + [""] * (len(header) - len(r)) for r in rows]
    widths = [max(3, len(h), *(len(r[i]) for r in body)) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
    return "\n".join([line(header), "| " + " | ".join("-" * w for w in widths) + " |", *map(line, body)])


# --- numbers --------------------------------------------------------------------------------

def number(value: float | None, unit: str = "") -> str:
    """A value to four significant digits, with its unit."""
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.4g}" + (f" {unit}" if unit else "")


def p_text(p: float | None) -> str:
    """A p-value: two significant digits."""
    return "-" if p is None else f"{p:.2g}"


def arm_text(arm: Summary | None, unit: str) -> str:
    """``100.0 ms ± 0.3%`` (``± ∞`` when too few runs for an interval of the median)."""
    if arm is None or not arm.n:
        return "-"
    spread = arm.spread_pct
    return f"{number(arm.median, unit)} ± {'∞' if spread is None else f'{spread:.1f}%'}"


def delta_text(c: Comparison | None, unit: str) -> str:
    """``-4.9% [-5.2%, -4.5%]`` for a ratio, ``-4.99 ms [-5.01, -4.97]`` for a shift."""
    if c is None:
        return "-"
    def shown(v: float) -> str:
        return f"{(v - 1) * 100:+.1f}%" if c.scale == "ratio" else f"{v:+.4g}"
    estimate = shown(c.estimate) + (f" {unit}" if c.scale == "shift" and unit else "")
    if c.low is None or c.high is None:
        return f"{estimate} [no interval: too few runs]"
    return f"{estimate} [{shown(c.low)}, {shown(c.high)}]"


def ratio_text(c: Comparison, confidence: float) -> str:
    """``ratio 0.949 [0.941, 0.957] (95% CI)``, or the shift's."""
    what = "ratio B/A" if c.scale == "ratio" else "shift B - A"
    interval = f" [{c.low:.4g}, {c.high:.4g}] ({confidence * 100:.3g}% CI)" if c.low is not None \
        and c.high is not None else " (no interval: too few runs)"
    return f"{what} {c.estimate:.4g}{interval}"


def verdict_text(c: Comparison | None) -> str:
    """``different: B is 4.9% faster``, ``same within ±2%``, ``unknown: collect more: …``."""
    if c is None:
        return "-"
    return c.words if c.verdict is Verdict.SAME else f"{c.verdict.value}: {c.words}"


def n_text(metric: MetricResult) -> str:
    return f"{metric.a.n}+{metric.b.n}" if metric.b is not None else str(metric.a.n)


def when(epoch: float | None) -> str:
    """An epoch time as UTC, to the second."""
    if epoch is None or not math.isfinite(epoch) or not 0 <= epoch < 1e11:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(epoch))


# --- the parts of the markdown -----------------------------------------------------------------

def _where(cell: CellAnalysis, matrix: bool) -> str:
    group = f"({md(cell.group)})" if matrix and cell.group else ""
    return " ".join(filter(None, [md(cell.device or ""), group]))


def _timing(report: CellReport | None) -> str:
    """``emulated (TCG): not for timing`` for a cell whose device's numbers are not for timing."""
    return report.fingerprint.timing_note if report is not None and report.fingerprint is not None else ""


def claims(job: JobView, analysis: Analysis) -> list[str]:
    """The claim in numbers, a line per comparison (or per metric of a plain job), each saying
    where its device's numbers are not for timing."""
    matrix = job.spec.matrix is not None
    reports = {c.cell: c for c in job.cells}
    lines = []
    for cell in analysis.cells:
        where = _where(cell, matrix)
        on = f" on {where}" if where else ""
        note = _timing(reports.get(cell.cell))
        timing = f"; {md(note)}" if note else ""
        if cell.not_run:
            lines.append(f"Not run{f' {where}' if where else ''}: {md(cell.not_run)}.")
        for metric in cell.metrics:
            c = metric.comparison
            if c is None and metric.b is None:
                lines.append(f"{md(metric.name)}{on}: median {number(metric.a.median, md(metric.unit))}, "
                             f"{metric.a.n} runs{timing}.")
            elif c is not None:
                said = {Verdict.DIFFERENT: f"**{md(c.words.replace('B is', 'B (patch) is', 1))} than A "
                                           "(baseline)**",
                        Verdict.SAME: f"**B (patch) is the same as A (baseline) {md(c.words.removeprefix('same '))}**",
                        Verdict.UNKNOWN: f"**undecided** ({md(c.words)})"}[c.verdict]
                lines.append(f"{md(metric.name)}{on}: {said}: {ratio_text(c, analysis.confidence)}, "
                             f"p = {p_text(c.p_holm)} (Holm), {n_text(metric)} runs{timing}.")
    return lines


def functional_only(job: JobView) -> str:
    """The job's label when every device it ran on is not for timing (an ISA matrix on
    emulators): its evidence is functional (the code runs, and agrees across the cells), its
    numbers are not for timing. Empty when a device it ran on is for timing, or none ran."""
    ran = [c for c in job.cells if c.fingerprint is not None]
    if not ran or not all(_timing(c) for c in ran):
        return ""
    kinds = ", ".join(dict.fromkeys(c.fingerprint.what or "emulated" for c in ran if c.fingerprint))
    return f"Functional evidence only: every device it ran on is {kinds}: not for timing."


def metric_table(cell: CellAnalysis, ab: bool) -> str:
    """benchstat's shape: metric | A ± | B ± | delta [CI] | p (Holm) | n | verdict."""
    if not ab:
        return table(["metric", "median ±", "n"],
                     [[md(m.name), arm_text(m.a, md(m.unit)), str(m.a.n)] for m in cell.metrics])
    rows = [[md(m.name), arm_text(m.a, md(m.unit)), arm_text(m.b, md(m.unit)), delta_text(m.comparison, md(m.unit)),
             p_text(m.comparison.p_holm if m.comparison else None), n_text(m), md(verdict_text(m.comparison))]
            for m in cell.metrics]
    return table(["metric", "A ±", "B ±", "delta [CI]", "p (Holm)", "n", "verdict"], rows)


MATRIX_COLUMNS = ["cell", "group", "device", "fidelity", "ISA features", "metric", "delta [CI]", "verdict"]


def matrix_rows(job: JobView, analysis: Analysis, escape: Callable[[str], str]) -> list[list[str]]:
    """A row per cell and metric (``MATRIX_COLUMNS``), text put through ``escape``; a cell
    that never ran is a row that says so."""
    reports = {c.cell: c for c in job.cells}
    rows = []
    for cell in analysis.cells:
        report = reports.get(cell.cell)
        isa = " ".join(notable_isa(report.fingerprint.isa)) if report and report.fingerprint else ""
        what = (_timing(report) or report.fingerprint.what) if report and report.fingerprint else ""
        head = [str(cell.cell), escape(cell.group), escape(cell.device or "-"), escape(what or "-"), escape(isa or "-")]
        if cell.not_run or not cell.metrics:
            rows.append(head + ["-", escape(f"not run: {cell.not_run}" if cell.not_run else "no runs"), "-"])
        for m in cell.metrics:
            rows.append(head + [escape(m.name), delta_text(m.comparison, escape(m.unit)),
                                escape(verdict_text(m.comparison))])
    return rows


def matrix_table(job: JobView, analysis: Analysis) -> str:
    """The matrix's summary as a markdown table: a row per cell and metric."""
    return table(MATRIX_COLUMNS, matrix_rows(job, analysis, md))


def warnings(analysis: Analysis) -> list[str]:
    """Every warning of the analysis, each saying where it applies (raw text: escape it
    where it goes)."""
    found = []
    for cell in analysis.cells:
        where = f"cell {cell.cell}" + (f" ({cell.group})" if cell.group else "") + ": " \
            if len(analysis.cells) > 1 else ""
        found += [where + w for w in cell.warnings]
        found += [f"{where}{metric.name}: {w}" for metric in cell.metrics for w in metric.warnings]
    return found


def drift_lines(analysis: Analysis, matrix: bool) -> list[str]:
    """Drift within each arm and the arms' start temperatures, per cell and metric."""
    def rho(r: float | None, p: float | None) -> str:
        return "-" if r is None else f"ρ = {r:+.2f} (p = {p_text(p)})"

    def temp(t: float | None) -> str:
        return "-" if t is None else f"{t:.1f} °C"
    lines = []
    for cell in analysis.cells:
        where = f"cell {cell.cell}, " if matrix else ""
        for m in cell.metrics:
            d = m.drift
            if analysis.ab:
                lines.append(f"{where}{md(m.name)}: value against run order A {rho(d.rho_a, d.p_a)}, "
                             f"B {rho(d.rho_b, d.p_b)}; mean start temperature A {temp(d.temp_a)}, "
                             f"B {temp(d.temp_b)}")
            else:
                lines.append(f"{where}{md(m.name)}: value against run order {rho(d.rho_a, d.p_a)}; "
                             f"mean start temperature {temp(d.temp_a)}")
    return lines


def fingerprint_lines(f: Fingerprint) -> list[str]:
    """A device's fingerprint as bullet items."""
    policies = "; ".join(", ".join(f"{k} {v}" for k, v in p.items()) for p in f.cpufreq)
    thermal = ", ".join(f"{zone} {c:.1f} °C" for zone, c in f.thermal.items())
    items = [("device", f.device), ("class", f.device_class), ("host", f.host), ("reached through", f.channel),
             ("kernel", f.kernel), ("CPU", f.cpu_model), ("ISA features", " ".join(f.isa)),
             ("cores", "" if f.cores is None else str(f.cores)), ("online CPUs", f.online),
             ("cpufreq", policies), ("thermal at fingerprint", thermal),
             ("memory", "" if f.memory_kb is None else f"{f.memory_kb} kB"), ("OS build", f.os_build),
             ("image", f.image), ("image sha256", f.image_sha256), ("device-loop", f.device_loop_version),
             ("fidelity", f.timing_note or f.what)]
    items += [(f"fact {key}", value) for key, value in f.extra.items()]
    return [f"- {md(name)}: {md(value) if value else '-'}" for name, value in items]


def runs_table(runs: list[RunRecord], metrics: list[str], ab: bool) -> str:
    """A row per run, in order (attempt by attempt, where a cell had more than one): what it
    ran, when, the device's readings, its values, its status and whose failure it was, its mark."""
    from device_loop.core.ab.abstats import run_value, start_temperature

    attempts = len({r.attempt for r in runs}) > 1
    header = [*(["attempt"] if attempts else []), "seq", "arm", "warmup", "started (UTC)", "temp °C", "governor",
              "MHz", "load", *map(md, metrics), "status", "failure", "marked"]
    rows = []
    for r in sorted(runs, key=lambda r: (r.attempt, r.seq)):
        temp = start_temperature(r)
        rows.append([*([str(r.attempt)] if attempts else []), str(r.seq), r.arm.value if ab else "",
                     "yes" if r.warmup else "", when(r.started_at),
                     "-" if temp is None else f"{temp:.1f}", md(r.readings.governor or "-"),
                     "-" if r.readings.freq_khz is None else f"{r.readings.freq_khz / 1000:.0f}",
                     "-" if r.readings.load is None else f"{r.readings.load:.2f}",
                     *(number(run_value(r, m)) for m in metrics), str(r.status),
                     r.failure.value if r.failure else "", md(r.readings.unfit or "")])
    return table(header, rows)


SHOWN_OUTPUT_LINES = 5  # of the last run of each arm, in the evidence


def printed(runs: list[RunRecord]) -> list[str]:
    """What the last run of each arm printed last (its last lines, fenced): a reader sees the
    answer a run gave, not only its status (the whole tail of every run: the job's API)."""
    last: dict[Arm, RunRecord] = {}
    for r in sorted(runs, key=lambda r: (r.attempt, r.seq)):
        if not r.warmup:
            last[r.arm] = r
    out: list[str] = []
    for arm, r in last.items():
        tail = "\n".join(r.last_lines(SHOWN_OUTPUT_LINES))
        said = f"Run {r.seq}" + ("" if arm == Arm.RUN else f" ({arm.value})") + f" exited {r.status}"
        out += [f"{said}, and printed last:" if tail else f"{said}, printing nothing.", "",
                *([fence(tail), ""] if tail else [])]
    return out


ATTEMPT_COLUMNS = ["cell", "attempt", "device", "runs", "ended", "cause"]


def attempt_rows(job: JobView, escape: Callable[[str], str]) -> list[list[str]]:
    """A row per attempt of every cell (``ATTEMPT_COLUMNS``): its device, its runs, how it
    ended (whose failure) and why, text put through ``escape``."""
    last = {c.cell: c.attempt for c in job.last_attempts()[0]}
    rows = []
    for report in sorted(job.cells, key=lambda c: (c.cell, c.attempt)):
        runs = sum(1 for r in job.runs if r.cell == report.cell and r.attempt == report.attempt)
        ended = (f"{report.failure.value} failure" if report.failure else "not run" if report.not_run
                 else "ran" if report.attempt == last.get(report.cell) else "-")
        cause = report.reason or report.not_run or ""
        rows.append([str(report.cell) + (f" ({escape(report.group)})" if report.group else ""), str(report.attempt),
                     escape(report.device or "-"), str(runs), ended, escape(cause.splitlines()[0] if cause else "-")])
    return rows


def retried(job: JobView) -> bool:
    """Whether a cell of ``job`` had more than one attempt, or an attempt ended in a failure."""
    return any(c.attempt > 0 or c.failure is not None for c in job.cells)


def commands(spec: JobSpec) -> list[str]:
    """The exact commands, each list in a fenced block."""
    parts = []
    lists = [("setup (once per device, after the lease)", spec.setup)]
    if spec.ab is not None:
        lists += [("baseline (A)", spec.ab.baseline), ("patch (B)", spec.ab.patch)]
    else:
        lists += [("run (each round)", spec.run)]
    for name, commands in lists:
        if commands:
            parts += [f"{name}:", "", fence("\n".join(commands), "sh"), ""]
    return parts


def spec_toml(spec: JobSpec) -> str:
    """The job spec as the TOML file ``device-loop run`` reads: of its top-level keys only those
    not at their default (no ``title = ""``) and never a plain job's ``rounds`` beside an A/B
    pair's own; its tables (the pair, the matrix, the target, the metrics) whole."""
    set_apart = spec.model_dump(by_alias=True, exclude_defaults=True).keys()
    whole = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    shown = {key: value for key, value in whole.items()
             if key in set_apart and not (key == "rounds" and spec.ab is not None)}
    return tomli_w.dumps(shown)


def _cell_title(cell: CellAnalysis, report: CellReport | None, matrix: bool) -> str:
    """``cell 0: vm-0 (tags=sve2), emulated (TCG): not for timing``."""
    name = f"cell {cell.cell}" if matrix else "device"
    device = md(cell.device or (report.fingerprint.device if report and report.fingerprint else "") or "-")
    note = _timing(report)
    return (f"{name}: {device}" + (f" ({md(cell.group)})" if matrix and cell.group else "")
            + (f", {md(note)}" if note else ""))


# --- the whole ----------------------------------------------------------------------------------

def markdown(job: JobView, analysis: Analysis) -> str:
    """The job's evidence, one markdown document."""
    spec = job.spec
    matrix = spec.matrix is not None
    reports = {c.cell: c for c in job.cells}
    kind = "matrix" if matrix else "A/B" if spec.ab else "job"
    out = [f"# {md(spec.title) if spec.title else f'device-loop {kind} {md(job.id)}'}", ""]
    out += [f"- {line}" for line in claims(job, analysis)] + [""]
    if label := functional_only(job):
        out += [f"**{md(label)}**", ""]
    out += [f"Job {md(job.id)}: {md(job.state.value)}" + (f" ({md(job.reason)})" if job.reason else "")
            + f"; owner {md(job.owner)} ({md(job.kind)}), worker {md(job.worker or '-')}; created "
            f"{when(job.created_at)}, started {when(job.started_at)}, ended {when(job.ended_at)}.", ""]
    if matrix:
        out += ["## Summary", "", matrix_table(job, analysis), ""]
    out += ["## Results", ""]
    for cell in analysis.cells:
        if matrix or len(analysis.cells) > 1:
            out += [f"### {_cell_title(cell, reports.get(cell.cell), matrix)}", ""]
        if cell.not_run:
            out += [f"Not run: {md(cell.not_run)}", ""]
            continue
        out += [metric_table(cell, analysis.ab), "",
                f"{cell.counted} runs counted, {cell.warmup} warmup, {cell.failed} failed, "
                f"{cell.unfit} marked unfit.", ""]
    if retried(job):  # (docs/architecture.md, "Lab failures": every attempt, its device and cause)
        out += ["## Attempts", "", "A cell whose attempt ended in a lab failure started again on another device "
                f"(retry = {spec.retry}); the results are its last attempt's.", "",
                table(ATTEMPT_COLUMNS, attempt_rows(job, md)), ""]
    out += ["## Warnings", "", *([f"- {md(w)}" for w in warnings(analysis)] or ["None."]), ""]
    out += ["## Drift", "", *[f"- {line}" for line in drift_lines(analysis, matrix)], ""]
    out += ["## Devices", ""]
    for cell in analysis.cells:
        report = reports.get(cell.cell)
        out += [f"### {_cell_title(cell, report, matrix)}", ""]
        if report is not None and report.fingerprint is not None:
            out += fingerprint_lines(report.fingerprint) + [""]
        else:
            out += [f"No fingerprint{f' (not run: {md(cell.not_run)})' if cell.not_run else ''}.", ""]
    out += ["## Runs", ""]
    metric_names = [m.name for cell in analysis.cells for m in cell.metrics]
    metric_names = list(dict.fromkeys(metric_names))
    for cell in analysis.cells:
        runs = [r for r in job.runs if r.cell == cell.cell]
        if runs:
            if len(analysis.cells) > 1:
                out += [f"### {_cell_title(cell, reports.get(cell.cell), matrix)}", ""]
            out += [runs_table(runs, metric_names, analysis.ab), "", *printed(runs)]
    if not job.runs:
        out += ["No runs.", ""]
    out += ["## Commands", "", *commands(spec)]
    images = {(c.fingerprint.image, c.fingerprint.image_sha256) for c in job.cells if c.fingerprint
              and (c.fingerprint.image or c.fingerprint.image_sha256)}
    out += ["## Images and versions", ""]
    out += [f"- image {md(name or '-')}: sha256 {md(sha or '-')}" for name, sha in sorted(images)] or \
        ["- no image recorded for these devices"]
    versions = sorted({c.fingerprint.device_loop_version for c in job.cells if c.fingerprint})
    out += [f"- device-loop (worker): {md(', '.join(versions) or '-')}",
            f"- device-loop (coordinator): {md(job.coordinator_version or '-')}", ""]
    out += ["## Method", "", analysis.method, ""]         # abstats' own words and numbers
    out += ["## Reproduce", "", "Rerun this job:", "", fence(f"device-loop run --from-job {plain(job.id)}", "sh"),
            "", "or save the spec below as job.toml and run `device-loop run job.toml`:", "",
            fence(spec_toml(spec).rstrip("\n"), "toml"), ""]
    return "\n".join(out)


# --- the terminal ---------------------------------------------------------------------------------

def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def terminal_table(analysis: Analysis, job: JobView | None = None) -> str:
    """benchstat's table for a terminal: metric, A ± spread, B ± spread, delta, p, n,
    verdict (a plain job: metric, median ± spread, n), a block per cell, then, for a matrix
    (given its ``job``, whose fingerprints name the ISA), one table of every cell, then the
    warnings."""
    lines = []
    reports = {c.cell: c for c in job.cells} if job is not None else {}
    for cell in analysis.cells:
        if len(analysis.cells) > 1 or cell.device:
            note = _timing(reports.get(cell.cell))
            where = " ".join(filter(None, [f"cell {cell.cell}", cell.group, cell.device and f"on {cell.device}",
                                           note and f"({note})"]))
            lines.append(plain(where + (f": not run: {cell.not_run}" if cell.not_run else "")))
        if not cell.metrics:
            continue
        if analysis.ab:
            rows = [["metric", "A", "B", "delta [CI]", "p (Holm)", "n", "verdict"]]
            rows += [[plain(m.name), arm_text(m.a, plain(m.unit)), arm_text(m.b, plain(m.unit)),
                      delta_text(m.comparison, plain(m.unit)), p_text(m.comparison.p_holm if m.comparison else None),
                      n_text(m), plain(verdict_text(m.comparison))] for m in cell.metrics]
        else:
            rows = [["metric", "median", "n"]]
            rows += [[plain(m.name), arm_text(m.a, plain(m.unit)), str(m.a.n)] for m in cell.metrics]
        lines += _columns(rows)
    if job is not None and job.spec.matrix is not None:
        lines += ["matrix"] + _columns([MATRIX_COLUMNS] + matrix_rows(job, analysis, plain))
    if job is not None and retried(job):
        lines += ["attempts"] + _columns([ATTEMPT_COLUMNS] + attempt_rows(job, plain))
    lines += [f"warning: {plain(w)}" for w in warnings(analysis)]
    return "\n".join(lines)
