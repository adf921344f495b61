"""Tests for rl_dist_ext.replay.prioritized.PrioritizedReplay (one shard, no Ray)."""

from __future__ import annotations

import contextlib
import pickle

import numpy as np
import pytest
from scipy import stats

from rl_dist_ext.ops.priorities import importance_weights, td_priorities
from rl_dist_ext.replay import PrioritizedReplay, ReplaySample, SampledItems


def make_batch(start: int, n: int) -> dict[str, np.ndarray]:
    """``n`` rows whose contents encode their global row id ``start .. start + n - 1``."""
    ids = np.arange(start, start + n)
    return {
        "obs": (ids[:, None] * 10 + np.arange(3)[None, :]).astype(np.float32),
        "action": ids.astype(np.int64),
        "done": ids % 2 == 0,
    }


def assert_batch_matches_keys(batch: dict[str, np.ndarray], keys: np.ndarray) -> None:
    expected = make_batch(0, 0)
    assert set(batch) == set(expected)
    want = {
        "obs": (keys[:, None] * 10 + np.arange(3)[None, :]).astype(np.float32),
        "action": keys.astype(np.int64),
        "done": keys % 2 == 0,
    }
    for name, column in batch.items():
        assert column.shape[0] == keys.shape[0]
        assert column.dtype == expected[name].dtype
        np.testing.assert_array_equal(column, want[name])


def stored_priorities(replay: PrioritizedReplay) -> dict[int, float]:
    """Key -> stored (exponentiated) priority of every live row, read from the public state."""
    state = replay.state_dict()
    ids = state["storage"]["insert_ids"]
    return dict(zip(ids.tolist(), np.asarray(state["priorities"]).tolist(), strict=True))


def live_keys(replay: PrioritizedReplay) -> set[int]:
    return set(stored_priorities(replay))


def key_counts(replay: PrioritizedReplay, draws: int, batch_size: int) -> dict[int, int]:
    counts: dict[int, int] = {}
    for _ in range(draws):
        keys = replay.sample_items(batch_size).keys
        for k, c in zip(*np.unique(keys, return_counts=True), strict=True):
            counts[int(k)] = counts.get(int(k), 0) + int(c)
    return counts


def chi_square_p(counts: dict[int, int], probs: dict[int, float]) -> float:
    assert set(counts) <= set(probs)
    order = sorted(probs)
    observed = np.array([counts.get(k, 0) for k in order], dtype=np.float64)
    p = np.array([probs[k] for k in order])
    expected = observed.sum() * p / p.sum()
    return float(stats.chisquare(observed, expected).pvalue)


# ---- add / FIFO -----------------------------------------------------------------------------


def test_add_returns_consecutive_keys_and_len_saturates():
    replay = PrioritizedReplay(10, seed=0)
    assert len(replay) == 0
    assert replay.num_inserted == 0
    start = 0
    for n in (3, 4, 5, 2, 10, 1):
        keys = replay.add(make_batch(start, n))
        assert keys.dtype == np.int64
        np.testing.assert_array_equal(keys, np.arange(start, start + n))
        start += n
        assert replay.num_inserted == start
        assert len(replay) == min(start, 10)
    assert replay.capacity == 10


def test_fifo_overwrites_oldest_first():
    replay = PrioritizedReplay(5, alpha=0.0, seed=1)
    replay.add(make_batch(0, 3))
    assert live_keys(replay) == {0, 1, 2}
    replay.add(make_batch(3, 4))  # ids 5 and 6 overwrite slots of 0 and 1
    assert len(replay) == 5
    assert live_keys(replay) == {2, 3, 4, 5, 6}
    items = replay.sample_items(2000)
    assert set(items.keys.tolist()) == {2, 3, 4, 5, 6}
    assert_batch_matches_keys(items.batch, items.keys)
    replay.add(make_batch(7, 1))  # overwrites id 2 (the oldest)
    assert live_keys(replay) == {3, 4, 5, 6, 7}
    items = replay.sample_items(2000)
    assert set(items.keys.tolist()) == {3, 4, 5, 6, 7}
    assert_batch_matches_keys(items.batch, items.keys)
    # Updates for overwritten ids are stale, for live ones they apply.
    assert replay.update_priorities(np.array([0, 1, 2]), np.ones(3)) == 3
    assert replay.update_priorities(np.array([3, 7]), np.ones(2)) == 0


def test_add_batch_larger_than_capacity_keeps_newest_rows():
    replay = PrioritizedReplay(4, alpha=1.0, seed=2)
    replay.add(make_batch(0, 2))
    raw = np.arange(10, dtype=np.float64) + 0.5
    keys = replay.add(make_batch(2, 10), priorities=raw)
    np.testing.assert_array_equal(keys, np.arange(2, 12))
    assert len(replay) == 4
    assert replay.num_inserted == 12
    stored = stored_priorities(replay)
    assert set(stored) == {8, 9, 10, 11}
    for key in (8, 9, 10, 11):
        assert stored[key] == pytest.approx(float(td_priorities(raw[key - 2], alpha=1.0)))
    items = replay.sample_items(500)
    assert set(items.keys.tolist()) == {8, 9, 10, 11}
    assert_batch_matches_keys(items.batch, items.keys)
    assert replay.update_priorities(keys[:6], np.ones(6)) == 6
    assert replay.stale_updates == 6


def test_first_add_may_exceed_capacity():
    replay = PrioritizedReplay(3, seed=0)
    keys = replay.add(make_batch(0, 7))
    np.testing.assert_array_equal(keys, np.arange(7))
    assert live_keys(replay) == {4, 5, 6}
    items = replay.sample_items(100)
    assert_batch_matches_keys(items.batch, items.keys)


# ---- schema ---------------------------------------------------------------------------------


def _missing(b):
    del b["done"]
    return b


def _extra(b):
    b["extra"] = np.zeros(len(b["action"]))
    return b


def _trailing(b):
    b["obs"] = np.zeros((len(b["action"]), 4), dtype=np.float32)
    return b


def _float_into_int(b):
    b["action"] = b["action"].astype(np.float64) + 0.5
    return b


def _complex_into_float(b):
    b["obs"] = b["obs"].astype(np.complex64)
    return b


def _rows_mismatch(b):
    b["done"] = b["done"][:-1]
    return b


def _scalar(b):
    b["done"] = np.bool_(True)
    return b


@pytest.mark.parametrize(
    ("mutate", "exc", "match"),
    [
        (_missing, ValueError, r"'done'"),
        (_extra, ValueError, r"'extra'"),
        (_trailing, ValueError, r"batch\['obs'\].*shape"),
        (_float_into_int, ValueError, r"batch\['action'\].*dtype float64"),
        (_complex_into_float, ValueError, r"batch\['obs'\].*dtype complex64"),
        (_rows_mismatch, ValueError, r"batch\['done'\] has 2 rows"),
        (_scalar, ValueError, r"batch\['done'\].*leading batch dim"),
        (lambda b: {}, TypeError, r"non-empty dict"),
        (lambda b: list(b.values()), TypeError, r"dict.*got list"),
        (lambda b: {1: b["obs"]}, TypeError, r"keys must be str"),
    ],
)
def test_schema_validation(mutate, exc, match):
    replay = PrioritizedReplay(8, seed=0)
    replay.add(make_batch(0, 3))
    before = stored_priorities(replay)
    with pytest.raises(exc, match=match):
        replay.add(mutate(make_batch(3, 3)))
    # Nothing was written; a valid batch still goes in with the next key.
    assert replay.num_inserted == 3
    assert stored_priorities(replay) == before
    np.testing.assert_array_equal(replay.add(make_batch(3, 2)), [3, 4])


def test_schema_allows_same_kind_casts():
    replay = PrioritizedReplay(8, seed=0)
    replay.add(make_batch(0, 2))
    batch = make_batch(2, 2)
    batch["obs"] = batch["obs"].astype(np.float64)  # float64 -> float32 column: same kind
    batch["action"] = batch["action"].astype(np.int32)  # int32 -> int64 column
    replay.add(batch)
    items = replay.sample_items(200)
    assert_batch_matches_keys(items.batch, items.keys)


def test_schema_first_add_validates_rows():
    replay = PrioritizedReplay(8, seed=0)
    with pytest.raises(ValueError, match=r"batch\['done'\]"):
        replay.add(_rows_mismatch(make_batch(0, 3)))
    assert replay.num_inserted == 0
    replay.add(make_batch(0, 1))


@pytest.mark.parametrize(
    "priorities", [np.ones(2), np.ones((3, 1)), np.array([1.0, -1.0, 1.0]), [1.0, np.nan, 1.0]]
)
def test_add_bad_priorities_rejected_before_write(priorities):
    replay = PrioritizedReplay(8, seed=0)
    replay.add(make_batch(0, 2))
    with pytest.raises(ValueError, match="priorities"):
        replay.add(make_batch(2, 3), priorities=priorities)
    assert replay.num_inserted == 2
    assert len(replay) == 2


# ---- sample / weights -----------------------------------------------------------------------


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_sample_batch_keys_and_weights(beta):
    alpha, eps = 0.7, 1e-3
    replay = PrioritizedReplay(12, alpha=alpha, eps=eps, seed=3)
    rng = np.random.default_rng(3)
    raw = {}
    start = 0
    for n in (5, 6, 7):  # 18 rows into 12 slots: wraps
        r = rng.uniform(0.0, 4.0, n)
        keys = replay.add(make_batch(start, n), priorities=r)
        raw.update(zip(keys.tolist(), r.tolist(), strict=True))
        start += n
    live = sorted(live_keys(replay))
    assert live == list(range(6, 18))
    p = {k: float(td_priorities(np.array(raw[k]), alpha=alpha, eps=eps)) for k in live}
    p_min = min(p.values())
    assert replay.total_priority == pytest.approx(sum(p.values()), rel=1e-12)
    assert replay.min_priority == pytest.approx(p_min, rel=1e-12)

    for batch_size in (1, 16, 64):
        sample = replay.sample(batch_size, beta=beta)
        assert isinstance(sample, ReplaySample)
        batch, keys, weights = sample
        assert keys.dtype == np.int64 and keys.shape == (batch_size,)
        assert set(keys.tolist()) <= set(live)
        assert_batch_matches_keys(batch, keys)
        assert weights.dtype == np.float32 and weights.shape == (batch_size,)
        assert (weights > 0).all() and (weights <= 1).all()
        p_keys = np.array([p[k] for k in keys.tolist()])
        np.testing.assert_allclose(weights, (p_keys / p_min) ** -beta, rtol=1e-6)
        reference = importance_weights(
            p_keys,
            total_priority=replay.total_priority,
            size=len(replay),
            beta=beta,
            min_priority=replay.min_priority,
        )
        np.testing.assert_allclose(weights, reference, rtol=1e-6)
        if beta == 0.0:
            np.testing.assert_array_equal(weights, np.ones(batch_size, dtype=np.float32))


def test_min_priority_item_gets_weight_one():
    replay = PrioritizedReplay(3, alpha=1.0, seed=0)
    replay.add(make_batch(0, 3), priorities=np.array([1.0, 1.0, 1.0]))
    replay.update_priorities(np.array([1]), np.array([0.0]))  # stored eps ** 1, tiny but > 0
    sample = replay.sample(64, beta=1.0)
    assert (sample.weights[sample.keys == 1] == 1.0).all()
    assert (sample.weights[sample.keys != 1] < 1e-5).all()


def test_sample_items_priorities_and_type():
    replay = PrioritizedReplay(6, alpha=0.5, eps=0.01, seed=4)
    raw = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    replay.add(make_batch(0, 6), priorities=raw)
    items = replay.sample_items(50)
    assert isinstance(items, SampledItems)
    assert items.priorities.dtype == np.float64
    np.testing.assert_allclose(
        items.priorities, td_priorities(raw[items.keys], alpha=0.5, eps=0.01), rtol=1e-12
    )
    assert_batch_matches_keys(items.batch, items.keys)
    assert (np.diff(items.keys) >= 0).all()  # stratified: increasing masses, no wrap yet


def test_sampled_frequencies_match_priorities():
    alpha, eps = 0.6, 1e-6
    replay = PrioritizedReplay(16, alpha=alpha, eps=eps, seed=5)
    replay.add(make_batch(0, 8))  # overwritten below, so keys != slots
    raw_add = np.linspace(0.1, 3.0, 16)
    keys = replay.add(make_batch(8, 16), priorities=raw_add)
    probs = dict(zip(keys.tolist(), td_priorities(raw_add, alpha=alpha, eps=eps), strict=True))
    counts = key_counts(replay, 3000, 32)
    assert chi_square_p(counts, probs) > 0.001

    # New priorities via update_priorities: a different, strongly skewed order.
    raw_new = np.random.default_rng(5).permutation(np.geomspace(0.01, 10.0, 16))
    assert replay.update_priorities(keys, raw_new) == 0
    probs = dict(zip(keys.tolist(), td_priorities(raw_new, alpha=alpha, eps=eps), strict=True))
    counts = key_counts(replay, 3000, 32)
    assert chi_square_p(counts, probs) > 0.001
    # The old distribution no longer fits.
    stale_probs = dict(zip(keys.tolist(), td_priorities(raw_add, alpha=alpha), strict=True))
    assert chi_square_p(counts, stale_probs) < 1e-6


def test_alpha_zero_is_uniform():
    replay = PrioritizedReplay(20, alpha=0.0, seed=6)
    raw = np.geomspace(1e-3, 1e3, 20)
    keys = replay.add(make_batch(0, 20), priorities=raw)
    replay.update_priorities(keys[:5], np.array([0.0, 50.0, 1e6, 3.0, 0.5]))
    assert set(stored_priorities(replay).values()) == {1.0}
    counts = key_counts(replay, 2000, 32)
    assert chi_square_p(counts, dict.fromkeys(keys.tolist(), 1.0)) > 0.001
    sample = replay.sample(128, beta=0.4)
    np.testing.assert_array_equal(sample.weights, np.ones(128, dtype=np.float32))


# ---- update_priorities ----------------------------------------------------------------------


def test_update_priorities_reaches_the_right_items():
    alpha, eps = 0.8, 1e-2
    replay = PrioritizedReplay(10, alpha=alpha, eps=eps, seed=7)
    replay.add(make_batch(0, 14))
    keys = replay.sample(6).keys
    raw = np.arange(6, dtype=np.float64) * 0.7
    before = stored_priorities(replay)
    assert replay.update_priorities(keys, raw) == 0
    assert replay.stale_updates == 0
    after = stored_priorities(replay)
    expected = dict(before)
    for k, r in zip(keys.tolist(), raw.tolist(), strict=True):  # repeated keys: last wins
        expected[k] = float(td_priorities(np.array(r), alpha=alpha, eps=eps))
    assert after.keys() == expected.keys()
    for k in expected:
        assert after[k] == pytest.approx(expected[k], rel=1e-12)
    assert replay.total_priority == pytest.approx(sum(expected.values()), rel=1e-12)
    assert replay.min_priority == pytest.approx(min(expected.values()), rel=1e-12)


def test_update_priorities_accepts_unsigned_and_list_like_keys():
    replay = PrioritizedReplay(4, alpha=1.0, eps=1e-6, seed=0)
    replay.add(make_batch(0, 4))
    assert replay.update_priorities(np.array([1, 2], dtype=np.uint32), [3.0, 4.0]) == 0
    assert replay.update_priorities([3], np.array([5.0])) == 0
    stored = stored_priorities(replay)
    assert stored[1] == pytest.approx(3.0) and stored[2] == pytest.approx(4.0)
    assert stored[3] == pytest.approx(5.0)


def test_new_rows_get_max_priority_seen():
    alpha, eps = 0.5, 1e-6

    def p(x):
        return float(td_priorities(np.array(x), alpha=alpha, eps=eps))

    replay = PrioritizedReplay(32, alpha=alpha, eps=eps, seed=8)
    assert replay.max_priority == 1.0
    k0 = replay.add(make_batch(0, 2))
    stored = stored_priorities(replay)
    assert stored[0] == stored[1] == pytest.approx(p(1.0))

    replay.update_priorities(k0[:1], np.array([7.0]))
    assert replay.max_priority == 7.0
    replay.update_priorities(k0, np.array([0.1, 0.2]))  # smaller: max is kept
    assert replay.max_priority == 7.0
    k1 = replay.add(make_batch(2, 3))
    stored = stored_priorities(replay)
    for k in k1.tolist():
        assert stored[k] == pytest.approx(p(7.0))
    # Also visible through sampling: the new rows carry the max stored priority.
    items = replay.sample_items(200)
    new = np.isin(items.keys, k1)
    assert new.any()
    np.testing.assert_allclose(items.priorities[new], p(7.0), rtol=1e-12)

    replay.add(make_batch(5, 2), priorities=np.array([9.0, 0.5]))
    assert replay.max_priority == 9.0
    k3 = replay.add(make_batch(7, 1))
    assert stored_priorities(replay)[int(k3[0])] == pytest.approx(p(9.0))
    sample = replay.sample(256, beta=1.0)
    mask = sample.keys == k3[0]
    assert mask.any()
    np.testing.assert_allclose(sample.weights[mask], replay.min_priority / p(9.0), rtol=1e-6)


def test_stale_keys_are_ignored_and_counted():
    capacity = 8
    replay = PrioritizedReplay(capacity, alpha=1.0, seed=9)
    replay.add(make_batch(0, capacity))
    old_keys = replay.sample(5).keys
    max_before = replay.max_priority
    new_keys = replay.add(make_batch(capacity, capacity))  # overwrites every slot
    before = stored_priorities(replay)
    assert set(before) == set(new_keys.tolist())

    stale = replay.update_priorities(old_keys, np.full(old_keys.shape, 100.0))
    assert stale == old_keys.shape[0]
    assert replay.stale_updates == old_keys.shape[0]
    assert stored_priorities(replay) == before
    assert replay.max_priority == max_before

    # Mixed batch: only the live keys apply.
    mixed = np.array([old_keys[0], new_keys[2], old_keys[1], new_keys[5]])
    stale = replay.update_priorities(mixed, np.array([50.0, 2.0, 60.0, 3.0]))
    assert stale == 2
    assert replay.stale_updates == old_keys.shape[0] + 2
    after = stored_priorities(replay)
    expected = dict(before)
    expected[int(new_keys[2])] = float(td_priorities(np.array(2.0), alpha=1.0))
    expected[int(new_keys[5])] = float(td_priorities(np.array(3.0), alpha=1.0))
    assert after.keys() == expected.keys()
    for k in expected:
        assert after[k] == pytest.approx(expected[k], rel=1e-12)
    assert replay.max_priority == max(max_before, 3.0)


@pytest.mark.parametrize(
    ("keys", "priorities", "match"),
    [
        (np.array([-1]), np.array([1.0]), r"key -1 must be in \[0, 12\)"),
        (np.array([12]), np.array([1.0]), r"key 12 must be in \[0, 12\)"),
        (np.array([3, 10**9]), np.array([1.0, 1.0]), r"item 1: key 1000000000"),
        (np.array([0.0, 1.0]), np.array([1.0, 1.0]), r"keys must be a \[B\] integer array"),
        (np.array([True]), np.array([1.0]), r"keys must be a \[B\] integer array"),
        (np.array([[0, 1]]), np.array([[1.0, 1.0]]), r"keys must be a \[B\] integer array"),
        (np.array([0, 1]), np.array([1.0]), r"priorities must have shape \(2,\)"),
        (np.array([0, 1]), np.array([[1.0, 1.0]]), r"priorities must have shape \(2,\)"),
        (np.array([0, 1]), np.array([1.0, -0.5]), r"item 1: .*priority -0.5"),
        (np.array([0, 1]), np.array([np.nan, 1.0]), r"item 0: .*priority nan"),
        (np.array([0, 1, 2]), np.array([1.0, 2.0, np.inf]), r"item 2: .*priority inf"),
    ],
)
def test_invalid_updates_rejected_and_replay_unchanged(keys, priorities, match):
    replay = PrioritizedReplay(8, alpha=0.6, seed=10)
    replay.add(make_batch(0, 12), priorities=np.linspace(0.1, 1.2, 12))
    before = stored_priorities(replay)
    total, max_p = replay.total_priority, replay.max_priority
    with pytest.raises(ValueError, match=match):
        replay.update_priorities(keys, priorities)
    assert stored_priorities(replay) == before
    assert replay.total_priority == total
    assert replay.max_priority == max_p
    assert replay.stale_updates == 0


# ---- state ----------------------------------------------------------------------------------


def _is_plain(obj) -> bool:
    if isinstance(obj, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return all(_is_plain(v) for v in obj)
    return obj is None or isinstance(obj, (bool, int, float, str, np.ndarray, np.generic))


def _assert_same_samples(a: PrioritizedReplay, b: PrioritizedReplay, rounds: int = 5) -> None:
    for i in range(rounds):
        sa, sb = a.sample(16 + i, beta=0.5), b.sample(16 + i, beta=0.5)
        np.testing.assert_array_equal(sa.keys, sb.keys)
        np.testing.assert_array_equal(sa.weights, sb.weights)
        assert sa.batch.keys() == sb.batch.keys()
        for name in sa.batch:
            np.testing.assert_array_equal(sa.batch[name], sb.batch[name])
            assert sa.batch[name].dtype == sb.batch[name].dtype


def _assert_same_counters(a: PrioritizedReplay, b: PrioritizedReplay) -> None:
    assert len(a) == len(b)
    assert a.num_inserted == b.num_inserted
    assert a.stale_updates == b.stale_updates
    assert a.max_priority == b.max_priority
    assert a.total_priority == b.total_priority
    assert a.min_priority == b.min_priority


def _exercise(replay: PrioritizedReplay, rows: int) -> None:
    rng = np.random.default_rng(rows)
    replay.add(make_batch(0, rows), priorities=rng.uniform(0.0, 3.0, rows))
    keys = replay.sample(8).keys
    replay.update_priorities(keys, rng.uniform(0.0, 5.0, 8))
    if rows > replay.capacity:
        replay.add(make_batch(rows, replay.capacity))  # everything sampled above goes stale
        assert replay.update_priorities(keys, np.ones(8)) == 8


@pytest.mark.parametrize("rows", [5, 23], ids=["not_full", "wrapped"])
def test_state_dict_round_trip(rows):
    replay = PrioritizedReplay(10, alpha=0.7, eps=1e-3, seed=11)
    _exercise(replay, rows)
    state = replay.state_dict()
    assert _is_plain(state)
    counters = (len(replay), replay.num_inserted, replay.stale_updates, replay.max_priority)
    assert counters[:3] == ((10, 33, 8) if rows > 10 else (5, 5, 0))
    pickled = pickle.loads(pickle.dumps(state))

    # What the original does after the snapshot; the snapshot must not alias live state.
    expected = [replay.sample(16 + i, beta=0.5) for i in range(5)]
    replay.add(make_batch(1000, 3))
    replay.update_priorities(replay.sample(4).keys, np.full(4, 42.0))

    for source in (state, pickled):
        restored = PrioritizedReplay(10, alpha=0.7, eps=1e-3, seed=999)
        restored.add({"other": np.zeros((4, 2))})  # a different schema is replaced
        restored.load_state_dict(source)
        assert (
            len(restored),
            restored.num_inserted,
            restored.stale_updates,
            restored.max_priority,
        ) == counters
        for want in expected:
            got = restored.sample(want.keys.shape[0], beta=0.5)
            np.testing.assert_array_equal(got.keys, want.keys)
            np.testing.assert_array_equal(got.weights, want.weights)
            for name in want.batch:
                np.testing.assert_array_equal(got.batch[name], want.batch[name])

    # Fresh copies from the same snapshot stay in lockstep through further use.
    a = PrioritizedReplay(10, alpha=0.7, eps=1e-3, seed=1)
    b = PrioritizedReplay(10, alpha=0.7, eps=1e-3, seed=2)
    a.load_state_dict(state)
    b.load_state_dict(pickled)
    _assert_same_counters(a, b)
    _assert_same_samples(a, b)
    for r in (a, b):
        r.update_priorities(np.array([r.num_inserted - 1]), np.array([2.5]))
        r.add(make_batch(r.num_inserted, 4))
    _assert_same_counters(a, b)
    _assert_same_samples(a, b)
    a_state, b_state = a.state_dict(), b.state_dict()
    np.testing.assert_array_equal(a_state["priorities"], b_state["priorities"])


def test_state_dict_round_trip_counters_match_original():
    replay = PrioritizedReplay(10, alpha=0.7, eps=1e-3, seed=12)
    _exercise(replay, 23)
    restored = PrioritizedReplay(10, alpha=0.7, eps=1e-3)
    restored.load_state_dict(replay.state_dict())
    _assert_same_counters(replay, restored)
    _assert_same_samples(replay, restored)


def test_state_dict_of_empty_replay():
    replay = PrioritizedReplay(4, seed=0)
    restored = PrioritizedReplay(4, seed=1)
    restored.add(make_batch(0, 2))
    restored.load_state_dict(pickle.loads(pickle.dumps(replay.state_dict())))
    assert len(restored) == 0 and restored.num_inserted == 0
    with pytest.raises(ValueError, match="empty"):
        restored.sample(1)
    np.testing.assert_array_equal(restored.add(make_batch(0, 2)), [0, 1])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"capacity": 11}, "capacity"), ({"alpha": 0.5}, "alpha")],
)
def test_load_state_dict_mismatch(kwargs, match):
    replay = PrioritizedReplay(10, alpha=0.7, seed=13)
    replay.add(make_batch(0, 4))
    state = replay.state_dict()
    other = PrioritizedReplay(**{"capacity": 10, "alpha": 0.7, **kwargs})
    other.add(make_batch(0, 2))
    with pytest.raises(ValueError, match=match):
        other.load_state_dict(state)
    assert other.num_inserted == 2


def test_load_state_dict_unknown_format():
    replay = PrioritizedReplay(4, seed=0)
    state = dict(replay.state_dict(), format=99)
    with pytest.raises(ValueError, match="format"):
        PrioritizedReplay(4).load_state_dict(state)


# ---- argument errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"capacity": 0}, "capacity"),
        ({"capacity": -5}, "capacity"),
        ({"capacity": 1.5}, "capacity"),
        ({"capacity": True}, "capacity"),
        ({"capacity": 4, "alpha": -0.1}, "alpha"),
        ({"capacity": 4, "alpha": float("nan")}, "alpha"),
        ({"capacity": 4, "eps": 0.0}, "eps"),
        ({"capacity": 4, "eps": -1e-6}, "eps"),
    ],
)
def test_constructor_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PrioritizedReplay(**kwargs)


def test_constructor_accepts_numpy_int():
    assert PrioritizedReplay(np.int64(3)).capacity == 3


@pytest.mark.parametrize("batch_size", [0, -1, 2.0, True])
def test_sample_bad_batch_size(batch_size):
    replay = PrioritizedReplay(4, seed=0)
    replay.add(make_batch(0, 4))
    with pytest.raises(ValueError, match="batch_size"):
        replay.sample(batch_size)
    with pytest.raises(ValueError, match="batch_size"):
        replay.sample_items(batch_size)


@pytest.mark.parametrize("beta", [-0.1, 1.5, float("nan")])
def test_sample_bad_beta(beta):
    replay = PrioritizedReplay(4, seed=0)
    replay.add(make_batch(0, 4))
    with pytest.raises(ValueError, match="beta"):
        replay.sample(4, beta=beta)


def test_sample_numpy_int_batch_size():
    replay = PrioritizedReplay(4, seed=0)
    replay.add(make_batch(0, 4))
    assert replay.sample(np.int64(3)).keys.shape == (3,)


def test_sample_on_empty_replay():
    replay = PrioritizedReplay(4, seed=0)
    with pytest.raises(ValueError, match="empty"):
        replay.sample(1)
    with pytest.raises(ValueError, match="empty"):
        replay.sample_items(1)


# ---- regressions -----------------------------------------------------------------------------


def test_rejected_add_with_overflowing_priority_is_atomic():
    replay = PrioritizedReplay(4, alpha=2.0, seed=0)
    replay.add(make_batch(0, 2))
    try:
        with np.errstate(over="ignore"):
            replay.add(make_batch(2, 2), priorities=np.array([1e200, 1.0]))
    except ValueError:  # rejected: then nothing may have been written
        assert replay.num_inserted == 2
        assert len(replay) == 2
    else:  # accepted: then every stored row must be sampleable with a finite priority
        stored = np.array(list(stored_priorities(replay).values()))
        assert len(stored) == 4 and np.isfinite(stored).all() and (stored > 0).all()


def test_update_with_overflowing_priority_never_stores_inf():
    replay = PrioritizedReplay(4, alpha=2.0, seed=0)
    keys = replay.add(make_batch(0, 4))
    with np.errstate(over="ignore"), contextlib.suppress(ValueError):  # rejecting is fine
        replay.update_priorities(keys[:1], np.array([1e200]))
    assert np.isfinite(replay.total_priority)


def test_load_state_with_different_eps_raises():
    replay = PrioritizedReplay(4, alpha=0.6, eps=1e-6, seed=0)
    replay.add(make_batch(0, 2))
    other = PrioritizedReplay(4, alpha=0.6, eps=1e-3, seed=0)
    with pytest.raises(ValueError, match="eps"):
        other.load_state_dict(replay.state_dict())


def test_update_with_empty_arrays_is_a_no_op():
    replay = PrioritizedReplay(4, seed=0)
    replay.add(make_batch(0, 2))
    total = replay.total_priority
    assert replay.update_priorities(np.array([]), np.array([])) == 0
    assert replay.total_priority == total
