"""Sampling with prefetch and importance weights, and the priority updates that follow.

Each batch comes from one shard chosen with probability proportional to the shard's total
priority (:meth:`ShardSet.pick_sample_shard`), so an item's probability is ``p_i / sum over all
shards``; importance weights ``(N P(i)) ** -beta`` use the size and minimum priority across
shards. ``prefetch`` requests stay in flight so the learner rarely waits on a round trip. With
``batches_per_request = K`` one request draws ``K * B`` rows (stratified) and serves ``K``
batches (every K-th row each, so each batch still spans the whole priority range): K times fewer
round trips per learner update, for priorities up to K batches older.

Priority updates are split by shard and sent without waiting (with ``batches_per_request = K``:
gathered over K calls, then sent together); keys of rows overwritten meanwhile, or of an
incarnation of the shard that is gone (it restarted since), are dropped by the shard and counted
there.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from rl_dist_ext.ops.priorities import importance_weights
from rl_dist_ext.replay.distributed.config import ReplayTimeout, ReplayUnavailable
from rl_dist_ext.replay.distributed.shards import ShardSet, actor_errors
from rl_dist_ext.replay.prioritized import ReplaySample
from rl_dist_ext.replay.shard import RateLimitTimeout, ShardSample
from rl_dist_ext.validation import check_int

#: how often a waiting sample calls ``Sampler.while_waiting``
WAIT_CALLBACK_S = 0.02


class PendingSample(NamedTuple):
    """A sample request in flight."""

    ref: Any
    shard: int
    batch_size: int


class ReadySample(NamedTuple):
    """A batch split off a larger reply (``batches_per_request > 1``), not handed out yet."""

    batch_size: int
    sample: ReplaySample


class Sampler:
    """One client's prefetched sample requests; see the module docstring."""

    def __init__(self, shards: ShardSet) -> None:
        self._shards = shards
        self._requests: deque[PendingSample] = deque()
        self._ready: deque[ReadySample] = deque()
        self.wait_s = 0.0
        self.first_sample_time: float | None = None
        #: called every ``WAIT_CALLBACK_S`` while a sample waits for a shard's reply (e.g. on
        #: the rate limiter): whoever hands out the actors' work keeps them acting meanwhile
        self.while_waiting: Callable[[], None] | None = None

    def sample(self, batch_size: int, *, beta: float) -> ReplaySample:
        check_int("batch_size", batch_size, 1)
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {beta!r}")
        self._requests = deque(r for r in self._requests if r.batch_size == batch_size)
        self._ready = deque(r for r in self._ready if r.batch_size == batch_size)
        if self._ready:
            return self._ready.popleft().sample
        shards = self._shards
        if all(view.status is None for view in shards.views):
            shards.refresh()  # a new or unpickled client: learn every shard's mass first
        shards.poll()
        started = time.monotonic()
        if self.first_sample_time is None:
            self.first_sample_time = started
        shard, reply = self._next_reply(batch_size, started)
        self.wait_s += time.monotonic() - started
        self._request(batch_size)
        shards.observe(shard, reply.status)
        return self._split(batch_size, shard, reply, beta)

    def drop(self) -> None:
        """Forget prefetched requests and batches (the shards' contents were replaced)."""
        self._requests.clear()
        self._ready.clear()

    def _next_reply(self, batch_size: int, started: float) -> tuple[int, ShardSample]:
        """The oldest prefetched reply that brings rows, re-asking past closed or dead shards."""
        import ray

        shards, config = self._shards, self._shards.config
        deadline = started + shards.reply_timeout_s
        while True:
            while len(self._requests) < config.prefetch:
                self._request(batch_size)
            request = self._requests.popleft()
            if self.while_waiting is not None:
                self._wait_calling_back(request.ref, deadline)
            try:
                return request.shard, ray.get(
                    request.ref, timeout=max(0.0, deadline - time.monotonic())
                )
            except RateLimitTimeout:
                shards.note_closed(request.shard, inserts=False)
                if time.monotonic() - started > config.timeout_s:
                    # The other prefetched requests are as old: a later call must not get
                    # their stale timeouts once rows have arrived.
                    self._requests.clear()
                    raise RateLimitTimeout(
                        f"no replay shard let a sample of {batch_size} rows through within "
                        f"{config.timeout_s}s: every shard's rate limiter says the learner is "
                        f"ahead (samples_per_insert={config.samples_per_insert}, "
                        f"min_size_to_sample={config.min_size_to_sample}); actors are not "
                        "inserting fast enough"
                    ) from None
                shards.poll()
            except ray.exceptions.GetTimeoutError:
                raise ReplayTimeout(
                    f"sample from replay shard {request.shard} got no answer in "
                    f"{shards.reply_timeout_s}s"
                ) from None
            except actor_errors() as error:
                shards.mark_down(request.shard, error)
                if time.monotonic() > deadline:
                    raise ReplayUnavailable("no replay shard answered a sample in time") from error
                if shards.all_down():
                    time.sleep(0.05)  # every shard is restarting: don't spin on failing calls

    def _wait_calling_back(self, ref: Any, deadline: float) -> None:
        """Until ``ref`` is ready (or the deadline), call ``while_waiting`` between short waits."""
        import ray

        while time.monotonic() < deadline:
            ready, _ = ray.wait([ref], timeout=WAIT_CALLBACK_S)
            if ready:
                return
            self.while_waiting()

    def _request(self, batch_size: int) -> None:
        shard = self._shards.pick_sample_shard()
        config = self._shards.config
        ref = self._shards.handles[shard].sample.remote(
            batch_size * config.batches_per_request, max_wait_s=config.status_refresh_s
        )
        self._requests.append(PendingSample(ref, shard, batch_size))

    def _split(self, batch_size: int, shard: int, reply: ShardSample, beta: float) -> ReplaySample:
        """Global keys and importance weights for ``reply``; its first batch (the rest wait)."""
        shards = self._shards
        live = [v.status for v in shards.views if v.status is not None and v.status.size > 0]
        weights = importance_weights(
            reply.priorities,
            total_priority=sum(s.total_priority for s in live),
            size=sum(s.size for s in live),
            beta=beta,
            min_priority=min(min(s.min_priority for s in live), float(reply.priorities.min())),
        )
        keys = shards.global_keys(shard, reply.keys, reply.status.incarnation)
        k = shards.config.batches_per_request
        parts = [  # strided: each batch spans the whole stratified draw (k = 1: the reply)
            ReplaySample({c: v[j::k] for c, v in reply.batch.items()}, keys[j::k], weights[j::k])
            for j in range(k)
        ]
        self._ready.extend(ReadySample(batch_size, part) for part in parts[1:])
        return parts[0]


class GatheredPriorities(NamedTuple):
    keys: np.ndarray  # [B] global keys
    priorities: np.ndarray  # [B] float64 raw priorities


class PendingUpdate(NamedTuple):
    """A priority update in flight to one shard."""

    ref: Any
    shard: int
    count: int


class PriorityUpdater:
    """One client's priority updates: gathered, then sent per shard without waiting."""

    def __init__(self, shards: ShardSet) -> None:
        self._shards = shards
        self._gathered: list[GatheredPriorities] = []
        self._updates: deque[PendingUpdate] = deque()
        self.updates_lost = 0

    def update(self, keys: np.ndarray, priorities: np.ndarray) -> None:
        keys = np.asarray(keys)
        if keys.ndim != 1 or keys.dtype.kind not in "iu":
            raise ValueError(f"keys must be a [B] integer array, got {keys.dtype} {keys.shape}")
        priorities = np.asarray(priorities, dtype=np.float64)
        if priorities.shape != keys.shape:
            raise ValueError(
                f"priorities must have shape {keys.shape} like keys, got {priorities.shape}"
            )
        if keys.size and (keys.min() < 0 or not np.isfinite(priorities).all()):
            raise ValueError("keys must be >= 0 and priorities finite")
        self._gathered.append(GatheredPriorities(keys, priorities))
        if len(self._gathered) >= self._shards.config.batches_per_request:
            self.send_gathered()

    def send_gathered(self) -> None:
        if not self._gathered:
            return
        keys = np.concatenate([g.keys for g in self._gathered])
        priorities = np.concatenate([g.priorities for g in self._gathered])
        self._gathered.clear()
        self._reap(block=False)
        num_shards = self._shards.num_shards
        for (shard, incarnation), mask in self._shards.split_keys(keys).items():
            # the shard drops keys of another incarnation than its own (it restarted since)
            ref = self._shards.handles[shard].update_priorities.remote(
                self._shards.local_keys(keys[mask]), priorities[mask], incarnation
            )
            self._updates.append(PendingUpdate(ref, int(shard), int(mask.sum())))
        while len(self._updates) > 4 * num_shards:
            self._reap(block=True)

    def flush(self) -> None:
        """Send what is gathered and wait until every update has been applied."""
        self.send_gathered()
        while self._updates:
            self._reap(block=True)

    def drop(self) -> None:
        self._gathered.clear()
        self._updates.clear()

    def _reap(self, *, block: bool) -> None:
        import ray

        if not self._updates:
            return
        if block:
            first = self._updates[0]
            self._shards.wait_for(first.ref, first.shard, "a priority update")
        while self._updates:
            update = self._updates[0]
            if not ray.wait([update.ref], timeout=0)[0]:
                break
            self._updates.popleft()
            try:
                self._shards.observe(update.shard, ray.get(update.ref))
            except actor_errors() as error:
                self._shards.mark_down(update.shard, error)
                self.updates_lost += update.count
