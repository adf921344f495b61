"""What a distributed replay client reports to metrics loggers (from statuses it already has)."""

from __future__ import annotations

import time
from typing import Any

from rl_dist_ext.replay.distributed.config import DistributedReplayConfig
from rl_dist_ext.replay.distributed.inserts import Inserter
from rl_dist_ext.replay.distributed.sampling import PriorityUpdater, Sampler
from rl_dist_ext.replay.distributed.shards import ShardSet


class ReplayStats:
    """Turns one client's view into a flat metrics dict.

    Rates are per second between the reports at which the shards' totals changed: the totals
    move only when new statuses arrive (every ``status_refresh_s``), so a report in between
    repeats the last rates instead of reading 0 and then twice the real rate.
    """

    def __init__(self) -> None:
        self._last_time: float | None = None
        self._last_totals = (0, 0)  # (num_inserted, num_sampled)
        self._rates = (0.0, 0.0)  # (insert_rate, sample_rate)

    def report(
        self,
        shards: ShardSet,
        sampler: Sampler,
        inserter: Inserter,
        priorities: PriorityUpdater,
        config: DistributedReplayConfig,
    ) -> dict[str, Any]:
        statuses = shards.statuses()
        alive = [s for s in statuses if s is not None]
        now = time.monotonic()
        inserted = sum(s.num_inserted for s in alive)
        sampled = sum(s.num_sampled for s in alive)
        counted = sum(s.counted_inserts for s in alive)
        counted_samples = sum(s.counted_samples for s in alive)
        if (inserted, sampled) != self._last_totals or self._last_time is None:
            if self._last_time is not None and now > self._last_time:
                dt = now - self._last_time
                self._rates = (
                    max(0, inserted - self._last_totals[0]) / dt,
                    max(0, sampled - self._last_totals[1]) / dt,
                )
            self._last_time, self._last_totals = now, (inserted, sampled)
        insert_rate, sample_rate = self._rates
        first = sampler.first_sample_time
        sampling_for = now - first if first is not None else 0.0
        size = sum(s.size for s in alive)
        storage_bytes = sum(s.storage_bytes for s in alive)
        raw_row_bytes = max((s.uncompressed_row_bytes for s in alive), default=0)
        return {
            "num_shards": shards.num_shards,
            "shards_alive": len(alive),
            "size": size,
            "size_per_shard": [s.size if s is not None else None for s in statuses],
            "capacity": config.capacity,
            "num_inserted": inserted,
            "num_sampled": sampled,
            "insert_rate": insert_rate,
            "sample_rate": sample_rate,
            "samples_per_insert": sampled / inserted if inserted else 0.0,
            # the ratio the rate limiters hold: sampled rows per counted insert (rows; env
            # steps in multi-agent runs)
            "counted_inserts": counted,
            "rate_limiter_ratio": counted_samples / counted if counted else 0.0,
            # the ratio the limiters are set to hold (config.samples_per_insert; 0: no limit)
            "samples_per_insert_limit": float(config.samples_per_insert or 0.0),
            "sample_wait_s": sampler.wait_s,
            "sample_wait_fraction": sampler.wait_s / sampling_for if sampling_for > 0 else 0.0,
            "stale_updates": sum(s.stale_updates for s in alive),
            "items_lost": shards.items_lost,
            # every row the live shards acknowledged (over their restarts) and what became of
            # it: rows_acknowledged == size + rows_evicted + items_lost (-1: a shard without
            # a local snapshot location keeps no row counters)
            "rows_acknowledged": _row_total(alive, "rows_acknowledged"),
            "rows_evicted": _row_total(alive, "rows_evicted"),
            # damaged snapshot generations the shards skipped when they restarted (falling
            # back to an older one, or starting empty: their rows count in items_lost)
            "snapshots_rejected": sum(s.snapshots_rejected for s in alive),
            "shard_failures": shards.shard_failures,
            "priority_updates_lost": priorities.updates_lost,
            "adds_rerouted": inserter.adds_rerouted,
            # memory: what the stored rows take, per row, and how much smaller than uncompressed
            "storage_bytes": storage_bytes,
            "bytes_per_transition": storage_bytes / size if size else 0.0,
            "compression_ratio": (
                raw_row_bytes * size / storage_bytes if storage_bytes and raw_row_bytes else 1.0
            ),
        }


def _row_total(statuses: list, field: str) -> int:
    values = [getattr(s, field) for s in statuses]
    return sum(values) if values and min(values) >= 0 else -1
