"""Inserts: batches sent to shards without waiting, re-routed rather than dropped.

At most ``max_in_flight_adds`` adds per client are in flight (back-pressure). An add whose shard
died, or whose shard's rate limiter kept it waiting ``status_refresh_s``, is sent to another
shard; only when no shard takes it within ``timeout_s`` does the client raise
(:class:`~rl_dist_ext.replay.shard.RateLimitTimeout` or
:class:`~rl_dist_ext.replay.distributed.config.ReplayUnavailable`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from rl_dist_ext.replay.compression import PackedRows
from rl_dist_ext.replay.distributed.config import ReplayTimeout, ReplayUnavailable
from rl_dist_ext.replay.distributed.ledger import ClientLedger
from rl_dist_ext.replay.distributed.shards import ShardSet, actor_errors, shard_error
from rl_dist_ext.replay.shard import RateLimitTimeout


@dataclass
class PendingAdd:
    """An add in flight: what to re-send to another shard if its shard dies."""

    ref: Any
    shard: int
    batch: dict[str, np.ndarray] | PackedRows
    priorities: np.ndarray | None
    rows: int
    count: int | None  # what the add counts for the rate limiter (None: its rows)
    first_sent: float


class Inserter:
    """One client's adds in flight; see the module docstring."""

    def __init__(self, shards: ShardSet) -> None:
        self._shards = shards
        self._adds: deque[PendingAdd] = deque()
        self.adds_rerouted = 0
        directory = shards.config.row_ledger_dir
        self._ledger = None if directory is None else ClientLedger(directory)

    def add(
        self,
        batch: dict[str, np.ndarray] | PackedRows,
        priorities: np.ndarray | None,
        rows: int,
        count: int | None = None,
    ) -> None:
        self._reap(block=False)
        while len(self._adds) >= self._shards.config.max_in_flight_adds:
            self._reap(block=True)
        add = PendingAdd(None, -1, batch, priorities, rows, count, time.monotonic())
        if self._ledger is not None:
            self._ledger.sent(rows)
        self._route(add)
        self._adds.append(add)

    def flush(self) -> None:
        """Wait until every add in flight has been applied."""
        while self._adds:
            self._reap(block=True)

    def drop(self) -> None:
        self._adds.clear()

    def _route(self, add: PendingAdd) -> None:
        """(Re-)send ``add`` to the next live shard whose limiter takes inserts."""
        add.shard = self._shards.pick_insert_shard()
        add.ref = self._shards.handles[add.shard].add.remote(
            add.batch,
            add.priorities,
            count=add.count,
            max_wait_s=self._shards.config.status_refresh_s,
        )

    def _reap(self, *, block: bool) -> None:
        import ray

        if not self._adds:
            return
        shards, config = self._shards, self._shards.config
        refs = [add.ref for add in self._adds]
        if block and not ray.wait(refs, num_returns=1, timeout=shards.reply_timeout_s)[0]:
            raise ReplayTimeout(
                f"no add to the replay shards {sorted({a.shard for a in self._adds})} got an "
                f"answer in {shards.reply_timeout_s}s"
            )
        done = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
        pending: deque[PendingAdd] = deque()
        adds = list(self._adds)
        for i, add in enumerate(adds):
            if add.ref not in done:
                pending.append(add)
                continue
            try:
                shards.observe(add.shard, ray.get(add.ref))
                if self._ledger is not None:
                    self._ledger.acknowledged(add.rows)
            except RateLimitTimeout:
                shards.note_closed(add.shard, inserts=True)
                if time.monotonic() - add.first_sent > config.timeout_s:
                    raise RateLimitTimeout(
                        f"no replay shard took a batch of {add.rows} rows within "
                        f"{config.timeout_s}s: every shard's rate limiter says the actors "
                        f"are ahead (samples_per_insert={config.samples_per_insert}); no "
                        "learner is sampling fast enough"
                    ) from None
                shards.poll()
                self._route(add)
                pending.append(add)
            except ray.exceptions.RayTaskError as error:  # the shard refused the batch
                self._adds = pending + deque(adds[i + 1 :])
                raise shard_error(
                    error,
                    f"replay shard {add.shard} refused an add of {add.rows} rows this client "
                    "sent earlier (none of them was stored)",
                ) from None
            except actor_errors() as error:
                shards.mark_down(add.shard, error)
                if time.monotonic() - add.first_sent > config.timeout_s:
                    raise ReplayUnavailable(
                        f"no replay shard took a batch of {add.rows} rows within "
                        f"{config.timeout_s}s (replay shard {add.shard} last: "
                        f"{type(error).__name__})"
                    ) from None
                self.adds_rerouted += 1
                if self._ledger is not None:
                    self._ledger.resent(add.rows)
                if shards.all_down():
                    time.sleep(0.05)  # every shard is restarting: don't spin on failing calls
                self._route(add)
                pending.append(add)
        self._adds = pending
