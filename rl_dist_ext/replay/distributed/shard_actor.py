"""A replay shard as a Ray actor: the plain :class:`~rl_dist_ext.replay.shard.ReplayShardServer`,
started restartable by :func:`rl_dist_ext.ray_actors.start_restartable_actor`."""

from __future__ import annotations

import warnings
from typing import Any

import ray

from rl_dist_ext.ray_actors import start_restartable_actor
from rl_dist_ext.replay.shard import ReplayShardServer, ShardSpec


class RestartAwareReplayShard(ReplayShardServer):
    """Restores the shard's snapshot only when Ray restarts the actor, not on a fresh start."""

    def __init__(self, spec: ShardSpec) -> None:
        with warnings.catch_warnings():  # Ray's own property warns about a deprecated field
            warnings.simplefilter("ignore", DeprecationWarning)
            restarted = ray.get_runtime_context().was_current_actor_reconstructed
        super().__init__(spec, restore_snapshot=restarted)


def start_replay_shard(
    spec: ShardSpec,
    *,
    num_cpus: float,
    placement_group: Any = None,
    bundle_index: int = -1,
    strategy: str = "DEFAULT",
) -> ray.actor.ActorHandle:
    """Start one replay shard actor, in ``placement_group`` (bundle ``bundle_index``) if given,
    else placed by Ray's ``strategy`` (``"DEFAULT"`` or ``"SPREAD"``).

    Ray restarts it without limit when its process dies; calls in flight then fail (no
    retries) and the clients route around the shard until it is back, with its latest snapshot
    restored."""
    return start_restartable_actor(
        RestartAwareReplayShard,
        spec,
        num_cpus=num_cpus,
        placement_group=placement_group,
        bundle_index=bundle_index,
        strategy=strategy,
    )
