"""Distributed prioritized replay (Ape-X, Horgan et al. 2018): N shard actors, a picklable client.

``DistributedReplay`` starts ``num_shards`` Ray actors, each a :class:`ReplayShardServer` around
one :class:`PrioritizedReplay`, and talks to them. The client holds only actor handles and its
config, so it pickles: actors and learners each get their own copy.

- ``add`` routes a batch to the next live shard (round-robin from a random start per client)
  without waiting; at most ``max_in_flight_adds`` adds per client are in flight (back-pressure).
  A batch whose shard died is sent to another shard, not dropped.
- ``sample`` takes each batch from one shard chosen with probability proportional to the
  shard's total priority, so an item's probability is ``p_i / sum over all shards``;
  importance weights ``(N P(i)) ** -beta`` use the size and minimum priority across shards.
  ``prefetch`` requests stay in flight so the learner rarely waits on a round trip. The shard
  totals used to pick come from the latest replies and from status requests the client sends
  to every shard by itself every ``status_refresh_s`` while it samples (without waiting for
  them), so a client anywhere (the driver, a learner actor, a process that unpickled it) keeps
  every shard's mass current, shards it has never sampled and shards that were empty included.
  Its first sample asks every shard and waits for the answers. With
  ``batches_per_request = K`` one request draws ``K * B`` rows (stratified) and serves ``K``
  batches (every K-th row each, so each batch still spans the whole priority range): K times
  fewer round trips per learner update, for priorities up to K batches older.
- ``update_priorities`` splits keys by shard and sends them without waiting (with
  ``batches_per_request = K``: gathered over K calls, then sent together); keys of rows
  overwritten meanwhile are dropped by the shard and counted.
- Rate limiting (Reverb semantics, per shard; see ``rate_limiter``) happens inside the shards,
  and the clients route around it: every status says whether the shard's limiter lets an insert
  or a sample through, inserts go to shards that take them and samples to shards that allow
  them (by priority mass among those). A call that finds its shard closed waits there at most
  ``status_refresh_s`` and is then re-routed with fresh statuses. Per shard, proportional
  sampling would otherwise run the learner ahead on high-mass shards and the actors ahead on
  the others, and a learner waiting on one shard while the actors wait on another would never
  wake. Only when no shard lets a side through for ``timeout_s`` does it fail with
  :class:`RateLimitTimeout`.
- A shard whose actor dies is restarted by Ray and reloads its latest snapshot (when
  ``snapshot_dir`` is set). Meanwhile the client samples from the others and inserts elsewhere;
  rows lost (inserted after the snapshot) are counted in ``stats()``.

Global keys are ``shard_key * num_shards + shard_index``.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rl_dist_ext.ops.priorities import importance_weights, validate_alpha_eps
from rl_dist_ext.replay import snapshot
from rl_dist_ext.replay.prioritized import ReplaySample
from rl_dist_ext.replay.rate_limiter import RateLimit
from rl_dist_ext.replay.shard import RateLimitTimeout, ShardSpec, ShardStatus
from rl_dist_ext.validation import check_int

log = logging.getLogger(__name__)

__all__ = [
    "DistributedReplay",
    "DistributedReplayConfig",
    "RateLimitTimeout",
    "ReplayTimeout",
    "ReplayUnavailable",
]


class ReplayTimeout(TimeoutError):
    """A replay request got no answer within ``timeout_s``."""


class ReplayUnavailable(RuntimeError):
    """A replay shard (or every one) is down and did not come back in time."""


def _positive_or_none(name: str, value: Any) -> None:
    if value is not None and not (isinstance(value, numbers.Real) and value > 0):
        raise ValueError(f"{name} must be > 0 or None, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class DistributedReplayConfig:
    """Settings of a :class:`DistributedReplay`, validated when built (before any actor starts).

    ``capacity`` and ``min_size_to_sample`` are totals over all shards (split evenly);
    ``samples_per_insert`` and ``error_buffer`` apply to each shard's own inserts and samples.
    """

    num_shards: int = 2
    capacity: int = 100_000
    alpha: float = 0.6
    eps: float = 1e-6
    min_size_to_sample: int = 1_000
    samples_per_insert: float | None = None
    error_buffer: float | None = None
    prefetch: int = 2
    batches_per_request: int = 1
    max_in_flight_adds: int = 4
    num_cpus_per_shard: float = 0.25
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

    def __post_init__(self) -> None:
        check_int("num_shards", self.num_shards, 1)
        check_int("capacity", self.capacity, self.num_shards)
        validate_alpha_eps(self.alpha, self.eps)
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
                    else snapshot.join(self.snapshot_dir, f"shard_{i}.pkl")
                ),
                snapshot_every_inserts=self.snapshot_every_inserts,
                snapshot_every_s=self.snapshot_every_s,
                timeout_s=self.timeout_s,
            )
            for i in range(self.num_shards)
        ]


@dataclass
class _ShardView:
    """What one client knows about one shard."""

    status: ShardStatus | None = None
    down_until: float = 0.0
    max_num_inserted_seen: int = 0


@dataclass
class _PendingAdd:
    """An add in flight: what to re-send to another shard if its shard dies."""

    ref: Any
    shard: int
    batch: dict[str, np.ndarray]
    priorities: np.ndarray | None
    rows: int
    first_sent: float


@dataclass
class _Counters:
    sample_wait_s: float = 0.0
    first_sample_time: float | None = None
    items_lost: int = 0
    shard_failures: int = 0
    priority_updates_lost: int = 0
    adds_rerouted: int = 0
    last_stats_time: float | None = None
    last_totals: tuple[int, int] = (0, 0)


class DistributedReplay:
    """Client of ``num_shards`` replay shard actors; see the module docstring.

    Args:
        config: a :class:`DistributedReplayConfig`. Starting requires Ray (``ray.init()`` is
            called if it was not).
    """

    def __init__(self, config: DistributedReplayConfig) -> None:
        if not isinstance(config, DistributedReplayConfig):
            raise TypeError(
                f"config must be a DistributedReplayConfig, got {type(config).__name__}"
            )
        import ray

        from rl_dist_ext.ray_actors import start_replay_shard

        if not ray.is_initialized():
            ray.init()
        if config.placement_group is None:
            available = ray.cluster_resources().get("CPU", 0.0)
            wanted = config.num_shards * config.num_cpus_per_shard
            if wanted > available:
                raise ValueError(
                    f"num_shards={config.num_shards} x num_cpus_per_shard="
                    f"{config.num_cpus_per_shard} asks for {wanted} CPUs but the Ray cluster has "
                    f"{available}; lower num_cpus_per_shard (shards mostly wait) or num_shards"
                )
        handles = [
            start_replay_shard(
                spec,
                num_cpus=config.num_cpus_per_shard,
                placement_group=config.placement_group,
                bundle_index=-1 if config.bundle_indices is None else config.bundle_indices[i],
            )
            for i, spec in enumerate(config.shard_specs())
        ]
        self._setup(config, handles)
        self.refresh(timeout_s=config.start_timeout_s)

    # ---- pickling: handles and config only ----------------------------------------------------
    def __reduce__(self):
        return (_rebuild, (self._config, self._handles))

    def _setup(self, config: DistributedReplayConfig, handles: list) -> None:
        self._config = config
        self._handles = handles
        self._views = [_ShardView() for _ in handles]
        self._rng = np.random.default_rng(config.seed)
        self._next_insert = int(self._rng.integers(len(handles)))
        self._adds: deque[_PendingAdd] = deque()
        self._samples: deque = deque()  # (ref, shard, batch_size)
        self._ready: deque = deque()  # (batch_size, ReplaySample) split off a larger reply
        self._updates: deque = deque()  # (ref, shard, count)
        self._gathered: list = []  # (keys, priorities) not sent yet (batches_per_request > 1)
        self._status_requests: dict[int, Any] = {}  # shard -> get_status ref in flight
        self._statuses_asked_at = -math.inf
        self._counters = _Counters()

    @property
    def _reply_timeout_s(self) -> float:
        # Longer than a shard's own rate-limiter wait, so its RateLimitTimeout arrives first.
        return self._config.timeout_s + max(5.0, 0.5 * self._config.timeout_s)

    @property
    def config(self) -> DistributedReplayConfig:
        return self._config

    @property
    def num_shards(self) -> int:
        return len(self._handles)

    @property
    def handles(self) -> list:
        return list(self._handles)

    def __len__(self) -> int:
        """Rows stored over all shards, as of the latest replies."""
        return sum(v.status.size for v in self._views if v.status is not None)

    # ---- insert -------------------------------------------------------------------------------
    def add(self, batch: Mapping[str, np.ndarray], priorities: np.ndarray | None = None) -> None:
        """Send ``B`` rows to one shard without waiting for it (unless too many are in flight).

        Args:
            batch: column -> ``[B, ...]`` array (the same schema on every call).
            priorities: ``[B]`` raw priorities (e.g. actor-computed ``|TD error|``) or ``None``.
        """
        if not isinstance(batch, Mapping) or not batch:
            raise TypeError(
                f"batch must be a non-empty dict[str, np.ndarray], got {type(batch).__name__}"
            )
        rows = len(next(iter(batch.values())))
        if priorities is not None:
            priorities = np.asarray(priorities, dtype=np.float64)
            if priorities.shape != (rows,):
                raise ValueError(f"priorities must have shape ({rows},), got {priorities.shape}")
        self._poll_statuses()
        self._reap_adds(block=False)
        while len(self._adds) >= self._config.max_in_flight_adds:
            self._reap_adds(block=True)
        self._send_add(dict(batch), priorities, rows)

    def flush(self) -> None:
        """Wait until every add and priority update made by this client has been applied."""
        self._send_gathered_priorities()
        while self._adds:
            self._reap_adds(block=True)
        while self._updates:
            self._reap_updates(block=True)

    def _send_add(self, batch: dict, priorities: np.ndarray | None, rows: int) -> None:
        add = _PendingAdd(None, -1, batch, priorities, rows, time.monotonic())
        self._route_add(add)
        self._adds.append(add)

    def _route_add(self, add: _PendingAdd) -> None:
        """(Re-)send ``add`` to the next live shard whose limiter takes inserts."""
        add.shard = self._pick_insert_shard()
        add.ref = self._handles[add.shard].add.remote(
            add.batch, add.priorities, max_wait_s=self._config.status_refresh_s
        )

    def _pick_insert_shard(self) -> int:
        """Round-robin over live shards, those whose limiter takes inserts first."""
        now = time.monotonic()
        order = [(self._next_insert + i) % self.num_shards for i in range(self.num_shards)]
        live = [i for i in order if self._views[i].down_until <= now]
        if not live:  # every shard failed recently: try the one that comes back soonest
            return min(range(self.num_shards), key=lambda i: self._views[i].down_until)
        open_ = [
            i for i in live if self._views[i].status is None or self._views[i].status.can_insert
        ]
        shard = (open_ or live)[0]
        self._next_insert = (shard + 1) % self.num_shards
        return shard

    def _reap_adds(self, *, block: bool) -> None:
        import ray

        if not self._adds:
            return
        refs = [add.ref for add in self._adds]
        if block and not ray.wait(refs, num_returns=1, timeout=self._reply_timeout_s)[0]:
            raise ReplayTimeout(
                f"no add to the replay shards {sorted({a.shard for a in self._adds})} got an "
                f"answer in {self._reply_timeout_s}s"
            )
        done = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
        pending: deque[_PendingAdd] = deque()
        for add in self._adds:
            if add.ref not in done:
                pending.append(add)
                continue
            try:
                self._observe(add.shard, ray.get(add.ref))
            except RateLimitTimeout:
                self._note_closed(add.shard, inserts=True)
                if time.monotonic() - add.first_sent > self._config.timeout_s:
                    raise RateLimitTimeout(
                        f"no replay shard took a batch of {add.rows} rows within "
                        f"{self._config.timeout_s}s: every shard's rate limiter says the actors "
                        f"are ahead (samples_per_insert={self._config.samples_per_insert}); no "
                        "learner is sampling fast enough"
                    ) from None
                self._poll_statuses()
                self._route_add(add)
                pending.append(add)
            except _actor_errors() as error:
                self._mark_down(add.shard, error)
                if time.monotonic() - add.first_sent > self._config.timeout_s:
                    raise ReplayUnavailable(
                        f"no replay shard took a batch of {add.rows} rows within "
                        f"{self._config.timeout_s}s (replay shard {add.shard} last: "
                        f"{type(error).__name__})"
                    ) from None
                self._counters.adds_rerouted += 1
                if all(v.down_until > time.monotonic() for v in self._views):
                    time.sleep(0.05)  # every shard is restarting: don't spin on failing calls
                self._route_add(add)
                pending.append(add)
        self._adds = pending

    def _note_closed(self, shard: int, *, inserts: bool) -> None:
        """A call to ``shard`` timed out on its rate limiter: route elsewhere until a newer
        status says it is open again."""
        status = self._views[shard].status
        if status is not None:
            closed = {"can_insert": False} if inserts else {"can_sample": False}
            self._views[shard].status = status._replace(**closed)

    # ---- sample -------------------------------------------------------------------------------
    def sample(self, batch_size: int, *, beta: float = 0.4) -> ReplaySample:
        """A prioritized batch from one shard, with importance weights normalised over all shards.

        Returns:
            ``ReplaySample(batch, keys, weights)``: column -> ``[B, ...]``, ``[B]`` int64 global
            keys for :meth:`update_priorities`, ``[B]`` float32 weights in ``(0, 1]``.
        """
        check_int("batch_size", batch_size, 1)
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {beta!r}")
        import ray

        self._samples = deque(s for s in self._samples if s[2] == batch_size)
        self._ready = deque(r for r in self._ready if r[0] == batch_size)
        if self._ready:
            return self._ready.popleft()[1]
        if all(view.status is None for view in self._views):
            self.refresh()  # a new or unpickled client: learn every shard's mass first
        self._poll_statuses()
        started = time.monotonic()
        deadline = started + self._reply_timeout_s
        if self._counters.first_sample_time is None:
            self._counters.first_sample_time = started
        while True:
            while len(self._samples) < self._config.prefetch:
                self._request_sample(batch_size)
            ref, shard, _ = self._samples.popleft()
            try:
                reply = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except RateLimitTimeout:
                self._note_closed(shard, inserts=False)
                if time.monotonic() - started > self._config.timeout_s:
                    # The other prefetched requests are as old: a later call must not get
                    # their stale timeouts once rows have arrived.
                    self._samples.clear()
                    raise RateLimitTimeout(
                        f"no replay shard let a sample of {batch_size} rows through within "
                        f"{self._config.timeout_s}s: every shard's rate limiter says the "
                        f"learner is ahead (samples_per_insert="
                        f"{self._config.samples_per_insert}, min_size_to_sample="
                        f"{self._config.min_size_to_sample}); actors are not inserting fast "
                        "enough"
                    ) from None
                self._poll_statuses()
                continue
            except ray.exceptions.GetTimeoutError:
                raise ReplayTimeout(
                    f"sample from replay shard {shard} got no answer in {self._reply_timeout_s}s"
                ) from None
            except _actor_errors() as error:
                self._mark_down(shard, error)
                if time.monotonic() > deadline:
                    raise ReplayUnavailable("no replay shard answered a sample in time") from error
                if all(v.down_until > time.monotonic() for v in self._views):
                    time.sleep(0.05)  # every shard is restarting: don't spin on failing calls
                continue
            break
        self._counters.sample_wait_s += time.monotonic() - started
        self._request_sample(batch_size)
        self._observe(shard, reply.status)
        live = [v.status for v in self._views if v.status is not None and v.status.size > 0]
        total = sum(s.total_priority for s in live)
        size = sum(s.size for s in live)
        min_priority = min(min(s.min_priority for s in live), float(reply.priorities.min()))
        weights = importance_weights(
            reply.priorities,
            total_priority=total,
            size=size,
            beta=beta,
            min_priority=min_priority,
        )
        keys = reply.keys * self.num_shards + shard
        k = self._config.batches_per_request
        parts = [  # strided: each batch spans the whole stratified draw (k = 1: the reply)
            ReplaySample({c: v[j::k] for c, v in reply.batch.items()}, keys[j::k], weights[j::k])
            for j in range(k)
        ]
        self._ready.extend((batch_size, part) for part in parts[1:])
        return parts[0]

    def _request_sample(self, batch_size: int) -> None:
        """Send a sample request to a shard picked by priority mass, among the live shards
        whose limiter lets samples through if there are any."""
        now = time.monotonic()
        up = [i for i, v in enumerate(self._views) if v.down_until <= now]
        if not up:
            up = [min(range(self.num_shards), key=lambda i: self._views[i].down_until)]
        open_ = [i for i in up if self._views[i].status and self._views[i].status.can_sample]
        up = open_ or up
        mass = np.array(
            [self._views[i].status.total_priority if self._views[i].status else 0.0 for i in up]
        )
        if mass.sum() > 0:
            shard = up[int(self._rng.choice(len(up), p=mass / mass.sum()))]
        else:  # nothing known yet: any live shard (its rate limiter waits for min size)
            shard = up[int(self._rng.integers(len(up)))]
        rows = batch_size * self._config.batches_per_request
        ref = self._handles[shard].sample.remote(rows, max_wait_s=self._config.status_refresh_s)
        self._samples.append((ref, shard, batch_size))

    def _poll_statuses(self) -> None:
        """Take the status replies that arrived; ask every shard again every
        ``status_refresh_s`` (never waits)."""
        import ray

        if self._status_requests:
            refs = list(self._status_requests.values())
            done = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
            for shard, ref in list(self._status_requests.items()):
                if ref not in done:
                    continue
                del self._status_requests[shard]
                try:
                    self._observe(shard, ray.get(ref))
                except _actor_errors() as error:
                    self._mark_down(shard, error)
        now = time.monotonic()
        if not self._status_requests and now - self._statuses_asked_at >= (
            self._config.status_refresh_s
        ):
            self._statuses_asked_at = now
            self._status_requests = {
                shard: handle.get_status.remote() for shard, handle in enumerate(self._handles)
            }

    # ---- priorities ---------------------------------------------------------------------------
    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> None:
        """Send new raw priorities for sampled ``keys``, split by shard, without waiting."""
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
        self._gathered.append((keys, priorities))
        if len(self._gathered) >= self._config.batches_per_request:
            self._send_gathered_priorities()

    def _send_gathered_priorities(self) -> None:
        if not self._gathered:
            return
        keys = np.concatenate([k for k, _ in self._gathered])
        priorities = np.concatenate([p for _, p in self._gathered])
        self._gathered.clear()
        self._reap_updates(block=False)
        shards = keys % self.num_shards
        for shard in np.unique(shards):
            mask = shards == shard
            ref = self._handles[shard].update_priorities.remote(
                keys[mask] // self.num_shards, priorities[mask]
            )
            self._updates.append((ref, int(shard), int(mask.sum())))
        while len(self._updates) > 4 * self.num_shards:
            self._reap_updates(block=True)

    def _reap_updates(self, *, block: bool) -> None:
        import ray

        if not self._updates:
            return
        if block:
            ref, shard, _ = self._updates[0]
            self._wait_for(ref, shard, "a priority update")
        while self._updates:
            ref, shard, count = self._updates[0]
            done, _ = ray.wait([ref], timeout=0)
            if not done:
                break
            self._updates.popleft()
            try:
                self._observe(shard, ray.get(ref))
            except _actor_errors() as error:
                self._mark_down(shard, error)
                self._counters.priority_updates_lost += count

    def _wait_for(self, ref: Any, shard: int, what: str) -> None:
        """Block until ``ref`` (a call to ``shard``) is done, at most the reply timeout."""
        import ray

        if not ray.wait([ref], timeout=self._reply_timeout_s)[0]:
            raise ReplayTimeout(
                f"{what} to replay shard {shard} got no answer in {self._reply_timeout_s}s"
            )

    # ---- health and stats ---------------------------------------------------------------------
    def refresh(self, *, timeout_s: float | None = None) -> list[ShardStatus | None]:
        """Ask every shard for its status now (dead shards are marked down); return them."""
        import ray

        timeout_s = self._config.timeout_s if timeout_s is None else timeout_s
        refs = [h.get_status.remote() for h in self._handles]
        out: list[ShardStatus | None] = []
        for shard, ref in enumerate(refs):
            try:
                status = ray.get(ref, timeout=timeout_s)
            except ray.exceptions.GetTimeoutError:
                raise ReplayTimeout(
                    f"replay shard {shard} did not answer a status request in {timeout_s}s"
                ) from None
            except _actor_errors() as error:
                self._mark_down(shard, error)
                out.append(None)
                continue
            self._observe(shard, status)
            out.append(status)
        return out

    def stats(self) -> dict[str, Any]:
        """Sizes, rates, sampler waiting and failure counts, for metrics loggers."""
        statuses = self.refresh()
        alive = [s for s in statuses if s is not None]
        now = time.monotonic()
        inserted = sum(s.num_inserted for s in alive)
        sampled = sum(s.num_sampled for s in alive)
        c = self._counters
        insert_rate = sample_rate = 0.0
        if c.last_stats_time is not None and now > c.last_stats_time:
            dt = now - c.last_stats_time
            insert_rate = max(0, inserted - c.last_totals[0]) / dt
            sample_rate = max(0, sampled - c.last_totals[1]) / dt
        c.last_stats_time, c.last_totals = now, (inserted, sampled)
        sampling_for = now - c.first_sample_time if c.first_sample_time is not None else 0.0
        return {
            "num_shards": self.num_shards,
            "shards_alive": len(alive),
            "size": sum(s.size for s in alive),
            "size_per_shard": [s.size if s is not None else None for s in statuses],
            "capacity": self._config.capacity,
            "num_inserted": inserted,
            "num_sampled": sampled,
            "insert_rate": insert_rate,
            "sample_rate": sample_rate,
            "samples_per_insert": sampled / inserted if inserted else 0.0,
            "sample_wait_s": c.sample_wait_s,
            "sample_wait_fraction": c.sample_wait_s / sampling_for if sampling_for > 0 else 0.0,
            "stale_updates": sum(s.stale_updates for s in alive),
            "items_lost": c.items_lost,
            "shard_failures": c.shard_failures,
            "priority_updates_lost": c.priority_updates_lost,
            "adds_rerouted": c.adds_rerouted,
        }

    def _observe(self, shard: int, status: ShardStatus) -> None:
        view = self._views[shard]
        if (
            view.status is not None
            and view.status.incarnation == status.incarnation
            and status.seq < view.status.seq
        ):
            return  # a reply that arrived after a newer one: keep the newer view
        if view.status is not None and view.status.incarnation != status.incarnation:
            lost = max(0, view.max_num_inserted_seen - status.restored_num_inserted)
            self._counters.items_lost += lost
            log.warning(
                "replay shard %d restarted with %d rows from its snapshot; %d rows inserted "
                "after the snapshot were lost",
                shard,
                status.size,
                lost,
            )
            view.max_num_inserted_seen = 0
        view.status = status
        view.down_until = 0.0
        view.max_num_inserted_seen = max(view.max_num_inserted_seen, status.num_inserted)

    def _mark_down(self, shard: int, error: BaseException) -> None:
        view = self._views[shard]
        if view.down_until <= time.monotonic():
            self._counters.shard_failures += 1
            log.warning("replay shard %d unavailable (%s); routing around it", shard, error)
        view.down_until = time.monotonic() + self._config.retry_down_shard_after_s

    # ---- checkpoints --------------------------------------------------------------------------
    def save(self, path: str) -> None:
        """Write every shard (rows, priorities, keys, counters) under ``path`` (dir or URI).

        Each shard is written as it is when the request reaches it; actors may go on inserting
        meanwhile. The manifest records the config and each shard's saved size and insert count.
        """
        self.flush()
        statuses = self._on_every_shard(
            "save", lambda i, h: h.save.remote(snapshot.join(path, f"shard_{i}.pkl"))
        )
        manifest = {k: v for k, v in asdict(self._config).items() if k != "placement_group"}
        manifest["size_per_shard"] = [status.size for status in statuses]
        manifest["num_inserted_per_shard"] = [status.num_inserted for status in statuses]
        snapshot.write_text(snapshot.join(path, "manifest.json"), json.dumps(manifest, indent=2))

    def restore(self, path: str) -> None:
        """Load every shard from :meth:`save` output; shard count, capacity and alpha must match."""
        text = snapshot.read_text(snapshot.join(path, "manifest.json"))
        if text is None:
            raise FileNotFoundError(f"no distributed replay checkpoint at {path!r}")
        manifest = json.loads(text)
        for name in ("num_shards", "capacity", "alpha", "eps"):
            if manifest[name] != getattr(self._config, name):
                raise ValueError(
                    f"checkpoint at {path!r} has {name}={manifest[name]!r}, this replay has "
                    f"{name}={getattr(self._config, name)!r}"
                )
        self._replace_contents(
            "restore", lambda i, h: h.restore.remote(snapshot.join(path, f"shard_{i}.pkl"))
        )

    def clear(self) -> None:
        """Drop every row in every shard; keys sampled before are stale from now on."""
        self._replace_contents("clear", lambda i, h: h.clear.remote())

    def _replace_contents(self, what: str, call: Callable[[int, Any], Any]) -> None:
        """Run ``what`` on every shard after flushing adds and dropping prefetched samples and
        status requests (they describe the old contents); the shards' replies are the new view."""
        self.flush()
        self._samples.clear()
        self._ready.clear()
        self._status_requests.clear()
        for shard, status in enumerate(self._on_every_shard(what, call)):
            self._views[shard] = _ShardView()
            self._observe(shard, status)

    def _on_every_shard(self, what: str, call: Callable[[int, Any], Any]) -> list[Any]:
        """``call(shard_index, handle)`` on every shard (it returns a Ray ref); the replies in
        shard order.

        A shard that is down (restarting after its process died) is asked again until it
        answers or ``timeout_s`` has passed; then :class:`ReplayUnavailable` names the shard
        and its state. Nothing here raises a raw Ray exception.
        """
        import ray

        timeout_s = self._config.timeout_s
        deadline = time.monotonic() + timeout_s
        replies: dict[int, Any] = {}
        pending = {shard: call(shard, handle) for shard, handle in enumerate(self._handles)}
        while pending:
            shard, ref = next(iter(pending.items()))
            try:
                replies[shard] = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except ray.exceptions.GetTimeoutError:
                raise ReplayTimeout(
                    f"{what}: replay shard {shard} did not answer within {timeout_s}s"
                ) from None
            except _actor_errors() as error:
                self._mark_down(shard, error)
                if time.monotonic() >= deadline:
                    state = (
                        "restarting"
                        if isinstance(error, ray.exceptions.ActorUnavailableError)
                        else "dead"
                    )
                    raise ReplayUnavailable(
                        f"{what}: replay shard {shard} is {state} ({type(error).__name__}) and "
                        f"did not come back within {timeout_s}s"
                    ) from None
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
                pending[shard] = call(shard, self._handles[shard])  # ask it again
                continue
            del pending[shard]
        return [replies[shard] for shard in range(self.num_shards)]

    def stop_rate_limiting(self) -> None:
        """Let every waiting and later insert or sample through, on every shard (without
        waiting for the replies): call it before stopping the actors and learners of a
        rate-limited run, so that none of them stays blocked on the limiter."""
        for handle in self._handles:
            handle.stop_rate_limiting.remote()

    def close(self) -> None:
        """Stop the shard actors (their snapshots stay on disk)."""
        import ray

        for handle in self._handles:
            ray.kill(handle, no_restart=True)
        self._adds.clear()
        self._samples.clear()
        self._ready.clear()
        self._updates.clear()
        self._gathered.clear()
        self._status_requests.clear()

    def __enter__(self) -> DistributedReplay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _rebuild(config: DistributedReplayConfig, handles: list) -> DistributedReplay:
    client = DistributedReplay.__new__(DistributedReplay)
    client._setup(config, handles)
    return client


def _actor_errors() -> tuple[type[BaseException], ...]:
    import ray

    return (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)
