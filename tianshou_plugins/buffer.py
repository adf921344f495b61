"""``DistributedPrioritizedReplayBuffer``: the sharded Ape-X replay behind Tianshou's buffer API.

The rows are n-step transitions folded by the actors (``rl_dist_ext.gorila.TRANSITION_COLUMNS``);
the learner samples them with importance weights and sends back new priorities. The shard actors
start on first use (:meth:`start`, called by :class:`~tianshou_plugins.GorilaCollector`), so a
buffer can be configured, validated and handed around before anything runs.

What Tianshou's trainer and algorithms call: ``sample(batch_size) -> (batch, indices)``,
``update_weight(indices, new_weight)``, ``len()``, ``hasnull()``, ``reset()``. Checkpoints:
:meth:`save` / :meth:`restore` (every shard's rows, priorities and counters).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tianshou.data import Batch

from rl_dist_ext.gorila import NEXT_ACTION_MASK
from rl_dist_ext.replay.distributed import DistributedReplay, DistributedReplayConfig
from rl_dist_ext.validation import check_real, with_settings


class DistributedPrioritizedReplayBuffer:
    """A prioritized replay of ``capacity`` rows spread over Ray actors (replay shards).

    Takes or builds one :class:`~rl_dist_ext.replay.distributed.DistributedReplayConfig`:
    ``DistributedPrioritizedReplayBuffer(100_000, num_shards=2, samples_per_insert=8)`` or
    ``DistributedPrioritizedReplayBuffer(config=DistributedReplayConfig(...))``; keyword
    settings replace the given config's fields. Every setting and its default is that class's
    (``num_shards``, ``alpha``, ``beta``, ``min_size_to_sample``, ``samples_per_insert``,
    ``batches_per_request``, ``num_cpus_per_shard``, ``snapshot_dir``, ``compression``, ...).

    ``beta`` (the importance-sampling exponent) can be changed later with :meth:`set_beta`, as
    with Tianshou's ``PrioritizedReplayBuffer``; ``sample`` waits until the shards hold
    ``min_size_to_sample`` rows.

    Args:
        capacity: rows over all shards (``DistributedReplayConfig.capacity``).
        config: the replay's settings (default ``DistributedReplayConfig()``); keyword settings
            replace its fields.
    """

    def __init__(
        self,
        capacity: int | None = None,
        *,
        config: DistributedReplayConfig | None = None,
        **settings: Any,
    ) -> None:
        if config is not None and not isinstance(config, DistributedReplayConfig):
            raise TypeError(
                f"config must be a DistributedReplayConfig, got {type(config).__name__}"
            )
        if capacity is not None:
            settings["capacity"] = capacity
        self._config = with_settings(config or DistributedReplayConfig(), settings)
        self.set_beta(self._config.beta)
        self._replay: DistributedReplay | None = None

    # ---- lifecycle ----------------------------------------------------------------------------
    @property
    def config(self) -> DistributedReplayConfig:
        return self._config

    @property
    def maxsize(self) -> int:
        """Capacity over all shards (Tianshou's name)."""
        return self._config.capacity

    @property
    def started(self) -> bool:
        return self._replay is not None

    def start(self, *, wait: bool = True) -> DistributedReplay:
        """Start the shard actors (once); return the picklable client actors push through
        (``wait=False``: without waiting for the shards to answer, see
        :meth:`DistributedReplay.wait_until_started`)."""
        if self._replay is None:
            self._replay = DistributedReplay(self._config, wait=wait)
        return self._replay

    @property
    def client(self) -> DistributedReplay:
        if self._replay is None:
            raise RuntimeError(
                "the replay shards are not running: call start() (GorilaCollector does)"
            )
        return self._replay

    def close(self) -> None:
        """Stop the shard actors (snapshots stay on disk); ``start()`` makes fresh ones."""
        if self._replay is not None:
            self._replay.close()
            self._replay = None

    def __enter__(self) -> DistributedPrioritizedReplayBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self):
        raise TypeError(
            "DistributedPrioritizedReplayBuffer holds live Ray actors and cannot be pickled; "
            "checkpoint it with save(path) and load it with restore(path)"
        )

    # ---- Tianshou's buffer API ----------------------------------------------------------------
    def __len__(self) -> int:
        """Rows stored over all live shards (asks every shard)."""
        if self._replay is None:
            return 0
        return sum(s.size for s in self._replay.refresh() if s is not None)

    def set_beta(self, beta: float) -> None:
        self._beta = check_real("beta", beta, low=0.0, high=1.0)

    @property
    def beta(self) -> float:
        return self._beta

    def sample(self, batch_size: int) -> tuple[Batch, np.ndarray]:
        """A prioritized batch and its keys (pass them back to :meth:`update_weight`).

        The batch has ``obs``, ``act``, ``rew`` (the n-step discounted reward sum),
        ``discount`` (``gamma ** m``, 0 where the episode terminated inside the window),
        ``obs_next`` (the observation ``m`` steps later), ``weight`` (importance weights) and,
        where the env masks actions, ``mask_next`` (the legal actions at ``obs_next``).
        """
        if batch_size is None or batch_size < 1:
            raise ValueError(
                f"batch_size must be >= 1 (a distributed replay cannot return all rows), "
                f"got {batch_size!r}"
            )
        sample = self.client.sample(int(batch_size), beta=self._beta)
        rows = sample.batch
        batch = Batch(
            obs=rows["obs"],
            act=rows["action"],
            rew=rows["reward"],
            discount=rows["discount"],
            obs_next=rows["next_obs"],
            weight=sample.weights,
        )
        if NEXT_ACTION_MASK in rows:  # multi-agent envs with action masks
            batch.mask_next = rows[NEXT_ACTION_MASK]
        return batch, sample.keys

    def update_weight(self, index: np.ndarray, new_weight: np.ndarray | torch.Tensor) -> None:
        """New priorities ``|new_weight|`` (TD errors) for sampled keys ``index``."""
        if isinstance(new_weight, torch.Tensor):
            new_weight = new_weight.detach().cpu().numpy()
        self.update_priorities(np.asarray(index), np.abs(np.asarray(new_weight, dtype=np.float64)))

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> None:
        """New raw priorities for sampled ``keys`` (sent without waiting; stale keys dropped)."""
        self.client.update_priorities(keys, priorities)

    def hasnull(self) -> bool:
        """Always False: actors reject non-finite rows before they are pushed."""
        return False

    def reset(self, keep_statistics: bool = False) -> None:
        """Drop every row in every shard (``keep_statistics`` has nothing to keep here)."""
        if self._replay is not None:
            self._replay.clear()

    # ---- checkpoints and metrics --------------------------------------------------------------
    def save(self, path: str) -> None:
        """Write every shard's rows, priorities and counters under ``path`` (dir or URI)."""
        self.client.save(path)

    def restore(self, path: str) -> None:
        """Load :meth:`save` output (starts the shards if needed); shard layout must match."""
        self.start().restore(path)

    def stats(self, *, wait: bool = False) -> dict[str, Any]:
        """The replay's sizes, rates, sampler wait and failure counts (see
        ``DistributedReplay.stats``: ``wait=True`` asks every shard first)."""
        if self._replay is None:
            return {"size": 0, "num_shards": self._config.num_shards, "shards_alive": 0}
        return self._replay.stats(wait=wait)
