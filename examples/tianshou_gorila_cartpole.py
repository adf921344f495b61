"""GorilaDQN (Ape-X style) on CartPole-v1 with Tianshou, on a local Ray instance.

``--num-actors`` Ray actors each run Tianshou's own ``Collector`` over ``--envs-per-actor`` envs
with their own Ape-X epsilon and push prioritized n-step transitions to a sharded replay; the
learner in this process trains double DQN and publishes weights the actors pull. Tianshou's
``OffPolicyTrainer`` drives it unchanged (``algorithm.run_training``): a progress bar, a greedy
test (10 episodes) every ``--epoch-steps`` env steps, and a checkpoint (algorithm and replay)
before each test. A ``TensorboardLogger`` writes under ``--out``/tb; the script stops at
``--env-steps`` or once the test return reaches ``--target-return``, then prints the final greedy
return (10 episodes) and writes a learning curve PNG under ``--out``.

    .venv/bin/python examples/tianshou_gorila_cartpole.py [--env-steps 200000] [--seed 0]
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import ray
import torch
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Collector
from tianshou.env import DummyVectorEnv
from tianshou.trainer import OffPolicyTrainerParams
from tianshou.utils import TensorboardLogger
from tianshou.utils.net.common import Net
from torch.utils.tensorboard import SummaryWriter
from tqdm.contrib.logging import logging_redirect_tqdm

from tianshou_plugins import DistributedPrioritizedReplayBuffer, GorilaCollector, GorilaDQN

log = logging.getLogger("tianshou_gorila_cartpole")

ENV = "CartPole-v1"


def make_env() -> gym.Env:
    return gym.make(ENV)


class CurveLogger(TensorboardLogger):
    """Tianshou's TensorBoard logger that also keeps the learning curve and logs progress.

    ``test_curve`` holds ``(env steps, mean test return)`` per test step; ``training_curve``
    holds ``(env steps, mean episode return of the exploring actors)`` per training log (when
    episodes finished in that collect step). Each training log also prints one progress line.
    """

    def __init__(self, writer: SummaryWriter, **kwargs: int | None) -> None:
        super().__init__(writer, **kwargs)
        self.test_curve: list[tuple[int, float]] = []
        self.training_curve: list[tuple[int, float]] = []

    def log_training_data(self, log_data: dict, step: int) -> None:
        super().log_training_data(log_data, step)
        if self.last_log_training_step != step:  # within the training interval: not logged
            return
        data = self.prepare_dict_for_logging(log_data)
        episode_return = float(data.get("returns_stat/mean", math.nan))
        if not math.isnan(episode_return):
            self.training_curve.append((step, episode_return))
        log.info(
            "env steps %7d | actors %5.0f steps/s | replay %6d (%.2f samples/insert) | "
            "policy lag %5.1f | episode return %6.1f",
            step,
            data.get("env_steps_per_s", data.get("collect_speed", math.nan)),
            data.get("replay/size", 0),
            data.get("replay/samples_per_insert", math.nan),
            data.get("policy_lag_mean", math.nan),
            episode_return,
        )

    def log_test_data(self, log_data: dict, step: int) -> None:
        super().log_test_data(log_data, step)
        self.test_curve.append((step, float(log_data["returns_stat"]["mean"])))


def plot_curve(logger: CurveLogger, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    if logger.training_curve:
        steps, returns = zip(*logger.training_curve, strict=True)
        ax.plot(steps, returns, label="episode return (exploring actors)", alpha=0.7)
    if logger.test_curve:
        steps, returns = zip(*logger.test_curve, strict=True)
        ax.plot(steps, returns, label="greedy test return (10 episodes)", marker="o")
    ax.set_xlabel("env steps")
    ax.set_ylabel("return")
    ax.set_title("GorilaDQN on CartPole-v1 (Tianshou, rl-dist-ext)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def greedy_collector(policy: DiscreteQLearningPolicy, episodes: int, seed: int) -> Collector:
    """A Tianshou collector over ``episodes`` envs: one greedy episode per env per collect."""
    envs = DummyVectorEnv([make_env] * episodes)
    envs.seed([seed + i for i in range(episodes)])
    return Collector(policy, envs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env-steps", type=int, default=200_000)
    parser.add_argument("--num-actors", type=int, default=4)
    parser.add_argument("--envs-per-actor", type=int, default=4)
    parser.add_argument("--num-shards", type=int, default=2)
    parser.add_argument("--cpus-per-actor", type=float, default=0.25, help="Ray CPUs reserved")
    parser.add_argument("--epoch-steps", type=int, default=10_000, help="env steps per test")
    parser.add_argument("--target-return", type=float, default=475.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/tianshou_gorila"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    ray.init(num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False)

    env = make_env()
    net = Net(
        state_shape=env.observation_space.shape,
        action_shape=env.action_space.n,
        hidden_sizes=[128, 128],
    )
    policy = DiscreteQLearningPolicy(model=net, action_space=env.action_space, eps_inference=0.0)
    env.close()
    algorithm = GorilaDQN(
        policy=policy,
        optim=AdamOptimizerFactory(lr=1e-3),
        gamma=0.99,
        n_step_return_horizon=3,
        target_update_freq=250,
    )
    buffer = DistributedPrioritizedReplayBuffer(
        50_000,
        num_shards=args.num_shards,
        min_size_to_sample=1_000,
        batches_per_request=4,  # one replay round trip serves 4 learner batches
        seed=args.seed,
    )
    collector = test_collector = eval_collector = None
    checkpoint_dir = (args.out / "checkpoint").resolve()
    writer = SummaryWriter(str(args.out / "tb"))
    logger = CurveLogger(writer, training_interval=1_000, save_interval=1)

    def save_checkpoint(epoch: int, env_step: int, gradient_step: int) -> str:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        torch.save(algorithm.state_dict(), checkpoint_dir / "algorithm.pt")
        buffer.save(str(checkpoint_dir / "replay"))
        log.info("checkpoint (epoch %d, %d env steps): %s", epoch, env_step, checkpoint_dir)
        return str(checkpoint_dir)

    try:
        collector = GorilaCollector(
            algorithm,
            env_factory=make_env,
            buffer=buffer,
            num_actors=args.num_actors,
            envs_per_actor=args.envs_per_actor,
            num_cpus_per_actor=args.cpus_per_actor,
            seed=args.seed,
        )
        test_collector = greedy_collector(policy, episodes=10, seed=10_000 + args.seed)
        start = time.perf_counter()
        with logging_redirect_tqdm():
            info = algorithm.run_training(
                OffPolicyTrainerParams(
                    training_collector=collector,
                    test_collector=test_collector,
                    max_epochs=max(1, math.ceil(args.env_steps / args.epoch_steps)),
                    epoch_num_steps=args.epoch_steps,
                    collection_step_num_env_steps=256,
                    update_step_num_gradient_steps_per_sample=0.25,
                    batch_size=128,
                    test_step_num_episodes=10,
                    stop_fn=lambda mean_return: mean_return >= args.target_return,
                    save_checkpoint_fn=save_checkpoint,
                    logger=logger,
                    show_progress=True,
                    verbose=False,  # Tianshou logs each test result through `logging` anyway
                )
            )
        eval_collector = greedy_collector(policy, episodes=10, seed=123_456)
        eval_collector.reset()
        final = float(eval_collector.collect(n_episode=10).returns_stat.mean)
        plot_curve(logger, args.out / "learning_curve.png")
    finally:
        logger.finalize()
        for c in (eval_collector, test_collector):
            if c is not None:
                c.close()
        if collector is not None:
            collector.close()
        buffer.close()
        ray.shutdown()
    log.info("checkpoint (algorithm and replay): %s", checkpoint_dir)
    log.info("tensorboard logs: %s", args.out / "tb")
    log.info("learning curve: %s", args.out / "learning_curve.png")
    print(
        f"final greedy evaluation return (10 episodes): {final:.1f} after {info.train_step} "
        f"env steps in {time.perf_counter() - start:.0f} s"
    )


if __name__ == "__main__":
    main()
