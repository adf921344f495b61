"""Distributed prioritized replay (Ape-X, Horgan et al. 2018): N shard actors, a picklable client.

The client is split by concern: ``config`` (settings and errors, no Ray), ``shards`` (routing
and health), ``inserts``, ``sampling`` (prefetch, importance weights, priority updates),
``checkpoints`` and ``stats``; ``client.DistributedReplay`` composes them.

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
  rows lost (inserted after the snapshot) are counted in ``stats()``: exactly, by the shard
  itself, when its snapshot location is local (it keeps row counters there).
- Every row can be accounted for: the shards' ``rows_acknowledged == size + rows_evicted +
  items_lost``; with ``row_ledger_dir`` set, each client also counts the rows it sent and saw
  acknowledged, and :func:`~.ledger.account_rows` adds it all up (rows sent by an actor that
  died before the answer came are dropped in transit).
- ``stats()`` reports from the statuses the client already has (never waits); ``stats(wait=True)``
  and ``refresh()`` ask every shard first.

Global keys are ``(generation << 40 | shard_key) * num_shards + shard_index``, ``generation``
numbering the shard's incarnations as the client met them: a priority update names the
incarnation its keys came from, and a shard that restarted since drops it as stale.
"""

from rl_dist_ext.replay.distributed.client import DistributedReplay, check_snapshot_dir_reachable
from rl_dist_ext.replay.distributed.config import (
    DistributedReplayConfig,
    ReplayTimeout,
    ReplayUnavailable,
)
from rl_dist_ext.replay.distributed.ledger import RowAccount, account_rows
from rl_dist_ext.replay.shard import RateLimitTimeout

__all__ = [
    "DistributedReplay",
    "DistributedReplayConfig",
    "RateLimitTimeout",
    "ReplayTimeout",
    "ReplayUnavailable",
    "RowAccount",
    "account_rows",
    "check_snapshot_dir_reachable",
]
