"""IMPALA / V-trace on CartPole-v1 with Tianshou, on a local Ray instance.

``--num-actors`` Ray actors each run Tianshou's own ``Collector`` over ``--envs-per-actor`` envs
with a local copy of the policy and hand fixed-length trajectories (with the behaviour log-probs
and the weights version that acted) to the learner in this process, which publishes weights
the actors pull. The learner trains ``VTrace``'s default loss, APPO's form around the actors'
behaviour policy (``--eps-clip 0.1 --clip-around behaviour --targets-for old``): the targets
are computed for the policy that acted, so no trace is cut, and PPO's clipped ratio pi/mu is
the correction for policy lag; it kept the target best in the retention race.
``--eps-clip 0`` trains IMPALA's loss, where V-trace's importance weights correct the lag.
Tianshou's ``OnPolicyTrainer`` drives it unchanged (``algorithm.run_training``): a progress
bar, a greedy test (10 episodes) every ``--epoch-steps`` env steps, and a checkpoint before
each test. A
``TensorboardLogger`` writes under ``--out``/tb (throughput, policy lag, queue fill, losses,
mean importance ratio); the script trains to ``--env-steps`` (``--stop-at-target``: to the first
test at ``--target-return``), then says what the run kept after its first test at the target,
prints the final greedy return (10 episodes) and writes a learning curve PNG under ``--out``.
``--central`` runs SEED mode: one inference server acts for every actor (the actors hold no
weights).

    .venv/bin/python examples/tianshou_vtrace_cartpole.py [--env-steps 300000] [--central]
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
from ray_cluster import add_address_argument, start_ray
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.trainer import OnPolicyTrainerParams
from tianshou_progress import (
    CurveLogger,
    final_greedy_return,
    greedy_collector,
    log_outputs,
    plot_curve,
    report_retention,
    stop_at,
)
from torch.utils.tensorboard import SummaryWriter
from tqdm.contrib.logging import logging_redirect_tqdm

from tianshou_plugins import CentralInference, VTrace, VTraceCollector, mlp_actor_critic

log = logging.getLogger("tianshou_vtrace_cartpole")

ENV = "CartPole-v1"
#: env steps per update, each taken in --repeat passes of --batch-size steps under PPO's clip
#: at --lr: the retention race's choice (docs/benchmarks.md, "Retention after the target")
COLLECT_STEPS = 512


def make_env() -> gym.Env:
    return gym.make(ENV)


def make_algorithm(
    env: gym.Env,
    *,
    lr: float,
    eps_clip: float | None,
    clip_around: str | None,
    targets_for: str | None,
) -> VTrace:
    """A discrete actor (logits) and a critic, each a 64-64 MLP, trained with V-trace and, with
    ``eps_clip``, PPO's clipped surrogate (around ``clip_around``'s policy, the targets computed
    for ``targets_for``'s; ``None``: VTrace's defaults, the behaviour policy's with a clip)."""
    policy, critic = mlp_actor_critic(env.observation_space, env.action_space, (64, 64))
    return VTrace(
        policy=policy,
        critic=critic,
        optim=AdamOptimizerFactory(lr=lr),
        vf_coef=0.5,
        ent_coef=0.01,
        max_grad_norm=40.0,
        gamma=0.99,
        eps_clip=eps_clip,
        clip_around=clip_around,
        targets_for=targets_for,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env-steps", type=int, default=300_000)
    parser.add_argument("--num-actors", type=int, default=2)
    parser.add_argument("--envs-per-actor", type=int, default=8)
    parser.add_argument("--steps-per-env", type=int, default=32, help="trajectory length T")
    parser.add_argument("--cpus-per-actor", type=float, default=0.25, help="Ray CPUs reserved")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=128, help="env steps per gradient step")
    parser.add_argument(
        "--collect-steps", type=int, default=COLLECT_STEPS, help="env steps per update"
    )
    parser.add_argument("--repeat", type=int, default=4, help="passes over each update's steps")
    parser.add_argument(
        "--eps-clip",
        type=float,
        default=0.1,
        help="PPO's clipped surrogate on the advantages (0: IMPALA's plain V-trace loss, which "
        "forgets the target with 4 passes; with it, use --repeat 1 --batch-size 512)",
    )
    parser.add_argument(
        "--clip-around",
        choices=("behaviour", "arrival"),
        help="the policy the clip's ratios are to: the actors' (behaviour, the default) or the "
        "learner's as each update's batch arrived; needs --eps-clip above 0",
    )
    parser.add_argument(
        "--targets-for",
        choices=("old", "current"),
        help="the policy V-trace's targets are computed for: the clip's (old, APPO's form, the "
        "default) or the learner's; needs --eps-clip above 0",
    )
    parser.add_argument("--epoch-steps", type=int, default=20_000, help="env steps per test")
    parser.add_argument("--target-return", type=float, default=475.0)
    parser.add_argument(
        "--stop-at-target",
        action="store_true",
        help="stop at the first greedy test at --target-return (default: train to --env-steps)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--central", action="store_true", help="SEED mode: an inference server")
    parser.add_argument("--out", type=Path, default=Path("runs/tianshou_vtrace"))
    add_address_argument(parser)
    args = parser.parse_args()
    if not args.eps_clip:
        for flag, value in (
            ("--clip-around", args.clip_around),
            ("--targets-for", args.targets_for),
        ):
            if value is not None:
                parser.error(f"{flag} {value} needs --eps-clip above 0 (0: IMPALA's plain loss)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    start_ray(args.address)

    env = make_env()
    eps_clip = args.eps_clip or None
    algorithm = make_algorithm(
        env,
        lr=args.lr,
        eps_clip=eps_clip,
        clip_around=args.clip_around,
        targets_for=args.targets_for,
    )
    env.close()
    collector = test_collector = None
    checkpoint_dir = (args.out / "checkpoint").resolve()
    writer = SummaryWriter(str(args.out / "tb"))
    logger = CurveLogger(
        writer,
        progress_fields={
            "actors steps/s": "env_steps_per_s",
            "policy lag": "policy_lag_mean",
            "queue fill": "queue_fill",
            "server batch": "inference/mean_batch_rows",
        },
        training_interval=1_000,
        update_interval=10,  # gradient steps (--repeat per --batch-size env steps)
        save_interval=1,
    )

    def save_checkpoint(epoch: int, env_step: int, gradient_step: int) -> str:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        torch.save(algorithm.state_dict(), checkpoint_dir / "algorithm.pt")
        log.info("checkpoint (epoch %d, %d env steps): %s", epoch, env_step, checkpoint_dir)
        return str(checkpoint_dir)

    try:
        collector = VTraceCollector(
            algorithm,
            env_factory=make_env,
            num_actors=args.num_actors,
            envs_per_actor=args.envs_per_actor,
            steps_per_env=args.steps_per_env,
            num_cpus_per_actor=args.cpus_per_actor,
            seed=args.seed,
            central_inference=CentralInference(num_cpus=0.25) if args.central else None,
        )
        test_collector = greedy_collector(
            algorithm.policy, make_env, episodes=10, seed=10_000 + args.seed
        )
        start = time.perf_counter()
        with logging_redirect_tqdm():
            info = algorithm.run_training(
                OnPolicyTrainerParams(
                    training_collector=collector,
                    test_collector=test_collector,
                    max_epochs=max(1, math.ceil(args.env_steps / args.epoch_steps)),
                    epoch_num_steps=args.epoch_steps,
                    collection_step_num_env_steps=args.collect_steps,
                    batch_size=args.batch_size,
                    update_step_num_repetitions=args.repeat,
                    test_step_num_episodes=10,
                    stop_fn=stop_at(args.target_return, args.stop_at_target),
                    save_checkpoint_fn=save_checkpoint,
                    logger=logger,
                    show_progress=True,
                    verbose=False,  # Tianshou logs each test result through `logging` anyway
                )
            )
        final = final_greedy_return(algorithm.policy, make_env)
        loss = (
            f"clip {eps_clip}, {algorithm.clip_around}, targets {algorithm.targets_for}"
            if eps_clip
            else "IMPALA"
        )
        title = f"V-trace ({loss}) on CartPole-v1 (Tianshou, rl-dist-ext)"
        report_retention(logger, args.target_return)
        plot_curve(logger, args.out / "learning_curve.png", title, target=args.target_return)
    finally:
        logger.finalize()
        if test_collector is not None:
            test_collector.close()
        if collector is not None:
            collector.close()
        ray.shutdown()
    log_outputs(args.out, str(checkpoint_dir))
    print(
        f"final greedy evaluation return (10 episodes): {final:.1f} after {info.train_step} "
        f"env steps in {time.perf_counter() - start:.0f} s"
    )


if __name__ == "__main__":
    main()
