"""Sampling throughput of SEED central inference vs local inference, with 1 to 8 env runners.

For each env (CartPole-v1, and "SlowCartPole-v1": the same env with 2 ms of latency per step, a
stand-in for a slow simulator), each number of env runners and each inference mode, a VTrace
algorithm is built in a fresh ``ray.init(num_cpus=2)`` and trained for one iteration (warm-up:
learner weights on the server or the runners). Then the driver keeps every env runner sampling
(``sample(num_timesteps=--chunk)``, re-issued as soon as it returns; no learning) for
``--seconds`` and counts the env steps. For central inference the server's request, batch and
row counters are read before and after the window: the mean batch size is over the window.

``--algo gorila`` measures GorilaDQN's runners instead (each request acts, folds n-step
transitions with initial priorities and pushes them to the replay: the whole actor step), and
``--envs ALE/Pong-v5`` or ``minatar:breakout`` runs pixel envs (``rllib_plugins.pixels``: uint8
frames, the Nature CNN for 84x84), e.g. the Nature-CNN row of the pixel issue::

    .venv/bin/python benchmarks/central_inference_bench.py --algo gorila --envs ALE/Pong-v5 \
        --runners 8 --envs-per-runner 1 --name pixel_inference_bench --target-ratio 1.5

Modes: ``local`` (``central_inference(enabled=False)``: each runner runs its own copy of the
policy), ``central`` (one inference server on CPU batches all runners' requests) and, when the
driver sees a GPU, ``central-gpu`` (the server on the GPU: ``central_inference(num_gpus=1)``).

Writes ``benchmarks/results/central_inference_bench.{json,md}``::

    .venv/bin/python benchmarks/central_inference_bench.py [--runners 1 2 4 8] \
        [--envs-per-runner 1 8] [--seconds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import gymnasium as gym
import ray
import torch
from slow_env import SlowStep

from rl_dist_ext.replay import ObsCompression

RESULTS = Path(__file__).parent / "results"
BENCH_TAG = "central_inference_bench"
TARGET_RATIO = 0.8  # central >= 0.8x local env steps/s at the most runners (CPU) ...
TARGET_BATCH_REQUESTS = 4.0  # ... with at least 4 requests per server batch


def build_config(env: str, runners: int, envs_per_runner: int, mode: str, args):
    from rllib_plugins import GorilaDQNConfig, VTraceConfig
    from rllib_plugins.pixels import pixel_env
    from rllib_plugins.vtrace import IMPALA_LOSS

    if env.startswith("ALE/") or env.startswith("minatar:"):
        env = pixel_env(env)
    if args.algo == "gorila":
        config = (
            GorilaDQNConfig()
            .training(lr=1e-4, train_batch_size=32, updates_per_iteration=8)
            .replay(
                num_shards=1,
                capacity=20_000,
                min_size_to_sample=256,
                samples_per_insert=None,
                num_cpus_per_shard=0.05,
                compression=ObsCompression() if "rl_dist_ext/" in env else None,
            )
            .reporting(min_sample_timesteps_per_iteration=256)
        )
    else:
        # IMPALA's loss and shared layers, as the recorded figures ran (VTraceConfig's default
        # since 2026-12-08, 4 passes and a value network of its own, costs the learner more)
        config = (
            VTraceConfig()
            .training(lr=5e-4, train_batch_size_per_learner=500, **IMPALA_LOSS)
            .rl_module(model_config={"vf_share_layers": True})
        )
    return (
        config.environment(env)
        .env_runners(
            num_env_runners=runners,
            num_envs_per_env_runner=envs_per_runner,
            num_cpus_per_env_runner=args.cpus_per_runner,
        )
        .learners(num_learners=0)
        .central_inference(
            enabled=mode != "local",
            max_batch_size=args.max_batch_size,
            max_wait_ms=args.max_wait_ms,
            num_cpus=args.server_cpus,
            num_gpus=1.0 if mode == "central-gpu" else 0.0,
        )
        .reporting(min_time_s_per_iteration=1)
        .debugging(seed=0)
    )


def runner_steps(algo: str, chunk: int):
    """What one sample request runs on an env runner; returns its env steps."""
    if algo == "gorila":
        return lambda runner: runner.collect_and_push(chunk)["env_steps"]
    return lambda runner: sum(len(episode) for episode in runner.sample(num_timesteps=chunk))


def modes_for(gpu: bool) -> list[str]:
    return ["local", "central", *(["central-gpu"] if gpu else [])]


def server_totals(algo) -> dict[str, float]:
    """The server's lifetime request, batch and row counters (empty in local mode)."""
    if algo._inference is None:
        return {}
    stats = algo._inference.stats()
    return {
        "requests": stats["num_requests"],
        "batches": stats["num_batches"],
        "rows": stats["mean_batch_rows"] * stats["num_batches"],
        "queue_ms_p50": stats["queue_ms_p50"],
        "queue_ms_p99": stats["queue_ms_p99"],
    }


def sample_for(group, runners: int, seconds: float, sample) -> tuple[int, float]:
    """Keep every runner running ``sample`` (a request of a fixed number of env steps) for
    ``seconds``; (steps, seconds). The clock stops when the last request returns, so every
    counted step lies in the window."""
    steps = 0
    start = time.perf_counter()
    deadline = start + seconds
    in_flight = group.foreach_env_runner_async(sample, tag=BENCH_TAG)
    if in_flight != runners:
        raise RuntimeError(f"only {in_flight} of {runners} env runners took a sample request")
    while in_flight:
        for runner_id, runner_steps in group.fetch_ready_async_reqs(
            tags=BENCH_TAG, timeout_seconds=0.05
        ):
            steps += runner_steps
            in_flight -= 1
            if time.perf_counter() < deadline:
                in_flight += group.foreach_env_runner_async(
                    sample, tag=BENCH_TAG, remote_worker_ids=[runner_id]
                )
    return steps, time.perf_counter() - start


def measure(env: str, runners: int, envs_per_runner: int, mode: str, args) -> dict:
    from ray.tune.registry import register_env

    import rllib_plugins  # noqa: F401  (registers VTrace)

    register_env("SlowCartPole-v1", lambda _cfg: SlowStep(gym.make("CartPole-v1")))
    algo = build_config(env, runners, envs_per_runner, mode, args).build_algo()
    try:
        algo.train()  # warm-up: one iteration, the learner's weights on the server / runners
        group = algo.env_runner_group
        # One synchronous round waits out IMPALA's sample requests still in flight; then
        # their results are dropped, so that none counts against the runners' request limit.
        sample = runner_steps(args.algo, args.chunk)
        group.foreach_env_runner(sample, local_env_runner=False)
        group.fetch_ready_async_reqs(timeout_seconds=5.0)
        before = server_totals(algo)
        steps, seconds = sample_for(group, runners, args.seconds, sample)
        after = server_totals(algo)
    finally:
        algo.stop()
    row = {
        "env": env,
        "runners": runners,
        "envs_per_runner": envs_per_runner,
        "mode": mode,
        "env_steps": steps,
        "seconds": seconds,
        "env_steps_per_s": steps / seconds,
        "server": None,
    }
    if after:
        batches = max(after["batches"] - before["batches"], 1)
        requests = after["requests"] - before["requests"]
        row["server"] = {
            "requests": requests,
            "batches": after["batches"] - before["batches"],
            "requests_per_s": requests / seconds,
            "mean_batch_requests": requests / batches,
            "mean_batch_rows": (after["rows"] - before["rows"]) / batches,
            "queue_ms_p50": after["queue_ms_p50"],
            "queue_ms_p99": after["queue_ms_p99"],
        }
    return row


def ratios(rows: list[dict]) -> list[dict]:
    """Central / local env steps/s for every (env, runners, central mode)."""

    def key(row: dict) -> tuple:
        return row["env"], row["envs_per_runner"], row["runners"]

    local = {key(r): r for r in rows if r["mode"] == "local"}
    out = []
    for row in rows:
        base = local.get(key(row))
        if row["mode"] == "local" or base is None:
            continue
        out.append(
            {
                "env": row["env"],
                "envs_per_runner": row["envs_per_runner"],
                "runners": row["runners"],
                "mode": row["mode"],
                "ratio": row["env_steps_per_s"] / base["env_steps_per_s"],
                "mean_batch_requests": row["server"]["mean_batch_requests"],
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algo", choices=["vtrace", "gorila"], default="vtrace")
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "SlowCartPole-v1"])
    parser.add_argument("--runners", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--envs-per-runner", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--cpus-per-runner", type=float, default=0.1, help="Ray CPUs reserved")
    parser.add_argument("--server-cpus", type=float, default=0.2, help="Ray CPUs reserved")
    parser.add_argument("--max-batch-size", type=int, default=64, help="observations per batch")
    parser.add_argument("--max-wait-ms", type=float, default=1.0, help="batching wait")
    parser.add_argument("--seconds", type=float, default=10.0, help="sampling window per row")
    parser.add_argument("--chunk", type=int, default=200, help="env steps per sample request")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--name", default="central_inference_bench", help="result file stem")
    parser.add_argument("--target-ratio", type=float, default=TARGET_RATIO)
    args = parser.parse_args()
    torch.set_num_threads(1)

    gpu = torch.cuda.is_available()
    rows = []
    for envs_per_runner in args.envs_per_runner:
        for env in args.envs:
            for runners in args.runners:
                for mode in modes_for(gpu):
                    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
                    try:
                        row = measure(env, runners, envs_per_runner, mode, args)
                    finally:
                        ray.shutdown()
                    rows.append(row)
                    print(json.dumps(row), flush=True)

    by_runners = ratios(rows)
    most = max(args.runners)
    at_most = [r for r in by_runners if r["runners"] == most]
    result = {
        "benchmark": "central_inference_bench",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "gpu": gpu},
        "params": vars(args) | {"out": str(args.out)},
        "results": rows,
        "ratios": by_runners,
        "targets": {
            "runners": most,
            "central_over_local_at_least": args.target_ratio,
            "mean_batch_requests_at_least": TARGET_BATCH_REQUESTS,
            "met": {
                f"{r['env']}, {r['envs_per_runner']} env(s) per runner, {r['mode']}": r["ratio"]
                >= args.target_ratio
                and r["mean_batch_requests"] >= TARGET_BATCH_REQUESTS
                for r in at_most
            },
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")

    ratio_of = {
        (r["env"], r["envs_per_runner"], r["runners"], r["mode"]): r["ratio"] for r in by_runners
    }
    lines = [
        "# Central (SEED) vs local inference: env steps/s with "
        f"{', '.join(map(str, args.runners))} env runners",
        "",
        f"{'GorilaDQN' if args.algo == 'gorila' else 'VTrace'}, "
        f"{' or '.join(map(str, args.envs_per_runner))} env(s) per runner (one server "
        "request carries all of a runner's envs), runners sampling "
        f"{args.chunk}-step chunks back to back for {args.seconds:.0f} s after one warm-up "
        f"iteration (no learning in the window); server batches of <= {args.max_batch_size} "
        f"observations, {args.max_wait_ms} ms wait. Ray with 2 CPUs, "
        f"{result['machine']['cpus']} CPUs on the machine, GPU: {'yes' if gpu else 'no'}, "
        f"one run ({result['date']} UTC). SlowCartPole-v1 adds 2 ms per env step.",
        "",
        "| env | envs/runner | runners | mode | env steps/s | central / local | requests/s | "
        "requests per batch | rows per batch | queue p50 / p99 ms |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        server = row["server"]
        ratio = ratio_of.get((row["env"], row["envs_per_runner"], row["runners"], row["mode"]))
        cells = [
            row["env"],
            str(row["envs_per_runner"]),
            str(row["runners"]),
            row["mode"],
            f"{row['env_steps_per_s']:,.0f}",
            "" if ratio is None else f"{ratio:.2f}",
        ]
        if server is None:
            cells += ["", "", "", ""]
        else:
            cells += [
                f"{server['requests_per_s']:,.0f}",
                f"{server['mean_batch_requests']:.1f}",
                f"{server['mean_batch_rows']:.1f}",
                f"{server['queue_ms_p50']:.1f} / {server['queue_ms_p99']:.1f}",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Target (CPU): at {most} runners, central >= {args.target_ratio}x local with >= "
        f"{TARGET_BATCH_REQUESTS:.0f} requests per server batch.",
        "",
    ]
    for row, met in zip(at_most, result["targets"]["met"].values(), strict=True):
        lines.append(
            f"- {row['env']}, {row['envs_per_runner']} env(s) per runner, {row['mode']}: "
            f"{row['ratio']:.2f}x, "
            f"{row['mean_batch_requests']:.1f} requests per batch: {'met' if met else 'not met'}"
        )
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
