"""What the Tune sweep examples share: the line they print before they start (a trial's
footprint and how many trials the cluster runs at once) and the Tianshou sweeps' plot."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path


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


def plot_test_curves(
    results, metric: str, path: Path, title: str, label: Callable[[dict], str]
) -> None:
    """Every trial's ``metric`` (one point per reported epoch) against its env steps, labelled
    ``label(trial config)``, as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for result in results:
        frame = result.metrics_dataframe
        ax.plot(frame["env_step"], frame[metric], marker="o", label=label(result.config))
    ax.set_xlabel("env steps")
    ax.set_ylabel("greedy test return (5 episodes)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
