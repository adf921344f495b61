"""Env steps to a greedy return of 450 on CartPole-v1: GorilaDQN through RLlib vs through Tianshou.

The two adapters share the core loss, n-step folding, priorities and replay; with matched
settings they should need about as many env steps. Both run here with the same settings:

- 4 actors (RLlib env runners / Tianshou Ray actors) x 4 envs, Ape-X epsilons (0.4, alpha 7),
  n-step 3, gamma 0.99, weights pulled every 400 env steps;
- a [128, 128] ReLU MLP Q-network (no dueling), Adam lr 1e-3, Huber loss, double-Q, hard
  target update every 250 gradient steps, batch 128;
- 2 replay shards, 50k rows, alpha 0.6, beta 0.4, 4 batches per replay round trip, learning
  from 1,000 rows;
- the same replay ratio: 32 sampled rows per inserted row (Tianshou's trainer: 0.25 gradient
  steps of 128 per env step; RLlib: the replay's rate limiter at ``samples_per_insert=32``).

Each run is tested every 5,000 env steps with 10 greedy episodes and stops at the first test
>= 450 or at ``--max-env-steps``. Env steps are what is compared (not time: the RLlib learner
and runners carry more per-step overhead). Writes ``benchmarks/results/
gorila_adapters_env_steps.{json,md}``::

    .venv/bin/python benchmarks/gorila_adapters_env_steps.py [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from race import TARGET, race_each_in_fresh_ray

RESULTS = Path(__file__).parent / "results"
TEST_EVERY = 5_000
TEST_EPISODES = 10
SETTINGS = {
    "actors": 4,
    "envs_per_actor": 4,
    "hidden": [128, 128],
    "lr": 1e-3,
    "batch_size": 128,
    "target_update": 250,
    "samples_per_insert": 32.0,
    "weight_sync_every": 400,
    "capacity": 50_000,
    "batches_per_request": 4,
}
TARGET_RATIO = 1.5


def rllib_run(seed: int, max_env_steps: int, s: dict, test_every: int, test_episodes: int) -> dict:
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    from rllib_plugins import GorilaDQNConfig
    from rllib_plugins.evaluation import greedy_return

    config = (
        GorilaDQNConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=s["actors"], num_envs_per_env_runner=s["envs_per_actor"])
        .learners(num_learners=0)
        .training(
            lr=s["lr"],
            n_step=3,
            gamma=0.99,
            train_batch_size_per_learner=s["batch_size"],
            target_update_every_n_updates=s["target_update"],
            weight_sync_every_n_steps=s["weight_sync_every"],
            dueling=False,
            double_q=True,
            td_error_loss_fn="huber",
        )
        .rl_module(
            model_config=DefaultModelConfig(
                fcnet_hiddens=s["hidden"], fcnet_activation="relu", head_fcnet_hiddens=[]
            )
        )
        .replay(
            num_shards=2,
            capacity=s["capacity"],
            min_size_to_sample=1_000,
            samples_per_insert=s["samples_per_insert"],
            batches_per_request=s["batches_per_request"],
        )
        .debugging(seed=seed)
    )
    algo = config.build_algo()
    tests: list[tuple[int, float]] = []
    env_steps, next_test, reached = 0, test_every, None
    started = time.perf_counter()
    try:
        while env_steps < max_env_steps and reached is None:
            result = algo.train()
            env_steps = int(result["env_runners"].get("num_env_steps_sampled_lifetime", 0))
            if env_steps >= next_test:
                next_test += test_every
                score = greedy_return(
                    algo.get_module(), "CartPole-v1", episodes=test_episodes, seed=50_000 + seed
                )
                tests.append((env_steps, round(score, 1)))
                if score >= TARGET:
                    reached = env_steps
        spi = result["gorila"]["replay_samples_per_insert"]
    finally:
        algo.stop()
    return {
        "env_steps_to_target": reached,
        "env_steps": env_steps,
        "seconds": time.perf_counter() - started,
        "samples_per_insert": spi,
        "tests": tests,
    }


def tianshou_run(
    seed: int, max_env_steps: int, s: dict, test_every: int, test_episodes: int
) -> dict:
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou_gorila_vs_dqn import (
        RunClock,
        cartpole,
        make_policy,
        test_collector,
        train_until_target,
    )

    from tianshou_plugins import DistributedPrioritizedReplayBuffer, GorilaCollector, GorilaDQN

    buffer = DistributedPrioritizedReplayBuffer(
        s["capacity"],
        num_shards=2,
        min_size_to_sample=1_000,
        batches_per_request=s["batches_per_request"],
        seed=seed,
    )
    collector = test = None
    tests: list[tuple[int, float]] = []
    started = time.perf_counter()
    try:
        algorithm = GorilaDQN(
            policy=make_policy(seed),  # [128, 128] ReLU MLP
            optim=AdamOptimizerFactory(lr=s["lr"]),
            gamma=0.99,
            n_step_return_horizon=3,
            target_update_freq=s["target_update"],
            huber_loss_delta=1.0,
        )
        collector = GorilaCollector(
            algorithm,
            env_factory=cartpole,
            buffer=buffer,
            num_actors=s["actors"],
            envs_per_actor=s["envs_per_actor"],
            weight_sync_every_n_steps=s["weight_sync_every"],
            seed=seed,
        )
        test = test_collector(algorithm.policy, seed)
        clock = RunClock(max_seconds=float("inf"))
        original_stop = clock.stop_fn

        def stop_fn(best_return: float) -> bool:
            tests.append((clock.env_steps, round(float(best_return), 1)))
            return original_stop(best_return) or clock.env_steps >= max_env_steps

        clock.stop_fn = stop_fn
        run = train_until_target(
            algorithm,
            collector,
            test,
            clock,
            SimpleNamespace(epoch_steps=test_every),
            collection_step_num_env_steps=256,
            update_step_num_gradient_steps_per_sample=s["samples_per_insert"] / s["batch_size"],
            batch_size=s["batch_size"],
        )
        spi = buffer.stats(wait=True)["samples_per_insert"]
    finally:
        if test is not None:
            test.close()
        if collector is not None:
            collector.close()
        buffer.close()
    reached = run["env_steps"] if run["seconds_to_target"] is not None else None
    return {
        "env_steps_to_target": reached,
        "env_steps": run["env_steps"],
        "seconds": time.perf_counter() - started,
        "samples_per_insert": spi,
        "tests": tests[1:],  # the first is the trainer's test of the untrained policy
    }


def median_steps(runs: list[dict], cap: int) -> float:
    """Median env steps to the target, counting a run that missed it as the cap."""
    return statistics.median(r["env_steps_to_target"] or cap for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-env-steps", type=int, default=150_000)
    parser.add_argument("--actors", type=int, default=SETTINGS["actors"])
    parser.add_argument("--envs-per-actor", type=int, default=SETTINGS["envs_per_actor"])
    parser.add_argument("--test-every", type=int, default=TEST_EVERY)
    parser.add_argument("--test-episodes", type=int, default=TEST_EPISODES)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    settings = SETTINGS | {"actors": args.actors, "envs_per_actor": args.envs_per_actor}

    adapters = {"RLlib": rllib_run, "Tianshou": tianshou_run}
    runs = race_each_in_fresh_ray(
        ["CartPole-v1"],
        args.seeds,
        list(adapters),
        lambda name, _env, seed: adapters[name](
            seed, args.max_env_steps, settings, args.test_every, args.test_episodes
        ),
    )["CartPole-v1"]

    rllib = median_steps(runs["RLlib"], args.max_env_steps)
    tianshou = median_steps(runs["Tianshou"], args.max_env_steps)
    result = {
        "benchmark": "gorila_adapters_env_steps",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "params": vars(args) | {"out": str(args.out), "settings": settings, "target": TARGET},
        "runs": runs,
        "summary": {
            "rllib_median_env_steps": rllib,
            "tianshou_median_env_steps": tianshou,
            "ratio": rllib / tianshou,
            "target_ratio": TARGET_RATIO,
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gorila_adapters_env_steps.json").write_text(json.dumps(result, indent=2) + "\n")

    def fmt(steps: int | None) -> str:
        return f"not reached ({args.max_env_steps:,})" if steps is None else f"{steps:,}"

    lines = [
        "# GorilaDQN, RLlib adapter vs Tianshou adapter: env steps to greedy return >= 450",
        "",
        f"CartPole-v1, matched settings (see the script's docstring: {settings['actors']} actors "
        f"x {settings['envs_per_actor']} envs, [128, 128] MLP, lr {settings['lr']}, batch "
        f"{settings['batch_size']}, {settings['samples_per_insert']:g} samples per insert), "
        f"tests of {args.test_episodes} greedy episodes every {args.test_every:,} env steps, seeds "
        f"{args.seeds}, {result['machine']['cpus']} CPUs, one run ({result['date']} UTC).",
        "",
        "| seed | RLlib env steps | samples/insert | Tianshou env steps | samples/insert |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r, t in zip(runs["RLlib"], runs["Tianshou"], strict=True):
        lines.append(
            f"| {r['seed']} | {fmt(r['env_steps_to_target'])} | {r['samples_per_insert']:.1f} | "
            f"{fmt(t['env_steps_to_target'])} | {t['samples_per_insert']:.1f} |"
        )
    lines += [
        "",
        f"Median env steps: RLlib {rllib:,.0f}, Tianshou {tianshou:,.0f}; ratio "
        f"{rllib / tianshou:.2f} (target <= {TARGET_RATIO}).",
    ]
    (args.out / "gorila_adapters_env_steps.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
