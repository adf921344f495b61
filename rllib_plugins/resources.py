"""Refuse resource asks the running Ray cluster can never satisfy, before any actor starts.

Without this check RLlib waits forever for an env runner or a replay shard that cannot be
placed. Inside a placement group (Tune) Ray itself has already checked the ask.
"""

from __future__ import annotations

import difflib
from typing import Any

from rl_dist_ext.ray_actors import check_resources_fit

_HOW_TO_LOWER = (
    "lower the counts or the per-actor asks (num_env_runners, num_cpus_per_env_runner, "
    "num_cpus_for_main_process, replay num_shards / num_cpus_per_shard, central_inference "
    "num_cpus / num_gpus)"
)


def _totals(bundles: list[dict[str, float]]) -> dict[str, float]:
    return {r: sum(bundle.get(r, 0.0) for bundle in bundles) for r in ("CPU", "GPU")}


def check_cluster_fits(algo_cls: type, config) -> None:
    """Raise ``ValueError`` if ``algo_cls.resource_request(config)`` cannot fit.

    Outside a placement group (``config.build_algo()``) the driver runs in the calling process
    and reserves nothing from Ray, so the first bundle (the main process) is not counted: only
    the actors' asks are (env runners, learner actors, replay shards, inference server).
    """
    actor_bundles = algo_cls.resource_request(config).bundles[1:]
    check_resources_fit(
        algo_cls.__name__,
        _totals(actor_bundles),
        how_to_lower=f"its actors are {config.num_env_runners} env runners x "
        f"{config.num_cpus_per_env_runner} CPUs, learner actors, replay shards and the inference "
        f"server: {_HOW_TO_LOWER}",
    )


def check_trial(algo_cls: type, config: Any, bundles: list[dict[str, float]]) -> None:
    """What Tune asks before it starts a trial, checked so that a sweep that cannot run fails
    with a clear error before any trial starts: Tune calls ``default_resource_request`` in the
    driver as it creates each trial, and an error there ends ``Tuner.fit()`` at once.

    - a key of a dict ``param_space`` the algorithm does not know (``update_from_dict`` would
      set it and the trial would silently ignore it): ``ValueError`` naming the key and the
      closest known ones;
    - the trial's config as the trial validates it (``AlgorithmConfig.validate``: every setting
      of the project's own sections says which field and value it refuses);
    - the trial's whole placement group (``bundles``: main process, env runners, learners,
      replay shards, inference server) against the cluster's total: a trial that asks more
      than the cluster has would wait forever (Tune only warns).
    """
    if isinstance(config, dict):
        _check_known_keys(algo_cls, config)
        config = algo_cls.get_default_config().update_from_dict(config)
    config.validate()
    check_resources_fit(
        f"a {algo_cls.__name__} trial",
        _totals(bundles),
        how_to_lower=f"its placement group is {bundles}: {_HOW_TO_LOWER}",
    )


class CheckedTrialResources:
    """Mixed into an algorithm class ahead of RLlib's: Tune's ``default_resource_request``
    returns the class's :meth:`resource_request` after :func:`check_trial`, so that a sweep
    that cannot run fails before any trial starts. A class that mixes it in defines
    ``resource_request(config)`` on top of :meth:`framework_resource_request` (RLlib's own)."""

    @classmethod
    def default_resource_request(cls, config):
        request = cls.resource_request(config)
        check_trial(cls, config, request.bundles)
        return request

    @classmethod
    def framework_resource_request(cls, config):
        """The placement group the RLlib algorithm below this mixin asks for."""
        return super().default_resource_request(config)


def _check_known_keys(algo_cls: type, config: dict) -> None:
    from ray.tune.result import TRIAL_INFO

    default = algo_cls.get_default_config()
    known = set(default.to_dict()) | {TRIAL_INFO, "multiagent", "callbacks_class"}
    for key in config:
        if key in known or default._translate_special_keys(key, warn_deprecated=False) in known:
            continue
        close = difflib.get_close_matches(key, sorted(known), n=3)
        hint = f"; did you mean {' or '.join(repr(k) for k in close)}?" if close else ""
        raise ValueError(
            f"{algo_cls.__name__} has no config key {key!r} (value {config[key]!r}): "
            f"keys are those of {type(default).__name__}().to_dict(){hint}"
        )
