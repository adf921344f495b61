"""Delta weight pulls: an actor that holds version v receives what changed since v.

The ``"delta"`` weights encoding of the parameter server (``weights_encoding="delta"``). Every
floating-point weight an actor holds stays within a stated bound of the learner's:

    |w_actor - w_learner| <= tau_t = tolerance * rms_t     for every element of tensor t,

where ``w_learner`` is the weights version the actor holds as the learner published it and
``rms_t`` is tensor t's root mean square when the server drew its grid (from the first weights
it was asked for; the network's RMS over all tensors, for a tensor that was all zero then),
fixed from then on, checked in the float32 arithmetic the actors use. A new grid is drawn (and
every actor pulls in full) when the server restarts, the network's layout changes, or a weight
grows past 2**24 grid units (where float32 still holds every count exactly); weights holding
NaN or inf are refused (``ValueError`` at the pull).

How (the server's side, :class:`DeltaPublisher`, inside the parameter server):

- **A shadow on a fixed grid.** The server keeps the weights the actors hold as integers,
  ``shadow_t = unit_t * m_t`` with ``unit_t = tau_t / 4`` and ``m_t`` int32, fixed for the server's
  life (a restarted server draws a new grid). Integers compose exactly: an actor that adds the
  changes of several versions holds the same floats as the server, bit for bit.
- **Error feedback on the server's side.** The shadow advances lazily, at the first pull after a
  publish: an element moves (``m += round((w - shadow) / unit)``) only where the learner's weight
  is more than ``tau_t`` from it; everything smaller waits in the residual ``w - shadow``, which the
  next advance sees again. So no actor's weight is ever more than ``tau_t`` off, and elements that
  drift slowly travel only when their drift adds up to ``tau_t``.
- **What travels.** A pull names the version (and grid) it holds; it gets the sum of the shadow's
  changes since then, as a bitmap of the changed elements plus their int8 steps (larger steps as
  int32), compressed (zstd where the ``zstandard`` package is installed, else zlib). New actors,
  actors behind the retained history (``max_history`` advances, and no more changes than twice
  the network's elements), actors of a previous server
  incarnation and pulls whose delta would not be smaller get the shadow in full (``m`` in the
  narrowest integer type, compressed, and the units).

The actor's side, :class:`DeltaReceiver`, lives in the parameter server client and rebuilds the
weights tree (float32; torch tensors where the learner published tensors). Measured bytes, pulls/s
and greedy-action agreement with real training steps: ``benchmarks/weight_sync_bench.py``.
"""

from __future__ import annotations

import uuid
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from rl_dist_ext.validation import check_int, check_real, is_torch_tensor
from rl_dist_ext.weight_compression import map_float_leaves, map_leaves

#: the default bound, as a fraction of each tensor's RMS (``benchmarks/weight_sync_bench.py``):
#: with it the Nature CNN's pull every 100 updates keeps at least 99.6% of the greedy actions at
#: every pull (0.005: 88.9%, 0.02: 0%), its pulls for 4 actors every 400 updates are 0.23x the
#: int8 full pull, and a CartPole MLP trained to a greedy 500 keeps 98.7% on the states it
#: visits at a pull every 400 updates (0.02: 65%; int8 full pulls 49%, fp16 98%)
DEFAULT_TOLERANCE = 0.001
UNITS_PER_TOLERANCE = 4  # grid units per tau: an element that moves lands within tau / 8
_ESCAPE = -128  # an int8 step that stands for "the next int32 escape value"
#: grid units a weight may be from 0: float32 holds every integer up to 2**24 exactly, so an
#: actor's unit x count is within rounding of the grid point (further out, float32's spacing
#: passes 4 units: the bound would fail)
_MAX_COUNT = 2**24


@dataclass(frozen=True)
class _LeafSpec:
    """Where a floating-point leaf's elements lie in the flat vector (a plain class, not a
    tuple, so tree walks stop at it)."""

    start: int
    shape: tuple[int, ...]
    torch_tensor: bool

    @property
    def stop(self) -> int:
        return self.start + int(np.prod(self.shape, dtype=np.int64))


class FlatWeights(NamedTuple):
    skeleton: Any  # the weights tree, each floating-point leaf replaced by its _LeafSpec
    values: np.ndarray  # float32 [N]: every floating-point leaf's elements, in tree order


def flatten_weights(weights: Any) -> FlatWeights:
    """The floating-point leaves of a weights tree as one float32 vector, and the rest."""
    parts: list[np.ndarray] = []
    start = 0

    def take(leaf: Any) -> _LeafSpec:
        nonlocal start
        is_torch = is_torch_tensor(leaf)
        array = leaf.detach().float().cpu().numpy() if is_torch else np.asarray(leaf)
        spec = _LeafSpec(start, tuple(array.shape), is_torch)
        parts.append(array.astype(np.float32, copy=False).ravel())
        start = spec.stop
        return spec

    skeleton = map_float_leaves(weights, take)
    values = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    return FlatWeights(skeleton, values)


def unflatten_weights(skeleton: Any, values: np.ndarray) -> Any:
    """The weights tree of ``skeleton`` with its floating-point leaves taken from ``values``."""

    def restore(leaf: Any) -> Any:
        if not isinstance(leaf, _LeafSpec):
            return leaf
        array = values[leaf.start : leaf.stop].reshape(leaf.shape)
        if not leaf.torch_tensor:
            return array
        import torch  # weights that were tensors go to a process that uses torch

        return torch.from_numpy(array)

    return map_leaves(skeleton, restore)


def _leaf_sizes(skeleton: Any) -> tuple[tuple[tuple[int, ...], int], ...]:
    """Each floating-point leaf's shape and element count, in tree order."""
    specs: list[_LeafSpec] = []
    map_leaves(skeleton, lambda leaf: specs.append(leaf) if isinstance(leaf, _LeafSpec) else None)
    return tuple((spec.shape, spec.stop - spec.start) for spec in specs)


class DeltaPull(NamedTuple):
    """What one pull carries: the shadow at ``version``, in full (``base_version == -1``) or as
    its change since ``base_version`` on grid ``grid``."""

    grid: str
    version: int
    base_version: int
    skeleton: Any
    units: np.ndarray | None  # float32 [num float leaves]: with full pulls only
    payload: tuple[bytes, ...]
    codec: str

    @property
    def is_full(self) -> bool:
        return self.base_version < 0

    @property
    def num_bytes(self) -> int:
        """The compressed bytes (the skeleton and units aside)."""
        return sum(len(part) for part in self.payload)


def _compressor() -> tuple[str, Any]:
    try:
        import zstandard

        return "zstd", zstandard.ZstdCompressor(level=3).compress
    except ImportError:
        return "zlib", lambda data: zlib.compress(data, 6)


def _decompress(codec: str, data: bytes) -> bytes:
    if codec == "zlib":
        return zlib.decompress(data)
    import zstandard

    return zstandard.ZstdDecompressor().decompress(data)


def _narrowest(values: np.ndarray) -> np.ndarray:
    for dtype in (np.int8, np.int16):
        info = np.iinfo(dtype)
        if values.size == 0 or (values.min() >= info.min and values.max() <= info.max):
            return values.astype(dtype)
    return values.astype(np.int32)


class _Step(NamedTuple):
    """One advance of the shadow: from ``base`` to ``version``, ``steps`` at ``where``."""

    base: int
    version: int
    where: np.ndarray  # int32 [changed]
    steps: np.ndarray  # int32 [changed]


class DeltaPublisher:
    """The server's side: the shadow the actors hold and the history of its advances.

    Args:
        tolerance: the bound ``tau_t`` as a fraction of each tensor's RMS (> 0).
        max_history: advances kept (and no more than twice the network's elements changed
            in them all: 16 bytes a weight at most); an actor further behind gets the shadow in
            full.
    """

    def __init__(self, tolerance: float = DEFAULT_TOLERANCE, *, max_history: int = 1024) -> None:
        self.tolerance = check_real("delta_tolerance", tolerance, low=0.0, strict=True)
        self._max_history = check_int("max_history", max_history, 1)
        self._codec, self._compress = _compressor()
        self.grid = uuid.uuid4().hex  # this incarnation's grid
        self._layout: tuple | None = None
        self._unit_of_leaf: np.ndarray | None = None  # float32 [leaves]
        self._unit: np.ndarray | None = None  # float32 [N]
        self._shadow: np.ndarray | None = None  # int32 [N]: shadow = unit * shadow
        self.version = -1  # of the shadow
        self._skeleton: Any = None
        self._history: deque[_Step] = deque()
        self._full: DeltaPull | None = None  # the shadow's full pull, cached per version
        self._full_bytes = 0  # the last full pull's size: a delta must be smaller
        self.num_full_pulls = 0
        self.num_delta_pulls = 0
        self.bytes_sent = 0

    def pull(self, weights: Any, version: int, held: tuple[str, int] | None) -> DeltaPull:
        """What an actor holding ``held`` (``(grid, version)``, or ``None``) needs to hold the
        published ``weights`` of ``version`` (newer than the actor's), within the bound."""
        if version > self.version:
            self._advance(flatten_weights(weights), version)
        answer = None
        if held is not None and held[0] == self.grid and held[1] != self.version:
            answer = self._delta_since(held[1])
        if answer is None or answer.num_bytes >= self._full_bytes:
            answer = self._full_pull()
            self._full_bytes = answer.num_bytes
        if answer.is_full:
            self.num_full_pulls += 1
        else:
            self.num_delta_pulls += 1
        self.bytes_sent += answer.num_bytes
        return answer

    def _advance(self, flat: FlatWeights, version: int) -> None:
        if not np.all(np.isfinite(flat.values)):
            raise ValueError(
                f"the weights of version {version} hold NaN or inf (the learner diverged): "
                "delta pulls carry finite weights only"
            )
        layout = _leaf_sizes(flat.skeleton)
        self._skeleton = flat.skeleton
        self._full = None
        counts = None if layout != self._layout else flat.values / self._unit
        if counts is None or np.abs(counts).max(initial=0.0) > _MAX_COUNT:
            # the first weights, another network, or weights that outgrew the grid's int32
            # range: a new grid, and every actor pulls in full
            self._new_grid(flat, layout)
            self.version = version
            return
        assert self._shadow is not None
        # The error an actor holding the shadow sees, in its own float32 arithmetic (the
        # subtraction of two such close floats is exact): checking grid units instead lets the
        # rounding of unit x count (a few 1e-4 units at thousands of units from 0) carry an
        # element just inside the bound outside it.
        error = flat.values - self._unit * self._shadow.astype(np.float32)
        where = np.flatnonzero(np.abs(error) > UNITS_PER_TOLERANCE * self._unit).astype(np.int32)
        steps = np.rint(counts[where] - self._shadow[where]).astype(np.int32)
        self._shadow[where] += steps
        self._history.append(_Step(self.version, version, where, steps))
        changed = sum(step.where.size for step in self._history)
        while len(self._history) > self._max_history or changed > 2 * self._shadow.size:
            changed -= self._history.popleft().where.size
        self.version = version

    def _new_grid(self, flat: FlatWeights, layout: tuple) -> None:
        """Units from these weights (after the first: a new grid, every actor pulls in full)."""
        if self._layout is not None:
            self.grid = uuid.uuid4().hex
        overall = float(np.sqrt(np.mean(np.square(flat.values, dtype=np.float64))))
        units, start = [], 0
        for _, size in layout:
            tensor = flat.values[start : start + size].astype(np.float64)
            start += size
            rms = float(np.sqrt(np.mean(np.square(tensor)))) if size else 0.0
            scale = rms if rms > 0 else (overall if overall > 0 else 1.0)
            units.append(self.tolerance * scale / UNITS_PER_TOLERANCE)
        self._layout = layout
        self._unit_of_leaf = np.asarray(units, np.float32)
        self._unit = np.repeat(self._unit_of_leaf, [size for _, size in layout])
        counts = flat.values / self._unit
        if np.abs(counts).max(initial=0.0) > _MAX_COUNT:
            raise ValueError(
                f"delta_tolerance={self.tolerance!r} is too fine for these weights: a weight "
                f"is {np.abs(counts).max():.3g} grid units from 0 (at most {_MAX_COUNT})"
            )
        self._shadow = np.rint(counts).astype(np.int32)
        self._full_bytes = self._shadow.size  # until a full pull is made: 1 byte an element
        self._history.clear()

    def _full_pull(self) -> DeltaPull:
        if self._full is None:
            assert self._shadow is not None
            payload = (self._compress(_narrowest(self._shadow).tobytes()),)
            self._full = DeltaPull(
                self.grid,
                self.version,
                -1,
                self._skeleton,
                self._unit_of_leaf,
                payload,
                self._codec,
            )
        return self._full

    def _delta_since(self, base: int) -> DeltaPull | None:
        """The shadow's change since version ``base``; ``None`` if that is not in the history."""
        bases = [step.base for step in self._history]
        if base not in bases:
            return None
        chain = list(self._history)[bases.index(base) :]
        assert self._shadow is not None
        if len(chain) == 1:
            where, steps = chain[0].where, chain[0].steps
        else:  # the sum of several advances; elements that went and came back drop out
            total = np.zeros(self._shadow.size, np.int64)
            for step in chain:
                total[step.where] += step.steps
            where = np.flatnonzero(total)
            steps = total[where].astype(np.int32)
        changed = np.zeros(self._shadow.size, bool)
        changed[where] = True
        small = np.abs(steps) <= 127
        step_bytes = np.where(small, steps, _ESCAPE).astype(np.int8)
        payload = (
            self._compress(np.packbits(changed).tobytes()),
            self._compress(step_bytes.tobytes()),
            self._compress(steps[~small].astype(np.int32).tobytes()),
        )
        return DeltaPull(self.grid, self.version, base, self._skeleton, None, payload, self._codec)

    def stats(self) -> dict[str, float]:
        return {
            "num_full_pulls": self.num_full_pulls,
            "num_delta_pulls": self.num_delta_pulls,
            "bytes_sent": self.bytes_sent,
        }


class DeltaReceiver:
    """The actor's side: the shadow it holds, advanced by each pull."""

    def __init__(self) -> None:
        self.grid: str | None = None
        self.version = -1
        self._unit: np.ndarray | None = None  # float32 [N]
        self._shadow: np.ndarray | None = None  # int32 [N]

    @property
    def held(self) -> tuple[str, int] | None:
        """``(grid, version)`` of the shadow held, for the next pull; ``None`` before the first."""
        return None if self.grid is None else (self.grid, self.version)

    def apply(self, pull: DeltaPull) -> Any:
        """Take ``pull``; returns the weights tree it brings (float32)."""
        if pull.is_full:
            assert pull.units is not None
            self._unit = np.repeat(pull.units, [size for _, size in _leaf_sizes(pull.skeleton)])
            raw = _decompress(pull.codec, pull.payload[0])
            width = len(raw) // self._unit.size if self._unit.size else 1  # bytes per element
            dtype = {1: np.int8, 2: np.int16, 4: np.int32}[width]
            self._shadow = np.frombuffer(raw, dtype).astype(np.int32)
            self.grid = pull.grid
        else:
            if (pull.grid, pull.base_version) != self.held or self._shadow is None:
                raise ValueError(
                    f"a delta from version {pull.base_version} of grid {pull.grid} reached a "
                    f"receiver holding {self.held}"
                )
            bitmap, step_bytes, escapes = (_decompress(pull.codec, part) for part in pull.payload)
            changed = np.unpackbits(np.frombuffer(bitmap, np.uint8), count=self._shadow.size)
            steps = np.frombuffer(step_bytes, np.int8).astype(np.int32)
            steps[steps == _ESCAPE] = np.frombuffer(escapes, np.int32)
            self._shadow[changed.view(bool)] += steps
        self.version = pull.version
        assert self._unit is not None
        return unflatten_weights(pull.skeleton, self._unit * self._shadow.astype(np.float32))
