"""What the races' RLlib arms share: the run of one arm (build, await start-up, train until the
target or the cap with greedy evaluations outside the clock) and the CartPole target; and the
fresh-Ray loop of the env-steps measurement (``gorila_adapters_env_steps.py``).

Imported by the benchmark scripts (their folder is on ``sys.path`` when they run).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

TARGET = 450.0  # greedy return (10 episodes) that ends a race
#: SlowCartPole has CartPole's dynamics: it is evaluated without the latency
EVAL_ENVS = {"SlowCartPole-v1": "CartPole-v1"}


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
    not counted. The curve, ``[trained seconds, env steps, return]``, holds each screen's
    return, or the 10 episodes' where they ran: its first point at the target is the time to
    target the harness reads.
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
            best = max(best, screen)
            value = screen
            if screen >= target:  # 10 episodes decide, and are the curve's point
                value = greedy_return(
                    module, eval_env, episodes=10, seed=7_000, max_steps=eval_max_steps
                )
            curve.append([round(trained, 2), env_steps, value])
            if value >= target:
                reached = trained
                break
    finally:
        algo.stop()
    return {
        "seconds_to_target": reached,
        "trained_seconds": round(trained, 2),  # as the curve rounds it
        "env_steps": env_steps,
        "iterations": iterations,
        "best_screen_return": best,
        "curve": curve,
    }


def learner_module(algo):
    """The driver's module with the learner's current weights (IMPALA-style algorithms never send
    weights to the driver's env runner, whose module ``get_module`` returns)."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    module = algo.get_module()
    weights = algo.learner_group.get_weights(module_ids=[DEFAULT_MODULE_ID])
    module.set_state(weights[DEFAULT_MODULE_ID])
    return module


def wait_for_state_server(algo) -> None:
    """Block until IMPALA's ``EnvRunnerStateServer`` actor is up (IMPALA, APPO and VTrace have one).

    It starts in a new worker process that is not awaited in ``setup``; the runners' first
    ``sample()`` waits for it instead (seconds on a busy 2-CPU machine). VTrace in SEED mode
    awaits its inference server in ``setup``, which hides that start-up: without this wait the
    others would pay it inside the clock and VTrace central would not.
    """
    import ray

    server = getattr(algo, "_env_runner_state_server", None)
    if server is not None:
        ray.get(server.get_version.remote(), timeout=120)


def rllib_race_run(
    config: Any,
    *,
    seed: int,
    cap_s: float,
    target: float,
    eval_every_s: float,
    eval_env: str | Callable[[], Any],
    greedy_module: Callable[[Any], Any] = lambda algo: algo.get_module(),
    screen_episodes: int | None = None,
    eval_max_steps: int | None = None,
) -> dict:
    """One run of an RLlib arm in a race's process (Ray is up): ``config`` built (the 2 ms
    ``SlowCartPole-v1`` registered), its start-up awaited, then :func:`rllib_time_to_target`.

    ``screen_episodes`` defaults to a 2-episode screen, or 10 episodes every time in a
    retention race (target past reach); ``eval_max_steps`` caps an evaluation episode."""
    import torch
    from ray.tune.registry import register_env
    from slow_env import slow_cartpole

    import rllib_plugins  # noqa: F401  (registers GorilaDQN and VTrace)

    torch.set_num_threads(1)
    register_env("SlowCartPole-v1", lambda _config: slow_cartpole())
    algo = config.build_algo()
    wait_for_state_server(algo)
    return rllib_time_to_target(
        algo,
        seed=seed,
        max_seconds=cap_s,
        eval_every_s=eval_every_s,
        greedy_module=greedy_module,
        target=target,
        eval_env=eval_env,
        # a run past the target (a retention race) is evaluated on 10 episodes every time
        screen_episodes=(
            screen_episodes if screen_episodes is not None else 2 if math.isfinite(target) else 10
        ),
        eval_max_steps=eval_max_steps,
    )
