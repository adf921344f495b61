"""What a run kept after it first reached its target (``rl_dist_ext.retention``), against a
count written out by hand, and the line the example scripts print."""

from __future__ import annotations

import pytest

from rl_dist_ext.retention import describe, keep_line, retention

CURVE = [(1_000, 20.0), (2_000, 480.0), (3_000, 500.0), (4_000, 140.0), (5_000, 380.0)]


def test_retention_counts_the_evaluations_after_the_first_at_the_target():
    kept = retention(CURVE, 475.0)
    # after 2,000: 500, 140, 380 against 0.8 x 475 = 380 (380 counts as kept)
    assert (kept.first, kept.later, kept.kept, kept.worst) == (2_000, 3, 2, 140.0)
    assert kept.line == pytest.approx(380.0) and kept.share == pytest.approx(2 / 3)
    naive = [v for x, v in CURVE if x > 2_000]
    assert kept.kept == sum(v >= 0.8 * 475 for v in naive) and kept.worst == min(naive)


def test_retention_only_counts_evaluations_until_the_limit():
    kept = retention(CURVE, 475.0, until=4_000)
    assert (kept.later, kept.kept, kept.worst) == (2, 1, 140.0)
    assert retention(CURVE, 475.0, until=1_500) is None


def test_retention_takes_another_keep_share_and_a_negative_target():
    kept = retention(CURVE, 475.0, keep=0.25)
    assert kept.kept == 3 and kept.line == pytest.approx(118.75)
    acrobot = [(1, -500.0), (2, -90.0), (3, -119.0), (4, -121.0)]
    kept = retention(acrobot, -100.0)
    assert kept.line == pytest.approx(-120.0) and (kept.later, kept.kept) == (2, 1)
    assert keep_line(-100.0, keep=1.0) == -100.0
    with pytest.raises(ValueError, match="keep must be in"):
        retention(acrobot, -100.0, keep=1.5)


def test_describe_says_what_the_run_kept_or_that_it_never_reached_the_target():
    assert describe(CURVE, 475.0, "env steps") == (
        "first reached 475 at 2,000 env steps; then 2 of 3 greedy evaluations stayed at or "
        "above 380 (67%), the worst 140"
    )
    assert describe(CURVE[:1], 475.0, "env steps") == (
        "never reached 475 (best greedy evaluation 20)"
    )
    assert describe(CURVE[:2], 475.0, "env steps") == (
        "first reached 475 at 2,000 env steps, the last evaluation"
    )
    assert describe([], 475.0, "env steps") == "no greedy evaluation ran"


def test_the_tianshou_examples_stop_at_the_target_only_when_asked(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "examples"))
    from tianshou_progress import stop_at

    assert stop_at(475.0, stop_at_target=False) is None
    stop = stop_at(475.0, stop_at_target=True)
    assert stop(475.0) and not stop(474.9)
