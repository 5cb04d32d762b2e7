"""Jobs, written once (docs/architecture.md, "Jobs and evidence"): what a job file says
(``JobSpec``), what a worker reports of each run (``RunRecord``) and of each device
(``CellReport``, with its ``Fingerprint``), and the readings taken at a run's start.

The worker, the coordinator (which stores and checks them), the analysis and the evidence
markdown all use these models; unknown fields are refused and every string and list is
bounded, as everywhere on the wire: a job spec comes from a user or an agent, a run from
a worker whose token can be stolen.

REST (coordinator/calls.py declares each once, for REST, MCP and OpenAPI):

- ``POST /api/v1/jobs`` ``{spec, claim}``: submit; ``claim=true`` (``device-loop run``)
  makes the caller its worker at once, else it waits for a ``device-loop worker``.
- ``GET /api/v1/jobs[?all=1]``, ``GET /api/v1/jobs/{id}[?wait=S&unless=STATE]``
- ``POST /api/v1/jobs/claim`` ``{users, wait_s}``: a worker takes the oldest queued job of
  the users it serves (its own by default; others only for an admin's token).
- ``POST /api/v1/jobs/{id}/beat``: the worker is alive (past ``job_worker_timeout`` the
  reaper fails the job, "worker lost", and releases its leases).
- ``POST /api/v1/jobs/{id}/reserve`` ``{cell, device | class, tags, exclude}``: a ticket (or a
  lease) for one cell, held by the job's owner, of the kind of whoever submitted it.
- ``POST /api/v1/jobs/{id}/cells`` ``CellReport``; ``POST /api/v1/jobs/{id}/runs`` ``RunRecord``
- ``POST /api/v1/jobs/{id}/finish`` ``{state, reason}``; ``POST /api/v1/jobs/{id}/cancel``
- ``GET /api/v1/jobs/{id}/evidence`` (text/markdown)
"""
from __future__ import annotations

import functools
import re
from enum import StrEnum
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from . import regex_cost
from ..needs import MAX_FALLBACK_AFTER_S, Need, check, fidelity_text, timing_note
from ..protocol import MAX_FACTS, FactKey, Tag
from ..vocabulary import Arm, FailureKind, Fidelity, JobState, Needs, TicketKind

MAX_COMMANDS = 16        # in one list (setup, run, baseline, patch)
MAX_COMMAND_CHARS = 2000
MAX_METRICS = 16         # declared by a job, and reported by one run
MAX_ROUNDS = 200         # of an A/B pair, warmup included, --until-decided's last look included
MAX_CELLS = 16           # of a matrix
MAX_WARMUP = 20          # AB blocks of an A/B pair run first and discarded
MAX_RUNS = MAX_CELLS * 2 * (MAX_WARMUP + MAX_ROUNDS)  # of a job: every cell's runs_per_cell at their most
MAX_TEXT_CHARS = 4000    # of a fingerprint field, an output tail, a reason
SHOWN_LINE_CHARS = 200   # of a line of a run's output, where its last lines are shown
MAX_RETRY = 5            # a job's retry: the times a cell's lab failure starts again on another device
MAX_ATTEMPTS = MAX_RETRY + 1  # of one cell
#: The latest time a run may say it started or ended (2100-01-01, in seconds since 1970):
#: every time a person may read is between 0 and this.
LATEST_TIME_S = 4102444800.0


class Better(StrEnum):
    LOWER = "lower"
    HIGHER = "higher"


class Order(StrEnum):
    ABAB = "abab"      # A then B in every block
    RANDOM = "random"  # a random order within each AB block (seeded: the spec records the seed)
    AABB = "aabb"      # every A, then every B: only to show what interleaving protects from


class Verdict(StrEnum):
    DIFFERENT = "different"
    SAME = "same"
    UNKNOWN = "unknown"


Text = Annotated[str, StringConstraints(max_length=MAX_TEXT_CHARS)]
Command = Annotated[str, StringConstraints(min_length=1, max_length=MAX_COMMAND_CHARS)]
Commands = Annotated[list[Command], Field(max_length=MAX_COMMANDS)]
MetricName = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_.:-]{0,63}$")]
Unit = Annotated[str, StringConstraints(max_length=16)]


Time = Annotated[float, Field(ge=0, le=LATEST_TIME_S)]
#: A measured number, and a temperature: finite, and bounded so that the analysis's sums and
#: squares of thousands of them stay finite too (1.7e308 twice overflowed a mean: a 500 on
#: every view of its job)
MAX_MEASURE = 1e100
Measure = Annotated[float, Field(ge=-MAX_MEASURE, le=MAX_MEASURE)]
COLDEST_C, HOTTEST_C = -273.15, 1000.0
Celsius = Annotated[float, Field(ge=COLDEST_C, le=HOTTEST_C)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


class MetricSpec(Strict):
    """Where one metric comes from: JSON lines on stdout (``{"metric": NAME, "value": V}``),
    unless ``regex`` is given: a regular expression with a group named ``value``."""
    name: MetricName
    better: Better = Better.LOWER
    unit: Unit = ""
    regex: Annotated[str, StringConstraints(max_length=500)] | None = None

    @field_validator("regex")
    @classmethod
    def _has_value_group(cls, regex: str | None) -> str | None:
        if regex is None:
            return regex
        try:
            groups = re.compile(regex).groupindex
        except re.error as exc:  # (not a ValueError: pydantic would let it through as it is)
            raise ValueError(f"a metric's regex is not one: {exc}") from None
        if "value" not in groups:
            raise ValueError("a metric's regex needs a group named value: (?P<value>[0-9.]+)")
        return regex


#: The CPU a worker gives a metric's regex over each MiB of output it reads (and over less).
METRIC_CPU_S_PER_MIB = 1.0
#: The places of a metric's regex that may be matching at once (``regex_cost``): at most 12
#: cost RE2 0.42 s of CPU a MiB at their worst on a busy 2-core machine, well within the above.
MAX_METRIC_AT_ONCE = 12


class CostlyRegex(ValueError):
    """RE2 takes the regex, but could work too hard at each byte of a run's output."""


@functools.lru_cache(maxsize=256)
def metric_pattern(regex: str) -> Any:
    """A metric's regex as RE2 reads it, in time linear in the text whatever the regex
    (Python's ``re`` can take exponential time, and a job's regex is its owner's to write);
    ``ValueError`` saying why RE2 does not take it (lookarounds and backreferences, for
    instance), or why it is no metric's (no group named ``value``); ``CostlyRegex`` where
    RE2's work at each byte could be too much (too many places matching at once)."""
    import re2

    options = re2.Options()
    options.log_errors = False  # (RE2 would print each refusal on stderr)
    try:
        pattern = re2.compile(regex, options=options)
    except re2.error as exc:
        said = exc.args[0] if exc.args else exc
        raise ValueError(said.decode(errors="replace") if isinstance(said, bytes) else str(said)) from None
    if "value" not in pattern.groupindex:
        raise ValueError("it needs a group named value: (?P<value>[0-9.]+)")
    if pattern.search("") is not None:  # (it would match at every character of the output: seconds a MiB)
        raise ValueError("it matches empty text, so at every place in the output: make its value need a "
                         "character, (?P<value>[0-9.]+) rather than (?P<value>[0-9.]*)")
    try:
        at_once = regex_cost.at_once(regex, MAX_METRIC_AT_ONCE)
    except regex_cost.Unbounded as exc:
        raise CostlyRegex(str(exc)) from None
    if at_once > MAX_METRIC_AT_ONCE:
        raise CostlyRegex(f"as many as {at_once} of its places (a character, a class or a ., each copy of a "
                          f"repetition counted) may be matching at once, and it works at each byte for each: at "
                          f"most {MAX_METRIC_AT_ONCE} may be; repeat less, or use fewer .*")
    return pattern


def metric_regex_refusal(metric: MetricSpec) -> str | None:
    """Why a worker does not read ``metric``'s regex (the coordinator refuses the job), or None."""
    if metric.regex is None:
        return None
    try:
        metric_pattern(metric.regex)
    except CostlyRegex as exc:
        return f"metric {metric.name}: a worker reads its regex with RE2, which would work too hard at it: {exc}"
    except ValueError as exc:
        return f"metric {metric.name}: a worker reads its regex with RE2, which does not take it: {exc}"
    return None


class Target(Strict):
    """What a job (or a matrix cell) runs on: one device by name, or any of a class/tags."""
    device: Annotated[str, StringConstraints(max_length=64)] | None = None
    device_class: Annotated[str, StringConstraints(max_length=64)] | None = Field(default=None, alias="class")
    tags: Annotated[list[Tag], Field(max_length=16)] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_way(self) -> Target:
        if self.device and (self.device_class or self.tags):
            raise ValueError("give a device, or a class and/or tags, not both")
        return self


class ABSpec(Strict):
    """An A/B pair on one device: ``baseline`` and ``patch`` interleaved, ``settle`` between runs."""
    baseline: Commands = Field(min_length=1)
    patch: Commands = Field(min_length=1)
    rounds: int = Field(default=10, ge=1, le=MAX_ROUNDS)    # A and B runs each, warmup not counted
    warmup: int = Field(default=1, ge=0, le=MAX_WARMUP)     # AB blocks run first and discarded
    order: Order = Order.ABAB
    settle: bool = True                                     # the device's settle steps before every run
    until_decided: bool = False                             # more looks at rounds*2, *4 … up to max_rounds
    max_rounds: int | None = Field(default=None, ge=1, le=MAX_ROUNDS)
    alpha: float = Field(default=0.05, gt=0, lt=0.5)
    same_within: float = Field(default=0.02, gt=0, lt=1)    # "same" rules out a change this large (2 %)
    governor: Annotated[str, StringConstraints(max_length=32)] | None = None  # a run on another is marked
    seed: int = Field(default=0, ge=0, le=2**32 - 1)


class MatrixSpec(Strict):
    """The same pair over device groups: each ``over`` item is ``tags=a,b``, ``class=C`` or ``device=D``."""
    over: Annotated[list[Annotated[str, StringConstraints(min_length=3, max_length=200)]],
                    Field(min_length=1, max_length=MAX_CELLS)]
    wait_s: float = Field(default=300, ge=0, le=86400)      # a cell with no device waits this long, then "not run"


def looks(ab: ABSpec) -> list[int]:
    """The rounds at which a worker looks at the analysis, fixed before the first run:
    ``rounds``, then (with ``until_decided``) doubled while <= ``max_rounds`` (4×rounds when
    not given), and ``max_rounds`` itself last (docs/architecture.md, "The A/B analysis")."""
    if not ab.until_decided:
        return [ab.rounds]
    last = min(ab.max_rounds or 4 * ab.rounds, max(ab.rounds, MAX_ROUNDS - ab.warmup))
    points = [ab.rounds]
    while points[-1] * 2 <= last:
        points.append(points[-1] * 2)
    if points[-1] < last:
        points.append(last)
    return points


def runs_per_cell(spec: JobSpec) -> int:
    """The most runs a cell of ``spec`` reports: a run is one round of a plain job's
    commands, or one arm of an A/B pair (its commands in turn), warmup blocks and the last
    look included."""
    if spec.ab is None:
        return spec.rounds
    return 2 * (spec.ab.warmup + looks(spec.ab)[-1])


GROUP_KEYS = ("tags", "class", "device")


def group_target(group: str, base: Target) -> Target:
    """The target of a matrix group, ``tags=a,b``, ``class=C`` or ``device=D``: it replaces
    that part of the job's own target (``tags=`` keeps its class, ``class=`` its tags, a
    device stands alone). Raises ``ValueError`` saying what is wrong with it."""
    key, sep, value = group.partition("=")
    key, value = key.strip(), value.strip()
    if not sep or key not in GROUP_KEYS or not value:
        raise ValueError(f"a matrix group is tags=a,b, class=C or device=D, not {group!r}")
    if key == "device":
        return Target(device=value)
    if base.device:
        raise ValueError(f"the job names a device ({base.device}): a group {group!r} cannot narrow it")
    if key == "class":
        return Target.model_validate({"class": value, "tags": base.tags})
    tags = [t.strip() for t in value.split(",") if t.strip()]
    if not tags:
        raise ValueError(f"the group {group!r} names no tag")
    return Target.model_validate({"class": base.device_class, "tags": tags})


class JobSpec(Strict):
    """A job file (TOML) or the flags of ``run``/``ab``/``matrix``: the whole of what was asked."""
    title: Annotated[str, StringConstraints(max_length=200)] = ""
    target: Target = Field(default_factory=Target)
    needs: Needs = Needs.REAL_HW                              # what its cells' leases may be (core/needs.py)
    fallback: Needs | None = None                            # with needs "any": real-hw after the wait
    fallback_after_s: float | None = Field(default=None, ge=0, le=MAX_FALLBACK_AFTER_S)
    setup: Commands = Field(default_factory=list)            # once per device, after the lease, before the runs
    run: Commands = Field(default_factory=list)              # a plain job's commands, each round
    rounds: int = Field(default=1, ge=1, le=MAX_ROUNDS)      # of a plain job
    metrics: Annotated[list[MetricSpec], Field(max_length=MAX_METRICS)] = Field(default_factory=list)
    ab: ABSpec | None = None
    matrix: MatrixSpec | None = None
    command_timeout_s: float = Field(default=600, gt=0, le=86400)
    lease_ttl_s: float = Field(default=3600, ge=60, le=86400)
    # a cell whose attempt ended in a lab failure starts again on another matching device,
    # at most this many times (docs/architecture.md, "Lab failures")
    retry: int = Field(default=0, ge=0, le=MAX_RETRY)

    @model_validator(mode="after")
    def _something_to_run(self) -> JobSpec:
        if not self.run and self.ab is None:
            raise ValueError("a job runs something: give run = [...] or an [ab] table")
        if self.run and self.ab is not None:
            raise ValueError("give run = [...] or an [ab] table, not both")
        if self.matrix is not None and self.ab is None:
            raise ValueError("a matrix expands an A/B pair: it needs an [ab] table")
        for group in self.matrix.over if self.matrix else ():
            group_target(group, self.target)  # refused here, not when a worker runs it
        check(self.needs, self.fallback, self.fallback_after_s)
        return self

    @property
    def need(self) -> Need:
        """What its cells' leases may be."""
        return Need(self.needs, self.fallback, self.fallback_after_s)


class Sample(Strict):
    metric: MetricName
    value: Measure
    unit: Unit = ""


class Readings(Strict):
    """The device at a run's start, so a reader sees drift and what interleaving did."""
    temperatures: Annotated[dict[Annotated[str, StringConstraints(max_length=64)], Celsius],
                            Field(max_length=MAX_FACTS)] = Field(default_factory=dict)
    governor: Annotated[str, StringConstraints(max_length=32)] | None = None
    freq_khz: int | None = Field(default=None, ge=0, le=10**9)
    load: float | None = Field(default=None, ge=0, le=1e6)  # 1-minute load average
    unfit: Text | None = None     # why the device was not fit to measure (a zone too hot, another governor)


Attempt = Annotated[int, Field(ge=0, le=MAX_RETRY)]


class RunRecord(Strict):
    cell: int = Field(default=0, ge=0, lt=MAX_CELLS)
    attempt: Attempt = 0                           # of its cell, from 0: a retry starts the cell again
    seq: int = Field(ge=0, lt=MAX_RUNS)            # its place in its attempt's order, warmup included
    arm: Arm
    warmup: bool = False
    started_at: Time
    ended_at: Time
    status: int = Field(ge=-255, le=255)           # the command's exit status (negative: a signal)
    readings: Readings = Field(default_factory=Readings)
    samples: Annotated[list[Sample], Field(max_length=MAX_METRICS)] = Field(default_factory=list)
    output_tail: Text = ""                         # the end of stdout+stderr, for a failed run's reason
    failure: FailureKind | None = None             # whose failure a failed run was (None: it did not fail)

    def last_lines(self, count: int, chars: int = SHOWN_LINE_CHARS) -> list[str]:
        """What it printed last: its output's last ``count`` lines, each cut at ``chars``
        (``job show``, the job's page and the evidence say them)."""
        return [line[:chars] for line in self.output_tail.rstrip("\n").splitlines()[-count:]]


class Fingerprint(Strict):
    """What a reviewer needs to judge a number measured on a device (``device-loop fingerprint``)."""
    device: Annotated[str, StringConstraints(max_length=64)]
    device_class: Annotated[str, StringConstraints(max_length=64)] = Field(default="", alias="class")
    host: Annotated[str, StringConstraints(max_length=255)] = ""
    channel: Literal["adb", "ssh", "console", ""] = ""   # how exec reached it
    kernel: Text = ""
    cpu_model: Text = ""
    isa: Annotated[list[Annotated[str, StringConstraints(max_length=32)]], Field(max_length=512)] = \
        Field(default_factory=list)
    cores: int | None = Field(default=None, ge=0, le=1 << 20)
    online: Annotated[str, StringConstraints(max_length=200)] = ""   # "0-7"
    cpufreq: Annotated[list[dict[Annotated[str, StringConstraints(max_length=32)],
                                 Annotated[str, StringConstraints(max_length=64)]]],
                       Field(max_length=64)] = Field(default_factory=list)  # per policy: governor, cur/min/max kHz
    thermal: Annotated[dict[Annotated[str, StringConstraints(max_length=64)], Celsius],
                       Field(max_length=MAX_FACTS)] = Field(default_factory=dict)
    memory_kb: int | None = Field(default=None, ge=0, le=1 << 50)
    os_build: Text = ""                               # ro.build.fingerprint on Android
    image: Annotated[str, StringConstraints(max_length=255)] = ""     # the image last flashed
    image_sha256: Annotated[str, StringConstraints(max_length=64)] = ""
    device_loop_version: Annotated[str, StringConstraints(max_length=64)] = ""
    emulated: bool = False                            # "not for timing" (its fidelity is in NOT_FOR_TIMING)
    fidelity: Fidelity | None = None                  # what it is (None: a fingerprint from before it was recorded)
    fidelity_detail: Annotated[str, StringConstraints(max_length=64)] = ""  # how: TCG, KVM (its plugin's fact)
    extra: Annotated[dict[FactKey, Text], Field(max_length=MAX_FACTS)] = Field(default_factory=dict)  # plugins'

    @property
    def what(self) -> str:
        """``emulated (TCG)``: its fidelity, and how where its plugin said ("" when not recorded)."""
        return fidelity_text(self.fidelity, self.fidelity_detail)

    @property
    def timing_note(self) -> str:
        """``emulated (TCG): not for timing`` where its numbers are not for timing, else empty (a
        fingerprint from before fidelity was recorded: by its ``emulated``)."""
        if self.fidelity is None:
            return "emulated: not for timing" if self.emulated else ""
        return timing_note(self.fidelity, self.fidelity_detail)


class CellReport(Strict):
    """One attempt of one cell (a plain job or A/B pair has one cell: 0; a cell has one
    attempt, 0, unless a lab failure made the worker start it again on another device) as
    its worker saw it."""
    cell: int = Field(ge=0, lt=MAX_CELLS)
    attempt: Attempt = 0
    group: Annotated[str, StringConstraints(max_length=200)] = ""     # the matrix's "tags=sve2"
    device: Annotated[str, StringConstraints(max_length=64)] | None = None
    lease_id: Annotated[str, StringConstraints(max_length=64)] | None = None
    fingerprint: Fingerprint | None = None
    not_run: Text | None = None                      # "no device" after the wait, or why it never began
    failure: FailureKind | None = None               # whose failure ended this attempt (None: it did not fail)
    reason: Text = ""                                # why it failed, in words


class JobSummary(Strict):
    """A job as listings show it (and a worker's beat answers): no spec, cells or runs."""
    id: str
    owner: str
    kind: TicketKind
    state: JobState
    reason: Text = ""
    title: Annotated[str, StringConstraints(max_length=200)] = ""
    needs: Needs | None = None                       # what its cells' leases may be (its spec's)
    fallback: Needs | None = None
    created_at: float
    started_at: float | None = None
    ended_at: float | None = None
    worker: Annotated[str, StringConstraints(max_length=200)] | None = None

    @classmethod
    def of(cls, answer: Mapping[str, Any]) -> JobSummary:
        """From a coordinator's answer, leaving out what a newer one may add."""
        return cls.model_validate({k: answer[k] for k in cls.model_fields if k in answer})


class JobView(Strict):
    """A job as the coordinator answers it (``GET /api/v1/jobs/{id}``) and as the analysis,
    the evidence markdown and the charts read it."""
    id: str
    owner: str
    kind: TicketKind                                 # of its tickets: batch when an agent submitted it
    state: JobState
    reason: Text = ""
    spec: JobSpec
    created_at: float
    started_at: float | None = None
    ended_at: float | None = None
    worker: Annotated[str, StringConstraints(max_length=200)] | None = None
    cells: Annotated[list[CellReport], Field(max_length=MAX_CELLS * MAX_ATTEMPTS)] = Field(default_factory=list)
    runs: Annotated[list[RunRecord], Field(max_length=MAX_RUNS * MAX_ATTEMPTS)] = Field(default_factory=list)
    coordinator_version: Annotated[str, StringConstraints(max_length=64)] = ""

    def last_attempts(self) -> tuple[list[CellReport], list[RunRecord]]:
        """Each cell's last attempt: its report and its runs (what the analysis reads)."""
        return last_attempts(self.cells, self.runs)

    def failure(self) -> FailureKind | None:
        """Whose failure a job that did not end ``done`` was, from each cell's last attempt: the
        test's (or a timeout) when any of its cells or runs failed so, else the lab's when one
        failed for the lab, else None (cancelled, or nothing says). ``device-loop run`` exits
        75 for the lab's (docs/architecture.md, "Lab failures")."""
        cells, runs = self.last_attempts()
        said = {c.failure for c in cells} | {r.failure for r in runs}
        for kind in (FailureKind.TEST, FailureKind.TIMEOUT, FailureKind.LAB):
            if kind in said:
                return kind
        return None


def last_attempts(cells: list[CellReport], runs: list[RunRecord]) -> tuple[list[CellReport], list[RunRecord]]:
    """Of a job's cell reports and runs, those of each cell's last attempt (docs/architecture.md,
    "Lab failures": the analysis reads each cell's last attempt; the evidence lists them all)."""
    last: dict[int, int] = {}
    for cell, attempt in [(c.cell, c.attempt) for c in cells] + [(r.cell, r.attempt) for r in runs]:
        last[cell] = max(last.get(cell, 0), attempt)
    return ([c for c in cells if c.attempt == last[c.cell]], [r for r in runs if r.attempt == last[r.cell]])


UNTITLED_CHARS = 80  # what a job without a title is listed as: the start of what it runs


def shown_title(spec: Mapping[str, Any]) -> str:
    """A job spec's (as JSON) title, else what it runs: ``A/B: BASELINE vs PATCH``, or its
    first command (at most ``UNTITLED_CHARS``)."""
    if spec.get("title"):
        return str(spec["title"])
    ab = spec.get("ab") or {}
    if ab.get("baseline") and ab.get("patch"):
        said = f"A/B: {ab['baseline'][0]} vs {ab['patch'][0]}"
    else:
        said = (spec.get("run") or ["(nothing to run)"])[0]
    return said if len(said) <= UNTITLED_CHARS else said[:UNTITLED_CHARS - 1] + "…"
