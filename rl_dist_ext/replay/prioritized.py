"""One prioritized replay shard: columnar storage + a sum/min tree sampler (Schaul et al. 2016).

Keys: every inserted row gets its global insertion id (``0, 1, 2, ...``) as its key. The row lives
in slot ``key % capacity`` until it is overwritten, so a key identifies (slot, generation): a
priority update whose key no longer matches the slot's occupant is stale; it is dropped and counted,
never applied to the newer item.

Priorities given to :meth:`PrioritizedReplay.add` and :meth:`PrioritizedReplay.update_priorities`
are raw magnitudes (typically ``|TD error|``); the shard stores ``(p + eps) ** alpha``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

import numba
import numpy as np

from rl_dist_ext.ops.priorities import (
    PER_ALPHA,
    PER_BETA,
    PER_EPS,
    td_priorities,
    validate_alpha_eps,
)
from rl_dist_ext.replay import compression as codec
from rl_dist_ext.replay.storage import ColumnarStorage, check_priorities
from rl_dist_ext.replay.sum_tree import SumTree
from rl_dist_ext.validation import check_int

STATE_FORMAT = 1
#: The most rows one sample draws (where the capacity is smaller): a larger request is a unit
#: mistake that would allocate gigabytes before failing.
MAX_SAMPLE_ROWS = 2**20
#: Snapshot column names (see PrioritizedReplay.snapshot)
ROW_PREFIX = "row."
INSERT_IDS = "key.insert_ids"
PRIORITIES = "key.priorities"


class ReplaySample(NamedTuple):
    """What :meth:`PrioritizedReplay.sample` returns."""

    batch: dict[str, np.ndarray]  # column -> [B, ...]
    keys: np.ndarray  # [B] int64, pass back to update_priorities
    weights: np.ndarray  # [B] float32 importance weights, max possible weight = 1


class SampledItems(NamedTuple):
    """Lower-level draw for callers that normalise weights across shards."""

    keys: np.ndarray  # [B] int64
    priorities: np.ndarray  # [B] float64, stored (exponentiated) priorities p_i
    batch: dict[str, np.ndarray]  # column -> [B, ...]


class PrioritizedReplay:
    """A fixed-capacity, FIFO, proportionally prioritized replay for any transition schema.

    Args:
        capacity: maximum number of rows; the oldest are overwritten first.
        alpha: prioritization exponent (``0`` = uniform replay).
        eps: added to raw priorities so none is zero.
        seed: seed of the sampler's random generator.
        compression: columns to store compressed (pixel observations), see
            :mod:`rl_dist_ext.replay.compression`; :meth:`add` takes raw batches or
            :class:`~rl_dist_ext.replay.compression.PackedRows`, :meth:`sample` returns raw arrays.
    """

    def __init__(
        self,
        capacity: int,
        *,
        alpha: float = PER_ALPHA,
        eps: float = PER_EPS,
        seed: int | None = None,
        compression: codec.ObsCompression | None = None,
    ) -> None:
        self._capacity = check_int("capacity", capacity, 1)
        if compression is not None and not isinstance(compression, codec.ObsCompression):
            raise TypeError(
                f"compression must be an ObsCompression or None, got {type(compression).__name__}"
            )
        self._compression = compression
        self._layout: tuple[codec.ColumnLayout, ...] | None = None
        validate_alpha_eps(alpha, eps)
        self._alpha = float(alpha)
        self._eps = float(eps)
        self._storage = ColumnarStorage(self._capacity)
        self._tree = SumTree(self._capacity)
        self._rng = np.random.default_rng(seed)
        self._max_priority = 1.0
        self._stale_updates = 0

    # ---- properties ---------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def alpha(self) -> float:
        return self._alpha

    @property
    def num_inserted(self) -> int:
        """Rows added since creation, including those since overwritten."""
        return self._storage.num_inserted

    @property
    def stale_updates(self) -> int:
        """Priority updates dropped because their row had been overwritten."""
        return self._stale_updates

    @property
    def total_priority(self) -> float:
        """Sum of stored priorities ``sum_i p_i``."""
        return self._tree.total

    @property
    def min_priority(self) -> float:
        """Smallest stored priority (``inf`` when empty)."""
        return self._tree.min

    @property
    def max_priority(self) -> float:
        """Largest raw priority seen; new rows without a priority get it."""
        return self._max_priority

    def __len__(self) -> int:
        return len(self._storage)

    @property
    def compression(self) -> codec.ObsCompression | None:
        return self._compression

    @property
    def nbytes(self) -> int:
        """Memory the stored rows take (compressed columns at their compressed size)."""
        return self._storage.nbytes

    @property
    def uncompressed_row_bytes(self) -> int:
        """What one row would take with nothing compressed (0 before the first add)."""
        layout = 0 if self._layout is None else codec.layout_row_bytes(self._layout)
        return self._storage.array_row_bytes + layout

    # ---- insert / sample / update -------------------------------------------------------------
    def add(
        self, batch: Mapping[str, np.ndarray], priorities: np.ndarray | None = None
    ) -> np.ndarray:
        """Insert ``B`` rows; return their ``[B]`` int64 keys.

        Args:
            batch: column name -> ``[B, ...]`` array; the first call fixes the schema. With
                ``compression``, also :class:`~rl_dist_ext.replay.compression.PackedRows`.
            priorities: ``[B]`` raw non-negative priorities (e.g. ``|TD error|``), or ``None``
                for the largest priority seen so far.
        """
        arrays, rows = self._storage.validate(self._to_stored(batch))
        if priorities is None:
            raw = np.full(rows, self._max_priority, dtype=np.float64)
        else:
            raw = check_priorities(priorities, rows)
        kept = slice(max(0, rows - self._capacity), rows)
        raw = raw[kept]
        stored = td_priorities(raw, alpha=self._alpha, eps=self._eps)
        if not np.isfinite(stored).all():
            raise ValueError(
                f"priorities overflow: (p + eps) ** alpha is not finite for alpha={self._alpha}"
            )
        slots = self._storage.write(arrays, rows)
        self._tree.update(slots[kept], stored)
        if raw.size:
            self._max_priority = max(self._max_priority, float(raw.max()))
        next_id = self._storage.next_id
        return np.arange(next_id - rows, next_id, dtype=np.int64)

    def sample(self, batch_size: int, *, beta: float = PER_BETA) -> ReplaySample:
        """Draw ``batch_size`` rows with probability ``p_i / sum_k p_k`` (stratified, replacing).

        Returns:
            :class:`ReplaySample` ``(batch, keys, weights)``; weights are ``(N P(i)) ** -beta``
            divided by the largest possible weight in the shard, ``(N P_min) ** -beta``.
        """
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {beta!r}")
        items = self.sample_items(batch_size)
        # importance_weights() with min_priority: (N p_i / total) ** -beta over
        # (N p_min / total) ** -beta, i.e. (p_i / p_min) ** -beta; N and total cancel.
        weights = np.power(items.priorities * (1.0 / self._tree.min), -beta, dtype=np.float32)
        return ReplaySample(items.batch, items.keys, weights)

    def sample_items(self, batch_size: int) -> SampledItems:
        """Draw rows as :meth:`sample` does, returning stored priorities instead of weights."""
        batch_size = check_int("batch_size", batch_size, 1)
        if batch_size > max(MAX_SAMPLE_ROWS, self._capacity):
            raise ValueError(
                f"batch_size={batch_size} is more rows than one draw takes (at most "
                f"{max(MAX_SAMPLE_ROWS, self._capacity)}: 2**20, or the capacity if larger)"
            )
        if self._storage.num_inserted == 0:
            raise ValueError("cannot sample from an empty replay; add() transitions first")
        slots, priorities = self._tree.sample_stratified(self._rng.random(batch_size))
        keys = self._storage.insert_ids[slots]
        batch = self._storage.gather(slots)
        if self._compression is not None:
            batch.update(
                codec.unpack(batch.pop(codec.BLOB_COLUMN), self._layout, self._compression.codec)
            )
        return SampledItems(keys, priorities, batch)

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        """Set new raw priorities for sampled rows; return how many were stale and dropped.

        Args:
            keys: ``[B]`` int64 keys from :meth:`sample`.
            priorities: ``[B]`` raw non-negative priorities (e.g. ``|TD error|``).
        """
        keys = np.asarray(keys)
        if keys.size == 0 and keys.ndim == 1:
            keys = keys.astype(np.int64)
        if keys.ndim != 1 or keys.dtype.kind not in "iu":
            raise ValueError(f"keys must be a [B] integer array, got {keys.dtype} {keys.shape}")
        raw = np.asarray(priorities, dtype=np.float64)
        if raw.shape != keys.shape:
            raise ValueError(f"priorities must have shape {keys.shape} like keys, got {raw.shape}")
        slots = np.empty(keys.shape[0], dtype=np.int64)
        values = np.empty(keys.shape[0], dtype=np.float64)
        live, max_raw, bad = _live_updates(
            keys.astype(np.int64, copy=False),
            raw,
            self._storage.insert_ids,
            self._storage.next_id,
            self._alpha,
            self._eps,
            slots,
            values,
        )
        if bad >= 0:
            raise ValueError(
                f"update_priorities rejected item {bad}: key {keys[bad]} must be in "
                f"[0, {self._storage.next_id}) (a key this replay handed out) and priority "
                f"{raw[bad]} must be finite and >= 0 with (p + eps) ** alpha finite"
            )
        self._tree.update(slots[:live], values[:live], validate=False)
        self._max_priority = max(self._max_priority, max_raw)
        stale = keys.shape[0] - live
        self._stale_updates += stale
        return stale

    def clear(self) -> None:
        """Drop every row. Keys handed out before never match a later row; counters go on.

        ``num_inserted`` restarts at 0 (it counts the rows of this replay's current contents);
        stale-update counts are kept.
        """
        next_id = self._storage.next_id
        self._storage = ColumnarStorage(self._capacity)
        self._storage.skip_ids(next_id // self._capacity + 1)
        self._tree = SumTree(self._capacity)
        self._max_priority = 1.0
        self._layout = None

    def invalidate_outstanding_keys(self, rng: np.random.Generator | None = None) -> None:
        """Make keys handed out by a lost copy of this replay unusable on this one.

        After restoring a snapshot, keys of rows added after the snapshot (by the copy that died)
        would otherwise be handed out again for different rows. This moves future keys a random
        ``[2**10, 2**20)`` multiples of ``capacity`` further on, so stale updates for those keys
        find no match and are dropped; keys of the restored rows stay valid.
        """
        rng = rng if rng is not None else np.random.default_rng()
        self._storage.skip_ids(int(rng.integers(2**10, 2**20)))

    # ---- checkpointing ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: rows, keys, priorities, counters, RNG state."""
        size = len(self)
        return {
            "format": STATE_FORMAT,
            "capacity": self._capacity,
            "alpha": self._alpha,
            "eps": self._eps,
            "storage": self._storage.state_dict(),
            "priorities": self._tree.leaves()[:size],
            "max_priority": self._max_priority,
            "stale_updates": self._stale_updates,
            "rng": self._rng.bit_generator.state,
            "compression": self._compression,
            "layout": self._layout,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict`; capacity and alpha must match this replay's."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"unknown replay state format {state.get('format')!r}")
        for name, mine in (
            ("capacity", self._capacity),
            ("alpha", self._alpha),
            ("eps", self._eps),
        ):
            if state[name] != mine:
                raise ValueError(
                    f"state was saved with {name}={state[name]!r}, this replay has {name}={mine!r}"
                )
        if state.get("compression") != self._compression:
            raise ValueError(
                f"state was saved with compression={state.get('compression')!r}, this replay "
                f"has compression={self._compression!r}"
            )
        max_priority = float(state["max_priority"])
        if not 0.0 <= max_priority < np.inf:
            raise ValueError(f"state max_priority must be finite and >= 0, got {max_priority}")
        priorities = np.asarray(state["priorities"], dtype=np.float64)
        size = min(int(state["storage"]["num_inserted"]), self._capacity)
        if priorities.shape != (size,) or not (np.isfinite(priorities) & (priorities >= 0)).all():
            raise ValueError(f"state priorities must be {size} finite values >= 0")
        self._storage.load_state_dict(state["storage"])
        self._layout = state.get("layout")
        leaves = np.zeros(self._capacity, dtype=np.float64)
        leaves[:size] = priorities
        self._tree.load_state_dict({"leaves": leaves})
        self._max_priority = max_priority
        self._stale_updates = int(state["stale_updates"])
        self._rng.bit_generator.state = state["rng"]

    def snapshot(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """This replay as a snapshot (:mod:`rl_dist_ext.replay.snapshot`): its counters and
        settings as JSON-able ``state``, its rows as ``columns`` (stored columns as
        ``row.<name>``, then ``key.insert_ids`` and ``key.priorities``). The stored columns are
        views: write them before the replay changes."""
        columns, insert_ids = self._storage.rows()
        compression = self._compression
        state = {
            "replay_format": STATE_FORMAT,
            "capacity": self._capacity,
            "alpha": self._alpha,
            "eps": self._eps,
            "num_inserted": self._storage.num_inserted,
            "key_base": self._storage.key_base,
            "max_priority": self._max_priority,
            "stale_updates": self._stale_updates,
            "rng": self._rng.bit_generator.state,
            "compression": None if compression is None else dataclasses.asdict(compression),
            "layout": None if self._layout is None else [list(c) for c in self._layout],
        }
        out = {f"{ROW_PREFIX}{name}": column for name, column in columns.items()}
        out[INSERT_IDS] = insert_ids
        out[PRIORITIES] = self._tree.leaves()[: len(self)]
        return state, out

    def load_snapshot(self, state: Mapping[str, Any], columns: Mapping[str, np.ndarray]) -> None:
        """Restore from :meth:`snapshot`'s output (as read back from a snapshot file); raises
        ``ValueError``/``TypeError``/``KeyError`` for content that does not fit this replay."""
        compression = state["compression"]
        if compression is not None:
            compression = codec.ObsCompression(
                columns=tuple(compression["columns"]),
                codec=compression["codec"],
                level=compression["level"],
            )
        layout = state["layout"]
        if layout is not None:
            layout = tuple(
                codec.ColumnLayout(name, tuple(shape), dtype) for name, shape, dtype in layout
            )
            names = tuple(column.name for column in layout)
            if compression is None or names != compression.columns:
                raise ValueError(f"snapshot layout names {names}, not the compressed columns")
            for column in layout:
                if (
                    not isinstance(column.dtype, str)
                    or np.dtype(column.dtype).kind not in "biuf"
                    or not all(type(d) is int and d >= 0 for d in column.shape)
                ):
                    raise ValueError(f"snapshot layout {state['layout']!r} is malformed")
        rows = {k[len(ROW_PREFIX) :]: v for k, v in columns.items() if k.startswith(ROW_PREFIX)}
        if set(columns) - {*(ROW_PREFIX + k for k in rows), INSERT_IDS, PRIORITIES}:
            raise ValueError(f"unknown snapshot columns {sorted(columns)}")
        self.load_state_dict(
            {
                "format": state["replay_format"],
                "capacity": state["capacity"],
                "alpha": state["alpha"],
                "eps": state["eps"],
                "storage": {
                    "columns": rows,
                    "insert_ids": columns[INSERT_IDS],
                    "num_inserted": state["num_inserted"],
                    "key_base": state["key_base"],
                },
                "priorities": columns[PRIORITIES],
                "max_priority": state["max_priority"],
                "stale_updates": state["stale_updates"],
                "rng": state["rng"],
                "compression": compression,
                "layout": layout,
            }
        )

    def _to_stored(self, batch: Any) -> Mapping[str, np.ndarray]:
        """The columns stored for ``batch``: compressed columns become one blob column."""
        if self._compression is None:
            if isinstance(batch, codec.PackedRows):
                raise ValueError(
                    "got compressed rows (PackedRows) but this replay has no compression set"
                )
            if isinstance(batch, Mapping) and codec.BLOB_COLUMN in batch:
                raise ValueError(f"batch column {codec.BLOB_COLUMN!r} is reserved")
            return batch
        if isinstance(batch, Mapping):
            batch = codec.pack(dict(batch), self._compression)
        if not isinstance(batch, codec.PackedRows):
            raise TypeError(
                f"batch must be a dict[str, np.ndarray] or PackedRows, got {type(batch).__name__}"
            )
        if batch.codec != self._compression.codec:
            raise ValueError(
                f"rows were compressed with codec {batch.codec!r}, this replay uses "
                f"{self._compression.codec!r}"
            )
        if self._layout is None:
            self._layout = batch.layout
        elif batch.layout != self._layout:
            raise ValueError(
                f"compressed columns {batch.layout} do not match the replay schema {self._layout}"
            )
        return {**batch.columns, codec.BLOB_COLUMN: batch.blobs}


@numba.njit(cache=True, nogil=True)
def _live_updates(keys, raw, insert_ids, next_id, alpha, eps, slots, values):  # pragma: no cover
    """Validate ``(keys, raw)``, drop stale keys, exponentiate; the fused hot path of an update.

    Writes the live items' slots and ``(raw + eps) ** alpha`` to the front of ``slots``/``values``
    and returns ``(num_live, max_raw, bad_position)`` (``bad_position = -1`` when all are valid).
    """
    capacity = insert_ids.shape[0]
    live = 0
    max_raw = 0.0
    for i in range(keys.shape[0]):
        key = keys[i]
        p = raw[i]
        if key < 0 or key >= next_id or not (p >= 0.0) or p == np.inf:
            return 0, 0.0, i
        value = (p + eps) ** alpha
        if value == np.inf:
            return 0, 0.0, i
        slot = key % capacity
        if insert_ids[slot] == key:
            slots[live] = slot
            values[live] = value
            live += 1
            max_raw = max(max_raw, p)
    return live, max_raw, -1
