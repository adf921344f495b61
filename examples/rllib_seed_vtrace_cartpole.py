"""VTrace (IMPALA with the shared V-trace learner) in SEED mode on CartPole-v1, with RLlib.

Env runners only step their envs: every step they send the observations to one central inference
server, which batches the requests of all runners, samples the actions from the current policy and
returns them with their log-probs. The learner (in the driver) computes V-trace targets and sends
its weights to the server only. ``--local`` turns central inference off (IMPALA mode: runners
infer with their own copy of the policy), for comparison.

The script prints progress every iteration (env steps/s, episode return, server requests/s, mean
batch size, queueing latency, policy lag), evaluates the greedy policy every ``--eval-every`` env
steps, stops at ``--env-steps`` or once the greedy return reaches ``--target-return``, then prints
the final greedy return (10 episodes) and writes a checkpoint and a learning curve PNG under
``--out``.

    .venv/bin/python examples/rllib_seed_vtrace_cartpole.py [--env-steps 300000] [--local]
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from pathlib import Path

import ray
import torch
from ray_cluster import add_address_argument, start_ray

from rllib_plugins.evaluation import greedy_return

log = logging.getLogger("rllib_seed_vtrace_cartpole")


def plot_curve(curve: list[tuple[int, float, float]], path: Path, mode: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    if curve:
        steps, train_returns, greedy = zip(*curve, strict=True)
        ax.plot(steps, train_returns, label="episode return (sampling runners)", alpha=0.7)
        ax.plot(steps, greedy, label="greedy evaluation return", marker="o")
    ax.set_xlabel("env steps")
    ax.set_ylabel("return")
    ax.set_title(f"VTrace ({mode} inference) on CartPole-v1 (RLlib, rl-dist-ext)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def build_config(args):
    from rllib_plugins import VTraceConfig

    return (
        VTraceConfig()
        .environment(args.env)
        .env_runners(
            num_env_runners=args.num_env_runners,
            num_envs_per_env_runner=args.num_envs_per_runner,
            num_cpus_per_env_runner=args.cpus_per_runner,
        )
        .learners(num_learners=0)
        .training(
            lr=5e-4,
            train_batch_size_per_learner=500,
            entropy_coeff=0.01,
            vf_loss_coeff=0.5,
        )
        .central_inference(
            enabled=args.central,
            max_batch_size=args.max_batch_size,
            max_wait_ms=args.max_wait_ms,
            num_cpus=args.server_cpus,
        )
        .reporting(min_time_s_per_iteration=1)
        .debugging(seed=args.seed)
    )


def server_window(server: dict, previous: dict, seconds: float) -> tuple[float, float]:
    """Server requests/s and mean rows per batch since ``previous`` (the last iteration's)."""

    def totals(stats: dict) -> tuple[float, float, float]:
        batches = stats.get("num_batches", 0.0)
        return stats.get("num_requests", 0.0), batches, stats.get("mean_batch_rows", 0.0) * batches

    (requests, batches, rows), (requests_0, batches_0, rows_0) = totals(server), totals(previous)
    rows_per_batch = (rows - rows_0) / (batches - batches_0) if batches > batches_0 else math.nan
    return (requests - requests_0) / seconds, rows_per_batch


def progress_line(
    result: dict, env_steps: int, seconds: float, steps_per_s: float, previous: dict
) -> str:
    runners = result["env_runners"]
    line = (
        f"iter {result['training_iteration']:3d} | env steps {env_steps:7d} | "
        f"{steps_per_s:5.0f} steps/s | "
        f"episode return {float(runners.get('episode_return_mean', math.nan)):6.1f}"
    )
    server = result.get("central_inference")
    if not server:  # local inference: no server
        return line
    requests_per_s, rows_per_batch = server_window(server, previous, seconds)
    return line + (
        f" | server {requests_per_s:5.0f} req/s, {rows_per_batch:4.1f} rows/batch, "
        f"queue p50/p99 {server.get('queue_ms_p50', math.nan):4.1f}/"
        f"{server.get('queue_ms_p99', math.nan):4.1f} ms | "
        f"policy lag {server.get('policy_lag', math.nan):4.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--env-steps", type=int, default=300_000)
    parser.add_argument("--num-env-runners", type=int, default=4)
    parser.add_argument("--num-envs-per-runner", type=int, default=4)
    parser.add_argument("--cpus-per-runner", type=float, default=0.2, help="Ray CPUs reserved")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--central",
        dest="central",
        action="store_true",
        default=True,
        help="SEED mode: one inference server acts for all runners (default)",
    )
    mode.add_argument(
        "--local",
        dest="central",
        action="store_false",
        help="IMPALA mode: each runner infers with its own copy of the policy",
    )
    parser.add_argument("--max-batch-size", type=int, default=64, help="observations per batch")
    parser.add_argument("--max-wait-ms", type=float, default=1.0, help="batching wait")
    parser.add_argument("--server-cpus", type=float, default=0.2, help="Ray CPUs reserved")
    parser.add_argument("--eval-every", type=int, default=10_000)
    parser.add_argument("--target-return", type=float, default=450.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/rllib_seed_vtrace"))
    add_address_argument(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(1)
    start_ray(args.address)

    import rllib_plugins  # noqa: F401  (registers "VTrace")

    algo = build_config(args).build_algo()
    log.info(
        "VTrace with %s inference: %d env runners x %d envs",
        "central (SEED)" if args.central else "local (IMPALA)",
        args.num_env_runners,
        args.num_envs_per_runner,
    )
    curve: list[tuple[int, float, float]] = []
    start = time.perf_counter()
    next_eval = args.eval_every
    env_steps = 0
    eval_seconds = 0.0
    try:
        last_time, last_steps, last_server = time.perf_counter(), 0, {}
        while env_steps < args.env_steps:
            result = algo.train()
            now = time.perf_counter()
            runners = result["env_runners"]
            env_steps = int(runners.get("num_env_steps_sampled_lifetime", 0))
            train_return = float(runners.get("episode_return_mean", math.nan))
            seconds = max(now - last_time, 1e-9)
            steps_per_s = (env_steps - last_steps) / seconds
            log.info(progress_line(result, env_steps, seconds, steps_per_s, last_server))
            last_server = result.get("central_inference", {})
            if env_steps >= next_eval:
                next_eval = (env_steps // args.eval_every + 1) * args.eval_every
                eval_start = time.perf_counter()
                greedy = greedy_return(
                    algo.get_module(), args.env, episodes=5, seed=10_000 + env_steps
                )
                eval_seconds += time.perf_counter() - eval_start
                curve.append((env_steps, train_return, greedy))
                log.info("greedy evaluation return after %d env steps: %.1f", env_steps, greedy)
                if greedy >= args.target_return:
                    log.info("target return %.0f reached", args.target_return)
                    break
            # Evaluation runs while the runners wait: keep it out of the next steps/s.
            last_time, last_steps = time.perf_counter(), env_steps
        final = greedy_return(algo.get_module(), args.env, episodes=10, seed=123_456)
        args.out.mkdir(parents=True, exist_ok=True)
        checkpoint = algo.save_to_path(str((args.out / "checkpoint").resolve()))
        plot_curve(curve, args.out / "learning_curve.png", "central" if args.central else "local")
    finally:
        algo.stop()
        ray.shutdown()
    log.info("checkpoint: %s", checkpoint)
    log.info("learning curve: %s", args.out / "learning_curve.png")
    log.info("greedy evaluations took %.0f s of the total", eval_seconds)
    print(
        f"final greedy evaluation return (10 episodes): {final:.1f} after {env_steps} env steps "
        f"in {time.perf_counter() - start:.0f} s"
    )


if __name__ == "__main__":
    main()
