"""The races' statistics (benchmarks/evidence.py) against naive references written from the
definitions (Agarwal et al., 2021), and against rliable where it computes the same thing."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import evidence


def naive_iqm(values):
    ordered = sorted(values)
    cut = len(ordered) // 4  # floor(n / 4) runs off each end
    middle = ordered[cut : len(ordered) - cut]
    return sum(middle) / len(middle)


def naive_bootstrap(values, stat, reps, rng):
    values = list(values)
    return [
        stat([values[i] for i in rng.integers(0, len(values), size=len(values))])
        for _ in range(reps)
    ]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 10, 13])
def test_iqm_is_the_mean_of_the_middle_runs(n):
    values = list(np.random.default_rng(n).exponential(100.0, size=n))
    assert evidence.iqm(values) == pytest.approx(naive_iqm(values))


def test_iqm_matches_rliable_and_scipy():
    from rliable import metrics
    from scipy import stats

    values = np.random.default_rng(1).normal(300.0, 80.0, size=10)
    assert evidence.iqm(values) == pytest.approx(metrics.aggregate_iqm(values[:, None]))
    assert evidence.iqm(values) == pytest.approx(stats.trim_mean(values, 0.25))


def test_iqm_ignores_the_outer_quarters():
    # 10 runs: 2 dropped each side; a capped outlier does not move it
    base = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0, 18.0, 19.0]
    assert evidence.iqm(base) == pytest.approx(14.5)
    assert evidence.iqm([*base[:-1], 1e6]) == pytest.approx(14.5)


def test_the_iqm_interval_is_the_percentile_bootstrap_of_the_iqm():
    values = list(np.random.default_rng(2).exponential(50.0, size=10))
    got = evidence.iqm_interval(values, reps=400, seed=7)
    samples = naive_bootstrap(values, naive_iqm, 400, np.random.default_rng(7))
    assert got.value == pytest.approx(naive_iqm(values))
    assert got.low == pytest.approx(np.percentile(samples, 2.5))
    assert got.high == pytest.approx(np.percentile(samples, 97.5))
    assert got.low <= got.value <= got.high


def test_the_iqm_interval_covers_the_true_iqm_in_most_experiments():
    """Draw 10 runs from a known distribution 300 times: the 95% interval holds the
    population's IQM in most (a percentile bootstrap of 10 runs under-covers a little)."""
    rng = np.random.default_rng(3)
    population = np.sort(rng.normal(0.0, 1.0, size=2_000_000))
    cut = population.size // 4
    true_iqm = population[cut:-cut].mean()  # ~0 for a symmetric distribution
    covered = 0
    for i in range(300):
        runs = rng.normal(0.0, 1.0, size=10)
        estimate = evidence.iqm_interval(runs, reps=1_000, seed=i)
        covered += estimate.low <= true_iqm <= estimate.high
    assert 0.85 <= covered / 300 <= 0.99, covered


def test_the_ratio_interval_resamples_each_arm_on_its_own():
    a = list(np.random.default_rng(4).exponential(30.0, size=10))
    b = list(np.random.default_rng(5).exponential(60.0, size=10))
    got = evidence.ratio_interval(a, b, reps=300, seed=11)
    rng = np.random.default_rng(11)
    a_samples = naive_bootstrap(a, naive_iqm, 300, rng)
    b_samples = naive_bootstrap(b, naive_iqm, 300, rng)
    ratios = np.asarray(a_samples) / np.asarray(b_samples)
    assert got.value == pytest.approx(naive_iqm(a) / naive_iqm(b))
    assert got.low == pytest.approx(np.percentile(ratios, 2.5))
    assert got.high == pytest.approx(np.percentile(ratios, 97.5))


def test_a_clearly_faster_arm_has_a_ratio_interval_below_one_and_equal_arms_do_not():
    rng = np.random.default_rng(6)
    fast, slow = rng.normal(100.0, 10.0, size=10), rng.normal(300.0, 30.0, size=10)
    assert evidence.ratio_interval(fast, slow).high < 1.0
    same = evidence.ratio_interval(slow, rng.permutation(slow))
    assert same.low < 1.0 < same.high


def test_probability_of_improvement_counts_every_pair_and_ties_as_half():
    a, b = [10.0, 20.0, 600.0, 600.0], [15.0, 600.0, 600.0]
    naive = 0.0
    for x in a:
        for y in b:
            naive += 1.0 if x < y else 0.5 if x == y else 0.0
    assert evidence.probability_of_improvement(a, b) == pytest.approx(naive / 12)
    # lower is better: the same pairs from b's side add up to 1
    assert evidence.probability_of_improvement(a, b) + evidence.probability_of_improvement(
        b, a
    ) == pytest.approx(1.0)


def test_probability_of_improvement_matches_rliable_for_higher_is_better():
    from rliable import metrics

    rng = np.random.default_rng(8)
    x, y = rng.normal(1.0, 1.0, size=10), rng.normal(0.5, 1.0, size=12)
    x[:3] = y[:3] = 2.0  # a few ties
    expected = metrics.probability_of_improvement(x[:, None], y[:, None])
    assert evidence.probability_of_improvement(x, y, lower_is_better=False) == pytest.approx(
        expected
    )


def test_time_to_target_is_the_first_point_at_the_target_or_the_cap():
    curve = [(10.0, 20.0), (20.0, 460.0), (30.0, 120.0), (40.0, 500.0)]
    assert evidence.time_to_target(curve, 450.0, cap=600.0) == (20.0, True)
    assert evidence.time_to_target(curve, 480.0, cap=600.0) == (40.0, True)
    assert evidence.time_to_target(curve, 480.0, cap=35.0) == (35.0, False)  # after the cap
    assert evidence.time_to_target([], 1.0, cap=5.0) == (5.0, False)


def test_the_survival_curve_steps_down_at_each_run_that_reached_and_keeps_the_rest():
    t, share = evidence.survival_curve([30.0, 10.0, 60.0, 60.0], [True, True, False, False], 60.0)
    assert list(t) == [0.0, 10.0, 30.0, 60.0]
    assert list(share) == [1.0, 0.75, 0.5, 0.5]  # two of four never got there
    t, share = evidence.survival_curve([5.0, 7.0], [True, True], 60.0)
    assert list(share) == [1.0, 0.5, 0.0, 0.0]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: evidence.iqm([]), "non-empty"),
        (lambda: evidence.iqm([1.0, math.nan]), "finite"),
        (lambda: evidence.ratio_interval([1.0], [0.0]), r"IQM\(b\) must be > 0"),
        (lambda: evidence.time_to_target([], 1.0, cap=0.0), "cap must be"),
        (lambda: evidence.survival_curve([1.0, 2.0], [True], 5.0), "differ in length"),
    ],
)
def test_bad_input_raises_a_clear_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_retention_counts_the_evaluations_after_the_first_at_the_target():
    curve = [(1, 100), (2, 460), (3, 500), (4, 300), (5, 360), (6, 450), (7, 20)]
    kept = evidence.retention(curve, target=450, cap=6.5)
    # after t=2: 500, 300, 360, 450 (t=7 is past the cap); the keep line is 0.8 x 450 = 360
    assert (kept.later, kept.kept, kept.worst, kept.first, kept.line) == (4, 3, 300.0, 2, 360)
    naive = [v for t, v in curve if 2 < t <= 6.5]
    assert kept.kept == sum(v >= 360 for v in naive) and kept.worst == min(naive)


def test_retention_is_none_without_a_target_or_a_later_evaluation():
    assert evidence.retention([(1, 100), (2, 200)], target=450, cap=10) is None
    assert evidence.retention([(1, 100), (2, 500)], target=450, cap=10) is None


def test_the_keep_line_of_a_negative_target_lies_below_it():
    assert evidence.keep_line(450.0) == pytest.approx(360.0)
    assert evidence.keep_line(-100.0) == pytest.approx(-120.0)
    with pytest.raises(ValueError, match="keep must be in"):
        evidence.keep_line(450.0, keep=0.0)
