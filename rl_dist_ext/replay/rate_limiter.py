"""Samples-per-insert rate limiting, Reverb's semantics (Cassirer et al. 2021, arXiv:2102.04736).

Counts are in items (rows). With ``samples_per_insert = r``, ``min_size_to_sample = m`` and
``error_buffer = e``, the limiter tracks ``diff = inserts * r - samples`` and keeps it inside
``[m r - e, m r + e]``:

- sampling is allowed once the replay holds ``m`` items and while ``diff >= m r - e``
  (the learner is not too far ahead of the actors);
- inserting is always allowed below ``m`` items, and afterwards while ``diff <= m r + e``
  (the actors are not too far ahead of the learner).

A call is admitted when the limit holds *before* it, so a batch may overshoot the window by its
own size; this keeps batches larger than ``2 e`` from dead-locking. ``samples_per_insert=None``
only enforces ``min_size_to_sample``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from rl_dist_ext.validation import check_int


def _is_positive(value: object) -> bool:
    """A real number > 0 (not a bool, not NaN, not a Tune search space left unresolved)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True, kw_only=True)
class RateLimit:
    """Validated rate-limiter settings (one replay shard)."""

    min_size_to_sample: int = 1
    samples_per_insert: float | None = None
    error_buffer: float | None = None

    def __post_init__(self) -> None:
        check_int("min_size_to_sample", self.min_size_to_sample, 1)
        if self.samples_per_insert is not None and not _is_positive(self.samples_per_insert):
            raise ValueError(
                f"samples_per_insert must be > 0 or None, got {self.samples_per_insert!r}"
            )
        if self.error_buffer is not None:
            if self.samples_per_insert is None:
                raise ValueError("error_buffer needs samples_per_insert to be set")
            if not _is_positive(self.error_buffer):
                raise ValueError(f"error_buffer must be > 0, got {self.error_buffer!r}")

    @property
    def effective_error_buffer(self) -> float:
        """``error_buffer``, defaulting to ``max(1, samples_per_insert) * 1000`` items."""
        if self.error_buffer is not None:
            return float(self.error_buffer)
        return max(1.0, self.samples_per_insert or 1.0) * 1000.0


class RateLimiter:
    """Decides whether an insert or a sample may proceed now; see the module docstring."""

    def __init__(self, limit: RateLimit) -> None:
        self.limit = limit
        self.inserts = 0
        self.samples = 0

    @property
    def diff(self) -> float:
        """``inserts * samples_per_insert - samples`` (0 when there is no ratio)."""
        if self.limit.samples_per_insert is None:
            return 0.0
        return self.inserts * self.limit.samples_per_insert - self.samples

    def _window(self) -> tuple[float, float]:
        offset = self.limit.min_size_to_sample * (self.limit.samples_per_insert or 0.0)
        error = self.limit.effective_error_buffer
        return offset - error, offset + error

    def can_insert(self, size: int) -> bool:
        """May rows be inserted now into a replay currently holding ``size`` items?"""
        if self.limit.samples_per_insert is None or size < self.limit.min_size_to_sample:
            return True
        return self.diff <= self._window()[1]

    def can_sample(self, size: int) -> bool:
        """May a batch be sampled now from a replay currently holding ``size`` items?"""
        if size < self.limit.min_size_to_sample:
            return False
        if self.limit.samples_per_insert is None:
            return True
        return self.diff >= self._window()[0]

    def inserted(self, rows: int) -> None:
        self.inserts += rows

    def sampled(self, rows: int) -> None:
        self.samples += rows

    def reset_balanced(self, size: int) -> None:
        """Restart the counters as if ``size`` items had been inserted and sampled in ratio."""
        self.inserts = size
        ratio = self.limit.samples_per_insert or 0.0
        self.samples = int(max(0.0, size - self.limit.min_size_to_sample) * ratio)

    def describe(self, size: int) -> str:
        low, high = self._window()
        return (
            f"size={size}, inserts={self.inserts}, samples={self.samples}, "
            f"min_size_to_sample={self.limit.min_size_to_sample}, "
            f"samples_per_insert={self.limit.samples_per_insert}, diff={self.diff:.1f}, "
            f"allowed diff window=[{low:.1f}, {high:.1f}]"
        )
