"""What the Tune sweep examples print before they start: a trial's footprint and how many
trials the cluster runs at once."""

from __future__ import annotations

import math


def print_footprint(bundles: list[dict[str, float]], trials: int) -> None:
    """``bundles``: one trial's placement group; ``trials``: how many the sweep runs."""
    import ray

    trial_cpus = sum(bundle.get("CPU", 0.0) for bundle in bundles)
    cluster_cpus = ray.cluster_resources().get("CPU", 0.0)
    at_once = min(trials, math.floor(cluster_cpus / trial_cpus + 1e-9))
    print(
        f"{trials} trials; each asks {trial_cpus:g} CPUs ({bundles}), so {at_once} run at once "
        f"on this cluster's {cluster_cpus:g} CPUs"
    )
