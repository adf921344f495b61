"""Tests for rl_dist_ext.replay.sum_tree.SumTree against naive numpy references (no Ray)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from rl_dist_ext.replay import SumTree

CAPACITIES = [1, 7, 8, 1000, 100_003]


def naive_min(arr: np.ndarray) -> float:
    positive = arr[arr > 0]
    return float(positive.min()) if positive.size else float("inf")


def naive_find(arr: np.ndarray, masses: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.cumsum(arr), masses, side="right")


def assert_matches(tree: SumTree, naive: np.ndarray) -> None:
    assert tree.total == pytest.approx(naive.sum(), rel=1e-9, abs=0.0)
    assert tree.min == naive_min(naive)
    np.testing.assert_array_equal(tree.leaves(), naive)
    np.testing.assert_array_equal(tree.get(np.arange(tree.capacity)), naive)


# ---- update / total / min / get -------------------------------------------------------------


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_random_batched_updates_match_naive(capacity):
    rng = np.random.default_rng(capacity)
    tree = SumTree(capacity)
    naive = np.zeros(capacity)
    assert tree.capacity == capacity
    assert_matches(tree, naive)
    assert tree.total == 0.0
    assert tree.min == float("inf")
    for step in range(40):
        if step % 13 == 12:
            # Every leaf back to zero: total 0 and min inf again.
            indices = rng.permutation(capacity)
            values = np.zeros(capacity)
        else:
            size = int(rng.integers(1, min(2 * capacity, 400) + 1))
            indices = rng.integers(0, capacity, size)  # repeats whenever size is large enough
            values = rng.exponential(size=size) * 10.0 ** rng.integers(-3, 4, size)
            values[rng.random(size) < 0.3] = 0.0
        tree.update(indices, values)
        for i, v in zip(indices, values, strict=True):  # sequential: the last value wins
            naive[i] = v
        assert_matches(tree, naive)
        sub = rng.integers(0, capacity, 17)
        np.testing.assert_array_equal(tree.get(sub), naive[sub])


def test_repeated_indices_last_value_wins():
    tree = SumTree(8)
    tree.update(np.array([3, 3, 3, 5]), np.array([1.0, 2.0, 4.0, 0.5]))
    assert tree.get(np.array([3, 5])).tolist() == [4.0, 0.5]
    assert tree.total == 4.5
    assert tree.min == 0.5
    tree.update(np.array([5, 3, 5]), np.array([7.0, 0.0, 0.0]))
    assert tree.get(np.array([3, 5])).tolist() == [0.0, 0.0]
    assert tree.total == 0.0
    assert tree.min == float("inf")
    tree.update(np.array([6, 6]), np.array([0.0, 9.0]))
    assert tree.leaves().tolist() == [0, 0, 0, 0, 0, 0, 9.0, 0]
    assert tree.min == 9.0


def test_update_accepts_lists_and_empty_batches():
    tree = SumTree(7)
    tree.update([0, 6], [1.5, 2.5])
    tree.update(np.array([], dtype=np.int64), np.array([], dtype=np.float64))
    assert tree.leaves().tolist() == [1.5, 0, 0, 0, 0, 0, 2.5]
    assert tree.total == 4.0
    assert tree.min == 1.5


def test_min_ignores_zero_leaves_and_tracks_removals():
    tree = SumTree(7)
    tree.update(np.arange(7), np.array([0.0, 3.0, 0.0, 0.25, 2.0, 0.0, 1.0]))
    assert tree.min == 0.25
    tree.update(np.array([3]), np.array([0.0]))
    assert tree.min == 1.0
    tree.update(np.array([6]), np.array([0.0]))
    assert tree.min == 2.0


def test_leaves_is_a_copy():
    tree = SumTree(4)
    tree.update(np.arange(4), np.ones(4))
    leaves = tree.leaves()
    leaves[:] = 100.0
    assert tree.leaves().tolist() == [1.0] * 4
    assert tree.total == 4.0


# ---- find_prefix_sum ------------------------------------------------------------------------


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_find_prefix_sum_exact_boundaries(capacity):
    """Integer-valued leaves make every sum exact, so boundary masses must match exactly."""
    rng = np.random.default_rng(100 + capacity)
    leaves = rng.integers(0, 4, capacity).astype(np.float64)  # ~25% zero leaves
    leaves[rng.integers(0, capacity)] = 3.0  # at least one positive leaf
    tree = SumTree(capacity)
    tree.update(np.arange(capacity), leaves)
    total = leaves.sum()
    cumsum = np.cumsum(leaves)
    boundaries = np.unique(cumsum[cumsum < total])
    masses = np.concatenate(
        [
            [0.0],
            boundaries,  # mass exactly on cumsum[i]: belongs to the next positive leaf
            np.nextafter(boundaries, -np.inf)[boundaries > 0],  # just below a boundary
            rng.uniform(0.0, total, 2000),
            [np.nextafter(total, -np.inf)],
        ]
    )
    got = tree.find_prefix_sum(masses)
    assert got.dtype == np.int64
    assert got.shape == masses.shape
    np.testing.assert_array_equal(got, naive_find(leaves, masses))
    assert (leaves[got] > 0).all()
    assert (got < capacity).all()


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_find_prefix_sum_random_floats(capacity):
    """With float leaves the tree and cumsum round differently only within ulps of a boundary."""
    rng = np.random.default_rng(200 + capacity)
    leaves = rng.exponential(size=capacity)
    leaves[rng.random(capacity) < 0.2] = 0.0
    leaves[-1] = 0.0 if capacity > 1 else 1.0  # a trailing zero leaf when possible
    if not leaves.any():
        leaves[0] = 1.0
    tree = SumTree(capacity)
    tree.update(np.arange(capacity), leaves)
    masses = rng.uniform(0.0, tree.total, 5000)
    got = tree.find_prefix_sum(masses)
    want = naive_find(leaves, masses)
    assert (leaves[got] > 0).all()
    mismatch = got != want
    if mismatch.any():
        cumsum = np.cumsum(leaves)
        gap = np.abs(masses[mismatch][:, None] - cumsum[None, :]).min(axis=1)
        assert (gap <= 1e-9 * tree.total).all()
    assert mismatch.mean() < 1e-3


def test_find_prefix_sum_skips_zero_leaves_hand_built():
    leaves = np.array([0.0, 1.0, 0.0, 0.0, 2.0, 0.0, 3.0, 0.0, 0.0])
    tree = SumTree(leaves.size)  # 9 leaves: padded to 16
    tree.update(np.arange(leaves.size), leaves)
    masses = np.array([0.0, 0.5, 1.0, 2.5, 2.9999, 3.0, 5.5, np.nextafter(6.0, 0.0)])
    assert tree.find_prefix_sum(masses).tolist() == [1, 1, 4, 4, 4, 6, 6, 6]
    np.testing.assert_array_equal(tree.find_prefix_sum(masses), naive_find(leaves, masses))


@pytest.mark.parametrize("capacity", [1, 7, 8, 1000, 100_003])
def test_find_prefix_sum_at_or_above_total_returns_last_positive_leaf(capacity):
    rng = np.random.default_rng(300 + capacity)
    leaves = rng.exponential(size=capacity)
    leaves[rng.random(capacity) < 0.3] = 0.0
    last = max(0, capacity - 1 - capacity // 3)  # zeros after the last positive leaf
    leaves[last] = 1.0
    leaves[last + 1 :] = 0.0
    tree = SumTree(capacity)
    tree.update(np.arange(capacity), leaves)
    total = tree.total
    masses = np.array([total, np.nextafter(total, np.inf), total * (1 + 1e-12), total * 2])
    assert tree.find_prefix_sum(masses).tolist() == [last] * masses.size


def test_find_prefix_sum_does_not_modify_masses():
    tree = SumTree(8)
    tree.update(np.arange(8), np.arange(8, dtype=np.float64))
    masses = np.array([0.5, 10.0, 27.9])
    before = masses.copy()
    tree.find_prefix_sum(masses)
    np.testing.assert_array_equal(masses, before)


# ---- sample_stratified ----------------------------------------------------------------------


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_sample_stratified_values_and_order(capacity):
    rng = np.random.default_rng(400 + capacity)
    leaves = rng.exponential(size=capacity)
    leaves[rng.random(capacity) < 0.25] = 0.0
    leaves[rng.integers(0, capacity)] = 1.0
    tree = SumTree(capacity)
    tree.update(np.arange(capacity), leaves)
    for batch in (1, 2, 32, 257):
        uniforms = rng.random(batch)
        uniforms[0] = 0.0
        uniforms[-1] = np.nextafter(1.0, 0.0)
        indices, values = tree.sample_stratified(uniforms)
        assert indices.dtype == np.int64 and values.dtype == np.float64
        assert indices.shape == values.shape == (batch,)
        np.testing.assert_array_equal(values, leaves[indices])
        np.testing.assert_array_equal(values, tree.get(indices))
        assert (values > 0).all()
        assert (np.diff(indices) >= 0).all()
        # Draw i takes mass (i + u_i) * total / B.
        masses = (np.arange(batch) + uniforms) * (tree.total / batch)
        np.testing.assert_array_equal(indices, tree.find_prefix_sum(masses))


def test_sample_stratified_frequencies_chi_square():
    rng = np.random.default_rng(7)
    capacity = 23
    leaves = rng.uniform(0.1, 5.0, capacity)
    zeros = np.array([0, 4, 5, 17, 22])
    leaves[zeros] = 0.0
    tree = SumTree(capacity)
    tree.update(np.arange(capacity), leaves)
    counts = np.zeros(capacity, dtype=np.int64)
    for _ in range(2000):
        indices, _ = tree.sample_stratified(rng.random(32))
        counts += np.bincount(indices, minlength=capacity)
    n = counts.sum()
    assert n == 2000 * 32
    assert counts[zeros].sum() == 0
    positive = leaves > 0
    expected = n * leaves[positive] / leaves[positive].sum()
    _, p_value = stats.chisquare(counts[positive], expected)
    assert p_value > 0.001


# ---- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize("capacity", [0, -1, 2.5, True, "8", None])
def test_bad_capacity(capacity):
    with pytest.raises(ValueError, match="capacity"):
        SumTree(capacity)


def test_numpy_integer_capacity_ok():
    assert SumTree(np.int64(5)).capacity == 5


@pytest.mark.parametrize(
    ("indices", "values", "match"),
    [
        ([8], [1.0], r"index 8 must be in \[0, 8\)"),
        ([-1], [1.0], r"index -1 must be in \[0, 8\)"),
        ([0, 100], [1.0, 1.0], r"position 1: index 100"),
        ([2], [-1.0], r"value -1\.0 must be finite and >= 0"),
        ([2], [np.nan], r"value nan must be finite"),
        ([2], [np.inf], r"value inf must be finite"),
        ([1, 2, 3], [1.0, 2.0, -np.inf], r"position 2: .*value -inf"),
        ([1, 2], [1.0], r"same shape"),
        ([1], [1.0, 2.0], r"same shape"),
    ],
)
def test_bad_update_rejected_and_tree_unchanged(indices, values, match):
    tree = SumTree(8)
    tree.update(np.arange(8), np.arange(1.0, 9.0))
    before = tree.state_dict()["leaves"]
    with pytest.raises(ValueError, match=match):
        tree.update(np.asarray(indices), np.asarray(values, dtype=np.float64))
    np.testing.assert_array_equal(tree.leaves(), before)
    assert tree.total == before.sum()
    assert tree.min == 1.0


def test_get_out_of_range():
    tree = SumTree(5)
    with pytest.raises(ValueError, match="indices"):
        tree.get(np.array([5]))
    with pytest.raises(ValueError, match="indices"):
        tree.get(np.array([-1]))


def test_empty_tree_search_and_sample_raise():
    tree = SumTree(6)
    with pytest.raises(ValueError, match="empty"):
        tree.find_prefix_sum(np.array([0.0]))
    with pytest.raises(ValueError, match="empty"):
        tree.sample_stratified(np.array([0.5]))
    tree.update(np.array([2]), np.array([1.0]))
    assert tree.find_prefix_sum(np.array([0.3])).tolist() == [2]
    tree.update(np.array([2]), np.array([0.0]))  # emptied again
    with pytest.raises(ValueError, match="empty"):
        tree.find_prefix_sum(np.array([0.0]))
    with pytest.raises(ValueError, match="empty"):
        tree.sample_stratified(np.array([0.5]))


# ---- state ----------------------------------------------------------------------------------


@pytest.mark.parametrize("capacity", [1, 7, 1000])
def test_state_dict_round_trip(capacity):
    rng = np.random.default_rng(500 + capacity)
    tree = SumTree(capacity)
    leaves = rng.exponential(size=capacity)
    leaves[rng.random(capacity) < 0.3] = 0.0
    leaves[0] = 0.5
    tree.update(np.arange(capacity), leaves)
    state = tree.state_dict()
    assert set(state) == {"leaves"}
    np.testing.assert_array_equal(state["leaves"], leaves)

    other = SumTree(capacity)
    other.update(np.array([capacity - 1]), np.array([123.0]))  # overwritten by the load
    other.load_state_dict(state)
    np.testing.assert_array_equal(other.leaves(), tree.leaves())
    assert other.total == tree.total
    assert other.min == tree.min
    masses = rng.uniform(0.0, tree.total, 500)
    np.testing.assert_array_equal(other.find_prefix_sum(masses), tree.find_prefix_sum(masses))

    state["leaves"][:] = 9.0  # the state is a copy, not a view of the tree
    np.testing.assert_array_equal(tree.leaves(), leaves)


@pytest.mark.parametrize("shape", [(6,), (8,), (7, 1), ()])
def test_load_state_dict_wrong_shape(shape):
    tree = SumTree(7)
    tree.update(np.arange(7), np.ones(7))
    with pytest.raises(ValueError, match="shape"):
        tree.load_state_dict({"leaves": np.ones(shape)})
    np.testing.assert_array_equal(tree.leaves(), np.ones(7))


def test_load_state_dict_invalid_values_raise():
    tree = SumTree(3)
    with pytest.raises(ValueError, match="finite and >= 0"):
        tree.load_state_dict({"leaves": np.array([1.0, -1.0, 2.0])})


def test_rejected_load_leaves_tree_unchanged():
    tree = SumTree(3)
    tree.update(np.arange(3), np.array([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError):
        tree.load_state_dict({"leaves": np.array([1.0, -1.0, 2.0])})
    assert tree.leaves().tolist() == [1.0, 2.0, 3.0]
    assert tree.total == 6.0
