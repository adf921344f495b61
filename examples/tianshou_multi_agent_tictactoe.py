"""Multi-agent GorilaDQN on PettingZoo tic-tac-toe with Tianshou: a learner in the second seat
against Tianshou's random masked opponent, on a local Ray instance.

Tianshou's own multi-agent pieces: ``PettingZooEnv``, ``MultiAgentOffPolicyAlgorithm`` (here
``MultiAgentGorilaDQN``, whose ``player_2`` is a ``GorilaDQN`` and ``player_1`` Tianshou's
``MARLRandomDiscreteMaskedOffPolicyAlgorithm``) and its ``OffPolicyTrainer``. The actors rebuild
each agent's own transitions from the env's turns and push the learner's to its sharded
prioritized replay; action masks are honoured when acting, in the initial priorities and in the
double-DQN target. Progress (actors' steps/s, replay size, policy lag, each agent's return) and
TensorBoard logs come through Tianshou's logger; the greedy learner is tested every
``--epoch-steps`` (50 games, Tianshou's test collector, its return reduced to the learner's with
``multi_agent_return_reduction``). The run trains to ``--env-steps`` (``--stop-at-target``: to
the first test at ``--target-return``). At the end the script says what the learner kept after
its first test at the target, prints its win rate against the random player over 200 games and
writes a checkpoint (algorithm and replay) and a learning curve PNG under ``--out``.

    .venv/bin/python examples/tianshou_multi_agent_tictactoe.py [--env-steps 60000] [--seed 0]
        [--stop-at-target]
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import ray
import torch
from pettingzoo.classic import tictactoe_v3
from ray_cluster import add_address_argument, start_ray
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.algorithm.random import MARLRandomDiscreteMaskedOffPolicyAlgorithm
from tianshou.data import Collector
from tianshou.env import DummyVectorEnv
from tianshou.trainer import OffPolicyTrainerParams
from tianshou.utils.net.common import Net
from tianshou_progress import CurveLogger, log_outputs, plot_curve, report_retention, stop_at
from torch.utils.tensorboard import SummaryWriter
from tqdm.contrib.logging import logging_redirect_tqdm

from rl_dist_ext.games import play_against_random
from tianshou_plugins import (
    GorilaCollector,
    GorilaDQN,
    MultiAgentDistributedReplayBuffer,
    MultiAgentGorilaDQN,
    PettingZooFactory,
)
from tianshou_plugins.multi_agent import greedy_act

log = logging.getLogger("tianshou_multi_agent_tictactoe")

ENV = PettingZooFactory(tictactoe_v3.env)
LEARNER_SEAT = "player_2"


def win_rate(learner: GorilaDQN) -> float:
    """The greedy learner's win rate from its seat against random legal moves (200 games)."""
    act = greedy_act(learner.policy)
    return play_against_random(ENV.raw, act, games=200, seed=123, seats=[LEARNER_SEAT]).win_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env-steps", type=int, default=60_000)
    parser.add_argument("--num-actors", type=int, default=2)
    parser.add_argument("--envs-per-actor", type=int, default=4)
    parser.add_argument("--epoch-steps", type=int, default=5_000, help="env steps per test")
    parser.add_argument("--target-return", type=float, default=0.8, help="learner's mean result")
    parser.add_argument(
        "--stop-at-target",
        action="store_true",
        help="stop at the first greedy test at --target-return (default: train to --env-steps)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/tianshou_multi_agent"))
    add_address_argument(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    start_ray(args.address)

    env = ENV()
    net = Net(state_shape=(3, 3, 2), action_shape=9, hidden_sizes=[64, 64])
    policy = DiscreteQLearningPolicy(
        model=net, action_space=gym.spaces.Discrete(9), eps_inference=0.0
    )
    learner = GorilaDQN(
        policy=policy,
        optim=AdamOptimizerFactory(lr=1e-3),
        gamma=0.9,
        n_step_return_horizon=1,  # a game lasts at most 9 moves
        target_update_freq=100,
    )
    random = MARLRandomDiscreteMaskedOffPolicyAlgorithm(action_space=env.action_space)
    algorithm = MultiAgentGorilaDQN(algorithms=[random, learner], env=env)
    buffer = MultiAgentDistributedReplayBuffer(
        20_000, num_shards=2, min_size_to_sample=500, batches_per_request=4, seed=args.seed
    )
    collector = test_collector = None
    checkpoint_dir = (args.out / "checkpoint").resolve()
    writer = SummaryWriter(str(args.out / "tb"))
    logger = CurveLogger(
        writer,
        progress_fields={
            "actors steps/s": "env_steps_per_s",
            "replay": f"replay/size/{LEARNER_SEAT}",
            "policy lag": "policy_lag_mean",
            f"{LEARNER_SEAT} return": f"agent_returns/{LEARNER_SEAT}",
        },
        training_interval=1_000,
        save_interval=1,
    )

    def save_checkpoint(epoch: int, env_step: int, gradient_step: int) -> str:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        torch.save(algorithm.state_dict(), checkpoint_dir / "algorithm.pt")
        buffer.save(str(checkpoint_dir / "replay"))
        log.info("checkpoint (epoch %d, %d env steps): %s", epoch, env_step, checkpoint_dir)
        return str(checkpoint_dir)

    try:
        collector = GorilaCollector(
            algorithm,
            env_factory=ENV,
            buffer=buffer,
            num_actors=args.num_actors,
            envs_per_actor=args.envs_per_actor,
            num_cpus_per_actor=0.2,
            weight_sync_every_n_steps=128,
            seed=args.seed,
        )
        test_envs = DummyVectorEnv([ENV] * 10)
        test_envs.seed([10_000 + args.seed + i for i in range(10)])
        test_collector = Collector(algorithm.policy, test_envs)
        log.info("untrained learner's win rate against random: %.2f", win_rate(learner))
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
                    test_step_num_episodes=50,
                    # Tianshou's per-agent returns -> the learner's game results
                    multi_agent_return_reduction=lambda returns: returns[:, 1],
                    stop_fn=stop_at(args.target_return, args.stop_at_target),
                    save_checkpoint_fn=save_checkpoint,
                    logger=logger,
                    show_progress=True,
                    verbose=False,
                )
            )
        final = win_rate(learner)
        report_retention(logger, args.target_return)
        plot_curve(
            logger,
            args.out / "learning_curve.png",
            "GorilaDQN on tic-tac-toe, second seat vs random (Tianshou, rl-dist-ext)",
            target=args.target_return,
        )
    finally:
        logger.finalize()
        if test_collector is not None:
            test_collector.close()
        if collector is not None:
            collector.close()
        buffer.close()
        ray.shutdown()
    log_outputs(args.out, f"{checkpoint_dir} (algorithm and replay)")
    print(
        f"final win rate against a random player (200 games, seat {LEARNER_SEAT}): {final:.2f} "
        f"after {info.train_step} env steps in {time.perf_counter() - start:.0f} s"
    )


if __name__ == "__main__":
    main()
