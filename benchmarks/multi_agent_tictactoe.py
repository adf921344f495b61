"""Wall-clock to a win rate against a random player on PettingZoo tic-tac-toe: GorilaDQN vs each
framework's own multi-agent DQN, side by side in one run.

The learner plays against uniformly random legal moves; action masks are honoured by every arm
(RLlib: rl-dist-ext's ``ActionMaskingDQNTorchRLModule`` for both algorithms, RLlib's default DQN
module cannot read masked observations; Tianshou: its DQN policy reads ``obs.mask``).

- ``gorila-rllib``: GorilaDQN, 2 env runners x 4 envs, 2 replay shards, learner in the driver,
  seats alternating per episode (``AlternatingSeats``); n-step 1, gamma 0.9, lr 1e-3, batch 128,
  target every 100 updates, 16 sampled rows per env step (the rate limiter).
- ``dqn-rllib``: RLlib's DQN with ``MultiAgentPrioritizedEpisodeReplayBuffer``, the same module,
  seats, n-step, gamma, lr, batch and target period (in env steps: 500), epsilon 1.0 -> 0.05
  over 10k steps, sampling in the driver (``num_env_runners=0``; its fastest layout here, see
  ARCHITECTURE.md) with ``--rllib-dqn-envs`` envs.
- ``gorila-tianshou``: ``MultiAgentGorilaDQN`` from the second seat against Tianshou's
  ``MARLRandomDiscreteMaskedOffPolicyAlgorithm`` (Tianshou's dispatcher has fixed seats), 2
  actors x 4 envs, 0.25 gradient steps of 128 per env step, target every 100 steps.
- ``dqn-tianshou``: Tianshou's ``MultiAgentOffPolicyAlgorithm`` with its DQN in the same seat
  and settings (epsilon 0.1 while training), ``VectorReplayBuffer`` and ``DummyVectorEnv`` of
  ``--tianshou-dqn-envs`` envs, Tianshou's ``OffPolicyTrainer``; ``dqn-tianshou-example``: the
  same with the settings of Tianshou's own tic-tac-toe example (``TIANSHOU_SETTINGS``).

Every ``--eval-every-s`` seconds of training the greedy learner plays 100 games against random
(RLlib: both seats; Tianshou: the second seat); when that reaches ``--target``, 400 games
decide. Evaluation time is not counted (asynchronous actors keep their queued rollouts going
meanwhile). Writes ``benchmarks/results/<--name>.{json,md}``::

    .venv/bin/python benchmarks/multi_agent_tictactoe.py [--seeds 0 1 2] [--max-seconds 300]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import ray
import torch
from pettingzoo.classic import tictactoe_v3
from race import fmt_seconds as fmt
from race import median_or_none

from rl_dist_ext.games import play_against_random

RESULTS = Path(__file__).parent / "results"
ALGOS = ("gorila-rllib", "dqn-rllib", "gorila-tianshou", "dqn-tianshou", "dqn-tianshou-example")
#: Tianshou's arms: network, DQN and trainer settings. ``dqn-tianshou-example`` is Tianshou's own
#: tic-tac-toe example (``examples/pettingzoo/pettingzoo_tic_tac_toe.py``): 4 x 128 units, lr
#: 1e-4, 3-step returns, target every 320 steps, 10 env steps per collect, 0.1 gradient steps of
#: 64 per env step, 10 envs.
TIANSHOU_SETTINGS = {
    "same": {
        "hidden": [64, 64],
        "lr": 1e-3,
        "dqn": {"gamma": 0.9, "n_step_return_horizon": 1, "target_update_freq": 100},
        "trainer": {
            "collection_step_num_env_steps": 256,
            "update_step_num_gradient_steps_per_sample": 0.25,
            "batch_size": 128,
        },
    },
    "example": {
        "hidden": [128, 128, 128, 128],
        "lr": 1e-4,
        "dqn": {"gamma": 0.9, "n_step_return_horizon": 3, "target_update_freq": 320},
        "trainer": {
            "collection_step_num_env_steps": 10,
            "update_step_num_gradient_steps_per_sample": 0.1,
            "batch_size": 64,
        },
        "envs": 10,
    },
}
TARGET_RATIO = 0.5
SEATS = ("player_1", "player_2")
TIANSHOU_SEAT = "player_2"


class Reached(Exception):
    """The learner reached the target (ends a Tianshou run from inside its trainer)."""


class RaceClock:
    """Training seconds (evaluation excluded), evaluation every ``every_s`` of them."""

    def __init__(self, args, evaluate: Callable[[int], float]) -> None:
        self.args = args
        self.evaluate = evaluate  # games -> win rate
        self.trained = 0.0
        self.last_eval = 0.0
        self.seconds_to_target: float | None = None
        self.best = 0.0
        self.checks: list[tuple[float, float]] = []
        self._since = time.perf_counter()

    def resume(self) -> None:
        self._since = time.perf_counter()

    def pause(self) -> None:
        self.trained += time.perf_counter() - self._since

    def check(self) -> bool:
        """(Clock paused.) Evaluate if due; ``True`` when the target is reached."""
        if self.trained - self.last_eval < self.args.eval_every_s:
            return False
        self.last_eval = self.trained
        screen = self.evaluate(100)
        self.best = max(self.best, screen)
        self.checks.append((round(self.trained, 1), screen))
        if screen >= self.args.target and self.evaluate(400) >= self.args.target:
            self.seconds_to_target = self.trained
            return True
        return False

    def done(self) -> bool:
        return self.seconds_to_target is not None or self.trained >= self.args.max_seconds

    def result(self, env_steps: int) -> dict:
        return {
            "seconds_to_target": self.seconds_to_target,
            "trained_seconds": round(self.trained, 1),
            "env_steps": int(env_steps),
            "best_screen_win_rate": self.best,
            "checks": self.checks,
        }


# ---- RLlib ------------------------------------------------------------------------------------
def rllib_config(algo: str, seed: int, args):
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from rllib_plugins import ActionMaskingDQNTorchRLModule, GorilaDQNConfig
    from rllib_plugins.pettingzoo import against_random_opponent

    if algo == "gorila-rllib":
        config = (
            GorilaDQNConfig()
            .env_runners(num_env_runners=2, num_envs_per_env_runner=4)
            .training(
                updates_per_iteration=32,
                env_steps_per_request=64,
                target_update_every_n_updates=100,
            )
            .replay(num_shards=2, capacity=20_000, min_size_to_sample=500)
            .reporting(min_sample_timesteps_per_iteration=500)
        )
    else:
        config = (
            DQNConfig()
            .env_runners(num_env_runners=0, num_envs_per_env_runner=args.rllib_dqn_envs)
            .training(
                replay_buffer_config={
                    "type": "MultiAgentPrioritizedEpisodeReplayBuffer",
                    "capacity": 20_000,
                    "alpha": 0.6,
                    "beta": 0.4,
                },
                target_network_update_freq=500,
                epsilon=[(0, 1.0), (10_000, 0.05)],
                num_steps_sampled_before_learning_starts=500,
            )
            # short iterations: each env step is sampled and trained on in turn here (~20
            # steps/s), so 500 steps per iteration would check the win rate every ~25 s
            .reporting(min_sample_timesteps_per_iteration=100)
        )
    learner = RLModuleSpec(module_class=ActionMaskingDQNTorchRLModule)
    return (
        against_random_opponent(config.environment("tictactoe"), SEATS, learner_spec=learner)
        .learners(num_learners=0)
        .training(lr=1e-3, gamma=0.9, n_step=1, train_batch_size_per_learner=128)
        .debugging(seed=seed)
    )


def rllib_run(algo_name: str, seed: int, args) -> dict:
    from ray.tune.registry import register_env

    from rllib_plugins.pettingzoo import PettingZooCreator, greedy_act

    register_env("tictactoe", PettingZooCreator(tictactoe_v3.env))
    algo = rllib_config(algo_name, seed, args).build_algo()

    def evaluate(games: int) -> float:
        act = greedy_act(algo.get_module("learner"))
        return play_against_random(tictactoe_v3.env, act, games=games, seed=7 * seed).win_rate

    clock = RaceClock(args, evaluate)
    env_steps = 0
    try:
        while not clock.done():
            clock.resume()
            result = algo.train()
            clock.pause()
            env_steps = result["env_runners"].get("num_env_steps_sampled_lifetime", 0)
            if clock.check():
                break
    finally:
        algo.stop()
    return clock.result(env_steps)


# ---- Tianshou ---------------------------------------------------------------------------------
def tianshou_run(algo_name: str, seed: int, args) -> dict:
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.multiagent.marl import MultiAgentOffPolicyAlgorithm
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.algorithm.random import MARLRandomDiscreteMaskedOffPolicyAlgorithm
    from tianshou.data import Collector, VectorReplayBuffer
    from tianshou.env import DummyVectorEnv
    from tianshou.trainer import OffPolicyTrainerParams
    from tianshou.utils.net.common import Net

    from tianshou_plugins import (
        GorilaCollector,
        GorilaDQN,
        MultiAgentDistributedReplayBuffer,
        MultiAgentGorilaDQN,
        PettingZooFactory,
    )
    from tianshou_plugins.multi_agent import greedy_act

    torch.manual_seed(seed)
    np.random.seed(seed)
    factory = PettingZooFactory(tictactoe_v3.env)
    env = factory()
    arm = TIANSHOU_SETTINGS["example" if algo_name == "dqn-tianshou-example" else "same"]
    net = Net(state_shape=(3, 3, 2), action_shape=9, hidden_sizes=arm["hidden"])
    policy = DiscreteQLearningPolicy(
        model=net, action_space=gym.spaces.Discrete(9), eps_training=0.1, eps_inference=0.0
    )
    settings = arm["dqn"]
    optim = AdamOptimizerFactory(lr=arm["lr"])
    random = MARLRandomDiscreteMaskedOffPolicyAlgorithm(action_space=env.action_space)
    if algo_name == "gorila-tianshou":
        learner = GorilaDQN(policy=policy, optim=optim, **settings)
        algorithm = MultiAgentGorilaDQN(algorithms=[random, learner], env=env)
        buffer = MultiAgentDistributedReplayBuffer(
            20_000, num_shards=2, min_size_to_sample=500, batches_per_request=4, seed=seed
        )
        collector = GorilaCollector(
            algorithm,
            env_factory=factory,
            buffer=buffer,
            num_actors=2,
            envs_per_actor=4,
            num_cpus_per_actor=0.2,
            weight_sync_every_n_steps=128,
            seed=seed,
        )
    else:
        learner = DQN(policy=policy, optim=optim, **settings)
        algorithm = MultiAgentOffPolicyAlgorithm(algorithms=[random, learner], env=env)
        num_envs = arm.get("envs", args.tianshou_dqn_envs)
        envs = DummyVectorEnv([factory] * num_envs)
        envs.seed([seed * 100 + i for i in range(num_envs)])
        buffer = VectorReplayBuffer(20_000, num_envs)
        collector = Collector(algorithm.policy, envs, buffer, exploration_noise=True)
        collector.reset()
        collector.collect(n_step=500, random=True)

    act = greedy_act(learner.policy)

    def evaluate(games: int) -> float:
        return play_against_random(
            factory.raw, act, games=games, seed=7 * seed, seats=[TIANSHOU_SEAT]
        ).win_rate

    clock = RaceClock(args, evaluate)
    steps = [0]

    def training_fn(epoch: int, env_step: int) -> None:
        clock.pause()
        steps[0] = env_step
        try:
            if clock.check() or clock.done():
                raise Reached
        finally:
            clock.resume()

    try:
        clock.resume()
        with contextlib.suppress(Reached):  # the target ends a run
            algorithm.run_training(
                OffPolicyTrainerParams(
                    training_collector=collector,
                    max_epochs=1_000_000,
                    epoch_num_steps=10_000,
                    **arm["trainer"],
                    test_step_num_episodes=0,
                    test_in_training=False,
                    training_fn=training_fn,
                    show_progress=False,
                    verbose=False,
                )
            )
    finally:
        collector.close()
        if algo_name == "gorila-tianshou":
            buffer.close()
    return clock.result(steps[0])


def run(algo: str, seed: int, args) -> dict:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        return (rllib_run if algo.endswith("rllib") else tianshou_run)(algo, seed, args)
    finally:
        ray.shutdown()


def summarise(runs: dict[str, list[dict]], max_seconds: float) -> dict:
    medians = {a: median_or_none([r["seconds_to_target"] for r in rs]) for a, rs in runs.items()}
    summary = {"medians_s": medians}
    for framework in ("rllib", "tianshou"):
        baselines = [a for a in runs if a.startswith(f"dqn-{framework}")]
        if f"gorila-{framework}" not in runs or not baselines:
            continue
        gorila = medians[f"gorila-{framework}"]
        reached = sorted((medians[a], a) for a in baselines if medians[a] is not None)
        best = reached[0][1] if reached else baselines[0]  # the fastest baseline setting
        dqn = medians[best]
        if gorila is not None and dqn is not None:
            ratio, bound = gorila / dqn, "="
        elif gorila is not None:  # DQN never reached it: the ratio is below this
            ratio, bound = gorila / max_seconds, "<"
        elif dqn is not None:
            ratio, bound = max_seconds / dqn, ">"
        else:
            ratio, bound = None, "n/a"
        summary[framework] = {
            "ratio": ratio,
            "bound": bound,
            "target": TARGET_RATIO,
            "baseline": best,
        }
    return summary


def markdown(result: dict) -> str:
    params, runs = result["params"], result["runs"]
    labels = list(runs)
    lines = [
        "# Tic-tac-toe against a random player: wall-clock to a win rate of "
        f"{params['target']:.2f}, GorilaDQN vs the framework's multi-agent DQN",
        "",
        f"Seeds {params['seeds']}, cap {params['max_seconds']:.0f} s of training per run "
        f"(evaluation excluded: 100 games every {params['eval_every_s']:.0f} s of training, "
        f"400 games decide), {result['machine']['cpus']} CPUs, Ray with 2 CPUs, one run "
        f"({result['date']} UTC). RLlib: the learner takes "
        "both seats in turn; Tianshou: the second seat (a random player wins ~44 % over both "
        "seats, ~29 % from the second). Baselines: RLlib's DQN sampling in the driver with "
        f"{params['rllib_dqn_envs']} env(s), Tianshou's DQN over {params['tianshou_dqn_envs']} "
        "DummyVectorEnv envs.",
        "",
        "| seed | " + " | ".join(labels) + " |",
        "|---:|" + "---:|" * len(labels),
    ]
    for i, seed in enumerate(params["seeds"]):
        cells = [
            f"{fmt(runs[x][i]['seconds_to_target'])} ({runs[x][i]['env_steps']:,})" for x in labels
        ]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    summary = result["summary"]
    lines += [
        "",
        "| framework | GorilaDQN / fastest DQN setting (medians) | target |",
        "|---|---:|---:|",
    ]
    for framework in ("rllib", "tianshou"):
        if framework in summary:
            s = summary[framework]
            ratio = "n/a" if s["ratio"] is None else f"{s['bound']} {s['ratio']:.2f}"
            lines.append(f"| {framework} | {ratio} (vs {s['baseline']}) | <= {s['target']} |")
    medians = ", ".join(f"{a} {fmt(m)}" for a, m in summary["medians_s"].items())
    lines += [
        "",
        f"Medians: {medians}. Cells: training seconds to the target (env steps at the end of "
        "the run). A median counts runs that never reached the target as infinitely slow.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--algos", nargs="+", choices=ALGOS, default=list(ALGOS[:4]))
    parser.add_argument("--target", type=float, default=0.8, help="win rate against random")
    parser.add_argument("--max-seconds", type=float, default=300.0)
    parser.add_argument("--eval-every-s", type=float, default=3.0)
    # the baselines' fastest layouts here (ARCHITECTURE.md): RLlib's DQN sampling one env in
    # the driver, Tianshou's DQN over 8 DummyVectorEnv envs
    parser.add_argument("--rllib-dqn-envs", type=int, default=1)
    parser.add_argument("--tianshou-dqn-envs", type=int, default=8)
    parser.add_argument("--name", default="multi_agent_tictactoe", help="results file name")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    runs: dict[str, list[dict]] = {a: [] for a in args.algos}
    for seed in args.seeds:
        for algo in args.algos:
            result = run(algo, seed, args) | {"seed": seed}
            runs[algo].append(result)
            print(f"{algo:16s} seed {seed}: {result}", flush=True)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "params": vars(args) | {"out": str(args.out)},
        "runs": runs,
        "summary": summarise(runs, args.max_seconds),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2))
    (args.out / f"{args.name}.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
