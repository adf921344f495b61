"""Wall-clock to a greedy return of 450 on CartPole: Tianshou GorilaDQN vs Tianshou's own DQN.

Both algorithms are trained by Tianshou's ``OffPolicyTrainer`` (``algorithm.run_training``) and
tested the same way: 10 greedy episodes on plain CartPole-v1 every ``--epoch-steps`` env steps.
The clock runs from the ``run_training`` call (test steps included) until a test averages
>= 450, or until ``--max-seconds`` (a ``training_fn`` stops the run at the next training step).

Cases:

- CartPole-v1: GorilaDQN (``--actors`` Ray actors x ``--envs-per-actor`` envs, learner in this
  process) vs DQN over 8 ``DummyVectorEnv`` envs (Tianshou's CartPole DQN settings: Net
  [128, 128], lr 1e-3, n-step 3, target update every 320 steps, 20k-row replay, epsilon 0.1,
  80 env steps per collect, 0.1 gradient steps per env step, batch 64). Target ratio <= 1.0.
- SlowCartPole-v1 (2 ms of latency per step, a stand-in for a slow simulator): GorilaDQN with
  more actors of fewer envs (each actor steps its envs one after the other) vs the same DQN over
  8 ``SubprocVectorEnv`` envs. Target ratio <= 0.3.
- Collection throughput on SlowCartPole-v1 with 1, 2, 4, 8 actors (``GorilaCollector`` and its
  replay, no learner): env steps/s and its ratio to N x the 1-actor rate. Target >= 0.8.

Seeds run one after the other, GorilaDQN and DQN alternating. Each GorilaDQN run gets a fresh
``ray.init(num_cpus=2)``; DQN does not use Ray and runs without it.

Writes ``benchmarks/results/tianshou_gorila_vs_dqn.{json,md}``::

    .venv/bin/python benchmarks/tianshou_gorila_vs_dqn.py [--seeds 0 1 2] [--max-seconds 300]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import ray
import torch
from race import TARGET, median_or_none
from race import fmt_seconds as fmt
from slow_env import slow_cartpole
from tianshou.algorithm import DQN
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Collector, VectorReplayBuffer
from tianshou.env import DummyVectorEnv, SubprocVectorEnv
from tianshou.utils.net.common import Net
from tianshou_race import RunClock, test_collector, train_until_target

from tianshou_plugins import DistributedPrioritizedReplayBuffer, GorilaCollector, GorilaDQN

RESULTS = Path(__file__).parent / "results"
ENVS = ("CartPole-v1", "SlowCartPole-v1")
TARGETS = {"CartPole-v1": 1.0, "SlowCartPole-v1": 0.3, "throughput_efficiency": 0.8}
ACTOR_TIMEOUT_S = 300.0  # actor start-up (not timed) is slow on a busy 2-core machine


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


ENV_FACTORIES: dict[str, Callable[[], gym.Env]] = {
    "CartPole-v1": cartpole,
    "SlowCartPole-v1": slow_cartpole,
}


def make_policy(seed: int, eps_training: float = 0.0) -> DiscreteQLearningPolicy:
    torch.manual_seed(seed)
    np.random.seed(seed)
    env = cartpole()
    net = Net(
        state_shape=env.observation_space.shape,
        action_shape=env.action_space.n,
        hidden_sizes=[128, 128],
    )
    policy = DiscreteQLearningPolicy(
        model=net, action_space=env.action_space, eps_training=eps_training, eps_inference=0.0
    )
    env.close()
    return policy


def gorila_run(env: str, seed: int, args) -> dict:
    actors, envs_per_actor = (
        (args.slow_actors, args.slow_envs_per_actor)
        if env == "SlowCartPole-v1"
        else (args.actors, args.envs_per_actor)
    )
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    collector = test = None
    buffer = DistributedPrioritizedReplayBuffer(
        50_000,
        num_shards=args.shards,
        num_cpus_per_shard=args.cpus_per_shard,
        min_size_to_sample=1_000,
        batches_per_request=args.gorila_batches_per_request,
        seed=seed,
    )
    try:
        algorithm = GorilaDQN(
            policy=make_policy(seed),
            optim=AdamOptimizerFactory(lr=args.gorila_lr),
            gamma=0.99,
            n_step_return_horizon=3,
            target_update_freq=args.gorila_target_update,
            huber_loss_delta=args.gorila_huber_delta,
        )
        collector = GorilaCollector(
            algorithm,
            env_factory=ENV_FACTORIES[env],
            buffer=buffer,
            num_actors=actors,
            envs_per_actor=envs_per_actor,
            weight_sync_every_n_steps=args.weight_sync_every,
            num_cpus_per_actor=args.cpus_per_actor,
            seed=seed,
            timeout_s=ACTOR_TIMEOUT_S,
        )
        test = test_collector(algorithm.policy, seed)
        run = train_until_target(
            algorithm,
            collector,
            test,
            RunClock(args.max_seconds),
            args,
            collection_step_num_env_steps=args.gorila_collect_steps,
            update_step_num_gradient_steps_per_sample=args.gorila_updates_per_step,
            batch_size=args.gorila_batch_size,
        )
        run["gradient_steps"] = algorithm.num_gradient_updates
        run["actors"] = f"{actors} x {envs_per_actor} envs"
        return run
    finally:
        if test is not None:
            test.close()
        if collector is not None:
            collector.close()
        buffer.close()
        ray.shutdown()


def dqn_run(env: str, seed: int, args) -> dict:
    policy = make_policy(seed, eps_training=0.1)
    algorithm = DQN(
        policy=policy,
        optim=AdamOptimizerFactory(lr=1e-3),
        gamma=0.99,
        n_step_return_horizon=3,
        target_update_freq=320,
    )
    vector_env = SubprocVectorEnv if env == "SlowCartPole-v1" else DummyVectorEnv
    train_envs = vector_env([ENV_FACTORIES[env]] * 8)
    train_envs.seed([seed * 100 + i for i in range(8)])
    collector = Collector(policy, train_envs, VectorReplayBuffer(20_000, 8), exploration_noise=True)
    test = test_collector(policy, seed)
    try:
        run = train_until_target(
            algorithm,
            collector,
            test,
            RunClock(args.max_seconds),
            args,
            collection_step_num_env_steps=80,
            update_step_num_gradient_steps_per_sample=0.1,
            batch_size=64,
        )
        run["actors"] = f"8 {vector_env.__name__} envs"
        return run
    finally:
        test.close()
        collector.close()


def collection_throughput(actor_counts: list[int], args) -> list[dict]:
    """Env steps/s of a ``GorilaCollector`` on SlowCartPole (no learner), per actor count."""
    if not actor_counts:
        return []
    rows = []
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        for num_actors in actor_counts:
            buffer = DistributedPrioritizedReplayBuffer(
                50_000,
                num_shards=args.shards,
                num_cpus_per_shard=args.cpus_per_shard,
                min_size_to_sample=256,
                seed=0,
            )
            collector = None
            try:
                collector = GorilaCollector(
                    GorilaDQN(
                        policy=make_policy(0),
                        optim=AdamOptimizerFactory(lr=args.gorila_lr),
                        gamma=0.99,
                        n_step_return_horizon=3,
                    ),
                    env_factory=slow_cartpole,
                    buffer=buffer,
                    num_actors=num_actors,
                    envs_per_actor=args.throughput_envs_per_actor,
                    num_cpus_per_actor=args.cpus_per_actor,
                    seed=0,
                    timeout_s=ACTOR_TIMEOUT_S,
                )
                # collect() returns every rollout finished since its last call (waiting for at
                # least one rollout per actor); the actors keep stepping between calls
                chunk = collector.env_num * 16  # steps_per_env=16: one rollout of each actor
                warm_up_end = time.perf_counter() + args.throughput_warmup_seconds
                while time.perf_counter() < warm_up_end:
                    collector.collect(n_step=chunk)
                steps, start = 0, time.perf_counter()
                while time.perf_counter() - start < args.throughput_seconds:
                    steps += collector.collect(n_step=chunk).n_collected_steps
                seconds = time.perf_counter() - start
            finally:
                if collector is not None:
                    collector.close()
                buffer.close()
            rows.append(
                {
                    "num_actors": num_actors,
                    "envs_per_actor": args.throughput_envs_per_actor,
                    "env_steps": steps,
                    "seconds": seconds,
                    "env_steps_per_s": steps / seconds,
                }
            )
            print(f"throughput {num_actors} actors: {rows[-1]}", flush=True)
    finally:
        ray.shutdown()
    single = next((r["env_steps_per_s"] for r in rows if r["num_actors"] == 1), None)
    for row in rows:
        row["efficiency"] = (
            None if single is None else row["env_steps_per_s"] / (row["num_actors"] * single)
        )
    return rows


def summarise(runs: dict[str, dict[str, list[dict]]], max_seconds: float) -> dict:
    summary = {}
    for env, by_algo in runs.items():
        gorila = median_or_none([r["seconds_to_target"] for r in by_algo["GorilaDQN"]])
        dqn = median_or_none([r["seconds_to_target"] for r in by_algo["DQN"]])
        if gorila is not None and dqn is not None:
            ratio, bound = gorila / dqn, "="
        elif gorila is not None:  # DQN's median is past the cap: the ratio is below this
            ratio, bound = gorila / max_seconds, "<"
        elif dqn is not None:  # GorilaDQN's median is past the cap: the ratio is above this
            ratio, bound = max_seconds / dqn, ">"
        else:
            ratio, bound = None, "n/a"
        summary[env] = {
            "gorila_median_s": gorila,
            "dqn_median_s": dqn,
            "gorila_median_env_steps": statistics.median(
                r["env_steps"] for r in by_algo["GorilaDQN"]
            ),
            "dqn_median_env_steps": statistics.median(r["env_steps"] for r in by_algo["DQN"]),
            "ratio": ratio,
            "ratio_bound": bound,
            "target": TARGETS[env],
        }
    return summary


def markdown(result: dict) -> str:
    params, runs = result["params"], result["runs"]

    lines = [
        "# Tianshou GorilaDQN vs Tianshou DQN: wall-clock to greedy return >= 450 (10 episodes)",
        "",
        f"Seeds {params['seeds']}, cap {params['max_seconds']:.0f} s per run, clock from "
        f"`run_training` (test steps included), tests every {params['epoch_steps']:,} env steps, "
        f"{result['machine']['cpus']} CPUs, one run ({result['date']} UTC). GorilaDQN: "
        f"{params['actors']} actors x {params['envs_per_actor']} envs on CartPole-v1, "
        f"{params['slow_actors']} x {params['slow_envs_per_actor']} on SlowCartPole-v1 "
        f"(2 ms per env step), learner in the driver, Ray with 2 CPUs; DQN: 8 envs "
        "(DummyVectorEnv; SubprocVectorEnv on SlowCartPole-v1).",
        "",
        f"GorilaDQN learner: {params['gorila_updates_per_step']} gradient steps per env step, "
        f"batch {params['gorila_batch_size']}, lr {params['gorila_lr']}, target update every "
        f"{params['gorila_target_update']} steps, Huber delta {params['gorila_huber_delta']}, "
        f"{params.get('gorila_batches_per_request', 1)} batches per replay round trip "
        "(priority updates sent as often).",
    ]
    if runs:
        lines += [
            "",
            "| env | seed | GorilaDQN | env steps | Tianshou DQN | env steps |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for env, by_algo in runs.items():
            for g, d in zip(by_algo["GorilaDQN"], by_algo["DQN"], strict=True):
                lines.append(
                    f"| {env} | {g['seed']} | {fmt(g['seconds_to_target'])} | "
                    f"{g['env_steps']:,} | {fmt(d['seconds_to_target'])} | {d['env_steps']:,} |"
                )
        lines += [
            "",
            "| env | GorilaDQN median | Tianshou DQN median | ratio | target |",
            "|---|---:|---:|---:|---:|",
        ]
        for env, s in result["summary"].items():
            ratio = "n/a" if s["ratio"] is None else f"{s['ratio_bound']} {s['ratio']:.2f}"
            lines.append(
                f"| {env} | {fmt(s['gorila_median_s'])} | {fmt(s['dqn_median_s'])} | {ratio} | "
                f"<= {s['target']} |"
            )
        lines += [
            "",
            "A median counts runs that never reached 450 as infinitely slow; when one median is "
            "'not reached', the ratio is bounded through the cap.",
        ]
    if result["throughput"]:
        lines += [
            "",
            f"Collection throughput on SlowCartPole-v1 ({params['throughput_envs_per_actor']} "
            f"envs per actor, no learner, {params['throughput_seconds']:.0f} s after "
            f"{params['throughput_warmup_seconds']:.0f} s of warm-up); efficiency is the rate "
            f"over N x the 1-actor rate (target >= {TARGETS['throughput_efficiency']}).",
            "",
            "| actors | env steps/s | efficiency |",
            "|---:|---:|---:|",
        ]
        for row in result["throughput"]:
            eff = "n/a" if row["efficiency"] is None else f"{row['efficiency']:.2f}"
            lines.append(f"| {row['num_actors']} | {row['env_steps_per_s']:,.0f} | {eff} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--envs", nargs="*", choices=ENVS, default=list(ENVS))
    parser.add_argument("--max-seconds", type=float, default=300.0)
    parser.add_argument("--epoch-steps", type=int, default=5_000, help="env steps per test")
    gorila = parser.add_argument_group("GorilaDQN")
    gorila.add_argument("--actors", type=int, default=4, help="CartPole-v1")
    gorila.add_argument("--envs-per-actor", type=int, default=4, help="CartPole-v1")
    gorila.add_argument("--slow-actors", type=int, default=8, help="SlowCartPole-v1")
    gorila.add_argument("--slow-envs-per-actor", type=int, default=2, help="SlowCartPole-v1")
    gorila.add_argument("--shards", type=int, default=2)
    gorila.add_argument("--cpus-per-actor", type=float, default=0.1, help="Ray CPUs reserved")
    gorila.add_argument("--cpus-per-shard", type=float, default=0.05, help="Ray CPUs reserved")
    gorila.add_argument("--weight-sync-every", type=int, default=400, help="actor env steps")
    gorila.add_argument("--gorila-collect-steps", type=int, default=256)
    gorila.add_argument("--gorila-updates-per-step", type=float, default=0.25)
    gorila.add_argument("--gorila-batch-size", type=int, default=128)
    gorila.add_argument("--gorila-target-update", type=int, default=250)
    gorila.add_argument("--gorila-lr", type=float, default=1e-3)
    gorila.add_argument(
        "--gorila-batches-per-request",
        type=int,
        default=4,
        help="learner batches per replay round trip (priority updates sent as often)",
    )
    gorila.add_argument(
        "--gorila-huber-delta",
        type=lambda v: None if v.lower() == "none" else float(v),
        default=1.0,
        help="Huber delta; 'none' for the squared loss",
    )
    throughput = parser.add_argument_group("collection throughput")
    throughput.add_argument("--throughput-actors", type=int, nargs="*", default=[1, 2, 4, 8])
    throughput.add_argument("--throughput-envs-per-actor", type=int, default=2)
    throughput.add_argument("--throughput-seconds", type=float, default=15.0)
    throughput.add_argument("--throughput-warmup-seconds", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)

    runs: dict[str, dict[str, list[dict]]] = {}
    for env in args.envs:
        runs[env] = {"GorilaDQN": [], "DQN": []}
        for seed in args.seeds:
            for algo_name, run_fn in (("GorilaDQN", gorila_run), ("DQN", dqn_run)):
                run = run_fn(env, seed, args)
                run["seed"] = seed
                runs[env][algo_name].append(run)
                print(f"{env:16s} {algo_name:9s} seed {seed}: {run}", flush=True)
    throughput_rows = collection_throughput(args.throughput_actors, args)

    result = {
        "benchmark": "tianshou_gorila_vs_dqn",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "params": vars(args) | {"out": str(args.out), "target_return": TARGET},
        "runs": runs,
        "summary": summarise(runs, args.max_seconds),
        "throughput": throughput_rows,
        "targets": TARGETS,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tianshou_gorila_vs_dqn.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    (args.out / "tianshou_gorila_vs_dqn.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
