"""A Tune sweep of Tianshou GorilaDQN on CartPole-v1: a function trainable around Tianshou's
trainer.

Each trial is ``train_gorila(config)``: it builds the algorithm, a ``GorilaCollector`` (its
Ray actors act with their own Ape-X epsilons) and a ``DistributedPrioritizedReplayBuffer``
(its shards are Ray actors) and calls ``algorithm.run_training(...)``. A ``TuneReporter``
logger reports every epoch to Tune after the epoch's greedy test (5 episodes): the test return,
the collector's throughput, policy lag and replay fields, the trainer's counters, and a
checkpoint with the algorithm and its replay. ``tianshou_plugins.tune.trial_resources``
declares the trial's whole footprint (the learner 0.5 CPU, one actor with 4 envs 0.3, one
replay shard 0.2: 1 CPU), and every actor and shard a trial starts runs inside its placement
group, so a 2-core laptop runs 2 trials at once. A trial that fails restarts from its last
checkpoint, the replay included (``--max-failures``). At the end the script prints the best
trial's config and test return and plots every trial's test curve to
``<--out>/learning_curve.png``.

    python examples/tune_tianshou_gorila.py [--lr 5e-4 1e-3] [--n-step 1 3]
        [--max-env-steps 60000] [--storage-path ~/ray_results]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import ray
from sweep_footprint import run_tianshou_sweep

from tianshou_plugins.tune import trial_resources

ENV = "CartPole-v1"
LEARNER_CPUS, ACTOR_CPUS, SHARD_CPUS = 0.5, 0.3, 0.2

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--lr", type=float, nargs="+", default=[5e-4, 1e-3])
parser.add_argument("--n-step", type=int, nargs="+", default=[1, 3])
parser.add_argument("--max-env-steps", type=int, default=60_000)
parser.add_argument("--epoch-steps", type=int, default=5_000, help="env steps per report")
parser.add_argument("--max-failures", type=int, default=2, help="restarts of a failed trial")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--storage-path", default=None, help="Tune's storage (default ~/ray_results)")
parser.add_argument("--out", type=Path, default=Path("runs/tune_tianshou_gorila"))


def train_gorila(config: dict) -> None:
    """One trial: Tianshou GorilaDQN with ``config``'s lr and n-step, reporting every epoch."""
    import gymnasium as gym
    import torch
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Collector
    from tianshou.env import DummyVectorEnv
    from tianshou.trainer import OffPolicyTrainerParams
    from tianshou.utils.net.common import Net

    from tianshou_plugins import DistributedPrioritizedReplayBuffer, GorilaCollector, GorilaDQN
    from tianshou_plugins.tune import TuneReporter

    torch.set_num_threads(1)
    torch.manual_seed(config["seed"])
    env = gym.make(ENV)
    net = Net(
        state_shape=env.observation_space.shape,
        action_shape=env.action_space.n,
        hidden_sizes=[128, 128],
    )
    policy = DiscreteQLearningPolicy(model=net, action_space=env.action_space, eps_inference=0.0)
    env.close()
    algorithm = GorilaDQN(
        policy=policy,
        optim=AdamOptimizerFactory(lr=config["lr"]),
        gamma=0.99,
        n_step_return_horizon=config["n_step"],
        target_update_freq=250,
    )
    max_epochs = math.ceil(config["max_env_steps"] / config["epoch_steps"])
    # the whole trial (each epoch's env steps and up to one collect step past it): a replay
    # that drops the early falls lets a learned policy forget (docs/tianshou.md)
    whole_trial = max(1_000, max_epochs * (config["epoch_steps"] + 256))
    buffer = DistributedPrioritizedReplayBuffer(
        whole_trial,
        num_shards=1,
        num_cpus_per_shard=SHARD_CPUS,
        min_size_to_sample=1_000,
        batches_per_request=4,
        seed=config["seed"],
    )

    def save(folder: Path) -> None:
        torch.save(algorithm.state_dict(), folder / "algorithm.pt")
        buffer.save(str(folder / "replay"))

    def load(folder: Path) -> None:
        algorithm.load_state_dict(torch.load(folder / "algorithm.pt", weights_only=False))
        buffer.restore(str(folder / "replay"))

    collector = test_collector = None
    try:
        collector = GorilaCollector(
            algorithm,
            env_factory=lambda: gym.make(ENV),
            buffer=buffer,
            num_actors=1,
            envs_per_actor=4,
            num_cpus_per_actor=ACTOR_CPUS,
            seed=config["seed"],
        )
        test_envs = DummyVectorEnv([lambda: gym.make(ENV)] * 5)
        test_envs.seed([10_000 + i for i in range(5)])
        test_collector = Collector(policy, test_envs)
        algorithm.run_training(
            OffPolicyTrainerParams(
                training_collector=collector,
                test_collector=test_collector,
                max_epochs=max_epochs,
                epoch_num_steps=config["epoch_steps"],
                collection_step_num_env_steps=256,
                update_step_num_gradient_steps_per_sample=0.25,
                batch_size=128,
                test_step_num_episodes=5,
                logger=TuneReporter(save=save, load=load),
                resume_from_log=True,  # a restarted trial goes on from its checkpoint
                show_progress=False,
            )
        )
    finally:
        if test_collector is not None:
            test_collector.close()
        if collector is not None:
            collector.close()
        buffer.close()


def main(argv: list[str] | None = None):
    args = parser.parse_args(argv)
    if not ray.is_initialized():
        ray.init()
    resources = trial_resources(
        num_actors=1,
        num_cpus_per_actor=ACTOR_CPUS,
        num_shards=1,
        num_cpus_per_shard=SHARD_CPUS,
        num_cpus_for_learner=LEARNER_CPUS,
    )
    return run_tianshou_sweep(
        train_gorila,
        resources,
        {"lr": args.lr, "n_step": args.n_step},
        {
            "max_env_steps": args.max_env_steps,
            "epoch_steps": args.epoch_steps,
            "seed": args.seed,
        },
        name="tune_tianshou_gorila",
        algorithm="GorilaDQN",
        args=args,
        label=lambda config: f"lr {config['lr']:g}, n-step {config['n_step']}",
    )


if __name__ == "__main__":
    main()
