"""What the wall-clock-to-target benchmarks share: the RLlib race loop and the summaries.

Imported by the benchmark scripts (their folder is on ``sys.path`` when they run).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

TARGET = 450.0  # greedy return (10 episodes) that ends a race


def race_each_in_fresh_ray(
    envs: list[str],
    seeds: list[int],
    algos: list[str],
    run_one: Callable[[str, str, int], dict],
) -> dict[str, dict[str, list[dict]]]:
    """``run_one(algo, env, seed)`` for every env, seed and algo (algos alternating within a
    seed), each in a fresh ``ray.init(num_cpus=2)``; env -> algo -> runs (with ``seed``)."""
    import ray

    width = max(len(name) for name in algos)
    runs: dict[str, dict[str, list[dict]]] = {}
    for env in envs:
        runs[env] = {name: [] for name in algos}
        for seed in seeds:
            for algo_name in algos:
                ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
                try:
                    run = run_one(algo_name, env, seed)
                finally:
                    ray.shutdown()
                run["seed"] = seed
                runs[env][algo_name].append(run)
                print(f"{env:16s} {algo_name:{width}s} seed {seed}: {run}", flush=True)
    return runs


def rllib_time_to_target(
    algo: Any,
    *,
    seed: int,
    max_seconds: float,
    eval_every_s: float,
    greedy_module: Callable[[Any], Any],
    target: float = TARGET,
    eval_env: str | Callable[[], Any] = "CartPole-v1",
    screen_episodes: int = 2,
    eval_max_steps: int | None = None,
) -> dict:
    """Train ``algo`` until its greedy policy averages ``target`` or ``max_seconds`` of training.

    Every ``eval_every_s`` seconds of training, a ``screen_episodes`` greedy screen runs on
    ``eval_env`` (an env id or a maker); when it passes, 10 episodes decide. Evaluation time is
    not counted. The screens make the curve: ``[trained seconds, env steps, return]``.
    ``algo`` is stopped at the end.
    """
    from rllib_plugins.evaluation import greedy_return

    trained = last_eval = 0.0
    env_steps = iterations = 0
    reached = None
    best = 0.0
    curve: list[list[float]] = []
    try:
        while trained < max_seconds:
            start = time.perf_counter()
            result = algo.train()
            trained += time.perf_counter() - start
            iterations += 1
            runners = result.get("env_runners", {})
            env_steps = int(runners.get("num_env_steps_sampled_lifetime", env_steps))
            if trained - last_eval < eval_every_s:
                continue
            last_eval = trained
            module = greedy_module(algo)
            # Evaluation needs no latency: SlowCartPole has CartPole's dynamics.
            screen = greedy_return(
                module,
                eval_env,
                episodes=screen_episodes,
                seed=1_000 * seed,
                max_steps=eval_max_steps,
            )
            curve.append([round(trained, 2), env_steps, screen])
            best = max(best, screen)
            if (
                screen >= target
                and greedy_return(
                    module, eval_env, episodes=10, seed=7_000, max_steps=eval_max_steps
                )
                >= target
            ):
                reached = trained
                break
    finally:
        algo.stop()
    return {
        "seconds_to_target": reached,
        "trained_seconds": trained,
        "env_steps": env_steps,
        "iterations": iterations,
        "best_screen_return": best,
        "curve": curve,
    }


def median_or_none(values: list[float | None]) -> float | None:
    """Median, counting runs that never reached the target as +inf (None if most did not)."""
    finite = sorted(float("inf") if v is None else v for v in values)
    med = statistics.median(finite)
    return None if med == float("inf") else med


def fmt_seconds(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.0f} s"
