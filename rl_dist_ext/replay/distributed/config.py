"""Settings of the distributed replay and the errors its client raises (no Ray here)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from rl_dist_ext.ops.priorities import PER_ALPHA, PER_BETA, PER_EPS, validate_alpha_eps
from rl_dist_ext.replay import snapshot
from rl_dist_ext.replay.compression import ObsCompression
from rl_dist_ext.replay.rate_limiter import RateLimit
from rl_dist_ext.replay.shard import ShardSpec
from rl_dist_ext.validation import check_choice, check_int, check_real


class ReplayTimeout(TimeoutError):
    """A replay request got no answer within ``timeout_s``."""


class ReplayUnavailable(RuntimeError):
    """A replay shard (or every one) is down and did not come back in time."""


def _positive_or_none(name: str, value: Any) -> None:
    if value is not None and not (isinstance(value, numbers.Real) and value > 0):
        raise ValueError(f"{name} must be > 0 or None, got {value!r}")


#: Ray scheduling strategies for shards started outside a placement group: ``"DEFAULT"``
#: (Ray's hybrid policy: fill the local node first) or ``"SPREAD"`` (one shard per node as far
#: as nodes go, so that losing a node loses fewest shards and the shards' traffic is spread).
SHARD_PLACEMENTS = ("DEFAULT", "SPREAD")


@dataclass(frozen=True, kw_only=True)
class DistributedReplayConfig:
    """Settings of a :class:`DistributedReplay`, validated when built (before any actor starts).

    The one definition of the replay's settings and their defaults: RLlib's
    ``GorilaDQNConfig.replay(...)``, Tianshou's ``DistributedPrioritizedReplayBuffer`` and the
    high-level ``GorilaParams`` all build one of these.

    Attributes:
        num_shards: shard actors.
        capacity: rows over all shards (split evenly; FIFO in each shard).
        alpha: prioritization exponent (0: uniform sampling).
        beta: importance-sampling exponent of samples (0: no correction); a sample call may
            name another (annealing).
        eps: added to every priority, so that no row's probability is 0.
        min_size_to_sample: rows over all shards before sampling starts (split evenly:
            sampling waits until every shard holds its share).
        samples_per_insert: the replay ratio (sampled rows per inserted row) each shard's rate
            limiter holds by making inserts or samples wait; ``None`` lets both run free.
        error_buffer: the slack the rate limiter allows around ``samples_per_insert``, in
            sampled rows (Reverb's ``error_buffer``); ``None``:
            ``max(1, samples_per_insert) * 1000``.
        prefetch: sample requests the learner keeps in flight.
        batches_per_request: learner batches one sample request serves: K times fewer round
            trips, priorities up to K batches older (Ape-X's learner also samples ahead).
        max_in_flight_adds: adds a client may have unanswered before it waits (back-pressure).
        num_cpus_per_shard: Ray CPUs per shard actor (fractional: shards mostly wait).
        placement_group: a placement group to start the shards in (set by the algorithm
            under Tune).
        bundle_indices: the placement group's bundle of each shard.
        snapshot_dir: where each shard writes periodic snapshots (``<dir>/shard_<i>/``), so that
            a restarted shard comes back with its rows: a local directory or a ``pyarrow.fs``
            URI; ``None``: no snapshots.
        snapshot_every_inserts: a snapshot after this many inserted rows per shard.
        snapshot_every_s: a snapshot after this many seconds.
        timeout_s: the longest any replay call waits (rate limiter included), in seconds.
        start_timeout_s: the longest the shards may take to start, in seconds.
        retry_down_shard_after_s: how often a client retries a shard that is down, in seconds.
        status_refresh_s: how often a client refreshes every shard's priority mass and limiter
            state while it samples, in seconds.
        seed: seeds the shards' samplers (shard ``i`` gets ``seed + i``); ``None``: random.
        compression: compress pixel observations (:class:`~rl_dist_ext.replay.ObsCompression`):
            clients compress before sending, shards store the blobs and decompress when
            sampling; ``None``: rows as they are.
        shard_placement: ``"DEFAULT"`` (Ray's placement: fill the local node first) or
            ``"SPREAD"`` (one shard per node as far as nodes go), outside a placement group.
        row_ledger_dir: a local directory (every node's: a shared mount) where each client
            that adds rows keeps its row counters, so that a run's rows can be accounted for
            after any process died
            (:func:`~rl_dist_ext.replay.distributed.ledger.account_rows`); one small write per
            add and acknowledgement. ``None``: no ledger.
    """

    num_shards: int = 2
    capacity: int = 100_000
    alpha: float = PER_ALPHA
    beta: float = PER_BETA
    eps: float = PER_EPS
    min_size_to_sample: int = 1_000
    samples_per_insert: float | None = None
    error_buffer: float | None = None
    prefetch: int = 2
    batches_per_request: int = 4
    max_in_flight_adds: int = 4
    num_cpus_per_shard: float = 0.1
    placement_group: Any = None
    bundle_indices: tuple[int, ...] | None = None
    snapshot_dir: str | None = None
    snapshot_every_inserts: int | None = None
    snapshot_every_s: float | None = None
    timeout_s: float = 60.0
    start_timeout_s: float = 120.0
    retry_down_shard_after_s: float = 1.0
    status_refresh_s: float = 1.0
    seed: int | None = None
    compression: ObsCompression | None = None
    shard_placement: str = "DEFAULT"
    row_ledger_dir: str | None = None

    def __post_init__(self) -> None:
        check_int("num_shards", self.num_shards, 1)
        check_int("capacity", self.capacity, 1)
        if self.capacity < self.num_shards:
            raise ValueError(
                f"capacity ({self.capacity}) must be >= num_shards ({self.num_shards}): every "
                "shard holds at least one row"
            )
        validate_alpha_eps(self.alpha, self.eps)
        check_real("beta", self.beta, low=0.0, high=1.0)
        check_int("min_size_to_sample", self.min_size_to_sample, 1)
        if self.min_size_to_sample > self.capacity:
            raise ValueError(
                f"min_size_to_sample ({self.min_size_to_sample}) must be <= capacity "
                f"({self.capacity}), or sampling could never start"
            )
        check_int("prefetch", self.prefetch, 1)
        check_int("batches_per_request", self.batches_per_request, 1)
        check_int("max_in_flight_adds", self.max_in_flight_adds, 1)
        if not (isinstance(self.num_cpus_per_shard, numbers.Real) and self.num_cpus_per_shard >= 0):
            raise ValueError(f"num_cpus_per_shard must be >= 0, got {self.num_cpus_per_shard!r}")
        if self.bundle_indices is not None:
            if self.placement_group is None:
                raise ValueError("bundle_indices needs placement_group to be set")
            if len(self.bundle_indices) != self.num_shards:
                raise ValueError(
                    f"bundle_indices must have one entry per shard ({self.num_shards}), "
                    f"got {self.bundle_indices!r}"
                )
        if self.snapshot_every_inserts is not None:
            check_int("snapshot_every_inserts", self.snapshot_every_inserts, 1)
        _positive_or_none("snapshot_every_s", self.snapshot_every_s)
        if self.snapshot_dir is None and (
            self.snapshot_every_inserts is not None or self.snapshot_every_s is not None
        ):
            raise ValueError("snapshot_every_inserts/snapshot_every_s need snapshot_dir to be set")
        _positive_or_none("timeout_s", self.timeout_s)
        if self.timeout_s is None:
            raise ValueError("timeout_s must be > 0 (no request may wait forever)")
        _positive_or_none("start_timeout_s", self.start_timeout_s)
        _positive_or_none("retry_down_shard_after_s", self.retry_down_shard_after_s)
        _positive_or_none("status_refresh_s", self.status_refresh_s)
        if self.status_refresh_s is None:
            raise ValueError("status_refresh_s must be > 0 (shard masses must stay current)")
        if self.seed is not None:
            check_int("seed", self.seed, 0)
        self.rate_limit()  # validates samples_per_insert / error_buffer
        check_choice("shard_placement", self.shard_placement, SHARD_PLACEMENTS)
        if self.shard_placement != "DEFAULT" and self.placement_group is not None:
            raise ValueError(
                "shard_placement applies outside a placement group only; with placement_group "
                "set, the group's own strategy places the shards"
            )
        if self.row_ledger_dir is not None:
            if not isinstance(self.row_ledger_dir, str) or not snapshot.is_local(
                self.row_ledger_dir
            ):
                raise ValueError(
                    "row_ledger_dir must be a local directory path (every client writes its "
                    f"file there) or None, got {self.row_ledger_dir!r}"
                )
            # the clients in other processes name the same place
            path = self.row_ledger_dir.removeprefix("file://")
            object.__setattr__(self, "row_ledger_dir", snapshot.resolve(path))
        if self.compression is not None and not isinstance(self.compression, ObsCompression):
            raise TypeError(
                "compression must be an ObsCompression or None, got "
                f"{type(self.compression).__name__}"
            )

    @property
    def capacity_per_shard(self) -> int:
        return math.ceil(self.capacity / self.num_shards)

    def rate_limit(self) -> RateLimit:
        return RateLimit(
            min_size_to_sample=math.ceil(self.min_size_to_sample / self.num_shards),
            samples_per_insert=self.samples_per_insert,
            error_buffer=self.error_buffer,
        )

    def shard_specs(self) -> list[ShardSpec]:
        return [
            ShardSpec(
                shard_index=i,
                capacity=self.capacity_per_shard,
                alpha=self.alpha,
                eps=self.eps,
                seed=None if self.seed is None else self.seed + i,
                rate_limit=self.rate_limit(),
                snapshot_uri=(
                    None
                    if self.snapshot_dir is None
                    else snapshot.join(snapshot.resolve(self.snapshot_dir), f"shard_{i}")
                ),
                snapshot_every_inserts=self.snapshot_every_inserts,
                snapshot_every_s=self.snapshot_every_s,
                timeout_s=self.timeout_s,
                compression=self.compression,
            )
            for i in range(self.num_shards)
        ]
