"""Refuse resource asks the running Ray cluster can never satisfy, before any actor starts.

Without this check RLlib waits forever for an env runner or a replay shard that cannot be
placed. Inside a placement group (Tune) Ray itself has already checked the ask.
"""

from __future__ import annotations

import ray


def check_cluster_fits(algo_cls: type, config) -> None:
    """Raise ``ValueError`` if ``algo_cls.default_resource_request(config)`` cannot fit.

    Outside a placement group (``config.build_algo()``) the driver runs in the calling process
    and reserves nothing from Ray, so the first bundle (the main process) is not counted: only
    the actors' asks are (env runners, learner actors, replay shards, inference server).
    """
    if not ray.is_initialized() or ray.util.get_current_placement_group() is not None:
        return
    actor_bundles = algo_cls.default_resource_request(config).bundles[1:]
    cluster = ray.cluster_resources()
    for resource in ("CPU", "GPU"):
        wanted = sum(bundle.get(resource, 0.0) for bundle in actor_bundles)
        have = float(cluster.get(resource, 0.0))
        if wanted > have + 1e-9:
            raise ValueError(
                f"{algo_cls.__name__} asks for {wanted:g} {resource}s for its actors "
                f"({config.num_env_runners} env runners x {config.num_cpus_per_env_runner} "
                "CPUs, learner actors, replay shards, inference server) but the Ray cluster "
                f"has {have:g}; lower the counts or the per-actor asks (num_cpus_per_env_runner, "
                "replay num_cpus_per_shard, central_inference num_cpus / num_gpus)"
            )
