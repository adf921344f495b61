"""Tests for rl_dist_ext.replay.rate_limiter (Reverb-style samples-per-insert limiting, no Ray)."""

from __future__ import annotations

import numpy as np
import pytest

from rl_dist_ext.replay.rate_limiter import RateLimit, RateLimiter

# ---- RateLimit validation -------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, False, "3", None])
def test_min_size_to_sample_must_be_positive_int(bad):
    with pytest.raises(ValueError, match="min_size_to_sample"):
        RateLimit(min_size_to_sample=bad)


@pytest.mark.parametrize("bad", [0, 0.0, -1, -0.5, float("nan")])
def test_samples_per_insert_must_be_positive(bad):
    with pytest.raises(ValueError, match="samples_per_insert"):
        RateLimit(samples_per_insert=bad)


def test_error_buffer_needs_samples_per_insert():
    with pytest.raises(ValueError, match="error_buffer needs samples_per_insert"):
        RateLimit(error_buffer=5.0)


@pytest.mark.parametrize("bad", [0, 0.0, -1, -3.5, float("nan")])
def test_error_buffer_must_be_positive(bad):
    with pytest.raises(ValueError, match="error_buffer must be > 0"):
        RateLimit(samples_per_insert=1.0, error_buffer=bad)


def test_valid_settings_are_kept():
    limit = RateLimit(min_size_to_sample=7, samples_per_insert=0.25, error_buffer=3)
    assert (limit.min_size_to_sample, limit.samples_per_insert, limit.error_buffer) == (7, 0.25, 3)
    default = RateLimit()
    assert (default.min_size_to_sample, default.samples_per_insert, default.error_buffer) == (
        1,
        None,
        None,
    )


def test_rate_limit_is_frozen():
    limit = RateLimit()
    with pytest.raises(AttributeError):
        limit.min_size_to_sample = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("samples_per_insert", "error_buffer", "expected"),
    [
        (None, None, 1000.0),
        (0.25, None, 1000.0),
        (1.0, None, 1000.0),
        (4.0, None, 4000.0),
        (4.0, 5, 5.0),
        (0.5, 0.75, 0.75),
    ],
)
def test_effective_error_buffer(samples_per_insert, error_buffer, expected):
    limit = RateLimit(samples_per_insert=samples_per_insert, error_buffer=error_buffer)
    assert limit.effective_error_buffer == expected
    assert isinstance(limit.effective_error_buffer, float)


# ---- without samples_per_insert -------------------------------------------------------------


def test_no_ratio_inserts_always_allowed_and_sampling_waits_for_min_size():
    limiter = RateLimiter(RateLimit(min_size_to_sample=5))
    for size in range(5):
        assert limiter.can_insert(size)
        assert not limiter.can_sample(size)
    for size in (5, 6, 100, 10**9):
        assert limiter.can_insert(size)
        assert limiter.can_sample(size)
    # however lopsided the counters get, only the size matters
    limiter.sampled(10**6)
    assert limiter.diff == 0.0
    assert limiter.can_sample(5) and limiter.can_insert(5)
    assert not limiter.can_sample(4)
    limiter.inserted(10**6)
    assert limiter.diff == 0.0
    assert limiter.can_insert(10**9)
    assert (limiter.inserts, limiter.samples) == (10**6, 10**6)


def test_default_limit_samples_from_one_item():
    limiter = RateLimiter(RateLimit())
    assert not limiter.can_sample(0)
    assert limiter.can_sample(1)
    assert limiter.can_insert(0)


# ---- with samples_per_insert: a hand-worked sequence ----------------------------------------


def test_hand_worked_sequence():
    # r = 2, m = 3, e = 4: diff = 2 * inserts - samples must stay in [6 - 4, 6 + 4] = [2, 10].
    limiter = RateLimiter(RateLimit(min_size_to_sample=3, samples_per_insert=2.0, error_buffer=4))
    size = 0

    def insert(rows):
        nonlocal size
        limiter.inserted(rows)
        size += rows

    def check(diff, can_insert, can_sample):
        assert limiter.diff == diff
        assert limiter.can_insert(size) is can_insert
        assert limiter.can_sample(size) is can_sample

    check(0.0, True, False)
    insert(1)  # size 1 < m: no sampling yet, inserts always allowed
    check(2.0, True, False)
    insert(1)
    check(4.0, True, False)
    insert(1)  # size reaches m
    check(6.0, True, True)
    insert(2)  # diff 10 == high: still allowed (bound is inclusive)
    check(10.0, True, True)
    insert(1)  # admitted at diff 10, overshoots to 12 > high: inserts blocked now
    check(12.0, False, True)
    limiter.sampled(1)
    check(11.0, False, True)
    limiter.sampled(1)  # back at the upper bound: inserts allowed again
    check(10.0, True, True)
    limiter.sampled(8)  # diff 2 == low: sampling still allowed (inclusive)
    check(2.0, True, True)
    limiter.sampled(3)  # admitted at diff 2, overshoots by its own size to -1 < low
    check(-1.0, True, False)
    insert(1)  # diff 1 < low: learner still ahead
    check(1.0, True, False)
    insert(1)
    check(3.0, True, True)
    assert (limiter.inserts, limiter.samples) == (8, 13)


def test_hand_worked_sequence_fractional_ratio():
    # r = 0.5, m = 4, e = 1: diff = 0.5 * inserts - samples must stay in [2 - 1, 2 + 1] = [1, 3].
    limiter = RateLimiter(RateLimit(min_size_to_sample=4, samples_per_insert=0.5, error_buffer=1))
    limiter.inserted(4)
    assert limiter.diff == 2.0
    assert limiter.can_sample(4) and limiter.can_insert(4)
    limiter.inserted(2)
    assert limiter.diff == 3.0
    assert limiter.can_insert(6)
    limiter.inserted(1)
    assert limiter.diff == 3.5
    assert not limiter.can_insert(7)
    assert limiter.can_sample(7)
    limiter.sampled(1)
    assert limiter.diff == 2.5
    assert limiter.can_insert(7)
    limiter.sampled(1)
    assert limiter.diff == 1.5
    assert limiter.can_sample(7)
    limiter.sampled(1)
    assert limiter.diff == 0.5
    assert not limiter.can_sample(7)
    limiter.inserted(1)
    assert limiter.diff == 1.0
    assert limiter.can_sample(8)


def test_inserts_always_allowed_below_min_size():
    limiter = RateLimiter(RateLimit(min_size_to_sample=10, samples_per_insert=1.0, error_buffer=2))
    limiter.inserted(1000)  # diff 1000, far above the window [8, 12]
    for size in range(10):
        assert limiter.can_insert(size)
        assert not limiter.can_sample(size)
    assert not limiter.can_insert(10)
    assert limiter.can_sample(10)


def test_sampling_needs_min_size_even_when_diff_allows_it():
    limiter = RateLimiter(RateLimit(min_size_to_sample=10, samples_per_insert=1.0, error_buffer=2))
    limiter.inserted(10)  # diff 10 is inside the window [8, 12] ...
    assert not limiter.can_sample(9)  # ... but the replay holds fewer than m items
    assert limiter.can_sample(10)


def test_batches_larger_than_the_window_do_not_deadlock():
    # window [0, 2] (r = 1, m = 1, e = 1): a batch of 100 is admitted when the limit holds before it
    limiter = RateLimiter(RateLimit(min_size_to_sample=1, samples_per_insert=1.0, error_buffer=1))
    limiter.inserted(100)  # admitted at size 0
    assert limiter.diff == 100.0
    assert not limiter.can_insert(100)
    assert limiter.can_sample(100)
    limiter.sampled(100)
    assert limiter.diff == 0.0
    assert limiter.can_sample(100)  # diff 0 == low
    limiter.sampled(100)  # admitted, overshoots to -100
    assert not limiter.can_sample(100)
    assert limiter.can_insert(100)
    limiter.inserted(100)
    assert limiter.can_sample(100) and limiter.can_insert(100)


def test_reset_balanced_puts_diff_at_the_window_centre():
    limit = RateLimit(min_size_to_sample=3, samples_per_insert=2.0, error_buffer=4)
    limiter = RateLimiter(limit)
    limiter.inserted(50)
    limiter.sampled(7)
    limiter.reset_balanced(10)
    assert limiter.inserts == 10
    assert limiter.samples == 14  # (10 - 3) * 2
    assert limiter.diff == 6.0  # m * r
    assert limiter.can_insert(10) and limiter.can_sample(10)

    limiter.reset_balanced(3)
    assert (limiter.inserts, limiter.samples, limiter.diff) == (3, 0, 6.0)

    # below min size nothing has been sampled yet: diff = size * r and sampling waits for m
    limiter.reset_balanced(2)
    assert (limiter.inserts, limiter.samples, limiter.diff) == (2, 0, 4.0)
    assert not limiter.can_sample(2)
    assert limiter.can_insert(2)

    limiter.reset_balanced(0)
    assert (limiter.inserts, limiter.samples, limiter.diff) == (0, 0, 0.0)


def test_reset_balanced_fractional_ratio_is_within_one_sample_of_centre():
    limit = RateLimit(min_size_to_sample=3, samples_per_insert=0.3, error_buffer=0.5)
    limiter = RateLimiter(limit)
    for size in range(3, 200):
        limiter.reset_balanced(size)
        assert limiter.inserts == size
        assert -1e-9 <= limiter.diff - 3 * 0.3 < 1.0 + 1e-9
        assert limiter.can_sample(size)  # diff >= m r >= low


def test_reset_balanced_without_ratio():
    limiter = RateLimiter(RateLimit(min_size_to_sample=3))
    limiter.reset_balanced(10)
    assert (limiter.inserts, limiter.samples, limiter.diff) == (10, 0, 0.0)
    assert limiter.can_sample(10)


def test_describe_mentions_the_numbers():
    limiter = RateLimiter(RateLimit(min_size_to_sample=3, samples_per_insert=2.0, error_buffer=4))
    limiter.inserted(5)
    limiter.sampled(1)
    text = limiter.describe(5)
    for piece in (
        "size=5",
        "inserts=5",
        "samples=1",
        "min_size_to_sample=3",
        "samples_per_insert=2.0",
        "diff=9.0",
        "[2.0, 10.0]",
    ):
        assert piece in text, (piece, text)


def test_describe_without_ratio():
    text = RateLimiter(RateLimit(min_size_to_sample=2)).describe(0)
    assert "samples_per_insert=None" in text
    assert "min_size_to_sample=2" in text
    assert "size=0" in text


# ---- a simulated actor / learner loop -------------------------------------------------------


@pytest.mark.parametrize(
    ("ratio", "min_size", "error", "insert_batch", "sample_batch", "p_actor", "p_learner"),
    [
        (1.0, 20, 10.0, 4, 8, 0.9, 0.9),  # balanced speeds
        (4.0, 50, 40.0, 8, 32, 0.9, 0.2),  # actors much faster: inserts get blocked
        (0.25, 100, 16.0, 16, 4, 0.1, 0.9),  # learner much faster: samples get blocked
        (2.0, 10, 3.0, 10, 64, 0.5, 0.5),  # batches larger than 2 e: overshoot, no dead-lock
    ],
)
def test_simulated_loop_converges_to_ratio(
    ratio, min_size, error, insert_batch, sample_batch, p_actor, p_learner
):
    rng = np.random.default_rng(1234)
    capacity = 10 * min_size
    limit = RateLimit(min_size_to_sample=min_size, samples_per_insert=ratio, error_buffer=error)
    limiter = RateLimiter(limit)
    low, high = min_size * ratio - error, min_size * ratio + error
    size = 0
    blocked_inserts = blocked_samples = 0
    steps = 20_000
    for _ in range(steps):
        can_insert, can_sample = limiter.can_insert(size), limiter.can_sample(size)
        assert can_insert or can_sample, "dead-lock: neither side may proceed"
        actor_first = rng.random() < 0.5
        for side in ("actor", "learner") if actor_first else ("learner", "actor"):
            if side == "actor" and rng.random() < p_actor:
                if limiter.can_insert(size):
                    limiter.inserted(insert_batch)
                    size = min(capacity, size + insert_batch)
                else:
                    blocked_inserts += 1
            elif side == "learner" and rng.random() < p_learner:
                if limiter.can_sample(size):
                    limiter.sampled(sample_batch)
                else:
                    blocked_samples += 1
            if size >= min_size:
                # a call admitted at the edge overshoots the window by at most its own size
                assert low - sample_batch <= limiter.diff <= high + insert_batch * ratio
    assert limiter.samples > 0
    observed = limiter.samples / limiter.inserts
    # |inserts r - samples| <= max(|low - sample_batch|, high + insert_batch r)
    bound = max(abs(low - sample_batch), high + insert_batch * ratio)
    assert abs(observed - ratio) <= bound / limiter.inserts
    assert abs(observed - ratio) < 0.05 * ratio
    if p_actor > 2 * p_learner:
        assert blocked_inserts > 0
    if p_learner > 2 * p_actor:
        assert blocked_samples > 0
