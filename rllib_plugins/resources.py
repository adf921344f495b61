"""Refuse resource asks the running Ray cluster can never satisfy, before any actor starts.

Without this check RLlib waits forever for an env runner or a replay shard that cannot be
placed. Inside a placement group (Tune) Ray itself has already checked the ask.
"""

from __future__ import annotations

from rl_dist_ext.ray_actors import check_resources_fit


def check_cluster_fits(algo_cls: type, config) -> None:
    """Raise ``ValueError`` if ``algo_cls.default_resource_request(config)`` cannot fit.

    Outside a placement group (``config.build_algo()``) the driver runs in the calling process
    and reserves nothing from Ray, so the first bundle (the main process) is not counted: only
    the actors' asks are (env runners, learner actors, replay shards, inference server).
    """
    actor_bundles = algo_cls.default_resource_request(config).bundles[1:]
    check_resources_fit(
        algo_cls.__name__,
        {r: sum(bundle.get(r, 0.0) for bundle in actor_bundles) for r in ("CPU", "GPU")},
        how_to_lower=f"its actors are {config.num_env_runners} env runners x "
        f"{config.num_cpus_per_env_runner} CPUs, learner actors, replay shards and the inference "
        "server: lower the counts or the per-actor asks (num_cpus_per_env_runner, replay "
        "num_cpus_per_shard, central_inference num_cpus / num_gpus)",
    )
