"""Pre-allocated columnar FIFO storage for transitions of any ``dict[str, np.ndarray]`` schema."""

from __future__ import annotations

import sys
from collections.abc import Mapping

import numpy as np

_BYTES_HEADER = sys.getsizeof(b"")  # what a Python bytes object costs beyond its contents


class ColumnarStorage:
    """Ring buffer of ``capacity`` rows; one pre-allocated numpy array per column.

    The schema (column names, per-row shapes, dtypes) is learned from the first :meth:`write` and
    every later batch is validated against it. Row number ``i`` (0, 1, 2, ... in insertion order)
    lives in slot ``i % capacity`` and gets the id ``key_base + i``; ``key_base`` is a multiple of
    ``capacity`` (0 unless :meth:`skip_ids` moved it), so ``id % capacity`` is always the slot and
    ``insert_ids[id % capacity] == id`` tells whether that row is still stored.
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._columns: dict[str, np.ndarray] = {}
        self._insert_ids = np.full(capacity, -1, dtype=np.int64)
        self._num_inserted = 0
        self._key_base = 0
        self._object_bytes = 0  # contents of the bytes objects in object columns, live rows

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def num_inserted(self) -> int:
        """Rows written since creation (never decreases)."""
        return self._num_inserted

    @property
    def next_id(self) -> int:
        """The id the next written row gets; every id handed out so far is below it."""
        return self._key_base + self._num_inserted

    def skip_ids(self, multiples: int) -> None:
        """Move future ids ``multiples * capacity`` further on (slots keep their FIFO order)."""
        if multiples < 1:
            raise ValueError(f"multiples must be >= 1, got {multiples!r}")
        self._key_base += multiples * self._capacity

    @property
    def insert_ids(self) -> np.ndarray:
        """``[capacity]`` int64 insertion id of the row in each slot (-1 = never written)."""
        return self._insert_ids

    def __len__(self) -> int:
        return min(self._num_inserted, self._capacity)

    @property
    def array_row_bytes(self) -> int:
        """Bytes of one row in the numeric (non-object) columns."""
        return sum(
            _row_items(c) * c.itemsize for c in self._columns.values() if not c.dtype.hasobject
        )

    @property
    def nbytes(self) -> int:
        """Memory the stored rows take: numeric columns, plus the bytes objects of object
        columns (e.g. compressed observations) with their pointers and Python object headers."""
        objects = sum(_row_items(c) for c in self._columns.values() if c.dtype.hasobject)
        per_row = self.array_row_bytes + objects * (8 + _BYTES_HEADER)
        return len(self) * per_row + self._object_bytes

    def validate(self, batch: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
        """Check ``batch`` against the schema (or that it can found one); return arrays and rows."""
        arrays, rows = check_batch(batch)
        if self._columns:
            self._check_schema(arrays)
        return arrays, rows

    def write(self, arrays: dict[str, np.ndarray], rows: int) -> np.ndarray:
        """Write validated ``arrays`` (from :meth:`validate`); return ``[rows]`` int64 slots.

        When ``rows > capacity`` only the newest ``capacity`` rows survive (FIFO).
        """
        if not self._columns:
            self._allocate(arrays)
        ids = np.arange(self.next_id, self.next_id + rows, dtype=np.int64)
        slots = ids % self._capacity
        keep = slice(max(0, rows - self._capacity), rows)
        for name, column in self._columns.items():
            if column.dtype.hasobject:
                live = slots[keep][self._insert_ids[slots[keep]] >= 0]
                self._object_bytes += _content_bytes(arrays[name][keep]) - _content_bytes(
                    column[live]
                )
            column[slots[keep]] = arrays[name][keep]
        self._insert_ids[slots[keep]] = ids[keep]
        self._num_inserted += rows
        return slots

    def gather(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """Rows at ``slots`` as a new ``dict[str, [B, ...]]``."""
        return {name: column.take(slots, axis=0) for name, column in self._columns.items()}

    def rows(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Views (not copies) of the stored rows' columns and insert ids, in slot order."""
        size = len(self)
        return {k: v[:size] for k, v in self._columns.items()}, self._insert_ids[:size]

    @property
    def key_base(self) -> int:
        return self._key_base

    def state_dict(self) -> dict:
        columns, insert_ids = self.rows()
        return {
            "columns": {k: v.copy() for k, v in columns.items()},
            "insert_ids": insert_ids.copy(),
            "num_inserted": self._num_inserted,
            "key_base": self._key_base,
        }

    def load_state_dict(self, state: Mapping) -> None:
        size = min(int(state["num_inserted"]), self._capacity)
        columns = state["columns"]
        insert_ids = np.asarray(state["insert_ids"], dtype=np.int64)
        if insert_ids.shape != (size,):
            raise ValueError(
                f"state insert_ids must have shape ({size},) for num_inserted="
                f"{state['num_inserted']} and capacity {self._capacity}, got {insert_ids.shape}"
            )
        for name, column in columns.items():
            if np.asarray(column).shape[:1] != (size,):
                raise ValueError(f"state column {name!r} must have {size} rows")
        key_base, num_inserted = int(state["key_base"]), int(state["num_inserted"])
        if key_base < 0 or key_base % self._capacity or num_inserted < 0:
            raise ValueError(
                f"state key_base={key_base} must be a multiple of the capacity {self._capacity} "
                f"and num_inserted={num_inserted} >= 0"
            )
        slots = np.arange(size, dtype=np.int64)
        if size and not (
            (insert_ids % self._capacity == slots).all()
            and (insert_ids >= 0).all()
            and (insert_ids < key_base + num_inserted).all()
        ):
            raise ValueError("state insert_ids do not name the rows in their slots")
        self._columns = {}
        self._insert_ids[:] = -1
        self._object_bytes = 0
        if columns:
            self._allocate(columns)
            for name, column in columns.items():
                self._columns[name][:size] = column
                if self._columns[name].dtype.hasobject:
                    self._object_bytes += _content_bytes(self._columns[name][:size])
        self._insert_ids[:size] = insert_ids
        self._num_inserted = num_inserted
        self._key_base = key_base

    def _allocate(self, arrays: Mapping[str, np.ndarray]) -> None:
        self._columns = {
            name: np.zeros((self._capacity, *np.shape(a)[1:]), dtype=np.asarray(a).dtype)
            for name, a in arrays.items()
        }

    def _check_schema(self, arrays: dict[str, np.ndarray]) -> None:
        if arrays.keys() != self._columns.keys():
            raise ValueError(
                f"batch columns {sorted(arrays)} do not match the replay schema "
                f"{sorted(self._columns)}"
            )
        for name, array in arrays.items():
            column = self._columns[name]
            if array.shape[1:] != column.shape[1:]:
                raise ValueError(
                    f"batch[{name!r}] rows have shape {array.shape[1:]}, the replay schema "
                    f"expects {column.shape[1:]}"
                )
            if not np.can_cast(array.dtype, column.dtype, casting="same_kind"):
                raise ValueError(
                    f"batch[{name!r}] has dtype {array.dtype}, which cannot be stored as "
                    f"{column.dtype} (the replay schema)"
                )


def check_batch(batch: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
    """``batch`` as arrays with its row count; ``TypeError``/``ValueError`` unless it is a
    non-empty ``dict[str, array]`` whose arrays have a row axis of one length (what any replay
    schema needs: the rest is checked against the schema where it is stored)."""
    if not isinstance(batch, Mapping) or not batch:
        raise TypeError(
            f"batch must be a non-empty dict[str, np.ndarray], got {type(batch).__name__}"
        )
    arrays: dict[str, np.ndarray] = {}
    rows = None
    for name, value in batch.items():
        if not isinstance(name, str):
            raise TypeError(f"batch keys must be str, got {name!r}")
        array = np.asarray(value)
        if array.ndim < 1:
            raise ValueError(f"batch[{name!r}] must have a leading batch dim, got a scalar")
        if rows is None:
            rows = array.shape[0]
        elif array.shape[0] != rows:
            raise ValueError(
                f"batch[{name!r}] has {array.shape[0]} rows but other columns have {rows}"
            )
        arrays[name] = array
    return arrays, int(rows)


def check_priorities(priorities: np.ndarray, rows: int) -> np.ndarray:
    """Raw priorities as float64 ``[rows]``; ``ValueError`` unless finite and >= 0."""
    raw = np.asarray(priorities, dtype=np.float64)
    if raw.shape != (rows,):
        raise ValueError(f"priorities must have shape ({rows},), got {raw.shape}")
    if rows and not (np.isfinite(raw).all() and raw.min() >= 0.0):
        raise ValueError("priorities must be finite and >= 0")
    return raw


def _content_bytes(objects: np.ndarray) -> int:
    """Total ``len`` of the bytes objects in an object array (0 for entries that are None)."""
    return sum(len(x) for x in objects.ravel() if x is not None)


def _row_items(column: np.ndarray) -> int:
    return int(np.prod(column.shape[1:], dtype=np.int64))
