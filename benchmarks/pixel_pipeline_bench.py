"""Pong through the whole pipeline: env frames/s from actors through the compressed replay to the
learner, with 2, 4 and 8 actors (RLlib GorilaDQN).

For each actor count a fresh ``ray.init(num_cpus=2)`` runs RLlib ``GorilaDQN`` on
``ALE/Pong-v5`` (``rllib_plugins.pixels.pixel_env``: 84x84x4 uint8, frame skip 4; the Nature CNN;
LZ4-compressed replay rows) with the learner in the driver, for ``--seconds`` of ``train()``
iterations after one warm-up iteration. Reported per row: env steps/s and env frames/s (x4, the
frame skip), gradient updates/s of ``--batch``-row batches, sampled rows per inserted row,
replay bytes per transition, policy lag. The learner shares the 2 cores with the actors, so
the rows show where this machine saturates, not how far the design scales.

Writes ``benchmarks/results/pixel_pipeline_bench.{json,md}``. Usage::

    .venv/bin/python benchmarks/pixel_pipeline_bench.py [--actors 2 4 8] [--seconds 60]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import ray
import torch
from results_files import write_results

RESULTS = Path(__file__).parent / "results"
FRAME_SKIP = 4


def build(actors: int, args):
    from rl_dist_ext.replay import ObsCompression
    from rllib_plugins import GorilaDQNConfig
    from rllib_plugins.pixels import pixel_env

    return (
        GorilaDQNConfig()
        .environment(pixel_env(args.env))
        .env_runners(num_env_runners=actors, num_envs_per_env_runner=1, num_cpus_per_env_runner=0.1)
        .learners(num_learners=0)
        .resources(num_cpus_for_main_process=0.2)
        .training(
            lr=1e-4,
            n_step=3,
            train_batch_size=args.batch,
            updates_per_iteration=16,
            env_steps_per_request=64,
            weight_sync_every_n_steps=400,
        )
        .replay(
            num_shards=2,
            capacity=50_000,
            min_size_to_sample=1_000,
            samples_per_insert=None,
            num_cpus_per_shard=0.05,
            compression=ObsCompression(),
        )
        .reporting(min_time_s_per_iteration=2)
        .debugging(seed=0)
    )


def measure(actors: int, args) -> dict:
    algo = build(actors, args).build_algo()
    try:
        result = algo.train()  # warm-up: the replay fills to min_size_to_sample
        while result["gorila"]["learner_weights_version"] == 0:
            result = algo.train()
        steps0 = result["num_env_steps_sampled_lifetime"]
        updates0 = result["gorila"]["learner_weights_version"]
        start = time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            result = algo.train()
        seconds = time.perf_counter() - start
        gorila = result["gorila"]
        steps = result["num_env_steps_sampled_lifetime"] - steps0
        updates = gorila["learner_weights_version"] - updates0
        row = {
            "actors": actors,
            "seconds": seconds,
            "env_steps_per_s": steps / seconds,
            "env_frames_per_s": FRAME_SKIP * steps / seconds,
            "updates_per_s": updates / seconds,
            "sampled_per_inserted": updates * args.batch / steps if steps else 0.0,
            "bytes_per_transition": float(gorila["replay_bytes_per_transition"]),
            "compression_ratio": float(gorila["replay_compression_ratio"]),
            "policy_lag_mean": float(gorila["policy_lag_mean"]),
        }
    finally:
        algo.stop()
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="ALE/Pong-v5")
    parser.add_argument("--actors", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--out", type=Path, default=RESULTS / "pixel_pipeline_bench")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for actors in args.actors:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            rows.append(measure(actors, args))
        finally:
            ray.shutdown()
    report = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "env": args.env,
        "seconds": args.seconds,
        "batch": args.batch,
        "rows": rows,
    }
    lines = [
        f"# {args.env} through actors -> compressed replay -> learner (RLlib GorilaDQN)",
        "",
        f"1 env per actor, learner in the driver (batches of {args.batch}), Nature CNN, LZ4 rows, "
        f"{args.seconds:.0f} s of train() after warm-up per row, Ray with 2 CPUs on "
        f"{report['cpus']} cores, one run ({report['when']}). Frames = env steps x {FRAME_SKIP}.",
        "",
        "| actors | env steps/s | env frames/s | updates/s | sampled/inserted | bytes/transition "
        "| compression | policy lag |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['actors']} | {r['env_steps_per_s']:,.0f} | {r['env_frames_per_s']:,.0f} | "
            f"{r['updates_per_s']:.1f} | {r['sampled_per_inserted']:.2f} | "
            f"{r['bytes_per_transition']:,.0f} | {r['compression_ratio']:.0f}x | "
            f"{r['policy_lag_mean']:.0f} |"
        )
    write_results(args.out, report, lines)


if __name__ == "__main__":
    main()
