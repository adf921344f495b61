"""GorilaDQN (Ape-X style) on PettingZoo tic-tac-toe with RLlib: a learner against a random
legal opponent, on a local Ray instance.

RLlib's own multi-agent setup: ``PettingZooEnv`` (through a picklable creator), two modules
(``learner``, trained, with its own sharded prioritized replay; ``random``, which plays
uniformly random legal moves), seats alternating per episode, action masks honoured when acting,
in the initial priorities and in the double-DQN target. The script prints progress every
iteration (env steps/s, replay size and ratio, policy lag, each module's mean game return),
measures the greedy learner's win rate against the random player (200 games, both seats) every
``--eval-every`` env steps, stops at ``--env-steps`` or at ``--target-win-rate``, then prints the
final win rate and writes a checkpoint (with the replay) and a learning curve PNG under
``--out``. ``--central-inference`` runs the learner module on one inference server (SEED).

    .venv/bin/python examples/rllib_multi_agent_tictactoe.py [--env-steps 60000] [--seed 0]
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import ray
import torch
from pettingzoo.classic import tictactoe_v3
from ray.tune.registry import register_env
from ray_cluster import add_address_argument, start_ray

from rl_dist_ext.games import play_against_random
from rllib_plugins import GorilaDQNConfig, PettingZooCreator
from rllib_plugins.pettingzoo import against_random_opponent, greedy_act

log = logging.getLogger("rllib_multi_agent_tictactoe")

ENV = "tictactoe"
SEATS = ("player_1", "player_2")


def build_config(args) -> GorilaDQNConfig:
    # GorilaDQN's default module for the learner: RLlib's DQN module reading the masks
    config = against_random_opponent(GorilaDQNConfig().environment(ENV), SEATS)
    config = (
        config.env_runners(
            num_env_runners=args.num_env_runners,
            num_envs_per_env_runner=args.num_envs_per_runner,
            num_cpus_per_env_runner=0.2,
        )
        .learners(num_learners=0)
        # one-step targets at gamma 0.9: a game lasts at most 9 moves
        .training(n_step=1, gamma=0.9, updates_per_iteration=32, env_steps_per_request=64)
        .replay(num_shards=2, capacity=20_000, min_size_to_sample=500)
        .reporting(min_sample_timesteps_per_iteration=500)
        .debugging(seed=args.seed)
    )
    if args.central_inference:
        config = config.central_inference(enabled=True, num_cpus=0.2)
    return config


def win_rate(algo) -> float:
    act = greedy_act(algo.get_module("learner"))
    return play_against_random(tictactoe_v3.env, act, games=200, seed=123).win_rate


def plot_curve(curve: list[tuple[int, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    if curve:
        steps, rates = zip(*curve, strict=True)
        ax.plot(steps, rates, marker="o", label="greedy learner vs random (200 games)")
    ax.axhline(0.44, color="grey", linestyle="--", label="random vs random (both seats)")
    ax.set_xlabel("env steps")
    ax.set_ylabel("win rate")
    ax.set_ylim(0, 1)
    ax.set_title("GorilaDQN on tic-tac-toe (RLlib, rl-dist-ext)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env-steps", type=int, default=60_000)
    parser.add_argument("--num-env-runners", type=int, default=2)
    parser.add_argument("--num-envs-per-runner", type=int, default=4)
    parser.add_argument("--eval-every", type=int, default=5_000)
    parser.add_argument("--target-win-rate", type=float, default=0.9)
    parser.add_argument("--central-inference", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/rllib_multi_agent"))
    add_address_argument(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(1)
    start_ray(args.address)
    register_env(ENV, PettingZooCreator(tictactoe_v3.env))

    algo = build_config(args).build_algo()
    curve: list[tuple[int, float]] = [(0, win_rate(algo))]
    log.info("untrained learner's win rate against random: %.2f", curve[0][1])
    start = time.perf_counter()
    next_eval, env_steps = args.eval_every, 0
    try:
        while env_steps < args.env_steps:
            result = algo.train()
            runners, gorila = result["env_runners"], result["gorila"]
            env_steps = int(runners.get("num_env_steps_sampled_lifetime", 0))
            modules = runners.get("module_episode_returns_mean", {})
            log.info(
                "iter %3d | env steps %6d | %5.0f steps/s | replay %6d (%.1f sampled rows per "
                "env step) | policy lag %4.1f | returns %s",
                result["training_iteration"],
                env_steps,
                gorila["env_steps_per_s"],
                gorila["replay_size"],
                gorila["replay_rate_limiter_ratio/learner"],
                gorila["policy_lag_mean"],
                ", ".join(f"{module} {ret:+.2f}" for module, ret in sorted(modules.items())),
            )
            if env_steps >= next_eval:
                next_eval += args.eval_every
                curve.append((env_steps, win_rate(algo)))
                log.info("win rate against random after %d env steps: %.2f", *curve[-1])
                if curve[-1][1] >= args.target_win_rate:
                    break
        final = win_rate(algo)
        args.out.mkdir(parents=True, exist_ok=True)
        checkpoint = algo.save_to_path(str((args.out / "checkpoint").resolve()))
        plot_curve(curve, args.out / "learning_curve.png")
    finally:
        algo.stop()
        ray.shutdown()
    log.info("checkpoint (with the learner's replay): %s", checkpoint)
    log.info("learning curve: %s", args.out / "learning_curve.png")
    print(
        f"final win rate against a random player (200 games, both seats): {final:.2f} after "
        f"{env_steps} env steps in {time.perf_counter() - start:.0f} s"
    )


if __name__ == "__main__":
    main()
