"""The statistics of the races (Agarwal et al., 2021, "Deep Reinforcement Learning at the Edge
of the Statistical Precipice", the method of the ``rliable`` library): interquartile means
with percentile-bootstrap confidence intervals, the interval of a ratio of two arms' IQMs,
the probability of improvement, and time to target as a survival curve.

Time to target is a lower-is-better score measured in training time only. A run that never
reached the target within its cap counts at the cap (it is censored there): the IQM and the
ratio then understate how much slower such an arm is, which the tables say, and the survival
curve shows the censored runs as never reaching zero.

Pure numpy; every function takes plain sequences of floats, one value per run (seed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

import rl_dist_ext.retention
from rl_dist_ext.retention import KEEP, Retention, keep_line

__all__ = [
    "Estimate",
    "Retention",
    "iqm",
    "iqm_interval",
    "keep_line",
    "probability_of_improvement",
    "ratio_interval",
    "retention",
    "survival_curve",
    "time_to_target",
]

#: bootstrap resamples of every interval (rliable's default is 50,000 for many tasks; one
#: task of 10 runs is stable to about 0.5 % of the IQM at 5,000)
BOOTSTRAP_REPS = 5_000
CONFIDENCE = 0.95


def _runs(values: Sequence[float], name: str = "values") -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty sequence of numbers, got {values!r}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite (count an unreached run at its cap): {values!r}")
    return array


def iqm(values: Sequence[float]) -> float:
    """Interquartile mean: the mean of the runs left after dropping the lowest and the highest
    ``floor(n / 4)`` (``scipy.stats.trim_mean(values, 0.25)``, as rliable computes it)."""
    array = np.sort(_runs(values))
    cut = int(0.25 * array.size)
    return float(array[cut : array.size - cut].mean())


def _resampled_iqms(array: np.ndarray, reps: int, rng: np.random.Generator) -> np.ndarray:
    """The IQM of ``reps`` resamples (with replacement, ``array.size`` runs each)."""
    picks = np.sort(array[rng.integers(0, array.size, size=(reps, array.size))], axis=1)
    cut = int(0.25 * array.size)
    return picks[:, cut : array.size - cut].mean(axis=1)


def _percentiles(samples: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(samples, [tail, 100.0 - tail])
    return float(low), float(high)


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its percentile-bootstrap interval."""

    value: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.value:.3g} [{self.low:.3g}, {self.high:.3g}]"


def iqm_interval(
    values: Sequence[float],
    *,
    reps: int = BOOTSTRAP_REPS,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> Estimate:
    """The IQM of one arm's runs and its percentile-bootstrap interval (the runs resampled
    with replacement; on one task rliable's stratified bootstrap is this)."""
    array = _runs(values)
    samples = _resampled_iqms(array, reps, np.random.default_rng(seed))
    return Estimate(iqm(array), *_percentiles(samples, confidence))


def ratio_interval(
    a: Sequence[float],
    b: Sequence[float],
    *,
    reps: int = BOOTSTRAP_REPS,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> Estimate:
    """IQM(a) / IQM(b) with the percentile-bootstrap interval of that ratio, each arm
    resampled independently of the other. With times to target, a ratio below 1 says ``a``
    is faster, and the claim holds at this confidence only where the interval's upper end is
    below 1."""
    a_runs, b_runs = _runs(a, "a"), _runs(b, "b")
    if iqm(b_runs) <= 0:
        raise ValueError(f"IQM(b) must be > 0 for a ratio, got {iqm(b_runs)}")
    rng = np.random.default_rng(seed)
    a_iqms = _resampled_iqms(a_runs, reps, rng)
    b_iqms = _resampled_iqms(b_runs, reps, rng)
    with np.errstate(divide="ignore"):
        ratios = a_iqms / b_iqms  # a resample of b's IQM can be 0 only if b has zeros
    return Estimate(iqm(a_runs) / iqm(b_runs), *_percentiles(ratios, confidence))


def probability_of_improvement(
    a: Sequence[float], b: Sequence[float], *, lower_is_better: bool = True
) -> float:
    """P(a run of ``a`` beats a run of ``b``): over every pair of runs, 1 where ``a``'s is
    better, 0.5 where they tie (two runs that both hit the cap, say), 0 otherwise; the mean
    (the Mann-Whitney U statistic over ``len(a) * len(b)``)."""
    a_runs, b_runs = _runs(a, "a")[:, None], _runs(b, "b")[None, :]
    better = a_runs < b_runs if lower_is_better else a_runs > b_runs
    return float((better + 0.5 * (a_runs == b_runs)).mean())


def time_to_target(
    curve: Sequence[tuple[float, float]], target: float, cap: float
) -> tuple[float, bool]:
    """``(time, reached)`` from a run's curve of ``(training time, greedy return)`` points:
    the first time the return is at least ``target``, or ``(cap, False)`` when no point
    within ``cap`` reaches it."""
    if not math.isfinite(cap) or cap <= 0:
        raise ValueError(f"cap must be a positive number of seconds, got {cap!r}")
    for time, value in curve:
        if time > cap:
            break
        if value >= target:
            return float(time), True
    return float(cap), False


def survival_curve(
    times: Sequence[float], reached: Sequence[bool], cap: float
) -> tuple[np.ndarray, np.ndarray]:
    """The share of runs that have not reached the target yet, as a step function of training
    time: ``(t, share)`` with ``share[i]`` holding from ``t[i]`` until ``t[i + 1]`` (from 0 at
    share 1 to ``cap``). A run that never reached it stays in the share up to the cap, so the
    curve ends above 0 when some runs never got there."""
    array = _runs(times, "times")
    hits = np.asarray(reached, dtype=bool)
    if hits.shape != array.shape:
        raise ValueError(f"times and reached differ in length: {array.size} vs {hits.size}")
    steps = np.sort(array[hits])
    share = 1.0 - np.arange(1, steps.size + 1) / array.size
    t = np.concatenate([[0.0], steps, [cap]])
    return t, np.concatenate([[1.0], share, [share[-1] if share.size else 1.0]])


def retention(
    curve: Sequence[tuple[float, float]], target: float, cap: float, keep: float = KEEP
) -> Retention | None:
    """After a run's first evaluation at the target (``curve``: ``(training time, greedy
    return)`` points, as :func:`time_to_target` reads them), how many of its later evaluations
    within ``cap`` stay at or above :func:`keep_line`, and the worst of them; ``None`` when the
    run never reached the target or was never evaluated after it did (the package's
    ``rl_dist_ext.retention``, which the example scripts print, within the race's cap)."""
    time_to_target(curve, target, cap)  # the cap's check
    return rl_dist_ext.retention.retention(curve, target, keep=keep, until=cap)
