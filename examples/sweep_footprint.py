"""What the Tune sweep examples share: the line they print before they start (a trial's
footprint and how many trials the cluster runs at once), and the Tianshou sweeps' grid run
with its report and plot."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


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


def run_tianshou_sweep(
    train: Callable[[dict], None],
    resources: Any,
    grid: dict[str, Sequence[Any]],
    fixed: dict[str, Any],
    *,
    name: str,
    algorithm: str,
    args: Any,
    label: Callable[[dict], str],
    metric: str = "test/returns_stat/mean",
):
    """A grid sweep of a Tianshou function trainable: refuse a trial larger than the cluster,
    print the footprint, run every combination of ``grid`` (with ``fixed`` in each trial's
    config) inside ``resources`` as the Tune experiment ``name``, print the best trial and plot
    every trial's ``metric``. ``args`` carries ``storage_path``, ``max_failures`` and ``out``."""
    from ray import tune

    from rl_dist_ext.ray_actors import check_resources_fit

    check_resources_fit(  # a trial larger than the cluster would wait forever
        f"a Tianshou {algorithm} trial",
        {"CPU": sum(bundle.get("CPU", 0.0) for bundle in resources.bundles)},
        how_to_lower=f"its placement group is {resources.bundles}",
    )
    print_footprint(resources.bundles, math.prod(len(values) for values in grid.values()))
    tuner = tune.Tuner(
        tune.with_resources(train, resources),
        param_space={key: tune.grid_search(list(v)) for key, v in grid.items()} | fixed,
        tune_config=tune.TuneConfig(metric=metric, mode="max"),
        run_config=tune.RunConfig(
            name=name,
            storage_path=args.storage_path,
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            failure_config=tune.FailureConfig(max_failures=args.max_failures),
            verbose=1,
        ),
    )
    results = tuner.fit()
    best = results.get_best_result(scope="all")
    swept = {key: best.config[key] for key in grid}
    print(f"best trial: test return {best.metrics_dataframe[metric].max():.1f} with {swept}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "learning_curve.png"
    plot_test_curves(results, metric, path, f"Tianshou {algorithm} sweep (rl-dist-ext)", label)
    print(f"learning curves: {path}")
    return results
