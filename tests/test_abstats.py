"""The A/B analysis (core/ab/abstats.py) on samples whose answer is known: p-values against
scipy, a true 5 % shift, identical arms, too few runs, Holm, the looks, the words."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy import stats

from device_loop.core.ab import abstats
from device_loop.core.ab.jobs import (ABSpec, Better, CellReport, Fingerprint, JobSpec, MatrixSpec, MetricSpec, Readings,
                                   RunRecord, Sample, Verdict)
from device_loop.core.vocabulary import Arm


def ab_spec(rounds=10, metrics=None, **ab):
    return JobSpec(ab=ABSpec(baseline=["run-a"], patch=["run-b"], rounds=rounds, **ab),
                   metrics=metrics if metrics is not None else [MetricSpec(name="workload_ms", unit="ms")])


def ab_runs(rounds, b_factor, noise=0.005, seed=0, metric="workload_ms", unit="ms", base=100.0, cell=0,
            warmup=0, order="abab", drift=0.0):
    """Interleaved A/B runs: A ~ base, B ~ base*b_factor, multiplicative noise, optional drift per run."""
    rng = np.random.default_rng(seed)
    arms = [Arm.A, Arm.B] * (rounds + warmup) if order == "abab" else \
        [Arm.A] * (rounds + warmup) + [Arm.B] * (rounds + warmup)
    runs, seen = [], {Arm.A: 0, Arm.B: 0}
    for seq, arm in enumerate(arms):
        factor = 1.0 if arm is Arm.A else b_factor
        value = base * factor * (1 + noise * rng.standard_normal()) * (1 + drift * seq)
        runs.append(RunRecord(cell=cell, seq=seq, arm=arm, warmup=seen[arm] < warmup, started_at=1000.0 + seq,
                              ended_at=1000.5 + seq, status=0,
                              readings=Readings(temperatures={"cpu": 40.0 + seq * 0.1}),
                              samples=[Sample(metric=metric, value=value, unit=unit)]))
        seen[arm] += 1
    return runs


def only(analysis, cell=0, metric="workload_ms"):
    found = [m for c in analysis.cells if c.cell == cell for m in c.metrics if m.name == metric]
    assert len(found) == 1
    return found[0]


# --- p-values and the null distribution --------------------------------------------------------

@pytest.mark.parametrize("m,n", [(3, 3), (4, 5), (8, 8), (12, 7), (20, 20)])
def test_u_distribution_is_scipys_exact_one(m, n):
    rng = np.random.default_rng(m * 100 + n)
    cdf = abstats.u_cdf(m, n)
    assert cdf[-1] == pytest.approx(1.0) and len(cdf) == m * n + 1
    for _ in range(5):
        a, b = rng.normal(size=m), rng.normal(size=n)
        u = int(stats.mannwhitneyu(a, b, method="exact", alternative="less").statistic)
        assert cdf[u] == pytest.approx(stats.mannwhitneyu(a, b, method="exact", alternative="less").pvalue)


def test_p_values_are_scipys():
    a = [1.83, 0.50, 1.62, 2.48, 1.68, 1.88, 1.55, 3.06, 1.30]
    b = [0.878, 0.647, 0.598, 2.05, 1.06, 1.29, 1.06, 3.14, 1.29]     # 1.29 twice: ties, asymptotic
    assert abstats.mann_whitney_p(a, b) == pytest.approx(
        stats.mannwhitneyu(b, a, alternative="two-sided", method="asymptotic").pvalue)
    small_a, small_b = [10.1, 10.4, 9.8, 10.0, 10.2], [9.5, 9.7, 9.1, 9.9, 9.6]
    assert abstats.mann_whitney_p(small_a, small_b) == pytest.approx(
        stats.mannwhitneyu(small_b, small_a, alternative="two-sided", method="exact").pvalue)
    assert abstats.mann_whitney_p(small_a, small_b) == pytest.approx(2 / math.comb(10, 5) * 2)  # U = 1
    assert abstats.mann_whitney_p([5.0] * 4, [5.0] * 4) == 1.0
    assert abstats.smallest_p(3, 3) == pytest.approx(0.1)
    assert abstats.least_runs(0.05) == 4


def test_median_interval_needs_six():
    assert abstats.median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    assert abstats.median_interval([3.0, 1.0, 2.0, 6.0, 5.0, 4.0]) == (1.0, 6.0)
    assert abstats.least_for_median_interval() == 6


def test_holm_on_hand_made_p_values():
    assert abstats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert abstats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert abstats.holm([]) == []


# --- verdicts ----------------------------------------------------------------------------------

def test_a_true_5_percent_shift_is_different_and_faster():
    analysis = abstats.analyse(ab_spec(), ab_runs(10, 0.95, seed=1), [])
    result = only(analysis)
    c = result.comparison
    assert c is not None and c.verdict is Verdict.DIFFERENT
    assert re.fullmatch(r"B is (4\.[89]|5\.[012])% faster", c.words), c.words
    assert c.low is not None and c.high is not None and c.low <= 0.95 <= c.high
    assert c.scale == "ratio" and "Hodges-Lehmann" in c.method
    assert result.a.n == result.b.n == 10 and result.warnings == ()
    assert abstats.decided(analysis)
    assert analysis.confidence == pytest.approx(0.95)


def test_identical_distributions_with_enough_runs_are_same():
    analysis = abstats.analyse(ab_spec(rounds=30), ab_runs(30, 1.0, seed=2), [])
    c = only(analysis).comparison
    assert c is not None and c.verdict is Verdict.SAME and c.words == "same within ±2%"
    assert 0.98 <= c.low <= 1 <= c.high <= 1.02
    assert abstats.decided(analysis)


def test_three_against_three_warns_and_is_never_different():
    analysis = abstats.analyse(ab_spec(rounds=3), ab_runs(3, 0.5, seed=3), [])   # B twice as fast
    result = only(analysis)
    assert result.comparison is not None and result.comparison.verdict is Verdict.UNKNOWN
    assert result.comparison.low is None
    assert any("too few runs for the test ever to decide" in w and "4+4" in w for w in result.warnings)
    assert re.fullmatch(r"collect more: about \d+ more rounds?", result.comparison.words)
    assert result.comparison.more_rounds >= 1
    assert not abstats.decided(analysis)


def test_unknown_estimates_more_rounds_from_the_spread():
    analysis = abstats.analyse(ab_spec(rounds=6), ab_runs(6, 0.985, noise=0.02, seed=4), [])
    c = only(analysis).comparison
    assert c.verdict is Verdict.UNKNOWN and 1 <= c.more_rounds <= abstats.MORE_ROUNDS_CAP
    assert c.words == f"collect more: about {c.more_rounds} more rounds"


@pytest.mark.parametrize("better,unit,factor,words", [
    (Better.HIGHER, "ops/s", 1.05, "B is 5.0% better"),
    (Better.HIGHER, "ops/s", 0.95, "B is 5.0% worse"),
    (Better.LOWER, "ms", 1.05, "B is 5.0% slower"),
    (Better.LOWER, "bytes", 0.95, "B is 5.0% better"),
    (Better.HIGHER, "s", 1.05, "B is 5.0% better"),
])
def test_words_respect_better_and_unit(better, unit, factor, words):
    spec = ab_spec(metrics=[MetricSpec(name="m", unit=unit, better=better)])
    c = only(abstats.analyse(spec, ab_runs(10, factor, noise=0.0005, metric="m", unit=unit, seed=5), []),
             metric="m").comparison
    assert c.verdict is Verdict.DIFFERENT and c.words == words


def test_holm_runs_across_metrics_and_cells():
    spec = JobSpec(ab=ABSpec(baseline=["a"], patch=["b"], rounds=8),
                   matrix=MatrixSpec(over=["tags=x", "tags=y"]),
                   metrics=[MetricSpec(name="t1", unit="ms"), MetricSpec(name="t2", unit="ms")])
    runs = []
    for cell, seed in ((0, 10), (1, 11)):
        first = ab_runs(8, 0.99, noise=0.01, seed=seed, metric="t1", cell=cell)
        second = ab_runs(8, 1.0, noise=0.01, seed=seed + 5, metric="t2", cell=cell)
        for r1, r2 in zip(first, second):
            runs.append(r1.model_copy(update={"samples": r1.samples + r2.samples}))
    analysis = abstats.analyse(spec, runs, [])
    found = list(analysis.comparisons())
    assert len(found) == 4
    raw = [c.p for _, _, c in found]
    assert [c.p_holm for _, _, c in found] == pytest.approx(abstats.holm(raw))
    assert all(c.p_holm >= c.p for _, _, c in found)
    assert "4 comparisons" in analysis.method


def test_warmup_and_failed_runs_are_left_out_and_unfit_runs_counted():
    runs = ab_runs(8, 0.95, seed=6, warmup=1)
    runs[5] = runs[5].model_copy(update={"status": 1})
    runs[6] = runs[6].model_copy(update={"readings": Readings(unfit="cpu at 61.0 °C, above 45 °C")})
    cell = abstats.analyse(ab_spec(rounds=8, warmup=1), runs, []).cells[0]
    assert cell.warmup == 2 and cell.failed == 1 and cell.counted == 15 and cell.unfit == 1
    assert only(abstats.analyse(ab_spec(rounds=8), runs, [])).a.n + \
        only(abstats.analyse(ab_spec(rounds=8), runs, [])).b.n == 15
    assert any("1 of 15 runs marked unfit" in w for w in cell.warnings)
    assert any("1 run failed" in w for w in cell.warnings)


def test_drift_shows_in_spearman_and_temperatures():
    runs = ab_runs(10, 1.0, noise=0.001, seed=7, order="aabb", drift=0.01)
    drift = only(abstats.analyse(ab_spec(), runs, [])).drift
    assert drift.rho_a == pytest.approx(1.0) and drift.rho_b == pytest.approx(1.0)
    assert drift.temp_b == pytest.approx(drift.temp_a + 1.0)


def test_plain_job_summary_without_verdict():
    spec = JobSpec(run=["bench"], rounds=8, metrics=[MetricSpec(name="t", unit="ms")])
    runs = [RunRecord(seq=i, arm=Arm.RUN, started_at=i, ended_at=i + 1, status=0,
                      samples=[Sample(metric="t", value=10.0 + i % 3), Sample(metric="extra", value=1.0 + i,
                                                                              unit="MB")])
            for i in range(8)]
    analysis = abstats.analyse(spec, runs, [])
    assert not analysis.ab and list(analysis.comparisons()) == []
    t = only(analysis, metric="t")
    assert t.a.n == 8 and t.a.median == 11.0 and t.b is None and t.a.spread_pct is not None
    extra = only(analysis, metric="extra")       # not declared: lower is better, the sample's unit
    assert extra.unit == "MB" and extra.better is Better.LOWER
    assert not abstats.decided(analysis)


def test_values_not_all_positive_compare_by_shift():
    spec = ab_spec(metrics=[MetricSpec(name="delta", unit="ms")])
    runs = ab_runs(10, 1.0, noise=0.0, metric="delta", seed=8, base=0.0)
    for i, r in enumerate(runs):
        runs[i] = r.model_copy(update={"samples": [Sample(metric="delta", value=(-5.0 if r.arm is Arm.B else 0.0)
                                                          + 0.01 * (i % 4))]})
    c = only(abstats.analyse(spec, runs, []), metric="delta").comparison
    assert c.scale == "shift" and c.estimate == pytest.approx(-5.0, abs=0.05)
    assert c.verdict is Verdict.DIFFERENT and re.fullmatch(r"B is (4\.99|5|5\.01) ms lower \(better\)", c.words)


def test_matrix_cell_not_run_and_emulated_device():
    spec = JobSpec(ab=ABSpec(baseline=["a"], patch=["b"], rounds=10),
                   matrix=MatrixSpec(over=["tags=sve2", "tags=rvv"]), metrics=[MetricSpec(name="workload_ms")])
    cells = [CellReport(cell=0, group="tags=sve2", device="sim-1",
                        fingerprint=Fingerprint(device="sim-1", emulated=True)),
             CellReport(cell=1, group="tags=rvv", not_run="no device")]
    analysis = abstats.analyse(spec, ab_runs(10, 0.95, seed=9), cells)
    assert [c.cell for c in analysis.cells] == [0, 1]
    assert any("emulated" in w for w in analysis.cells[0].warnings)
    assert analysis.cells[1].not_run == "no device" and analysis.cells[1].counted == 0
    assert abstats.decided(analysis)          # the cell that never ran does not hold it up


# --- the looks of --until-decided ----------------------------------------------------------------

def test_looks_and_alpha_split():
    def ab(**kw):
        return ABSpec(baseline=["a"], patch=["b"], **kw)
    assert abstats.looks(ab(rounds=10)) == [10]
    assert abstats.alpha_per_look(ab(rounds=10)) == 0.05
    assert abstats.looks(ab(rounds=10, until_decided=True, max_rounds=40)) == [10, 20, 40]
    assert abstats.looks(ab(rounds=10, until_decided=True, max_rounds=50)) == [10, 20, 40, 50]
    assert abstats.looks(ab(rounds=10, until_decided=True)) == [10, 20, 40]
    assert abstats.looks(ab(rounds=10, until_decided=True, max_rounds=5)) == [10]
    assert abstats.looks(ab(rounds=100, until_decided=True, max_rounds=200, warmup=2)) == [100, 198]
    assert abstats.alpha_per_look(ab(rounds=10, until_decided=True, max_rounds=40)) == pytest.approx(0.05 / 3)
    spec = ab_spec(rounds=10, until_decided=True, max_rounds=40)
    analysis = abstats.analyse(spec, ab_runs(10, 0.95, seed=1), [])
    assert analysis.alpha == pytest.approx(0.05 / 3)
    assert abstats.analyse(spec, ab_runs(10, 0.95, seed=1), [], alpha=0.01).alpha == 0.01
