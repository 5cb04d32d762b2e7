"""The job commands (docs/architecture.md, "Jobs and evidence"): ``run``, ``ab`` and
``matrix`` (this process is the job's worker, in the foreground, unless ``--submit`` queues
it for a ``device-loop worker``), ``jobs``, and ``job show | evidence | cancel | rm``.

``matrix`` takes its device groups as ``--over`` options, or as arguments after the first
(``device-loop matrix --over tags=sve2 tags=rvv ab --baseline … --patch …``, the word ``ab``
optional), and the options of ``ab``.
"""
from __future__ import annotations

import dataclasses
import json
import math
import signal
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from device_loop.core.durations import format_duration
from device_loop.core.ab.jobs import JobSpec, JobSummary, JobView, Order, group_target
from device_loop.core.vocabulary import LAB_FAILURE_STATUS, Arm, FailureKind, JobState, Needs

from .ci_results import check_distinct, ci_options, write_job_results
from .commands import _tags, _ttl, json_option, lab_command
from device_loop.client.lab import Lab
from .output import emit, table

MAX_JOB_FILE_BYTES = 1 << 20
BETTER_WORDS = ("lower", "higher")
#: The files ``--junit`` and ``--markdown`` name (cli/ci_results.py), or None for neither.
Reports = tuple[Path | None, Path | None] | None


# --- building a spec ---------------------------------------------------------------------------

def readable(exc: ValidationError) -> str:
    """A spec's refusal in one line per problem: where, and what is wrong."""
    lines = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"] if p != "__root__")
        lines.append(f"{where}: {error['msg']}" if where else error["msg"])
    return "; ".join(lines)


def spec_of(data: dict, where: str) -> JobSpec:
    """A ``JobSpec`` from a job file's table or the flags, or a usage error saying what is wrong."""
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise click.UsageError(f"{where}: {readable(exc)}") from None


def load_job_file(path: str) -> JobSpec:
    """A job file (TOML, ``JobSpec``'s fields), or a usage error naming what is wrong with it."""
    file = Path(path)
    try:
        if file.stat().st_size > MAX_JOB_FILE_BYTES:
            raise click.UsageError(f"{path}: a job file is at most {MAX_JOB_FILE_BYTES >> 10} KiB")
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise click.UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise click.UsageError(f"{path} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise click.UsageError(f"{path} is not TOML: {exc}") from None
    return spec_of(data, path)


def metric_option(value: str) -> dict[str, Any]:
    """``NAME[:lower|higher][:UNIT]`` as a metric's fields."""
    parts = value.split(":")
    at = next((i for i, part in enumerate(parts) if i and part in BETTER_WORDS), None)
    if at is None:
        return {"name": value}
    return {"name": ":".join(parts[:at]), "better": parts[at], "unit": ":".join(parts[at + 1:])}


def metrics_of(metrics: tuple[str, ...], regexes: tuple[str, ...]) -> list[dict[str, Any]]:
    """``--metric`` and ``--metric-regex`` as the spec's metrics (a regex joins its metric)."""
    declared: dict[str, dict[str, Any]] = {}
    for value in metrics:
        metric = metric_option(value)
        declared[metric["name"]] = metric
    for value in regexes:
        name, sep, regex = value.partition("=")
        if not sep or not name or not regex:
            raise click.BadParameter(f"give NAME=REGEX (a group named value), not {value!r}",
                                     param_hint="--metric-regex")
        declared.setdefault(name, {"name": name})["regex"] = regex
    return list(declared.values())


def ab_spec(options: dict[str, Any], matrix: dict[str, Any] | None = None) -> JobSpec:
    """The spec the flags of ``ab`` (and ``matrix``) describe; unset flags keep the spec's defaults."""
    target = {k: v for k, v in (("device", options["device"]), ("class", options["device_class"]),
                                ("tags", options["tags"])) if v}
    ab = {k: v for k, v in (("baseline", list(options["baseline"])), ("patch", list(options["patch"])),
                            ("rounds", options["rounds"]), ("warmup", options["warmup"]),
                            ("order", options["order"]), ("until_decided", options["until_decided"] or None),
                            ("max_rounds", options["max_rounds"]), ("alpha", options["alpha"]),
                            ("governor", options["governor"]), ("seed", options["seed"]))
          if v is not None}
    if options["no_settle"]:
        ab["settle"] = False
    if options["max_rounds"] is not None and not options["until_decided"]:
        raise click.UsageError("--max-rounds is where --until-decided stops: give --until-decided too")
    data: dict[str, Any] = {"target": target, "ab": ab, "setup": list(options["setup"]),
                            "metrics": metrics_of(options["metric"], options["metric_regex"])}
    for key, name in (("title", "title"), ("needs", "needs"), ("fallback", "fallback"),
                      ("fallback_after_s", "fallback_after"), ("command_timeout_s", "command_timeout"),
                      ("lease_ttl_s", "ttl")):
        if options[name] is not None:
            data[key] = options[name]
    if matrix is not None:
        data["matrix"] = matrix
    return spec_of(data, "the job")


def ab_options(command: Callable) -> Callable:
    """The options ``ab`` and ``matrix`` share."""
    options = [
        click.option("--baseline", multiple=True, required=True, metavar="CMD",
                     help="A's command (run on this machine with the lease's environment; again for more commands)"),
        click.option("--patch", multiple=True, required=True, metavar="CMD", help="B's command (again for more)"),
        click.option("--device", help="run on this device"),
        click.option("--class", "device_class", help="run on any free device of this class"),
        click.option("--tags", callback=_tags, help="... with all these tags, separated by commas"),
        click.option("--rounds", type=click.IntRange(1), help="A and B runs each, warmup not counted  [default: 10]"),
        click.option("--warmup", type=click.IntRange(0), help="AB blocks run first and left out  [default: 1]"),
        click.option("--order", type=click.Choice([o.value for o in Order]),
                     help="abab; random (within each AB block, from --seed); aabb (every A, then every B: only to "
                          "show what interleaving protects from)  [default: abab]"),
        click.option("--no-settle", is_flag=True, help="no settle (the device's cool-down steps) before each run"),
        click.option("--until-decided", is_flag=True,
                     help="look at rounds, 2x, 4x ... up to --max-rounds (fixed before the first run, α split "
                          "over the looks) and stop once every metric is decided"),
        click.option("--max-rounds", type=click.IntRange(1), help="the last look of --until-decided  [default: 4x]"),
        click.option("--metric", multiple=True, metavar="NAME[:lower|higher][:UNIT]",
                     help="a metric the commands print as JSON lines {\"metric\": NAME, \"value\": V} (lower is "
                          "better unless said)"),
        click.option("--metric-regex", multiple=True, metavar="NAME=REGEX",
                     help="a metric read by a regular expression with a group named value, e.g. "
                          "'t=time: (?P<value>[0-9.]+)'"),
        click.option("--setup", multiple=True, metavar="CMD", help="a command run once on the lease, before the runs"),
        click.option("--alpha", type=click.FloatRange(0, 0.5, min_open=True, max_open=True),
                     help="the test's α  [default: 0.05]"),
        click.option("--governor", help="mark runs whose device's cpufreq governor is another"),
        click.option("--seed", type=click.IntRange(0, 2**32 - 1), help="the random order's seed  [default: 0]"),
        click.option("--title", help="what the evidence is titled"),
        click.option("--needs", type=click.Choice([n.value for n in Needs]),
                     help="what it may run on: real-hw (a board, or a simulated one), any (a virtual machine or an "
                          "emulator)  [default: real-hw]"),
        click.option("--fallback", type=click.Choice([Needs.REAL_HW.value]),
                     help="with --needs any: a real device once a cell waited --fallback-after for a virtual one"),
        click.option("--fallback-after", callback=_ttl, help="with --fallback: how long to wait first  [default: 60s]"),
        click.option("--command-timeout", callback=_ttl, help="the longest one command may run  [default: 10m]"),
        click.option("--ttl", callback=_ttl, help="the lease's time to live, renewed as the job runs  [default: 1h]"),
        click.option("--plot", type=click.Path(dir_okay=False), help="also draw the runs as a chart (PNG)"),
        click.option("--submit", is_flag=True, help="queue the job for a device-loop worker, print its id, and return"),
        json_option,
    ]
    for option in reversed(options):
        command = option(command)
    return command


# --- running one in the foreground ----------------------------------------------------------------

def _say(text: str) -> None:
    click.echo(f"  {text}", err=True)


def run_here(lab: Lab, spec: JobSpec, as_json: bool, plot: str | None = None, share_token: bool = True,
             reports: Reports = None) -> None:
    """Submit ``spec`` with this process as its worker, run it, print its table (or JSON),
    and exit 0 once done, 75 if the lab failed it, 1 if it failed otherwise. Ctrl-C,
    SIGTERM or SIGHUP stops it (exit 130, 143, 129): failed, leases released.
    Its commands run in a cgroup of the job's where this machine lets it make one
    (``client/job_cgroups.py``), else each in a process group; ``share_token``: they get
    this process's token. ``reports``: the JUnit and markdown files to write once it ended,
    however it ended (and the step summary, in GitHub Actions)."""
    from device_loop.core.process import keep_private

    from device_loop.client.job_cgroups import CgroupsUnavailable, JobCgroups
    from device_loop.client.runner import Runner, Stopper

    keep_private()
    try:
        cgroups: JobCgroups | None = JobCgroups.start(_say)
    except CgroupsUnavailable:
        cgroups = None
    job = lab.jobs.submit(spec, claim=True)
    if not as_json:
        click.echo(f"{job.id}: running ({_what(spec)})", err=True)
    stopper = Stopper()
    stopped_by: list[int] = []  # the signal that stopped it: the exit status says it, as a shell's does

    def stop(signum: int, frame: object) -> None:
        stopped_by.append(signum)
        stopper.stop("interrupted (Ctrl-C)" if signum == signal.SIGINT else
                     f"its worker was stopped ({signal.Signals(signum).name})")
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        ended = Runner(lab.jobs, say=None if as_json else _say, share_token=share_token, cgroups=cgroups).run(job,
                                                                                                          stopper)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if cgroups is not None:
            cgroups.close()
    show_ended(ended, as_json, plot)
    write_job_results(lab.api.url, ended, *(reports or (None, None)))
    if ended.state is not JobState.DONE:
        sys.exit(128 + stopped_by[0] if stopped_by else
                 LAB_FAILURE_STATUS if ended.failure() is FailureKind.LAB else 1)


def analysis_of(job: JobView):
    """The analysis of a job's runs, as the coordinator makes it (the same runs, the same answer)."""
    from device_loop.core.ab import abstats

    return abstats.analyse(job.spec, job.runs, job.cells)


def show_ended(job: JobView, as_json: bool, plot: str | None = None) -> None:
    """A job's table (or its JSON, with the analysis), and the chart when asked."""
    analysis = analysis_of(job)
    if plot:
        from device_loop.core.ab import charts

        charts.png(job, analysis, plot)
    if as_json:
        click.echo(json.dumps({**job.model_dump(mode="json", by_alias=True), "analysis": _jsonable(analysis)},
                              indent=2))
        return
    from device_loop.core.ab import evidence

    click.echo(evidence.terminal_table(analysis, job))
    click.echo(f"{job.id}: {job.state}" + (f" ({job.reason})" if job.reason else ""))
    click.echo(f"evidence: device-loop job evidence {job.id} > evidence.md" + (f"; chart: {plot}" if plot else ""))


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):  # (JSON has no NaN or infinity)
        return None
    return value


def _what(spec: JobSpec) -> str:
    target = spec.target
    parts = ([f"class {target.device_class}"] if target.device_class else []) + \
        ([f"tags {','.join(target.tags)}"] if target.tags else [])
    where = target.device or " ".join(parts)
    if spec.matrix is not None:
        where = f"{len(spec.matrix.over)} groups: {', '.join(spec.matrix.over)}"
    where = (where or "any device") + f" ({spec.need.words()})"
    if spec.ab is not None:
        return f"A/B, {spec.ab.rounds} rounds, {spec.ab.order}, on {where}"
    return f"{spec.rounds} round{'s' if spec.rounds != 1 else ''} on {where}"


def _go(lab: Lab, spec: JobSpec, as_json: bool, submit: bool, plot: str | None, reports: Reports = None) -> None:
    if not submit:
        run_here(lab, spec, as_json, plot, reports=reports)
        return
    if plot:
        raise click.UsageError("--plot draws the runs of a job run here: with --submit, draw them later with "
                               "device-loop job evidence ID --plot FILE.png")
    if reports is not None and any(reports):
        raise click.UsageError("--junit and --markdown write the results of a job run here: with --submit, write "
                               "them once it ended with device-loop job evidence ID --junit FILE --markdown FILE")
    job = lab.jobs.submit(spec)
    emit(as_json, job.model_dump(mode="json", by_alias=True),
         lambda _: f"{job.id}: queued for a device-loop worker of {job.owner}'s; follow it with: "
                   f"device-loop job show {job.id}")


# --- the commands ---------------------------------------------------------------------------------

@click.command("run")
@click.argument("job_file", metavar="JOBFILE.toml", required=False)
@click.option("--from-job", metavar="ID", help="run again the spec of the job ID (another person's: its commands "
                                               "are shown and you are asked first)")
@click.option("--yes", is_flag=True, help="with --from-job: run another person's commands without asking")
@click.option("--share-token", is_flag=True, help="with --from-job: give another person's commands your token too")
@ci_options
@json_option
@lab_command
def run_command(lab: Lab, job_file: str | None, from_job: str | None, yes: bool, share_token: bool, as_json: bool,
                junit_file: Path | None, markdown_file: Path | None):
    """Run a job file here (this process is its worker) and print its table; exit 0 once
    done, 75 if the lab failed it (docs/architecture.md, "Lab failures"), 1 if it failed otherwise."""
    if (job_file is None) == (from_job is None):
        raise click.UsageError("give a JOBFILE.toml or --from-job ID (one of them)")
    check_distinct(junit_file, markdown_file)
    reports = (junit_file, markdown_file)
    if job_file is not None:
        run_here(lab, load_job_file(job_file), as_json, reports=reports)
        return
    job = lab.jobs.get(from_job or "")
    if _yours(lab, job):
        run_here(lab, job.spec, as_json, reports=reports)
        return
    _ask_before_running(job, yes)
    run_here(lab, job.spec, as_json, share_token=share_token, reports=reports)


def _yours(lab: Lab, job: JobView) -> bool:
    """Whether the job is surely the reader's: in a lab without tokens, by name. With
    tokens, who the reader is is the coordinator's to say, and it does not: any job may be
    another person's (an admin reads everyone's)."""
    return "Authorization" not in lab.api.headers and job.owner == lab.api.user


def _ask_before_running(job: JobView, yes: bool) -> None:
    """Show the commands of a job that may be another person's, and ask before running them
    here, as the reader: they could do whatever the reader's account can. Without a
    terminal to ask on, only ``--yes`` runs them."""
    spec = job.spec
    lists = [("setup", spec.setup), ("run", spec.run)] + \
        ([("baseline (A)", spec.ab.baseline), ("patch (B)", spec.ab.patch)] if spec.ab is not None else [])
    lines = [f"{job.id} is {job.owner}'s job. Its commands run on this machine as you, with your files (a token "
             f"file among them: ~/.config/device-loop/token):"]
    for name, commands in lists:
        lines += [f"  {name}: {_shown(command)}" for command in commands]
    click.echo("\n".join(lines), err=True)
    if yes:
        return
    if not sys.stdin.isatty():
        raise click.ClickException(f"not run: read {job.owner}'s commands above, then run it again with --yes")
    if not click.confirm("Run them?", default=False, err=True):
        raise click.ClickException("not run")


def _shown(command: str) -> str:
    """A command as a terminal cannot be made to hide any of it: every character that is not
    printable (a carriage return, an escape sequence, a right-to-left mark) written as its
    escape, and each line after the first indented."""
    shown = "".join(c if c.isprintable() or c == "\n" else c.encode("unicode_escape").decode("ascii")
                    for c in command)
    return shown.replace("\n", "\n      ")


@click.command("ab")
@ab_options
@ci_options
@lab_command
def ab_command(lab: Lab, as_json: bool, submit: bool, plot: str | None, junit_file: Path | None,
               markdown_file: Path | None, **options):
    """An A/B pair on one device: --baseline and --patch interleaved, settle before each run,
    then the table (benchstat's shape) and the job's id for its evidence."""
    check_distinct(junit_file, markdown_file)
    _go(lab, ab_spec(options), as_json, submit, plot, (junit_file, markdown_file))


@click.command("matrix")
@click.argument("groups", nargs=-1, metavar="[GROUP]... [ab]")
@click.option("--over", multiple=True, metavar="GROUP", help="a device group: tags=a,b, class=C or device=D")
@click.option("--cell-wait", callback=_ttl, help="how long a group waits for a device before it is 'not run'  "
                                                 "[default: 5m]")
@ab_options
@ci_options
@lab_command
def matrix_command(lab: Lab, groups: tuple[str, ...], over: tuple[str, ...], cell_wait: float | None,
                   as_json: bool, submit: bool, plot: str | None, junit_file: Path | None,
                   markdown_file: Path | None, **options):
    """The same A/B pair over device groups, each on its own device, side by side where the
    lab allows: one table, a row per group."""
    words = list(groups)
    if words and words[-1] == "ab":
        words.pop()
    everything = [*over, *words]
    check_distinct(junit_file, markdown_file)
    if not everything:
        raise click.UsageError("give the device groups: --over tags=sve2 --over tags=rvv (or after --over, "
                               "as arguments)")
    base = ab_spec(options).target
    for group in everything:
        try:
            group_target(group, base)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    matrix: dict[str, Any] = {"over": everything}
    if cell_wait is not None:
        matrix["wait_s"] = cell_wait
    _go(lab, ab_spec(options, matrix), as_json, submit, plot, (junit_file, markdown_file))


def _when(seconds: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) if seconds else "-"


def _jobs_text(jobs: list[JobSummary]) -> str:
    if not jobs:
        return "no jobs"
    return table(["JOB", "STATE", "OWNER", "KIND", "NEEDS", "TITLE", "CREATED", "TOOK", "WORKER", "REASON"],
                 [[j.id, j.state, j.owner, j.kind,
                   (j.needs or "-") + (f" ({j.fallback} after a wait)" if j.fallback else ""), j.title or "-",
                   _when(j.created_at),
                   format_duration((j.ended_at or time.time()) - j.started_at) if j.started_at else "-",
                   j.worker or "-", (j.reason[:60] + "…") if len(j.reason) > 60 else (j.reason or "-")]
                  for j in jobs])


@click.command("jobs")
@click.option("--all", "everyone", is_flag=True, help="everyone's jobs (admins)")
@json_option
@lab_command
def jobs_command(lab: Lab, everyone: bool, as_json: bool):
    """Your jobs, open ones first: state, owner, kind, title, worker."""
    jobs = lab.jobs.list(everyone)
    emit(as_json, [j.model_dump(mode="json") for j in jobs], lambda _: _jobs_text(jobs))


@click.group("job")
def job_group():
    """One job: show, evidence, cancel, rm."""


SHOWN_RUNS = 8        # `job show` says the output of the last runs this many (--json has every run's)
SHOWN_LINES = 3       # ... the last lines of each


def _outputs(runs) -> list[str]:
    """Each of the last runs' output, its last lines (what it printed is evidence too: a
    `uname -m` job says its answer, not only that it exited 0)."""
    lines = [f"  ({len(runs) - SHOWN_RUNS} runs before these: device-loop job show --json has them)"] \
        if len(runs) > SHOWN_RUNS else []
    for run in runs[-SHOWN_RUNS:]:
        said = run.last_lines(SHOWN_LINES)
        arm = "" if run.arm == Arm.RUN else f" {run.arm.value}"
        head = f"  run {run.seq}{arm}{' (warmup)' if run.warmup else ''} exited {run.status}"
        lines.append(head + (":" if said else ", printing nothing"))
        lines += [f"    {line}" for line in said]
    return lines


def _isa_words(isa: list[str]) -> str:
    """A cell's ISA in a few words: its vector and SIMD features (what a claim turns on), not
    its cpuinfo's flags from the first (``fpu vme de pse``...); --json has them all."""
    from device_loop.core.ab.fingerprint import notable_isa

    notable = notable_isa(isa)
    return (f"ISA {' '.join(notable[:12])}" if notable else "no vector ISA") + f" ({len(isa)} features)"


def _job_text(job: JobView) -> str:
    lines = [f"{job.id}: {job.state}" + (f" ({job.reason})" if job.reason else ""),
             f"  {_what(job.spec)}; owner {job.owner} ({job.kind}), worker {job.worker or '-'}",
             f"  created {_when(job.created_at)}, started {_when(job.started_at)}, ended {_when(job.ended_at)}"]
    for cell in job.cells:
        where = cell.device or "-"
        isa = _isa_words(cell.fingerprint.isa) if cell.fingerprint else ""
        lines.append(f"  cell {cell.cell}{f' {cell.group}' if cell.group else ''}: "
                     + (f"not run: {cell.not_run}" if cell.not_run else f"{where} ({cell.lease_id or '-'})"
                        + (f" {isa}" if isa else "")))
    warmup = sum(r.warmup for r in job.runs)
    failed = sum(1 for r in job.runs if r.status != 0)
    lines.append(f"  runs: {len(job.runs)} ({warmup} warmup, {failed} failed)")
    lines += _outputs(job.runs)
    if job.runs:
        from device_loop.core.ab import evidence

        lines.append(evidence.terminal_table(analysis_of(job), job))
    lines.append(f"evidence: device-loop job evidence {job.id} > evidence.md")
    return "\n".join(lines)


@job_group.command("show")
@click.argument("job_id", metavar="ID")
@json_option
@lab_command
def job_show_command(lab: Lab, job_id: str, as_json: bool):
    """A job: its state, cells, runs and table."""
    if as_json:
        emit(True, lab.api.get(f"/jobs/{job_id}"), str)
        return
    click.echo(_job_text(lab.jobs.get(job_id)))


@job_group.command("evidence")
@click.argument("job_id", metavar="ID")
@click.option("--plot", type=click.Path(dir_okay=False), help="also draw the runs as a chart (PNG), linked from it")
@ci_options
@lab_command
def job_evidence_command(lab: Lab, job_id: str, plot: str | None, as_json: bool, junit_file: Path | None,
                         markdown_file: Path | None):
    """The job's evidence as one markdown, for a pull request or a review: device-loop job
    evidence ID > evidence.md"""
    check_distinct(junit_file, markdown_file)
    markdown = lab.jobs.evidence(job_id)
    if junit_file is not None or markdown_file is not None:
        write_job_results(lab.api.url, lab.jobs.get(job_id), junit_file, markdown_file, markdown)
    if plot:
        from device_loop.core.ab import charts

        job = lab.jobs.get(job_id)
        charts.png(job, analysis_of(job), plot)
        markdown = markdown.rstrip("\n") + f"\n\n![the runs of {job.id} over time, with temperature]({plot})\n"
    click.echo(markdown, nl=not markdown.endswith("\n"))


@job_group.command("rm")
@click.argument("job_id", metavar="ID")
@json_option
@lab_command
def job_rm_command(lab: Lab, job_id: str, as_json: bool):
    """Delete an ended job (done, failed or cancelled) with its runs, for good: they no longer
    count against your stored runs (the lab's --max-stored-runs)."""
    gone = lab.jobs.delete(job_id)
    emit(as_json, gone, lambda _: f"{job_id}: deleted ({gone['runs']} runs)")


@job_group.command("cancel")
@click.argument("job_id", metavar="ID")
@json_option
@lab_command
def job_cancel_command(lab: Lab, job_id: str, as_json: bool):
    """Cancel a queued or running job: its leases are released at once, and its worker stops
    at its next beat (within seconds), killing the command it runs."""
    job = lab.jobs.cancel(job_id)
    emit(as_json, job.model_dump(mode="json", by_alias=True), lambda _: f"{job.id}: {job.state} ({job.reason})")

