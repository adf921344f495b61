"""Endurance: GorilaDQN (RLlib) and GorilaDQN (Tianshou) on CartPole for a long run each, with
memory, object store and throughput sampled every ``--sample-every-s`` seconds.

Each framework runs in a fresh ``ray.init(num_cpus=2)``: 2 actors x 4 envs, 2 replay shards
holding ``--capacity`` rows in all (full after the first minute or so, then overwritten in
place for the rest of the run), 16 sampled rows per inserted row (RLlib: the rate limiter;
Tianshou: 0.125 gradient steps of 128 per env step). Every sample records the RSS of the driver
and of every actor (env runners / actors, replay shards, weights server; found by pid, read
from ``/proc`` on this Linux machine), Ray's object store use (plasma bytes, from the raylets'
memory summary), replay size and bytes, and env steps/s since the previous sample.

After ``--warmup-min`` minutes each series gets a least-squares slope, reported per hour next
to its noise (the residuals' standard deviation); a series counts as flat when the growth its
slope predicts over one hour is below ``max(3 x noise, 2% of its mean)``. Writes
``benchmarks/results/soak.{json,md,png}``::

    .venv/bin/python benchmarks/soak.py [--minutes 30] [--frameworks rllib tianshou]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

RESULTS = Path(__file__).parent / "results"
MB = 2**20


# ---- what one sample reads --------------------------------------------------------------------
def actor_pid(handle) -> int:
    import ray

    return ray.get(handle.__ray_call__.remote(lambda self: os.getpid()), timeout=60)


def rss_mb(pid: int) -> float | None:
    """Resident set size of process ``pid`` (Linux ``/proc``); None if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:  # an actor that restarted: its new pid is looked up again
        return None
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, flags=re.MULTILINE)
    return int(match.group(1)) / 1024 if match else None


def object_store_mb() -> float:
    """Plasma bytes in use, as ``ray memory --stats-only`` reports them."""
    import ray
    from ray._private.internal_api import memory_summary

    summary = memory_summary(address=ray.get_runtime_context().gcs_address, stats_only=True)
    match = re.search(r"Plasma memory usage (\d+) MiB", summary)
    return float(match.group(1)) if match else float("nan")


class Sampler:
    """Samples every ``every_s`` seconds: RSS per named process, object store, replay, speed."""

    def __init__(self, every_s: float, pids: Callable[[], dict[str, int]]) -> None:
        self.every_s = every_s
        self._pids = pids
        self._known = pids()
        self.samples: list[dict] = []
        self._started = time.monotonic()
        self._last = (-float("inf"), 0)

    def due(self) -> bool:
        return time.monotonic() - self._last[0] >= self.every_s

    def take(self, env_steps: int, replay_stats: dict) -> None:
        now = time.monotonic()
        rss = {name: rss_mb(pid) for name, pid in self._known.items()}
        if any(v is None for v in rss.values()):  # a process restarted: look the pids up again
            self._known = self._pids()
            rss = {name: rss_mb(pid) for name, pid in self._known.items()}
        last_time, last_steps = self._last
        self.samples.append(
            {
                "t_min": (now - self._started) / 60,
                "env_steps": env_steps,
                "env_steps_per_s": (env_steps - last_steps) / (now - last_time)
                if self.samples
                else float("nan"),
                "driver_rss_mb": rss_mb(os.getpid()),
                "actors_rss_mb": {k: v for k, v in rss.items() if v is not None},
                "object_store_mb": object_store_mb(),
                "replay_size": replay_stats["size"],
                "replay_bytes_mb": replay_stats["storage_bytes"] / MB,
            }
        )
        self._last = (now, env_steps)
        s = self.samples[-1]
        print(
            f"  {s['t_min']:5.1f} min  {env_steps:>9,} env steps  "
            f"{s['env_steps_per_s']:7.0f}/s  driver {s['driver_rss_mb']:.0f} MB  actors "
            f"{sum(s['actors_rss_mb'].values()):.0f} MB  store {s['object_store_mb']:.0f} MiB  "
            f"replay {s['replay_size']:,}",
            flush=True,
        )


# ---- the two runs ---------------------------------------------------------------------------
def rllib_soak(args: argparse.Namespace) -> list[dict]:
    from rllib_plugins import GorilaDQNConfig

    config = (
        GorilaDQNConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=2, num_envs_per_env_runner=4)
        .learners(num_learners=0)
        .replay(num_shards=2, capacity=args.capacity, samples_per_insert=16)
        .debugging(seed=0)
    )
    algo = config.build_algo()

    def pids() -> dict[str, int]:
        import ray

        runners = algo.env_runner_group.foreach_env_runner(
            lambda r: (r.worker_index, os.getpid()), local_env_runner=False
        )
        out = {f"env_runner_{i}": pid for i, pid in runners}
        out |= {f"shard_{i}": actor_pid(h) for i, h in enumerate(algo.replay().handles)}
        out["weights_server"] = actor_pid(algo._param_server.handle)
        del ray
        return out

    sampler = Sampler(args.sample_every_s, pids)
    ends = time.monotonic() + 60 * args.minutes
    try:
        while time.monotonic() < ends:
            result = algo.train()
            if sampler.due():
                steps = int(result["env_runners"].get("num_env_steps_sampled_lifetime", 0))
                sampler.take(steps, algo.replay().stats(wait=True))
    finally:
        algo.stop()
    return sampler.samples


def tianshou_soak(args: argparse.Namespace) -> list[dict]:
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Collector
    from tianshou.env import DummyVectorEnv
    from tianshou.trainer import OffPolicyTrainerParams
    from tianshou_gorila_vs_dqn import cartpole, make_policy

    from tianshou_plugins import DistributedPrioritizedReplayBuffer, GorilaCollector, GorilaDQN

    policy = make_policy(seed=0)  # [128, 128] ReLU MLP
    algorithm = GorilaDQN(
        policy=policy,
        optim=AdamOptimizerFactory(lr=1e-3),
        gamma=0.99,
        n_step_return_horizon=3,
        target_update_freq=250,
    )
    buffer = DistributedPrioritizedReplayBuffer(
        args.capacity, num_shards=2, batches_per_request=4, seed=0
    )
    collector = GorilaCollector(
        algorithm,
        env_factory=cartpole,
        buffer=buffer,
        num_actors=2,
        envs_per_actor=4,
        weight_sync_every_n_steps=400,
        seed=0,
    )
    test = Collector(policy, DummyVectorEnv([cartpole]))

    def pids() -> dict[str, int]:
        out = {f"actor_{i}": actor_pid(h) for i, h in enumerate(collector._actor_pool.handles)}
        out |= {f"shard_{i}": actor_pid(h) for i, h in enumerate(buffer.client.handles)}
        out["weights_server"] = actor_pid(collector.weights_sink.handle)
        return out

    sampler = Sampler(args.sample_every_s, pids)
    ends = time.monotonic() + 60 * args.minutes
    steps = {"n": 0}

    def training_fn(_epoch: int, env_step: int) -> None:
        steps["n"] = env_step
        if sampler.due():
            sampler.take(env_step, buffer.stats(wait=True))

    try:
        algorithm.run_training(
            OffPolicyTrainerParams(
                training_collector=collector,
                test_collector=test,
                max_epochs=10**6,
                epoch_num_steps=5_000,
                collection_step_num_env_steps=256,
                update_step_num_gradient_steps_per_sample=16 / 128,
                batch_size=128,
                test_step_num_episodes=1,
                training_fn=training_fn,
                stop_fn=lambda _mean_return: time.monotonic() >= ends,
                show_progress=False,
            )
        )
    finally:
        test.close()
        collector.close()
        buffer.close()
    return sampler.samples


# ---- trends ---------------------------------------------------------------------------------
def trend(t_min: np.ndarray, values: np.ndarray) -> dict:
    """Least-squares slope per hour, residual noise, and whether the series is flat."""
    ok = np.isfinite(values)
    t, v = t_min[ok] / 60.0, values[ok]
    if len(v) < 3:
        return {"slope_per_h": float("nan"), "noise": float("nan"), "mean": float("nan")}
    slope, intercept = np.polyfit(t, v, 1)
    noise = float(np.std(v - (slope * t + intercept)))
    mean = float(np.mean(v))
    return {
        "slope_per_h": float(slope),
        "noise": noise,
        "mean": mean,
        "flat": bool(abs(slope) <= max(3 * noise, 0.02 * abs(mean))),
    }


def series(samples: list[dict]) -> dict[str, np.ndarray]:
    names = sorted({k for s in samples for k in s["actors_rss_mb"]})
    out = {
        "driver_rss_mb": np.array([s["driver_rss_mb"] for s in samples], float),
        "actors_rss_total_mb": np.array([sum(s["actors_rss_mb"].values()) for s in samples]),
        "object_store_mb": np.array([s["object_store_mb"] for s in samples], float),
        "replay_bytes_mb": np.array([s["replay_bytes_mb"] for s in samples], float),
        "env_steps_per_s": np.array([s["env_steps_per_s"] for s in samples], float),
    }
    for name in names:
        out[f"rss_mb/{name}"] = np.array(
            [s["actors_rss_mb"].get(name, np.nan) for s in samples], float
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frameworks", nargs="+", default=["rllib", "tianshou"])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--sample-every-s", type=float, default=30.0)
    parser.add_argument("--warmup-min", type=float, default=5.0)
    parser.add_argument("--capacity", type=int, default=50_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import ray

    runs = {}
    for framework in args.frameworks:
        print(f"{framework}: {args.minutes:g} min", flush=True)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            runs[framework] = {"rllib": rllib_soak, "tianshou": tianshou_soak}[framework](args)
        finally:
            ray.shutdown()

    trends = {}
    for framework, samples in runs.items():
        t = np.array([s["t_min"] for s in samples])
        after = t >= args.warmup_min
        trends[framework] = {
            name: trend(t[after], values[after]) for name, values in series(samples).items()
        }
    result = {
        "benchmark": "soak",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "params": vars(args) | {"out": str(args.out)},
        "runs": runs,
        "trends": trends,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
    write_table(args, result)
    plot(args, runs)


def write_table(args: argparse.Namespace, result: dict) -> None:
    lines = [
        "# Soak: memory and throughput over a long run (GorilaDQN, CartPole-v1)",
        "",
        f"{args.minutes:g} minutes per framework, sampled every {args.sample_every_s:g} s, "
        f"2 actors x 4 envs, replay {args.capacity:,} rows (2 shards, full after the first "
        f"minute or so); trends fitted after {args.warmup_min:g} min of warm-up. "
        f"{result['machine']['cpus']} CPUs, one run ({result['date']} UTC).",
        "",
        "| framework | series | mean | slope per hour | noise (std) | flat |",
        "|---|---|---:|---:|---:|:---:|",
    ]
    for framework, trends in result["trends"].items():
        for name, tr in trends.items():
            flat = "yes" if tr.get("flat") else "**no**"
            lines.append(
                f"| {framework} | {name} | {tr['mean']:.1f} | {tr['slope_per_h']:+.1f} | "
                f"{tr['noise']:.1f} | {flat} |"
            )
    lines += [
        "",
        "Memory in MB (object store: MiB of plasma in use), throughput in env steps/s. Flat: "
        "the slope's growth over an hour is below max(3 x noise, 2% of the mean).",
    ]
    (args.out / "soak.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def plot(args: argparse.Namespace, runs: dict[str, list[dict]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, len(runs), figsize=(6 * len(runs), 9), squeeze=False)
    for col, (framework, samples) in enumerate(runs.items()):
        t = [s["t_min"] for s in samples]
        data = series(samples)
        ax = axes[0][col]
        ax.plot(t, data["driver_rss_mb"], label="driver")
        for name, values in data.items():
            if name.startswith("rss_mb/"):
                ax.plot(t, values, label=name.removeprefix("rss_mb/"), linewidth=0.8)
        ax.set_title(f"{framework}: RSS (MB)")
        ax.legend(fontsize=7)
        axes[1][col].plot(t, data["object_store_mb"], label="object store (MiB)")
        axes[1][col].plot(t, data["replay_bytes_mb"], label="replay storage (MB)")
        axes[1][col].legend(fontsize=7)
        axes[2][col].plot(t, data["env_steps_per_s"])
        axes[2][col].set_title("env steps/s")
        axes[2][col].set_xlabel("minutes")
        for row in axes:
            row[col].axvline(args.warmup_min, color="grey", linestyle=":", linewidth=0.8)
    fig.tight_layout()
    fig.savefig(args.out / "soak.png", dpi=100)


if __name__ == "__main__":
    main()
