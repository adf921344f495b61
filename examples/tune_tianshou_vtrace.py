"""A Tune sweep of Tianshou VTrace (IMPALA) on CartPole-v1: a function trainable around
Tianshou's on-policy trainer.

Each trial is ``train_vtrace(config)``: it builds the algorithm (the same actor and critic as
``examples/tianshou_vtrace_cartpole.py``) and a ``VTraceCollector`` (its Ray actors step 8
envs each with a local copy of the policy and hand trajectories to the learner in the trial's
process) and calls ``algorithm.run_training(...)``. A ``TuneReporter`` logger reports every
epoch to Tune after the epoch's greedy test (5 episodes): the test return, the collector's
throughput, policy lag and queue fields, the losses and the trainer's counters, with a
checkpoint of the algorithm (weights, optimizer, counters; V-trace keeps no replay).
``tianshou_plugins.tune.trial_resources`` declares the trial's whole footprint (the learner 0.5
CPU, one actor 0.3 CPU: 0.8 CPU), and the actor runs inside the trial's placement group, so a
2-core laptop runs 2 trials at once. A trial that fails restarts from its last checkpoint
(``--max-failures``). At the end the script prints the best trial's config and test return and
plots every trial's test curve to ``<--out>/learning_curve.png``.

    python examples/tune_tianshou_vtrace.py [--lr 5e-4 1e-3] [--ent-coef 0.0 0.01]
        [--max-env-steps 150000] [--storage-path ~/ray_results]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import ray
from sweep_footprint import run_tianshou_sweep

from tianshou_plugins.tune import trial_resources

ENV = "CartPole-v1"
LEARNER_CPUS, ACTOR_CPUS = 0.5, 0.3

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--lr", type=float, nargs="+", default=[5e-4, 1e-3])
parser.add_argument("--ent-coef", type=float, nargs="+", default=[0.0, 0.01])
parser.add_argument("--max-env-steps", type=int, default=150_000)
parser.add_argument("--epoch-steps", type=int, default=10_000, help="env steps per report")
parser.add_argument("--envs-per-actor", type=int, default=8)
parser.add_argument("--max-failures", type=int, default=2, help="restarts of a failed trial")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--storage-path", default=None, help="Tune's storage (default ~/ray_results)")
parser.add_argument("--out", type=Path, default=Path("runs/tune_tianshou_vtrace"))


def train_vtrace(config: dict) -> None:
    """One trial: Tianshou VTrace with ``config``'s lr and entropy weight, reporting every
    epoch."""
    import gymnasium as gym
    import torch
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Collector
    from tianshou.env import DummyVectorEnv
    from tianshou.trainer import OnPolicyTrainerParams

    from tianshou_plugins import VTrace, VTraceCollector, mlp_actor_critic
    from tianshou_plugins.tune import TuneReporter

    torch.set_num_threads(1)
    torch.manual_seed(config["seed"])
    env = gym.make(ENV)
    policy, critic = mlp_actor_critic(env.observation_space, env.action_space, (64, 64))
    env.close()
    algorithm = VTrace(
        policy=policy,
        critic=critic,
        optim=AdamOptimizerFactory(lr=config["lr"]),
        vf_coef=0.5,
        ent_coef=config["ent_coef"],
        max_grad_norm=40.0,
        gamma=0.99,
    )

    def save(folder: Path) -> None:
        torch.save(algorithm.state_dict(), folder / "algorithm.pt")

    def load(folder: Path) -> None:
        algorithm.load_state_dict(torch.load(folder / "algorithm.pt", weights_only=False))

    collector = test_collector = None
    try:
        collector = VTraceCollector(
            algorithm,
            env_factory=lambda: gym.make(ENV),
            num_actors=1,
            envs_per_actor=config["envs_per_actor"],
            steps_per_env=32,
            num_cpus_per_actor=ACTOR_CPUS,
            seed=config["seed"],
        )
        test_envs = DummyVectorEnv([lambda: gym.make(ENV)] * 5)
        test_envs.seed([10_000 + i for i in range(5)])
        test_collector = Collector(policy, test_envs)
        algorithm.run_training(
            OnPolicyTrainerParams(
                training_collector=collector,
                test_collector=test_collector,
                max_epochs=math.ceil(config["max_env_steps"] / config["epoch_steps"]),
                epoch_num_steps=config["epoch_steps"],
                collection_step_num_env_steps=512,
                batch_size=512,  # one gradient step per collected batch
                update_step_num_repetitions=1,
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


def main(argv: list[str] | None = None):
    args = parser.parse_args(argv)
    if not ray.is_initialized():
        ray.init()
    resources = trial_resources(
        num_actors=1, num_cpus_per_actor=ACTOR_CPUS, num_cpus_for_learner=LEARNER_CPUS
    )
    return run_tianshou_sweep(
        train_vtrace,
        resources,
        {"lr": args.lr, "ent_coef": args.ent_coef},
        {
            "max_env_steps": args.max_env_steps,
            "epoch_steps": args.epoch_steps,
            "envs_per_actor": args.envs_per_actor,
            "seed": args.seed,
        },
        name="tune_tianshou_vtrace",
        algorithm="VTrace",
        args=args,
        label=lambda config: f"lr {config['lr']:g}, entropy {config['ent_coef']:g}",
    )


if __name__ == "__main__":
    main()
