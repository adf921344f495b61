"""One Tianshou VTrace actor's acting alone: milliseconds per vector step, its own sampling
against Tianshou's ``Collector``.

A :class:`tianshou_plugins.actor.VTraceActor` with the races' 64-64 MLP acts on plain
CartPole-v1 in this process (no Ray, no weight pulls), trajectories of 32 steps of every env,
two ways, interleaved within each round:

- ``sampled``: :meth:`VTraceActor.sample_rollout`, what the actors run (one forward per
  vector step, the log-probs from the same pass);
- ``collector``: Tianshou's ``Collector`` (:meth:`EnvActor.collect_rollout`, what SEED mode
  runs and local actors ran before), then the log-probs in a second batched pass, as the
  actors did then.

Each row is the median over ``--rounds`` of ``--trajectories`` trajectories; the table gives
the ratio collector / sampled::

    .venv/bin/python benchmarks/tianshou_actor_bench.py [--envs 1 8 16] [--stepping sequential]

Writes ``benchmarks/results/tianshou_actor_bench.{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
from results_files import write_results
from tianshou_race import cartpole
from tianshou_vtrace_vs_ppo import actor_critic

from tianshou_plugins.actor import EnvActor, VTraceActor, behaviour_log_probs
from tianshou_plugins.vector_envs import ENV_STEPPINGS

RESULTS = Path(__file__).resolve().parent / "results"
STEPS_PER_ENV = 32
WAYS = ("sampled", "collector")


class NoPulls:
    """A weights source that never has newer weights: acting alone is measured."""

    def pull_if_newer(self, version: int) -> None:
        return None


def collector_rollout(actor: VTraceActor) -> np.ndarray:
    """A trajectory through Tianshou's ``Collector`` and the log-probs' second pass."""
    columns, _ = EnvActor.collect_rollout(actor)
    return behaviour_log_probs(actor.policy, columns["obs"], columns["actions"])


def sampled_rollout(actor: VTraceActor) -> np.ndarray:
    return actor.sample_rollout()[1]["logp"]


def ms_per_vector_step(actor: VTraceActor, way: str, trajectories: int) -> float:
    rollout = sampled_rollout if way == "sampled" else collector_rollout
    start = time.perf_counter()
    for _ in range(trajectories):
        rollout(actor)
    return (time.perf_counter() - start) / (trajectories * STEPS_PER_ENV) * 1e3


def measure(envs: int, stepping: str, rounds: int, trajectories: int) -> dict:
    policy, _ = actor_critic(0)
    actor = VTraceActor(
        policy=policy,
        env_factory=cartpole,
        num_envs=envs,
        weights_server=NoPulls(),
        weight_sync_every_n_steps=10**9,
        steps_per_env=STEPS_PER_ENV,
        actor_index=0,
        seed=0,
        env_stepping=stepping,
    )
    try:
        for way in WAYS:  # warm-up
            ms_per_vector_step(actor, way, 3)
        times: dict[str, list[float]] = {way: [] for way in WAYS}
        for _ in range(rounds):
            for way in WAYS:
                times[way].append(ms_per_vector_step(actor, way, trajectories))
    finally:
        actor.envs.close()
    row = {"envs": envs, "stepping": stepping}
    for way in WAYS:
        row[f"{way}_ms"] = statistics.median(times[way])
        row[f"{way}_env_steps_per_s"] = envs / row[f"{way}_ms"] * 1e3
    row["ratio"] = row["collector_ms"] / row["sampled_ms"]
    return row


def markdown(report: dict) -> list[str]:
    lines = [
        "# One Tianshou VTrace actor: ms per vector step, its own sampling vs the Collector",
        "",
        f"{report['when']}, {report['cpus']} CPUs, {report['python']}; plain CartPole-v1, the "
        f"64-64 MLP, trajectories of {STEPS_PER_ENV} steps of every env, no Ray; median of "
        f"{report['rounds']} rounds of {report['trajectories']} trajectories, the two ways "
        "interleaved. `collector`: Tianshou's `Collector`, then the log-probs in a second "
        "pass (the actors before 2026-12-07, and SEED mode's acting); `sampled`: "
        "`VTraceActor.sample_rollout`.",
        "",
        "| envs | stepping | sampled ms | collector ms | collector / sampled | "
        "sampled env steps/s |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['envs']} | {row['stepping']} | {row['sampled_ms']:.3f} | "
            f"{row['collector_ms']:.3f} | {row['ratio']:.2f}x | "
            f"{row['sampled_env_steps_per_s']:,.0f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--stepping", nargs="+", choices=ENV_STEPPINGS, default=["sequential"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trajectories", type=int, default=20)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rows = [
        measure(envs, stepping, args.rounds, args.trajectories)
        for stepping in args.stepping
        for envs in args.envs
    ]
    report = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "rounds": args.rounds,
        "trajectories": args.trajectories,
        "rows": rows,
    }
    write_results(args.out / "tianshou_actor_bench", report, markdown(report))


if __name__ == "__main__":
    main()
