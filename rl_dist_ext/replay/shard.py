"""One replay shard as a service: a :class:`PrioritizedReplay` behind a rate limiter, snapshotted.

``ReplayShardServer`` is a plain class with ``async`` methods; ``rl_dist_ext.ray_actors`` turns
it into a Ray actor (an async actor, so a call waiting on the rate limiter does not block other
calls). It runs and is tested without Ray under ``asyncio``.

Every reply carries the shard's :class:`ShardStatus`, so clients keep an up-to-date view of each
shard's size and priority mass without polling.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from rl_dist_ext.ops.priorities import PER_ALPHA, PER_EPS
from rl_dist_ext.replay import snapshot
from rl_dist_ext.replay.compression import ObsCompression, PackedRows
from rl_dist_ext.replay.prioritized import PrioritizedReplay
from rl_dist_ext.replay.rate_limiter import RateLimit, RateLimiter
from rl_dist_ext.replay.row_counts import ShardRowCounts

log = logging.getLogger(__name__)


class RateLimitTimeout(TimeoutError):
    """An insert or sample waited on the rate limiter for longer than its timeout."""


class ShardStatus(NamedTuple):
    """What every shard reply carries."""

    shard_index: int
    size: int
    total_priority: float
    min_priority: float  # inf when empty
    num_inserted: int  # rows ever inserted into this incarnation's replay (restored ones count)
    num_sampled: int  # rows handed out by sample() since this incarnation started
    stale_updates: int
    incarnation: str  # random id of this actor incarnation; changes when the shard restarts
    restored_num_inserted: int  # num_inserted right after the last restore (0 if none)
    can_insert: bool = True  # the rate limiter lets an insert through now
    can_sample: bool = False  # the rate limiter lets a sample through now
    seq: int = 0  # increases with every status of this incarnation: replies can arrive late
    #: the rate limiter's counts: inserts (rows, or what each add's ``count`` said), samples
    counted_inserts: int = 0
    counted_samples: int = 0
    #: memory of the stored rows (compressed columns at their compressed size), and what one
    #: row would take uncompressed
    storage_bytes: int = 0
    uncompressed_row_bytes: int = 0
    #: damaged snapshot generations this incarnation skipped when it restarted (it fell back to
    #: an older one, or started empty)
    snapshots_rejected: int = 0
    #: periodic snapshots that failed (the storage, or a column the format cannot hold): the
    #: adds that triggered them stored their rows; a restart would lose the rows since the last
    snapshot_failures: int = 0
    #: the generation this shard's last save() or snapshot wrote (0: none yet)
    saved_generation: int = 0
    #: rows every incarnation of this shard acknowledged, and what became of them:
    #: acknowledged == size + evicted + lost (see ShardRowCounts; -1: not counted, the shard
    #: has no local snapshot location)
    rows_acknowledged: int = -1
    rows_evicted: int = -1
    rows_lost: int = -1


class ShardSample(NamedTuple):
    keys: np.ndarray  # [B] int64 shard-local keys
    priorities: np.ndarray  # [B] float64 stored priorities p_i
    batch: dict[str, np.ndarray]
    status: ShardStatus


@dataclass(frozen=True, kw_only=True)
class ShardSpec:
    """Everything a shard needs to (re)start; a restarted actor gets the same spec."""

    shard_index: int
    capacity: int
    alpha: float = PER_ALPHA
    eps: float = PER_EPS
    seed: int | None = None
    rate_limit: RateLimit = field(default_factory=RateLimit)
    snapshot_uri: str | None = None  # location this shard snapshots to and restores from
    snapshot_every_inserts: int | None = None
    snapshot_every_s: float | None = None
    timeout_s: float = 60.0
    compression: ObsCompression | None = None


class ReplayShardServer:
    """A prioritized replay shard that can restore its latest snapshot when it restarts.

    Args:
        spec: the shard's settings.
        restore_snapshot: load ``spec.snapshot_uri`` if it exists (the Ray wrapper passes
            ``True`` when Ray restarted the actor; a fresh shard's first snapshot replaces what
            the location held).
    """

    def __init__(self, spec: ShardSpec, *, restore_snapshot: bool = False) -> None:
        self._spec = spec
        self._replay = self._new_replay()
        self._limiter = RateLimiter(spec.rate_limit)
        self._changed: asyncio.Condition | None = None  # bound to the loop it was made in
        self._changed_loop: asyncio.AbstractEventLoop | None = None
        self._num_sampled = 0
        self._rate_limited = True
        self._status_seq = 0
        self._incarnation = uuid.uuid4().hex
        self._stale_incarnation_updates = 0
        self._restored_num_inserted = 0
        self._inserts_at_snapshot = 0
        self._last_snapshot_time = time.monotonic()
        self._snapshots_rejected = 0
        self._snapshot_failures = 0
        self._saved_generation = 0
        self._prepared: PrioritizedReplay | None = None
        # A fresh shard's first snapshot replaces what the location holds (another run's rows,
        # which must not come back as a fallback); later ones keep the previous generation.
        self._keep_previous_snapshot = False
        self._row_counts = self._open_row_counts(restarted=restore_snapshot)
        if restore_snapshot and spec.snapshot_uri is not None:
            replay = self._read(spec.snapshot_uri, fall_back=True)
            self._keep_previous_snapshot = True
            if replay is not None:
                self._adopt(replay)
        if self._row_counts is not None and restore_snapshot:
            self._row_counts.restarted_with(self._replay.num_inserted, len(self._replay))

    # ---- data path ----------------------------------------------------------------------------
    async def add(
        self,
        batch: Mapping[str, np.ndarray] | PackedRows,
        priorities: np.ndarray | None = None,
        *,
        count: int | None = None,
        max_wait_s: float | None = None,
    ) -> ShardStatus:
        """Insert rows, waiting while the rate limiter says actors are ahead: up to
        ``max_wait_s`` (default: the spec's timeout), then :class:`RateLimitTimeout`.

        ``count``: what the insert counts for the rate limiter (default: its rows; multi-agent
        runs count env steps, see ``rl_dist_ext.gorila.actor``)."""
        await self._wait_until(
            lambda: self._limiter.can_insert(len(self._replay)), "insert", max_wait_s
        )
        rows = self._replay.num_inserted
        self._replay.add(batch, priorities)
        added = self._replay.num_inserted - rows
        if self._row_counts is not None:  # before the snapshot: a restart never counts less
            self._row_counts.added(added, self._replay.num_inserted, len(self._replay))
        self._limiter.inserted(added if count is None else count)
        await self._notify()
        self._maybe_snapshot()
        return self.status()

    async def sample(self, batch_size: int, *, max_wait_s: float | None = None) -> ShardSample:
        """Draw ``batch_size`` rows, waiting while the rate limiter says the learner is ahead
        (up to ``max_wait_s``, as in :meth:`add`)."""
        await self._wait_until(
            lambda: self._limiter.can_sample(len(self._replay)), "sample", max_wait_s
        )
        items = self._replay.sample_items(batch_size)
        self._limiter.sampled(batch_size)
        self._num_sampled += batch_size
        await self._notify()
        return ShardSample(items.keys, items.priorities, items.batch, self.status())

    async def update_priorities(
        self, keys: np.ndarray, priorities: np.ndarray, incarnation: str | None = None
    ) -> ShardStatus:
        """Apply priorities to sampled rows; keys sampled from another ``incarnation`` of this
        shard (it restarted since, and its insert ids name other rows now) are stale: dropped
        and counted."""
        if incarnation is not None and incarnation != self._incarnation:
            self._stale_incarnation_updates += len(keys)
        else:
            self._replay.update_priorities(keys, priorities)
        return self.status()

    # ---- management ---------------------------------------------------------------------------
    async def get_status(self) -> ShardStatus:
        return self.status()

    def status(self) -> ShardStatus:
        self._status_seq += 1
        return ShardStatus(
            shard_index=self._spec.shard_index,
            size=len(self._replay),
            total_priority=self._replay.total_priority,
            min_priority=self._replay.min_priority,
            num_inserted=self._replay.num_inserted,
            num_sampled=self._num_sampled,
            stale_updates=self._replay.stale_updates + self._stale_incarnation_updates,
            incarnation=self._incarnation,
            restored_num_inserted=self._restored_num_inserted,
            can_insert=not self._rate_limited or self._limiter.can_insert(len(self._replay)),
            can_sample=not self._rate_limited or self._limiter.can_sample(len(self._replay)),
            seq=self._status_seq,
            counted_inserts=self._limiter.inserts,
            counted_samples=self._limiter.samples,
            storage_bytes=self._replay.nbytes,
            uncompressed_row_bytes=self._replay.uncompressed_row_bytes,
            snapshots_rejected=self._snapshots_rejected,
            snapshot_failures=self._snapshot_failures,
            saved_generation=self._saved_generation,
            **self._row_accounting(),
        )

    def _row_accounting(self) -> dict[str, int]:
        counts = self._row_counts
        if counts is None or not counts.exact:
            return {}
        num_inserted, size = self._replay.num_inserted, len(self._replay)
        return {
            "rows_acknowledged": counts.acknowledged,
            "rows_evicted": counts.evicted(num_inserted, size),
            "rows_lost": counts.lost,
        }

    async def save(self, uri: str) -> ShardStatus:
        """Write a snapshot generation at the location ``uri``."""
        self._write(uri)
        return self.status()

    async def restore(self, uri: str, generation: int | None = None) -> ShardStatus:
        """Load the newest snapshot at the location ``uri`` (or its ``generation``):
        ``FileNotFoundError`` if there is none, :class:`~rl_dist_ext.replay.snapshot.
        ReplaySnapshotCorrupt` if it is damaged (the shard keeps its rows then)."""
        await self.prepare_restore(uri, generation)
        return await self.commit_restore()

    async def prepare_restore(self, uri: str, generation: int | None = None) -> ShardStatus:
        """The first half of :meth:`restore`: read and check the snapshot, keep it aside (the
        shard serves its own rows meanwhile). A checkpoint of several shards is prepared on
        every shard before any commits, so a damaged one leaves them all as they were; it
        names each shard's ``generation``, so that a later save that failed half-way does
        not mix two checkpoints."""
        replay = self._read(uri, fall_back=False, generation=generation)
        if replay is None:
            at = "" if generation is None else f" (generation {generation})"
            raise FileNotFoundError(f"no replay snapshot at {uri!r}{at}")
        self._prepared = replay
        return self.status()

    async def commit_restore(self) -> ShardStatus:
        """Swap in what :meth:`prepare_restore` read."""
        if self._prepared is None:
            raise RuntimeError(
                f"replay shard {self._spec.shard_index} has no prepared restore (it restarted "
                "since, or none was prepared): restore the checkpoint again"
            )
        self._adopt(self._prepared)
        self._prepared = None
        if self._row_counts is not None:
            self._row_counts.reset(self._replay.num_inserted, len(self._replay))
        await self._notify()
        return self.status()

    async def abort_restore(self) -> ShardStatus:
        """Drop what :meth:`prepare_restore` read."""
        self._prepared = None
        return self.status()

    async def clear(self) -> ShardStatus:
        """Drop every row (the next snapshot replaces the older ones); see
        PrioritizedReplay.clear."""
        self._replay.clear()
        self._keep_previous_snapshot = False  # the next snapshot replaces the old rows'
        self._limiter.reset_balanced(0)
        self._inserts_at_snapshot = 0
        self._restored_num_inserted = 0
        if self._row_counts is not None:
            self._row_counts.reset(0, 0)
        await self._notify()
        return self.status()

    async def stop_rate_limiting(self) -> ShardStatus:
        """Let every waiting and later insert or sample through (for shutting a run down: an
        actor blocked on the limiter would otherwise hold its caller until the timeout)."""
        self._rate_limited = False
        await self._notify()
        return self.status()

    async def snapshot_now(self) -> ShardStatus:
        if self._spec.snapshot_uri is None:
            raise ValueError("this shard has no snapshot_uri configured")
        self._write_snapshot(periodic=False)
        return self.status()

    # ---- internals ----------------------------------------------------------------------------
    def _new_replay(self) -> PrioritizedReplay:
        spec = self._spec
        return PrioritizedReplay(
            spec.capacity,
            alpha=spec.alpha,
            eps=spec.eps,
            seed=spec.seed,
            compression=spec.compression,
        )

    def _open_row_counts(self, *, restarted: bool) -> ShardRowCounts | None:
        """The shard's row counters, in its snapshot location when that is local (per add, a
        write to an object store would cost a request); ``None`` otherwise."""
        uri = self._spec.snapshot_uri
        if uri is None or not snapshot.is_local(uri):
            return None
        _, path = snapshot.filesystem(uri)
        return ShardRowCounts(f"{path}/{ShardRowCounts.FILE}", restarted=restarted)

    def _write(self, uri: str) -> None:
        state, columns = self._replay.snapshot()
        keep = self._keep_previous_snapshot or uri != self._spec.snapshot_uri
        self._saved_generation = snapshot.write_snapshot(
            uri, {"replay": state}, columns, keep_previous=keep
        )
        if uri == self._spec.snapshot_uri:
            self._keep_previous_snapshot = True

    def _read(
        self, uri: str, *, fall_back: bool, generation: int | None = None
    ) -> PrioritizedReplay | None:
        """A replay loaded from the newest usable generation at ``uri``, or from its
        ``generation`` only (``None``: none). Without ``fall_back`` a damaged newest one
        raises; with it (a restarting shard) older ones are tried, then none: what was skipped
        is counted, logged and renamed aside (so that the next save keeps a good generation as
        its previous)."""
        try:
            found = snapshot.generations(uri)
            if generation is not None:
                found = [g for g in found if g.number == generation]
        except Exception as error:  # an earlier version's pickle, or the storage failed
            if not fall_back:
                raise
            self._reject(error)
            return None
        for generation in found:
            try:
                return self._load(generation.read(max_rows=self._spec.capacity))
            except snapshot.ReplaySnapshotCorrupt as error:
                if not fall_back:
                    raise
                self._reject(error)
                generation.quarantine()
        return None

    def _reject(self, error: Exception) -> None:
        self._snapshots_rejected += 1
        log.warning("replay shard %d skipped a damaged snapshot: %s", self._spec.shard_index, error)

    def _load(self, loaded: snapshot.Snapshot) -> PrioritizedReplay:
        replay = self._new_replay()
        try:
            replay.load_snapshot(loaded.state["replay"], loaded.columns)
        except Exception as error:
            raise snapshot.ReplaySnapshotCorrupt(
                loaded.source, "schema", f"{type(error).__name__}: {error}"
            ) from None
        return replay

    def _adopt(self, replay: PrioritizedReplay) -> None:
        self._replay = replay
        # Keys handed out after that state was written belong to rows that are gone.
        self._replay.invalidate_outstanding_keys()
        self._limiter.reset_balanced(len(self._replay))
        self._inserts_at_snapshot = self._replay.num_inserted
        self._restored_num_inserted = self._replay.num_inserted

    def _maybe_snapshot(self) -> None:
        spec = self._spec
        if spec.snapshot_uri is None:
            return
        by_count = (
            spec.snapshot_every_inserts is not None
            and self._replay.num_inserted - self._inserts_at_snapshot >= spec.snapshot_every_inserts
        )
        by_time = (
            spec.snapshot_every_s is not None
            and time.monotonic() - self._last_snapshot_time >= spec.snapshot_every_s
        )
        if by_count or by_time:
            self._write_snapshot()

    def _write_snapshot(self, *, periodic: bool = True) -> None:
        """Snapshot to the spec's location. A periodic one's failure is logged and counted,
        not raised (the add that triggered it stored its rows; the next due one tries again)."""
        try:
            self._write(self._spec.snapshot_uri)
        except Exception as error:  # the storage, or a column the format cannot hold
            if not periodic:
                raise
            self._snapshot_failures += 1
            if self._snapshot_failures == 1 or self._snapshot_failures % 100 == 0:
                log.warning(
                    "replay shard %d: periodic snapshot %d failed: %s: %s",
                    self._spec.shard_index,
                    self._snapshot_failures,
                    type(error).__name__,
                    error,
                )
        self._inserts_at_snapshot = self._replay.num_inserted
        self._last_snapshot_time = time.monotonic()

    async def _wait_until(self, limit_allows, what: str, max_wait_s: float | None) -> None:
        def allowed() -> bool:
            return not self._rate_limited or limit_allows()

        if allowed():
            return
        timeout_s = self._spec.timeout_s if max_wait_s is None else max_wait_s
        loop = asyncio.get_running_loop()
        if self._changed_loop is not loop:
            self._changed, self._changed_loop = asyncio.Condition(), loop
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(allowed), timeout_s)
            except asyncio.TimeoutError:
                raise RateLimitTimeout(
                    f"replay shard {self._spec.shard_index}: {what} waited "
                    f"{timeout_s:.1f}s on the rate limiter "
                    f"({self._limiter.describe(len(self._replay))}); "
                    + (
                        "no learner is sampling fast enough"
                        if what == "insert"
                        else "actors are not inserting fast enough"
                    )
                ) from None

    async def _notify(self) -> None:
        if self._changed is None or self._changed_loop is not asyncio.get_running_loop():
            return
        async with self._changed:
            self._changed.notify_all()
