"""Wall-clock to a greedy mean return of 10 on MinAtar Breakout: GorilaDQN (RLlib and Tianshou)
vs RLlib's DQN and Tianshou's DQN, side by side in one run.

Every algorithm learns with one DQN recipe, so that the race is about how fast each framework
and layout turns env steps into updates: the MinAtar paper's network (Young & Tian 2019: conv 16
3x3/1, a 128-unit layer; uint8 frames scaled at the first layer), Adam ``--lr``, batch 32,
gamma 0.99, 3-step returns, a 100k-row replay that starts sampling at ``--learning-starts``
rows (5k), 8 replayed rows
per inserted row (one update of 32 per 4 env steps), a hard target update every 1,000 updates.
Exploration and replay are each algorithm's own: RLlib and Tianshou DQN decay epsilon 1.0 ->
0.05 over the first 50k env steps, GorilaDQN gives each actor its own Ape-X epsilon; RLlib DQN
and GorilaDQN replay by priority (alpha 0.6, beta 0.4), Tianshou DQN uniformly (its default).
``--rllib-dqn-replay uniform`` and ``--rllib-dqn-n-step`` tune RLlib's DQN away from the recipe
(its uniform ``EpisodeReplayBuffer``, another n).

Layouts (2 cores): GorilaDQN with ``--runners`` x ``--envs-per-runner`` (learner in the driver,
one replay shard, its rate limiter holding the ratio); RLlib DQN sampling in the driver with
``--dqn-envs`` envs (RLlib's fastest layout here for CartPole, ``rllib_dqn_layouts.md``); Tianshou
DQN over ``--dqn-envs`` ``DummyVectorEnv`` envs (MinAtar steps take microseconds, so subprocess
envs only add overhead).

The clock counts training only. RLlib runs are evaluated every ``--eval-every-s`` seconds of
training (a 10-episode greedy test; when it averages >= the target, a second 10-episode test on
other seeds decides); Tianshou runs are tested by Tianshou's trainer every ``--epoch-steps`` env
steps (10 greedy episodes, test time counted, as in the CartPole races). Evaluation episodes are
capped at ``--eval-max-steps`` steps. Each run gets a fresh ``ray.init(num_cpus=2)``.

Writes ``benchmarks/results/minatar_race.{json,md,png}`` (the PNG: every run's test returns
against training seconds)::

    .venv/bin/python benchmarks/minatar_race.py [--seeds 0 1 2] [--max-seconds 600]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
from race import fmt_seconds as fmt
from race import median_or_none, race_each_in_fresh_ray, rllib_time_to_target
from results_files import write_results

RESULTS = Path(__file__).parent / "results"
GAME = "breakout"
ALGOS = ("gorila-rllib", "dqn-rllib", "gorila-tianshou", "dqn-tianshou")
GORILAS = ("gorila-rllib", "gorila-tianshou")
RATIO_TARGET = 0.5
#: the MinAtar paper's network in RLlib's terms: one 3x3 convolution of 16, then 128 units
MINATAR_CONV = [[16, 3, 1, "valid"]]
MINATAR_HIDDEN = [128]
EPSILON_STEPS = 50_000
CAPACITY = 100_000
TARGET_UPDATE_UPDATES = 1_000
BATCH = 32
SAMPLES_PER_INSERT = 8
GAMMA = 0.99
N_STEP = 3


#: RLlib DQN's replay kinds: prioritized is its default (as in its CartPole race)
RLLIB_DQN_REPLAY = {
    "prioritized": {
        "type": "PrioritizedEpisodeReplayBuffer",
        "capacity": CAPACITY,
        "alpha": 0.6,
        "beta": 0.4,
    },
    "uniform": {"type": "EpisodeReplayBuffer", "capacity": CAPACITY},
}


def rllib_recipe(args) -> dict:
    """The recipe's ``.training()`` settings both RLlib arms share."""
    return {
        "lr": args.lr,
        "gamma": GAMMA,
        "n_step": N_STEP,
        "train_batch_size_per_learner": BATCH,
        "double_q": True,
        "dueling": False,
    }


def rllib_model_config():
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    return DefaultModelConfig(conv_filters=MINATAR_CONV, head_fcnet_hiddens=MINATAR_HIDDEN)


def gorila_rllib_config(seed: int, args):
    from rl_dist_ext.replay import ObsCompression
    from rllib_plugins import GorilaDQNConfig
    from rllib_plugins.pixels import pixel_env

    return (
        GorilaDQNConfig()
        .environment(pixel_env(f"minatar:{GAME}"))
        .env_runners(num_env_runners=args.runners, num_envs_per_env_runner=args.envs_per_runner)
        .learners(num_learners=0)
        .training(**rllib_recipe(args), target_update_every_n_updates=TARGET_UPDATE_UPDATES)
        .replay(
            num_shards=1,
            capacity=CAPACITY,
            min_size_to_sample=args.learning_starts,
            samples_per_insert=SAMPLES_PER_INSERT,
            compression=ObsCompression(),
        )
        .rl_module(model_config=rllib_model_config())
        .reporting(min_sample_timesteps_per_iteration=1_000)
        .debugging(seed=seed)
    )


def dqn_rllib_config(seed: int, args):
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from rllib_plugins.action_masking import ActionMaskingDQNTorchRLModule
    from rllib_plugins.pixels import pixel_env

    return (
        DQNConfig()
        .environment(pixel_env(f"minatar:{GAME}"))
        .env_runners(num_env_runners=0, num_envs_per_env_runner=args.dqn_envs)
        .learners(num_learners=0)
        .training(
            **(rllib_recipe(args) | {"n_step": args.rllib_dqn_n_step}),
            training_intensity=SAMPLES_PER_INSERT,
            num_steps_sampled_before_learning_starts=args.learning_starts,
            # RLlib counts the target period in env steps: 1,000 updates = 4,000 env steps
            target_network_update_freq=TARGET_UPDATE_UPDATES * BATCH // SAMPLES_PER_INSERT,
            replay_buffer_config=RLLIB_DQN_REPLAY[args.rllib_dqn_replay],
            num_atoms=1,
            noisy=False,
            epsilon=[(0, 1.0), (EPSILON_STEPS, 0.05)],
        )
        # RLlib's DQN module; this subclass only turns uint8 frames into floats at its input
        .rl_module(
            rl_module_spec=RLModuleSpec(module_class=ActionMaskingDQNTorchRLModule),
            model_config=rllib_model_config(),
        )
        .reporting(min_sample_timesteps_per_iteration=1_000)
        .debugging(seed=seed)
    )


def rllib_run(algo_name: str, seed: int, args) -> dict:
    import rllib_plugins  # noqa: F401  (registers GorilaDQN)
    from rllib_plugins.pixels import PixelEnvCreator

    build = gorila_rllib_config if algo_name == "gorila-rllib" else dqn_rllib_config
    algo = build(seed, args).build_algo()
    return rllib_time_to_target(
        algo,
        seed=seed,
        max_seconds=args.max_seconds,
        eval_every_s=args.eval_every_s,
        greedy_module=lambda a: a.get_module(),
        target=args.target,
        eval_env=PixelEnvCreator(f"minatar:{GAME}"),
        screen_episodes=10,
        eval_max_steps=args.eval_max_steps,
    )


def tianshou_policy(seed: int, eps_training: float):
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy

    from rl_dist_ext.pixel_envs import make_minatar
    from tianshou_plugins.pixels import pixel_q_network

    torch.manual_seed(seed)
    np.random.seed(seed)
    env = make_minatar(GAME)
    net = pixel_q_network(env.observation_space, env.action_space)
    policy = DiscreteQLearningPolicy(
        model=net, action_space=env.action_space, eps_training=eps_training, eps_inference=0.0
    )
    env.close()
    return policy


def tianshou_tests(policy, seed: int, clock, args):
    from tianshou.env import DummyVectorEnv
    from tianshou_race import TEST_EPISODES, RecordingCollector

    from rl_dist_ext.pixel_envs import make_minatar

    maker = partial(make_minatar, GAME, max_episode_steps=args.eval_max_steps)
    envs = DummyVectorEnv([maker] * TEST_EPISODES)
    envs.seed([50_000 + 100 * seed + i for i in range(TEST_EPISODES)])
    return RecordingCollector(policy, envs, clock)


def tianshou_run(algo_name: str, seed: int, args) -> dict:
    from tianshou.algorithm import DQN
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Collector, VectorReplayBuffer
    from tianshou.env import DummyVectorEnv
    from tianshou_race import RunClock, train_until_target

    from rl_dist_ext.pixel_envs import make_minatar
    from rl_dist_ext.replay import ObsCompression
    from tianshou_plugins import DistributedPrioritizedReplayBuffer, GorilaCollector, GorilaDQN

    clock = RunClock(args.max_seconds, target=args.target)
    steps = {
        "collection_step_num_env_steps": 4 * args.dqn_envs,
        "update_step_num_gradient_steps_per_sample": SAMPLES_PER_INSERT / BATCH,
        "batch_size": BATCH,
    }
    if algo_name == "dqn-tianshou":
        policy = tianshou_policy(seed, eps_training=1.0)
        algorithm = DQN(
            policy=policy,
            optim=AdamOptimizerFactory(lr=args.lr),
            gamma=GAMMA,
            n_step_return_horizon=N_STEP,
            target_update_freq=TARGET_UPDATE_UPDATES,
        )
        envs = DummyVectorEnv([partial(make_minatar, GAME)] * args.dqn_envs)
        envs.seed([seed * 100 + i for i in range(args.dqn_envs)])
        training = Collector(policy, envs, VectorReplayBuffer(CAPACITY, args.dqn_envs))
        training.reset()
        training.collect(n_step=args.learning_starts, random=True)
        decay = clock.training_fn

        def training_fn(epoch: int, env_step: int) -> None:  # epsilon 1.0 -> 0.05 over 50k
            policy.set_eps_training(max(0.05, 1.0 - 0.95 * env_step / EPSILON_STEPS))
            decay(epoch, env_step)

        clock.training_fn = training_fn
        test = tianshou_tests(policy, seed, clock, args)
        try:
            return train_until_target(algorithm, training, test, clock, args, **steps)
        finally:
            training.close()
            test.close()
    policy = tianshou_policy(seed, eps_training=0.0)
    buffer = DistributedPrioritizedReplayBuffer(
        CAPACITY,
        num_shards=1,
        min_size_to_sample=args.learning_starts,
        samples_per_insert=SAMPLES_PER_INSERT,
        compression=ObsCompression(),
        seed=seed,
    )
    algorithm = GorilaDQN(
        policy=policy,
        optim=AdamOptimizerFactory(lr=args.lr),
        gamma=GAMMA,
        n_step_return_horizon=N_STEP,
        target_update_freq=TARGET_UPDATE_UPDATES,
    )
    collector = GorilaCollector(
        algorithm,
        env_factory=partial(make_minatar, GAME),
        buffer=buffer,
        num_actors=args.runners,
        envs_per_actor=args.envs_per_runner,
    )
    test = tianshou_tests(policy, seed, clock, args)
    try:
        steps["collection_step_num_env_steps"] = 256
        return train_until_target(algorithm, collector, test, clock, args, **steps)
    finally:
        collector.close()
        buffer.close()
        test.close()


def run_one(algo_name: str, env: str, seed: int, args) -> dict:
    if algo_name.endswith("-rllib"):
        return rllib_run(algo_name, seed, args)
    return tianshou_run(algo_name, seed, args)


def best_return(run: dict) -> float | None:
    """A run's best greedy test return (RLlib runs: their screens; Tianshou: the trainer's)."""
    return run.get("best_screen_return", run.get("best_test_return"))


def plot(runs: dict[str, list[dict]], path: Path, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for color, (name, by_seed) in zip(plt.cm.tab10.colors, runs.items(), strict=False):
        for i, run in enumerate(by_seed):
            if run["curve"]:
                seconds, _, returns = zip(*run["curve"], strict=True)
                ax.plot(seconds, returns, color=color, alpha=0.8, label=name if i == 0 else None)
    ax.axhline(target, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("training seconds")
    ax.set_ylabel("greedy mean return (10 episodes)")
    ax.set_title(f"MinAtar {GAME}: every seed")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--algos", nargs="+", default=list(ALGOS), choices=ALGOS)
    parser.add_argument("--target", type=float, default=10.0, help="greedy mean return")
    parser.add_argument("--max-seconds", type=float, default=600.0)
    parser.add_argument("--eval-every-s", type=float, default=20.0, help="RLlib runs")
    parser.add_argument("--epoch-steps", type=int, default=20_000, help="Tianshou runs")
    parser.add_argument("--eval-max-steps", type=int, default=2_000)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--learning-starts", type=int, default=5_000, help="replay rows")
    parser.add_argument("--runners", type=int, default=2, help="GorilaDQN actors")
    parser.add_argument("--envs-per-runner", type=int, default=4)
    parser.add_argument("--dqn-envs", type=int, default=4, help="RLlib / Tianshou DQN envs")
    parser.add_argument(
        "--rllib-dqn-replay",
        choices=sorted(RLLIB_DQN_REPLAY),
        default="prioritized",
        help="RLlib DQN's replay buffer (tuning; the recipe replays by priority)",
    )
    parser.add_argument(
        "--rllib-dqn-n-step", type=int, default=N_STEP, help="RLlib DQN's n (tuning)"
    )
    parser.add_argument("--name", default="minatar_race")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)

    env = f"minatar:{GAME}"
    runs = race_each_in_fresh_ray(
        [env], args.seeds, args.algos, lambda a, e, s: run_one(a, e, s, args)
    )[env]
    medians = {
        name: median_or_none([run["seconds_to_target"] for run in runs[name]])
        for name in args.algos
    }
    gorilas = [name for name in args.algos if name in GORILAS]
    dqns = [name for name in args.algos if name not in GORILAS]
    inf = float("inf")

    def fastest(name: str) -> tuple[float, float]:
        """Median time, then (among arms that never got there) the higher best return."""
        return (medians[name] or inf, -max(best_return(run) or 0.0 for run in runs[name]))

    best_gorila = min(gorilas, key=fastest, default=None)
    best_dqn = min(dqns, key=fastest, default=None)
    g = medians.get(best_gorila) if best_gorila else None
    d = medians.get(best_dqn) if best_dqn else None
    if g is not None and d is not None:
        ratio, bound = g / d, "="
    elif g is not None and best_dqn is not None:
        ratio, bound = g / args.max_seconds, "<"  # no DQN got there within the cap
    else:
        ratio, bound = None, "n/a"
    report = {
        "benchmark": args.name,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "params": vars(args) | {"out": str(args.out), "env": env},
        "runs": runs,
        "summary": {
            "median_s": medians,
            "best_gorila": best_gorila,
            "best_dqn": best_dqn,
            "ratio": ratio,
            "ratio_bound": bound,
            "target_ratio": RATIO_TARGET,
        },
    }
    rllib_dqn = (
        f" (RLlib DQN: {args.rllib_dqn_replay} replay, {args.rllib_dqn_n_step}-step)"
        if "dqn-rllib" in args.algos
        else ""
    )
    lines = [
        f"# MinAtar {GAME}: wall-clock to a greedy mean return of {args.target:g}",
        "",
        f"Seeds {args.seeds}; one DQN recipe (MinAtar network, Adam lr {args.lr:g}, batch "
        f"{BATCH}, 3-step, {SAMPLES_PER_INSERT} replayed rows per inserted row, target every "
        f"{TARGET_UPDATE_UPDATES} updates); GorilaDQN {args.runners} actors x "
        f"{args.envs_per_runner} envs, DQN {args.dqn_envs} envs in the driver{rllib_dqn}; cap "
        f"{args.max_seconds:.0f} s of training per run; {report['machine']['cpus']} CPUs, one "
        f"run ({report['date']} UTC).",
        "",
        "| algorithm | seed | seconds to target | env steps | best test return |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in args.algos:
        for run in runs[name]:
            best = best_return(run)
            lines.append(
                f"| {name} | {run['seed']} | {fmt(run['seconds_to_target'])} | "
                f"{run['env_steps']:,} | {best if best is None else round(best, 2)} |"
            )
    ratio_text = "n/a" if ratio is None else f"{bound} {ratio:.2f}"
    lines += [
        "",
        "| " + " | ".join(f"{name} median" for name in args.algos) + " | ratio | target |",
        "|" + "---:|" * (len(args.algos) + 2),
        "| "
        + " | ".join(fmt(medians[name]) for name in args.algos)
        + f" | {ratio_text} ({best_gorila} vs {best_dqn}) | <= {RATIO_TARGET} |",
        "",
        "A median counts runs that never reached the target as infinitely slow; the ratio is the "
        "faster GorilaDQN's median over the faster DQN's (bounded by the cap when no DQN got "
        f"there). Curves: `{args.name}.png`.",
    ]
    write_results(args.out / args.name, report, lines)
    plot(runs, args.out / f"{args.name}.png", args.target)


if __name__ == "__main__":
    main()
