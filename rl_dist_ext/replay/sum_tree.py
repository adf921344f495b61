"""Sum + min segment tree over non-negative priorities: the sampler of a prioritized replay.

A binary heap of ``2 * L`` float64 nodes (``L`` = capacity rounded up to a power of two, leaves at
``L .. 2L - 1``) keeps, for every node, the sum and the minimum of the leaves below it. Updating a
leaf rewrites its ``log2(L)`` ancestors; sampling descends from the root comparing a target mass
with left-subtree sums (Schaul et al. 2016, appendix B.2.1).

Why numba: the two hot paths, a batched leaf update and a batched prefix-sum search, are
``B * log2(L)`` dependent scalar steps each. In numpy they become one vectorised op per tree level
(``np.unique`` on every level for duplicate-safe updates), which costs ~20 numpy calls per batch;
in per-element Python they cost milliseconds. A compiled loop does the whole batch in one call of a
few microseconds. numba (``njit(cache=True, nogil=True)``) is a widely used, pip-installable
compiler that Tianshou itself depends on for the same purpose, needs no C toolchain at install
time, caches compiled code on disk, and releases the GIL so a Ray actor can sample while another
thread inserts. Hand-written C would add a build step for no measurable gain.
"""

from __future__ import annotations

import numba
import numpy as np

from rl_dist_ext.validation import check_int


class SumTree:
    """Sum and min over ``capacity`` non-negative leaves, with batched update and search.

    Leaves start at 0 (they hold no mass and are never sampled). ``min`` is taken over leaves
    with a positive value only, so empty slots do not pin it to zero.
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = check_int("capacity", capacity, 1)
        self._leaf_offset = 1 << max(0, (self._capacity - 1).bit_length())
        self._sum = np.zeros(2 * self._leaf_offset, dtype=np.float64)
        self._min = np.full(2 * self._leaf_offset, np.inf, dtype=np.float64)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def total(self) -> float:
        """Sum of all leaves."""
        return float(self._sum[1])

    @property
    def min(self) -> float:
        """Smallest positive leaf (``inf`` when every leaf is 0)."""
        return float(self._min[1])

    def update(self, indices: np.ndarray, values: np.ndarray, *, validate: bool = True) -> None:
        """Set ``leaf[indices[i]] = values[i]``; for a repeated index the last value wins.

        Args:
            indices: ``[B]`` integer leaf indices in ``[0, capacity)``.
            values: ``[B]`` finite non-negative floats.
            validate: ``False`` skips the checks for callers that pass int64/float64 arrays they
                have already validated (the replay's update hot path).
        """
        if not validate:
            _update_levels(self._sum, self._min, self._leaf_offset, indices, values)
            return
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        if indices.shape != values.shape:
            raise ValueError(
                f"indices and values must have the same shape, got {indices.shape} "
                f"and {values.shape}"
            )
        bad = _update(self._sum, self._min, self._leaf_offset, self._capacity, indices, values)
        if bad >= 0:
            raise ValueError(
                f"update rejected at position {bad}: index {indices[bad]} must be in "
                f"[0, {self._capacity}) and value {values[bad]} must be finite and >= 0"
            )

    def get(self, indices: np.ndarray) -> np.ndarray:
        """Leaf values at ``indices`` (``[B]`` -> ``[B]`` float64)."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= self._capacity):
            raise ValueError(f"indices must be in [0, {self._capacity})")
        return self._sum[indices + self._leaf_offset]

    def leaves(self) -> np.ndarray:
        """A copy of all ``[capacity]`` leaf values."""
        return self._sum[self._leaf_offset : self._leaf_offset + self._capacity].copy()

    def find_prefix_sum(self, masses: np.ndarray) -> np.ndarray:
        """Per mass ``m`` in ``[0, total)``, the leaf ``i`` with ``cumsum[i-1] <= m < cumsum[i]``.

        Only leaves with positive value are returned; masses at or above ``total`` (rounding)
        land on the last positive leaf.

        Args:
            masses: ``[B]`` floats.

        Returns:
            ``[B]`` int64 leaf indices.
        """
        if not self.total > 0.0:
            raise ValueError("cannot search an empty tree (total is 0)")
        masses = np.asarray(masses, dtype=np.float64).reshape(-1)
        out = np.empty(masses.shape[0], dtype=np.int64)
        _find(self._sum, self._leaf_offset, masses, out)
        return out

    def sample_stratified(self, uniforms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Stratified proportional sampling: one draw from each of ``B`` equal slices of mass.

        Args:
            uniforms: ``[B]`` floats in ``[0, 1)``; draw ``i`` takes mass
                ``(i + uniforms[i]) * total / B``.

        Returns:
            ``(indices [B] int64, values [B] float64)``.
        """
        if not self.total > 0.0:
            raise ValueError("cannot sample from an empty tree (total is 0)")
        uniforms = np.asarray(uniforms, dtype=np.float64).reshape(-1)
        indices = np.empty(uniforms.shape[0], dtype=np.int64)
        values = np.empty(uniforms.shape[0], dtype=np.float64)
        _sample_stratified(self._sum, self._leaf_offset, uniforms, indices, values)
        return indices, values

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"leaves": self.leaves()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        leaves = np.asarray(state["leaves"], dtype=np.float64)
        if leaves.shape != (self._capacity,):
            raise ValueError(
                f"state leaves must have shape ({self._capacity},), got {leaves.shape}"
            )
        if not (np.isfinite(leaves).all() and (leaves >= 0.0).all()):
            raise ValueError("state leaves must be finite and >= 0")
        self._sum[:] = 0.0
        self._min[:] = np.inf
        self.update(np.arange(self._capacity, dtype=np.int64), leaves)


@numba.njit(cache=True, nogil=True)
def _update(tree_sum, tree_min, offset, capacity, indices, values):  # pragma: no cover - jitted
    for i in range(indices.shape[0]):
        value = values[i]
        if indices[i] < 0 or indices[i] >= capacity or not (value >= 0.0) or value == np.inf:
            return i
    _update_levels(tree_sum, tree_min, offset, indices, values)
    return -1


@numba.njit(cache=True, nogil=True)
def _update_levels(tree_sum, tree_min, offset, indices, values):  # pragma: no cover - jitted
    # Level-synchronous: write every leaf, then recompute each touched level from its (already
    # final) children. Recomputing a parent twice for a repeated index is harmless, and the
    # independent iterations of the inner loop let the CPU overlap their cache misses.
    batch = indices.shape[0]
    if batch == 0:
        return
    nodes = np.empty(batch, dtype=np.int64)
    for i in range(batch):
        node = indices[i] + offset
        tree_sum[node] = values[i]
        tree_min[node] = values[i] if values[i] > 0.0 else np.inf
        nodes[i] = node >> 1
    while nodes[0] >= 1:
        previous = -1
        for i in range(batch):
            node = nodes[i]
            if node != previous:  # sorted input (sampled slots are) shares upper ancestors
                left = 2 * node
                tree_sum[node] = tree_sum[left] + tree_sum[left + 1]
                tree_min[node] = min(tree_min[left], tree_min[left + 1])
                previous = node
            nodes[i] = node >> 1


@numba.njit(cache=True, nogil=True)
def _descend(tree_sum, offset, masses, indices):  # pragma: no cover - jitted
    # Level-synchronous and branch-free: a data-dependent branch per level mispredicts half the
    # time; the select below does not, and the batch's loads at one level are independent.
    # A step goes right when the mass is past the left subtree and the right one has mass, so the
    # descent only ever enters subtrees with positive mass and always ends on a positive leaf.
    batch = masses.shape[0]
    for i in range(batch):
        indices[i] = 1
    width = offset
    while width > 1:
        for i in range(batch):
            left = 2 * indices[i]
            left_sum = tree_sum[left]
            mass = masses[i]
            right = np.int64((mass >= left_sum) & (tree_sum[left + 1] > 0.0))
            masses[i] = mass - left_sum * right
            indices[i] = left + right
        width >>= 1
    for i in range(batch):
        indices[i] -= offset


@numba.njit(cache=True, nogil=True)
def _find(tree_sum, offset, masses, out):  # pragma: no cover - jitted
    _descend(tree_sum, offset, masses.copy(), out)


@numba.njit(cache=True, nogil=True)
def _sample_stratified(tree_sum, offset, uniforms, indices, values):  # pragma: no cover - jitted
    batch = uniforms.shape[0]
    segment = tree_sum[1] / batch
    masses = np.empty(batch, dtype=np.float64)
    for i in range(batch):
        masses[i] = (i + uniforms[i]) * segment
    _descend(tree_sum, offset, masses, indices)
    for i in range(batch):
        values[i] = tree_sum[indices[i] + offset]
