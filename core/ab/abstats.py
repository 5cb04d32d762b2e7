"""The A/B analysis (docs/architecture.md, "The A/B analysis"): from a job's stored runs,
per cell and metric, the medians of A and B, the ratio B/A with its interval, a
Mann-Whitney U p-value adjusted by Holm-Bonferroni across the job, and a verdict.

Methods, chosen once here:

- **Spread** (``±``): as benchstat, the half-width of the distribution-free 95 % interval of
  the median (order statistics), the larger side, as a percentage of the median; it needs
  6 runs a side, and is unknown (``∞``) below.
- **Ratio B/A**: the Hodges-Lehmann estimate on log values (the median of every
  ``log b - log a``), with its distribution-free interval at ``1 - α`` from the exact null
  distribution of U (ties are rare in timings and ignored there). A metric with a value
  <= 0 is compared by its shift ``b - a`` the same way instead.
- **p**: ``scipy.stats.mannwhitneyu``, two-sided: exact when neither arm has ties and the
  arms are small (m·n <= 400), else the normal approximation with continuity correction.
  Holm-Bonferroni over every metric × cell of the job.
- **Verdict**: *different* when the interval excludes 1 and the adjusted p < α (first:
  a real change smaller than ``same_within`` is still a change); *same* when the interval
  lies within ``[1 - same_within, 1 + same_within]`` (so a change of that size is ruled
  out at ``1 - α``); else *unknown*, with the rounds more that would make the interval
  narrow enough for either, its half-width taken to shrink as 1/sqrt(n).
- **Drift**: Spearman's ρ of value against run order within each arm, and each arm's mean
  start temperature (the hottest zone): drift there, and whether interleaving shared it.

``--until-decided`` looks at ``looks(ab)`` only, each at ``alpha_per_look(ab)``.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

import numpy as np
from scipy import stats

from device_loop.core.ab.jobs import (MAX_ROUNDS, ABSpec, Better, CellReport, JobSpec, RunRecord, Verdict,
                                      last_attempts, looks)
from device_loop.core.vocabulary import Arm

SPREAD_CONFIDENCE = 0.95
EXACT_P_MAX_PAIRS = 400
TIME_UNITS = {"ns", "us", "µs", "ms", "s", "sec", "secs", "min", "h"}
MORE_ROUNDS_CAP = 100_000
HL_RATIO = "Hodges-Lehmann ratio of B/A on log values, distribution-free interval"
HL_SHIFT = "Hodges-Lehmann shift B - A, distribution-free interval"


@dataclass(frozen=True)
class Summary:
    """One arm's values of one metric."""
    n: int
    median: float | None = None
    low: float | None = None      # the 95 % interval of the median, when n allows one
    high: float | None = None

    @property
    def spread_pct(self) -> float | None:
        """benchstat's ±: the interval's larger half as % of the median (None: unknown)."""
        if self.median is None or self.low is None or self.high is None or self.median == 0:
            return None
        return max(self.median - self.low, self.high - self.median) / abs(self.median) * 100


@dataclass(frozen=True)
class Drift:
    """Whether values moved with run order, per arm, and each arm's mean start temperature."""
    rho_a: float | None = None
    p_a: float | None = None
    rho_b: float | None = None
    p_b: float | None = None
    temp_a: float | None = None
    temp_b: float | None = None


@dataclass(frozen=True)
class Comparison:
    """B against A on one metric of one cell."""
    scale: Literal["ratio", "shift"]
    method: str
    estimate: float                 # the ratio B/A, or the shift B - A
    low: float | None               # its interval at the analysis' confidence; None: too few runs
    high: float | None
    p: float
    p_holm: float
    verdict: Verdict
    words: str                      # "B is 5.1% faster", "same within ±2%", "collect more: ..."
    more_rounds: int | None = None  # for unknown
    regressed: bool = False         # different, and the worse way: B slower or worse than A


@dataclass(frozen=True)
class MetricResult:
    name: str
    unit: str
    better: Better
    a: Summary                      # a plain job's only arm
    b: Summary | None = None
    comparison: Comparison | None = None
    drift: Drift = field(default_factory=Drift)
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class CellAnalysis:
    cell: int
    group: str
    device: str | None
    not_run: str | None
    counted: int                    # runs analysed: not warmup, status 0
    warmup: int
    failed: int
    unfit: int                      # of the counted runs, those marked unfit to measure
    metrics: tuple[MetricResult, ...]
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class Analysis:
    ab: bool
    alpha: float
    confidence: float
    same_within: float | None
    method: str                     # in words, for the evidence
    cells: tuple[CellAnalysis, ...]

    def comparisons(self) -> Iterator[tuple[CellAnalysis, MetricResult, Comparison]]:
        """Every comparison of the job, cell by cell, metric by metric."""
        for cell in self.cells:
            for metric in cell.metrics:
                if metric.comparison is not None:
                    yield cell, metric, metric.comparison


# --- the sequential schedule --------------------------------------------------------------------

def alpha_per_look(ab: ABSpec) -> float:
    """α split evenly over the looks (Bonferroni): the chance of any false "different"
    over all looks stays below ``ab.alpha``."""
    return ab.alpha / len(looks(ab))


def decided(analysis: Analysis) -> bool:
    """Whether every comparison of every cell that ran is different or same."""
    verdicts = [c.verdict for _, _, c in analysis.comparisons()]
    return bool(verdicts) and all(v is not Verdict.UNKNOWN for v in verdicts)


# --- statistics on plain numbers ------------------------------------------------------------------

@lru_cache(maxsize=256)
def u_cdf(m: int, n: int) -> np.ndarray:
    """P(U <= u), u = 0..m·n, of the Mann-Whitney U statistic under the null hypothesis,
    without ties: the Gaussian binomial coefficient [m+n, m]_q's coefficients, normalised."""
    if m > n:
        m, n = n, m
    size = m * n + 1
    poly = np.zeros(size)
    poly[0] = 1.0
    for i in range(1, m + 1):
        shift = n + i
        if shift < size:
            poly[shift:] -= poly[:size - shift].copy()
        # divide by (1 - q^i): a running sum within each residue class mod i
        padded = np.zeros(-(-size // i) * i)
        padded[:size] = poly
        poly = np.cumsum(padded.reshape(-1, i), axis=0).ravel()[:size]
    cdf = np.cumsum(poly)
    result: np.ndarray = cdf / cdf[-1]
    return result


def smallest_p(m: int, n: int) -> float:
    """The smallest two-sided p-value Mann-Whitney U can give for m and n runs."""
    return min(1.0, 2 / math.comb(m + n, m)) if m and n else 1.0


def least_runs(alpha: float) -> int:
    """The fewest runs a side with which U can give a p below ``alpha``."""
    n = 1
    while smallest_p(n, n) >= alpha and n < MAX_ROUNDS:
        n += 1
    return n


def least_for_median_interval(confidence: float = SPREAD_CONFIDENCE) -> int:
    """The fewest runs with which the median has a distribution-free interval at ``confidence``."""
    return math.ceil(math.log2(2 / (1 - confidence)) - 1e-9)


def median_interval(values: list[float], confidence: float = SPREAD_CONFIDENCE) -> tuple[float, float] | None:
    """The order-statistic interval of the median: [x_(k), x_(n-k+1)] with the largest k
    whose coverage is at least ``confidence``; None when n is too small for one."""
    n = len(values)
    if n == 0:
        return None
    tail = (1 - confidence) / 2
    k = int(np.sum(stats.binom.cdf(np.arange(n), n, 0.5) <= tail + 1e-12))
    if k == 0:
        return None
    ordered = sorted(values)
    return ordered[k - 1], ordered[n - k]


def summary(values: list[float]) -> Summary:
    """n, median and the 95 % interval of the median."""
    if not values:
        return Summary(0)
    interval = median_interval(values)
    return Summary(len(values), statistics.median(values), *(interval or (None, None)))


def hodges_lehmann(x: list[float], y: list[float], confidence: float) -> tuple[float, float | None, float | None]:
    """The Hodges-Lehmann shift of y against x (the median of every y_j - x_i) and its
    distribution-free interval at ``confidence`` (None, None when the sizes are too small)."""
    diffs = np.sort((np.asarray(y)[:, None] - np.asarray(x)[None, :]).ravel())
    estimate = float(np.median(diffs))
    cdf = u_cdf(len(x), len(y))
    k = int(np.sum(cdf <= (1 - confidence) / 2 + 1e-12))
    if k == 0:
        return estimate, None, None
    return estimate, float(diffs[k - 1]), float(diffs[len(diffs) - k])


def mann_whitney_p(a: list[float], b: list[float]) -> float:
    """The two-sided Mann-Whitney U p-value of B against A."""
    if len(set(a) | set(b)) == 1:      # every value the same: nothing to rank
        return 1.0
    exact = len(set(a) | set(b)) == len(a) + len(b) and len(a) * len(b) <= EXACT_P_MAX_PAIRS
    result = stats.mannwhitneyu(b, a, alternative="two-sided", method="exact" if exact else "asymptotic")
    p = float(result.pvalue)
    return p if math.isfinite(p) else 1.0


def holm(pvalues: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the order given."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted = [1.0] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def spearman(x: list[float], y: list[float]) -> tuple[float | None, float | None]:
    """Spearman's ρ and its p-value; None when there are fewer than 3 values or one is constant."""
    if len(x) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return None, None
    result = stats.spearmanr(x, y)
    rho, p = float(result.statistic), float(result.pvalue)
    return (rho, p) if math.isfinite(rho) and math.isfinite(p) else (None, None)


# --- words -------------------------------------------------------------------------------------

def is_time(unit: str) -> bool:
    """Whether a unit measures time (so lower is "faster")."""
    return unit.strip().lower() in TIME_UNITS


def improved(estimate: float, scale: Literal["ratio", "shift"], better: Better) -> bool:
    """Whether B moved the good way: a ratio B/A below 1 (a shift below 0) where lower is
    better, above where higher is."""
    neutral = 1.0 if scale == "ratio" else 0.0
    return estimate < neutral if better is Better.LOWER else estimate > neutral


def change_words(ratio: float, better: Better, unit: str) -> str:
    """``B is 5.1% faster`` for a time that dropped; ``better``/``worse`` for anything else,
    as ``better`` says which way is good."""
    is_better = improved(ratio, "ratio", better)
    if is_time(unit) and better is Better.LOWER:
        word = "faster" if is_better else "slower"
    else:
        word = "better" if is_better else "worse"
    return f"B is {abs(ratio - 1) * 100:.1f}% {word}"


def shift_words(shift: float, better: Better, unit: str) -> str:
    """``B is 3.2 ms lower (better)``, for a metric compared by its shift."""
    unit_text = f" {unit}" if unit else ""
    direction = "lower" if shift < 0 else "higher"
    return f"B is {abs(shift):.4g}{unit_text} {direction} ({'better' if improved(shift, 'shift', better) else 'worse'})"


# --- one comparison ----------------------------------------------------------------------------

@dataclass(frozen=True)
class _Raw:
    """A comparison before the Holm adjustment, on its working scale (log for ratios)."""
    scale: Literal["ratio", "shift"]
    estimate: float
    low: float | None
    high: float | None
    margin: tuple[float, float] | None      # "same" when the interval is inside it
    p: float
    sigma: float                            # pooled robust spread on the working scale
    m: int
    n: int


def _raw(a: list[float], b: list[float], alpha: float, same_within: float) -> _Raw:
    positive = min(a + b) > 0
    x, y = (np.log(a).tolist(), np.log(b).tolist()) if positive else (a, b)
    estimate, low, high = hodges_lehmann(x, y, 1 - alpha)
    if positive:
        margin: tuple[float, float] | None = (math.log(1 - same_within), math.log(1 + same_within))
    else:
        scale = abs(statistics.median(a))
        margin = (-same_within * scale, same_within * scale) if scale > 0 else None
    deviations = [v - statistics.median(x) for v in x] + [v - statistics.median(y) for v in y]
    sigma = 1.4826 * statistics.median([abs(d) for d in deviations])
    return _Raw("ratio" if positive else "shift", estimate, low, high, margin, mann_whitney_p(a, b), sigma,
                len(a), len(b))


def _more_rounds(raw: _Raw, alpha: float) -> int:
    """About how many more rounds would make the interval narrow enough for a verdict."""
    balanced = 2 / (1 / raw.m + 1 / raw.n)
    if raw.low is not None and raw.high is not None:
        half = (raw.high - raw.low) / 2
    else:  # no interval yet: the normal approximation of the HL estimate's spread
        z = float(stats.norm.ppf(1 - alpha / 2))
        half = z * math.sqrt(math.pi / 3) * raw.sigma * math.sqrt(1 / raw.m + 1 / raw.n)
    targets = [abs(raw.estimate)] if raw.estimate != 0 else []
    if raw.margin is not None:
        room = min(raw.estimate - raw.margin[0], raw.margin[1] - raw.estimate)
        if room > 0:
            targets.append(room)
    needed = [balanced * (half / t) ** 2 for t in targets if t > 0]
    more = math.ceil(min(needed) - balanced) if needed else MORE_ROUNDS_CAP
    floor = least_runs(alpha) - min(raw.m, raw.n)
    return int(min(MORE_ROUNDS_CAP, max(1, floor, more)))


def _compare(raw: _Raw, p_holm: float, alpha: float, better: Better, unit: str, same_within: float) -> Comparison:
    back = math.exp if raw.scale == "ratio" else (lambda v: v)
    low, high = raw.low, raw.high
    excludes = low is not None and high is not None and (low > 0 or high < 0)
    inside = (low is not None and high is not None and raw.margin is not None
              and raw.margin[0] <= low and high <= raw.margin[1])
    estimate = back(raw.estimate)
    more, regressed = None, False
    if excludes and p_holm < alpha:
        verdict = Verdict.DIFFERENT
        words = change_words(estimate, better, unit) if raw.scale == "ratio" else shift_words(estimate, better, unit)
        regressed = not improved(estimate, raw.scale, better)
    elif inside:
        verdict, words = Verdict.SAME, f"same within ±{same_within * 100:g}%"
    else:
        more = _more_rounds(raw, alpha)
        verdict, words = Verdict.UNKNOWN, f"collect more: about {more} more round{'s' if more != 1 else ''}"
    return Comparison(raw.scale, HL_RATIO if raw.scale == "ratio" else HL_SHIFT, estimate,
                      None if low is None else back(low), None if high is None else back(high),
                      raw.p, p_holm, verdict, words, more, regressed)


# --- a job -------------------------------------------------------------------------------------

def run_value(run: RunRecord, metric: str) -> float | None:
    """A run's value of a metric: the median of its samples of it (a run is one observation)."""
    values = [s.value for s in run.samples if s.metric == metric]
    return statistics.median(values) if values else None


def start_temperature(run: RunRecord) -> float | None:
    """The hottest zone at the run's start."""
    return max(run.readings.temperatures.values()) if run.readings.temperatures else None


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _metrics(spec: JobSpec, runs: list[RunRecord]) -> list[tuple[str, str, Better]]:
    """The declared metrics, then those only seen in samples (lower is better, their unit)."""
    units: dict[str, str] = {}
    for run in runs:
        for sample in run.samples:
            units.setdefault(sample.metric, sample.unit)
    declared = [(m.name, m.unit or units.get(m.name, ""), m.better) for m in spec.metrics]
    names = {m.name for m in spec.metrics}
    return declared + [(name, unit, Better.LOWER) for name, unit in units.items() if name not in names]


@dataclass
class _CellWork:
    """A cell while it is analysed: its counted runs and each metric's raw comparison."""
    report: CellReport
    runs: list[RunRecord]
    warmup: int
    failed: int
    metrics: list[tuple[str, str, Better, dict[Arm, list[RunRecord]]]]
    raws: dict[str, _Raw] = field(default_factory=dict)


def _cells(spec: JobSpec, runs: list[RunRecord], cells: list[CellReport]) -> list[CellReport]:
    """Every cell the job has (a matrix's every group, reported or not), by index."""
    over = spec.matrix.over if spec.matrix else []
    reported = {c.cell: c for c in cells}
    indices = sorted(set(range(max(1, len(over)))) | set(reported) | {r.cell for r in runs})
    return [reported.get(i) or CellReport(cell=i, group=over[i] if i < len(over) else "") for i in indices]


def _pct(count: int, of: int) -> str:
    return f"{count} of {of} run{'s' if of != 1 else ''}"


def analyse(spec: JobSpec, runs: list[RunRecord], cells: list[CellReport], alpha: float | None = None) -> Analysis:
    """The analysis of a job's runs (docs/architecture.md, "The A/B analysis"); ``alpha``
    defaults to the spec's, split over its looks when it runs until decided. It reads each
    cell's last attempt (docs/architecture.md, "Lab failures")."""
    cells, runs = last_attempts(cells, runs)
    ab = spec.ab
    alpha = alpha if alpha is not None else (alpha_per_look(ab) if ab else 0.05)
    arms = (Arm.A, Arm.B) if ab else (Arm.RUN,)
    works: list[_CellWork] = []
    metrics = _metrics(spec, runs)
    for report in _cells(spec, runs, cells):
        mine = sorted((r for r in runs if r.cell == report.cell), key=lambda r: r.seq)
        counted = [r for r in mine if not r.warmup and r.status == 0 and r.arm in arms]
        per_metric = []
        for name, unit, better in metrics:
            by_arm = {arm: [r for r in counted if r.arm is arm and run_value(r, name) is not None] for arm in arms}
            per_metric.append((name, unit, better, by_arm))
        works.append(_CellWork(report, counted, sum(r.warmup for r in mine),
                               sum(1 for r in mine if not r.warmup and r.status != 0), per_metric))
    if ab:
        for work in works:
            for name, _, _, by_arm in work.metrics:
                a = [v for r in by_arm[Arm.A] if (v := run_value(r, name)) is not None]
                b = [v for r in by_arm[Arm.B] if (v := run_value(r, name)) is not None]
                if a and b:
                    work.raws[name] = _raw(a, b, alpha, ab.same_within)
    keys = [(w.report.cell, name) for w in works for name in w.raws]
    adjusted = dict(zip(keys, holm([w.raws[name].p for w in works for name in w.raws])))
    result = tuple(_cell(w, spec, alpha, adjusted) for w in works)
    return Analysis(ab is not None, alpha, 1 - alpha, ab.same_within if ab else None,
                    method_words(ab is not None, alpha, len(keys), ab.same_within if ab else None), result)


def _cell(work: _CellWork, spec: JobSpec, alpha: float, adjusted: dict[tuple[int, str], float]) -> CellAnalysis:
    report = work.report
    results = []
    for name, unit, better, by_arm in work.metrics if work.runs or not report.not_run else []:
        values = {arm: [v for r in rs if (v := run_value(r, name)) is not None] for arm, rs in by_arm.items()}
        if not any(values.values()) and name not in {m.name for m in spec.metrics}:
            continue
        first = Arm.A if spec.ab else Arm.RUN
        drift_a = spearman([float(r.seq) for r in by_arm[first]], values[first])
        temps = {arm: [t for r in rs if (t := start_temperature(r)) is not None] for arm, rs in by_arm.items()}
        warnings = []
        if not any(values.values()):
            warnings.append(f"no samples of {name}")
        if spec.ab:
            drift_b = spearman([float(r.seq) for r in by_arm[Arm.B]], values[Arm.B])
            drift = Drift(*drift_a, *drift_b, _mean(temps[Arm.A]), _mean(temps[Arm.B]))
            m, n = len(values[Arm.A]), len(values[Arm.B])
            if any(values.values()) and smallest_p(m, n) >= alpha:
                least = least_runs(alpha)
                warnings.append(f"too few runs for the test ever to decide: {m}+{n} runs cannot give p below "
                                f"{alpha:.3g} (the smallest is {smallest_p(m, n):.3g}); {least}+{least} is the least")
            raw = work.raws.get(name)
            comparison = None if raw is None else _compare(raw, adjusted[(report.cell, name)], alpha, better,
                                                           unit, spec.ab.same_within)
            results.append(MetricResult(name, unit, better, summary(values[Arm.A]), summary(values[Arm.B]),
                                        comparison, drift, tuple(warnings)))
        else:
            results.append(MetricResult(name, unit, better, summary(values[Arm.RUN]), None, None,
                                        Drift(drift_a[0], drift_a[1], temp_a=_mean(temps[Arm.RUN])), tuple(warnings)))
        least_median = least_for_median_interval()
        if any(0 < len(v) < least_median for v in values.values()):
            results[-1] = dataclasses.replace(results[-1], warnings=results[-1].warnings + (
                f"fewer than {least_median} runs a side: no 95% interval of the median (± unknown)",))
    unfit = [r for r in work.runs if r.readings.unfit]
    warnings = []
    if report.not_run:
        warnings.append(f"not run: {report.not_run}")
    if unfit:
        warnings.append(f"{_pct(len(unfit), len(work.runs))} marked unfit to measure at their start "
                        f"(first: {unfit[0].readings.unfit})")
    if work.failed:
        warnings.append(f"{work.failed} run{'s' if work.failed != 1 else ''} failed (exit status not 0), left out")
    if report.fingerprint is not None and report.fingerprint.timing_note:
        warnings.append(f"{report.device or report.fingerprint.device} is {report.fingerprint.timing_note}")
    return CellAnalysis(report.cell, report.group, report.device, report.not_run, len(work.runs), work.warmup,
                        work.failed, len(unfit), tuple(results), tuple(warnings))


def method_words(ab: bool, alpha: float, comparisons: int, same_within: float | None) -> str:
    """The statistical method, in words, for the evidence."""
    spread = ("Medians ± the larger half of the distribution-free 95% interval of the median "
              "(order statistics; 6 runs a side at least), as a percentage.")
    if not ab:
        return spread
    within = same_within or 0
    return (f"{spread} The ratio B/A is the Hodges-Lehmann estimate on log values with its distribution-free "
            f"{(1 - alpha) * 100:.3g}% interval (the exact Mann-Whitney null distribution; a shift B - A when "
            f"a value is not positive). p is the two-sided Mann-Whitney U test (exact without ties for small "
            f"samples), adjusted by Holm-Bonferroni over the job's {comparisons} comparison"
            f"{'s' if comparisons != 1 else ''}; α = {alpha:.3g}. Different: the interval excludes 1 and the "
            f"adjusted p is below α. Same: the interval lies within [{1 - within:g}, {1 + within:g}]. Otherwise "
            f"unknown, with the rounds more that would narrow the interval enough (its width taken to shrink "
            f"as 1/√n). Warmup runs and runs whose command failed are left out; Spearman's ρ of value against "
            f"run order shows drift within each arm.")
