"""GorilaDQN (Ape-X style) on CartPole-v1 with RLlib, on a local Ray instance.

Env runners act with their own Ape-X epsilons and push prioritized n-step transitions to a
sharded replay; one learner trains double DQN and publishes weights the runners pull. The script
prints progress every iteration, evaluates the greedy policy every ``--eval-every`` env steps,
stops at ``--env-steps`` or once ``--target-evals`` evaluations in a row reach
``--target-return`` (it learned, and stayed learned), then prints the final greedy return (10
episodes) and writes a checkpoint (including the replay) and a learning curve PNG under
``--out``. This is what ``make demo`` runs.

    .venv/bin/python examples/rllib_gorila_cartpole.py [--env-steps 300000] [--seed 0]
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import ray
import torch
from ray_cluster import add_address_argument, start_ray

from rllib_plugins.evaluation import greedy_return

log = logging.getLogger("rllib_gorila_cartpole")


def plot_curve(curve: list[tuple[int, float, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    if curve:
        steps, train_returns, greedy = zip(*curve, strict=True)
        ax.plot(steps, train_returns, label="episode return (exploring runners)", alpha=0.7)
        ax.plot(steps, greedy, label="greedy evaluation return", marker="o")
    ax.set_xlabel("env steps")
    ax.set_ylabel("return")
    ax.set_title("GorilaDQN on CartPole-v1 (RLlib, rl-dist-ext)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def build_config(args):
    """GorilaDQNConfig's defaults (lr 1e-3, batch 128, n-step 3, target update every 250
    gradient updates, 16 samples per insert held by the rate limiter) plus the layout."""
    from rllib_plugins import GorilaDQNConfig

    return (
        GorilaDQNConfig()
        .environment(args.env)
        .env_runners(
            num_env_runners=args.num_env_runners,
            num_envs_per_env_runner=args.num_envs_per_runner,
            num_cpus_per_env_runner=args.cpus_per_runner,
        )
        .learners(num_learners=0)
        .replay(num_shards=args.num_shards, capacity=50_000)
        .reporting(min_sample_timesteps_per_iteration=1_000)
        .debugging(seed=args.seed)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--env-steps", type=int, default=300_000)
    parser.add_argument("--num-env-runners", type=int, default=4)
    parser.add_argument("--num-envs-per-runner", type=int, default=4)
    parser.add_argument("--num-shards", type=int, default=2)
    parser.add_argument("--cpus-per-runner", type=float, default=0.2, help="Ray CPUs reserved")
    parser.add_argument("--eval-every", type=int, default=5_000)
    parser.add_argument("--target-return", type=float, default=475.0)
    parser.add_argument("--target-evals", type=int, default=3, help="in a row, to stop early")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/rllib_gorila"))
    add_address_argument(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(1)
    start_ray(args.address)

    import rllib_plugins  # noqa: F401  (registers "GorilaDQN")

    algo = build_config(args).build_algo()
    curve: list[tuple[int, float, float]] = []
    start = time.perf_counter()
    next_eval = args.eval_every
    env_steps = in_a_row = 0
    try:
        while env_steps < args.env_steps:
            result = algo.train()
            runners, gorila = result["env_runners"], result["gorila"]
            env_steps = int(runners.get("num_env_steps_sampled_lifetime", 0))
            train_return = float(runners.get("episode_return_mean", float("nan")))
            learners = result.get("learners", {}).get("__all_modules__", {})
            updates = learners.get("num_gradient_updates", 0)
            log.info(
                "iter %3d | env steps %6d | %5.0f steps/s | updates %5d | replay %6d "
                "(%.1f samples/insert) | policy lag %4.1f | episode return %6.1f",
                result["training_iteration"],
                env_steps,
                gorila["env_steps_per_s"],
                updates,
                gorila["replay_size"],
                gorila["replay_samples_per_insert"],
                gorila["policy_lag_mean"],
                train_return,
            )
            if env_steps >= next_eval:
                next_eval += args.eval_every
                greedy = greedy_return(
                    algo.get_module(), args.env, episodes=5, seed=10_000 + env_steps
                )
                curve.append((env_steps, train_return, greedy))
                log.info("greedy evaluation return after %d env steps: %.1f", env_steps, greedy)
                in_a_row = in_a_row + 1 if greedy >= args.target_return else 0
                if in_a_row >= args.target_evals:
                    log.info(
                        "target return %.0f reached in %d evaluations in a row",
                        args.target_return,
                        in_a_row,
                    )
                    break
        final = greedy_return(algo.get_module(), args.env, episodes=10, seed=123_456)
        args.out.mkdir(parents=True, exist_ok=True)
        checkpoint = algo.save_to_path(str((args.out / "checkpoint").resolve()))
        plot_curve(curve, args.out / "learning_curve.png")
    finally:
        algo.stop()
        ray.shutdown()
    log.info("checkpoint (with replay): %s", checkpoint)
    log.info("learning curve: %s", args.out / "learning_curve.png")
    print(
        f"final greedy evaluation return (10 episodes): {final:.1f} after {env_steps} env steps "
        f"in {time.perf_counter() - start:.0f} s"
    )


if __name__ == "__main__":
    main()
