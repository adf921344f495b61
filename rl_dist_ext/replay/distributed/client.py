"""``DistributedReplay``: the picklable client every actor and learner holds.

It starts the shard actors (or, unpickled, reattaches to them) and composes one part per
concern: :class:`~.shards.ShardSet` (routing and health), :class:`~.inserts.Inserter`,
:class:`~.sampling.Sampler` and :class:`~.sampling.PriorityUpdater`, and the checkpoint
functions of :mod:`~.checkpoints`. It holds only actor handles and its config when pickled.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rl_dist_ext.replay import compression as codec
from rl_dist_ext.replay import snapshot
from rl_dist_ext.replay.distributed import checkpoints
from rl_dist_ext.replay.distributed.config import DistributedReplayConfig
from rl_dist_ext.replay.distributed.inserts import Inserter
from rl_dist_ext.replay.distributed.sampling import PriorityUpdater, Sampler
from rl_dist_ext.replay.distributed.shards import ShardSet
from rl_dist_ext.replay.distributed.stats import ReplayStats
from rl_dist_ext.replay.prioritized import ReplaySample
from rl_dist_ext.replay.shard import ShardStatus
from rl_dist_ext.replay.storage import check_batch, check_priorities
from rl_dist_ext.validation import check_int, start_timeout_s

log = logging.getLogger(__name__)


class DistributedReplay:
    """Client of ``num_shards`` replay shard actors; see :mod:`rl_dist_ext.replay.distributed`.

    Args:
        config: a :class:`DistributedReplayConfig`. Starting requires Ray (``ray.init()`` is
            called if it was not).
        wait: wait (up to ``config.start_timeout_s``) until every shard answers. ``False``
            starts the shards and returns at once, for a caller that starts other actors
            meanwhile and then calls :meth:`wait_until_started`.
    """

    def __init__(self, config: DistributedReplayConfig, *, wait: bool = True) -> None:
        if not isinstance(config, DistributedReplayConfig):
            raise TypeError(
                f"config must be a DistributedReplayConfig, got {type(config).__name__}"
            )
        import ray

        from rl_dist_ext.ray_actors import check_resources_fit
        from rl_dist_ext.replay.distributed.shard_actor import start_replay_shard

        if not ray.is_initialized():
            ray.init()
        check_snapshot_dir_reachable(config.snapshot_dir)
        if config.placement_group is None:
            check_resources_fit(
                f"the replay (num_shards={config.num_shards} x num_cpus_per_shard="
                f"{config.num_cpus_per_shard})",
                {"CPU": config.num_shards * config.num_cpus_per_shard},
                how_to_lower="lower num_cpus_per_shard (shards mostly wait) or num_shards",
            )
        handles = [
            start_replay_shard(
                spec,
                num_cpus=config.num_cpus_per_shard,
                placement_group=config.placement_group,
                bundle_index=-1 if config.bundle_indices is None else config.bundle_indices[i],
                strategy=config.shard_placement,
            )
            for i, spec in enumerate(config.shard_specs())
        ]
        self._setup(config, handles)
        if wait:
            self.wait_until_started()

    def wait_until_started(self) -> None:
        """Wait until every shard answers (up to ``config.start_timeout_s``, or the longer floor
        the environment sets, :func:`~rl_dist_ext.validation.start_timeout_s`; then
        :class:`ReplayTimeout`)."""
        self.refresh(timeout_s=start_timeout_s(self._config.start_timeout_s))

    # ---- pickling: handles and config only ----------------------------------------------------
    def __reduce__(self):
        return (_rebuild, (self._config, self._shards.handles))

    def _setup(self, config: DistributedReplayConfig, handles: list) -> None:
        self._config = config
        self._shards = ShardSet(config, handles)
        self._inserter = Inserter(self._shards)
        self._sampler = Sampler(self._shards)
        self._priorities = PriorityUpdater(self._shards)
        self._stats = ReplayStats()

    @property
    def config(self) -> DistributedReplayConfig:
        return self._config

    @property
    def num_shards(self) -> int:
        return self._shards.num_shards

    @property
    def handles(self) -> list:
        return list(self._shards.handles)

    def __len__(self) -> int:
        """Rows stored over all shards, as of the latest replies."""
        return sum(v.status.size for v in self._shards.views if v.status is not None)

    # ---- the data path ------------------------------------------------------------------------
    def add(
        self,
        batch: Mapping[str, np.ndarray],
        priorities: np.ndarray | None = None,
        *,
        count: int | None = None,
    ) -> None:
        """Send ``B`` rows to one shard without waiting for it (unless too many are in flight).

        Args:
            batch: column -> ``[B, ...]`` array (the same schema on every call).
            priorities: ``[B]`` raw priorities (e.g. actor-computed ``|TD error|``) or ``None``.
            count: what this insert counts for the shard's rate limiter (default ``B``; a
                multi-agent actor counts the env steps, see ``rl_dist_ext.gorila.actor``).

        With ``config.compression`` set, the batch's compressed columns are compressed here
        (on the actor) and the shard stores the blobs.
        """
        if count is not None:
            count = check_int("count", count, 0)
        # what can be checked here is checked before anything is sent (the shard checks the
        # columns against its schema; an add it refuses raises at this client's next call)
        arrays, rows = check_batch(batch)
        if priorities is not None:
            priorities = check_priorities(priorities, rows)
        self._shards.poll()
        compression = self._config.compression
        sent = arrays if compression is None else codec.pack(arrays, compression)
        self._inserter.add(sent, priorities, rows, count)

    def while_waiting(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback()`` (in this process, every 20 ms) while :meth:`sample` waits for a
        shard's reply, e.g. while the rate limiters hold the learner back. A learner loop that
        also hands out the actors' work (Tianshou's trainer, through a collector) keeps the
        actors acting there; otherwise the learner would wait for inserts that never come.
        Not pickled; ``None`` removes it."""
        if callback is not None and not callable(callback):
            raise TypeError(f"callback must be callable or None, got {type(callback).__name__}")
        self._sampler.while_waiting = callback

    def sample(self, batch_size: int, *, beta: float | None = None) -> ReplaySample:
        """A prioritized batch from one shard, with importance weights normalised over all shards
        (exponent ``beta``; ``None``: the config's).

        Returns:
            ``ReplaySample(batch, keys, weights)``: column -> ``[B, ...]``, ``[B]`` int64 global
            keys for :meth:`update_priorities`, ``[B]`` float32 weights in ``(0, 1]``.
        """
        return self._sampler.sample(batch_size, beta=self._config.beta if beta is None else beta)

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> None:
        """Send new raw priorities for sampled ``keys``, split by shard, without waiting."""
        self._priorities.update(keys, priorities)

    def flush(self) -> None:
        """Wait until every add and priority update made by this client has been applied."""
        self._priorities.send_gathered()
        self._inserter.flush()
        self._priorities.flush()

    # ---- health and stats ---------------------------------------------------------------------
    def refresh(self, *, timeout_s: float | None = None) -> list[ShardStatus | None]:
        """Ask every shard for its status now and wait (dead shards are marked down)."""
        return self._shards.refresh(timeout_s=timeout_s)

    def stats(self, *, wait: bool = False) -> dict[str, Any]:
        """Sizes, rates, sampler waiting and failure counts, for metrics loggers.

        Without waiting (the default, for training loops): the newest statuses this client
        has, which its status requests keep at most ``status_refresh_s`` old while it is used.
        ``wait=True`` asks every shard first and waits for the answers.
        """
        if wait:
            self._shards.refresh()
        else:
            self._shards.poll()
        return self._stats.report(
            self._shards, self._sampler, self._inserter, self._priorities, self._config
        )

    # ---- checkpoints --------------------------------------------------------------------------
    def save(self, path: str) -> None:
        """Write every shard (rows, priorities, keys, counters) and a manifest under ``path``
        (dir or URI); see :mod:`~rl_dist_ext.replay.distributed.checkpoints`."""
        check_snapshot_dir_reachable(path, what="checkpoint path", refuse_relative=False)
        self.flush()
        checkpoints.save(self._shards, snapshot.resolve(path))

    def restore(self, path: str) -> None:
        """Load every shard from :meth:`save` output; shard count, capacity and alpha must match.
        Every shard reads and checks its file before any swaps its rows in: a damaged one
        (:class:`~rl_dist_ext.replay.snapshot.ReplaySnapshotCorrupt`) leaves all as they were."""
        check_snapshot_dir_reachable(path, what="checkpoint path", refuse_relative=False)
        path = snapshot.resolve(path)
        pinned = checkpoints.check_manifest(self._config, path)
        self.flush()  # adds in flight land before the shards read (and then replace) their rows
        try:
            self._shards.on_every_shard(
                "restore",
                lambda i, h: h.prepare_restore.remote(checkpoints.shard_file(path, i), pinned[i]),
            )
            self._replace_contents("restore", lambda i, h: h.commit_restore.remote())
        except BaseException:  # no shard keeps a prepared copy (a second replay's memory)
            for handle in self._shards.handles:
                handle.abort_restore.remote()
            raise

    def clear(self) -> None:
        """Drop every row in every shard; keys sampled before are stale from now on."""
        self._replace_contents("clear", lambda i, h: h.clear.remote())

    def _replace_contents(self, what: str, call: Callable[[int, Any], Any]) -> None:
        """Run ``what`` on every shard after flushing adds and dropping prefetched samples and
        status requests (they describe the old contents); the shards' replies are the new view."""
        self.flush()
        self._sampler.drop()
        replies = self._shards.on_every_shard(what, call)
        self._shards.forget()
        for shard, status in enumerate(replies):
            self._shards.observe(shard, status)

    # ---- shutdown -----------------------------------------------------------------------------
    def stop_rate_limiting(self) -> None:
        """Let every waiting and later insert or sample through, on every shard (without
        waiting for the replies): call it before stopping the actors and learners of a
        rate-limited run, so that none of them stays blocked on the limiter."""
        for handle in self._shards.handles:
            handle.stop_rate_limiting.remote()

    def close(self) -> None:
        """Stop the shard actors (their snapshots stay on disk)."""
        import ray

        for handle in self._shards.handles:
            ray.kill(handle, no_restart=True)
        self._inserter.drop()
        self._sampler.drop()
        self._priorities.drop()

    def __enter__(self) -> DistributedReplay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _rebuild(config: DistributedReplayConfig, handles: list) -> DistributedReplay:
    client = DistributedReplay.__new__(DistributedReplay)
    client._setup(config, handles)
    return client


def check_snapshot_dir_reachable(
    snapshot_dir: str | None, *, what: str = "snapshot_dir", refuse_relative: bool = True
) -> None:
    """Refuse a relative local path on a Ray cluster of several nodes (unless
    ``refuse_relative=False``: checkpoint paths, which are resolved on the caller); warn about
    any other local one (it must be a shared mount). Needs Ray to be initialized.

    Every shard reads and writes its own file: a shard restarted on another node reads its
    snapshot there, and a checkpoint's shard files land on the shards' nodes (see
    :mod:`rl_dist_ext.replay.snapshot`); a relative path names a different place on every node.
    """
    if snapshot_dir is None or not snapshot.is_local(snapshot_dir):
        return
    import ray

    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    if nodes <= 1:
        return
    path = snapshot_dir.removeprefix("file://")
    if refuse_relative and not path.startswith(("/", "~")):
        raise ValueError(
            f"{what}={snapshot_dir!r} is a relative local path, but the Ray cluster has "
            f"{nodes} nodes, and every replay shard reads and writes its own file there. Give "
            "storage every node reaches: a pyarrow.fs URI (s3://..., gs://..., hdfs://...) "
            "or an absolute path on a shared mount"
        )
    log.warning(
        "%s=%r is a local path on a Ray cluster of %d nodes: every replay shard reads and "
        "writes its own file there, which works only if it is a shared mount (NFS) or all "
        "nodes run on this machine; otherwise use a pyarrow.fs URI such as s3://...",
        what,
        snapshot_dir,
        nodes,
    )
