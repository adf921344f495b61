"""Wall-clock to a greedy return of 450 on CartPole: GorilaDQN vs RLlib's own DQN, side by side.

For each env (CartPole-v1, and "SlowCartPole-v1": the same env with 2 ms of latency per step, a
stand-in for a slow simulator), each seed and each algorithm, the clock runs from the first
``train()`` call until the greedy policy averages >= 450 over 10 episodes, or until
``--max-seconds``. Greedy evaluations (a 2-episode screen, then 10 episodes when it passes) are
run every ``--eval-every-s`` seconds of training and are not counted in the clock.

RLlib DQN uses RLlib's tuned CartPole settings (prioritized episode replay, n-step (2, 5),
dueling, double-Q, 256-unit tanh MLP and head, epsilon 1.0 -> 0.02 over 10k steps, lr 5e-4,
batch 32) in its fastest sampling layout on this machine: ``--dqn-layouts`` races several
(``--no-gorila --name rllib_dqn_layouts`` picks one), the default is the one that won.
GorilaDQN uses its class defaults in ``--gorila-layouts`` (runners x envs per runner); the ratio
compares the faster GorilaDQN layout with the faster DQN layout of the same run. GorilaDQN's
layouts were raced with DQN on CartPole-v1 (``--envs CartPole-v1 --gorila-layouts 4x4 2x4 2x8
--name rllib_gorila_layouts``).

Writes ``benchmarks/results/<--name>.{json,md}``::

    .venv/bin/python benchmarks/rllib_gorila_vs_dqn.py --no-gorila --envs CartPole-v1 \\
        --seeds 0 --dqn-layouts driver-1env driver-4envs 1-runner --name rllib_dqn_layouts
    .venv/bin/python benchmarks/rllib_gorila_vs_dqn.py [--seeds 0 1 2] [--max-seconds 600]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import gymnasium as gym
import torch
from race import TARGET, median_or_none, race_each_in_fresh_ray, rllib_time_to_target
from race import fmt_seconds as fmt
from slow_env import slow_cartpole

RESULTS = Path(__file__).parent / "results"


def make_env(name: str) -> gym.Env:
    if name == "SlowCartPole-v1":
        return slow_cartpole()
    return gym.make(name)


#: GorilaDQN's layouts: remote env runners x envs per runner (the learner is in the driver).
GORILA_LAYOUTS = {
    "4x4": {"num_env_runners": 4, "num_envs_per_env_runner": 4},
    "2x4": {"num_env_runners": 2, "num_envs_per_env_runner": 4},
    "2x8": {"num_env_runners": 2, "num_envs_per_env_runner": 8},
}

#: Measured on CartPole-v1 (``benchmarks/results/rllib_gorila_layouts.md``): 2 x 8 was fastest
#: there (fewer runner processes leave the learner more of the 2 cores); 4 x 4 hides a slow env's
#: latency with more processes. The race runs both and takes the faster per env.
RACE_GORILA_LAYOUTS = ["2x8", "4x4"]


def gorila_config(env: str, seed: int, layout: str):
    """GorilaDQNConfig's defaults (16 samples per insert, batch 128, lr 1e-3, target update
    every 250 gradient updates) in ``layout`` (see ``GORILA_LAYOUTS``)."""
    from rllib_plugins import GorilaDQNConfig

    return (
        GorilaDQNConfig()
        .environment(env)
        .env_runners(**GORILA_LAYOUTS[layout])
        .learners(num_learners=0)
        .replay(num_shards=2, capacity=50_000, min_size_to_sample=1_000)
        .reporting(min_sample_timesteps_per_iteration=1_000)
        .debugging(seed=seed)
    )


#: Where RLlib's DQN samples: in the driver (0 remote env runners) with 1 or 4 envs, or in one
#: remote env runner. The race uses ``--dqn-layouts`` (default: the fastest one measured here,
#: ``benchmarks/results/rllib_dqn_layouts.md``).
DQN_LAYOUTS = {
    "driver-1env": {"num_env_runners": 0, "num_envs_per_env_runner": 1},
    "driver-4envs": {"num_env_runners": 0, "num_envs_per_env_runner": 4},
    "1-runner": {"num_env_runners": 1, "num_envs_per_env_runner": 1},
}


BEST_DQN_LAYOUT = "driver-1env"


def dqn_config(env: str, seed: int, layout: str):
    """RLlib's tuned CartPole DQN (``examples/algorithms/dqn/cartpole_dqn.py``): prioritized
    episode replay, n-step (2, 5), dueling, double-Q, 256-unit tanh MLP and head, epsilon 1.0 ->
    0.02 over 10k steps, lr 5e-4, batch 32."""
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    return (
        DQNConfig()
        .environment(env)
        .env_runners(**DQN_LAYOUTS[layout])
        .learners(num_learners=0)
        .training(
            lr=5e-4,
            train_batch_size_per_learner=32,
            replay_buffer_config={
                "type": "PrioritizedEpisodeReplayBuffer",
                "capacity": 50_000,
                "alpha": 0.6,
                "beta": 0.4,
            },
            n_step=(2, 5),
            double_q=True,
            num_atoms=1,
            noisy=False,
            dueling=True,
            epsilon=[(0, 1.0), (10_000, 0.02)],
        )
        .rl_module(
            model_config=DefaultModelConfig(
                fcnet_hiddens=[256],
                fcnet_activation="tanh",
                fcnet_bias_initializer="zeros_",
                head_fcnet_hiddens=[256],
                head_fcnet_bias_initializer="zeros_",
            )
        )
        .debugging(seed=seed)
    )


def fastest(names: list[str], medians: dict[str, float | None]) -> str | None:
    """The name with the smallest median (not reached counts as infinitely slow)."""
    return min(names, key=lambda name: medians[name] or float("inf"), default=None)


def time_to_target(algo_name, env, seed, args) -> dict:
    from ray.tune.registry import register_env

    import rllib_plugins  # noqa: F401  (registers GorilaDQN)

    register_env("SlowCartPole-v1", lambda _cfg: make_env("SlowCartPole-v1"))
    if algo_name.startswith("GorilaDQN:"):
        config = gorila_config(env, seed, algo_name.removeprefix("GorilaDQN:"))
    else:
        config = dqn_config(env, seed, algo_name.removeprefix("DQN:"))
    algo = config.build_algo()
    return rllib_time_to_target(
        algo,
        seed=seed,
        max_seconds=args.max_seconds,
        eval_every_s=args.eval_every_s,
        greedy_module=lambda a: a.get_module(),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "SlowCartPole-v1"])
    parser.add_argument(
        "--gorila-layouts",
        nargs="+",
        default=RACE_GORILA_LAYOUTS,
        choices=sorted(GORILA_LAYOUTS),
        help="GorilaDQN's env runners x envs per runner",
    )
    parser.add_argument(
        "--dqn-layouts", nargs="+", default=[BEST_DQN_LAYOUT], choices=sorted(DQN_LAYOUTS)
    )
    parser.add_argument("--no-gorila", action="store_true", help="race the DQN layouts only")
    parser.add_argument("--max-seconds", type=float, default=600.0)
    parser.add_argument("--eval-every-s", type=float, default=5.0)
    parser.add_argument("--name", default="rllib_gorila_vs_dqn", help="results file name")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)

    dqns = [f"DQN:{layout}" for layout in args.dqn_layouts]
    gorilas = [] if args.no_gorila else [f"GorilaDQN:{layout}" for layout in args.gorila_layouts]
    algos = [*gorilas, *dqns]
    runs = race_each_in_fresh_ray(
        args.envs,
        args.seeds,
        algos,
        lambda algo_name, env, seed: time_to_target(algo_name, env, seed, args),
    )

    summary = {}
    for env, by_algo in runs.items():
        medians = {
            name: median_or_none([r["seconds_to_target"] for r in by_algo[name]]) for name in algos
        }
        best_dqn, best_gorila = (fastest(names, medians) for names in (dqns, gorilas))
        entry = {"median_s": medians, "best_dqn": best_dqn, "best_gorila": best_gorila}
        gorila, dqn = medians.get(best_gorila), medians[best_dqn]
        if best_gorila is None:
            ratio, bound = None, "n/a"
        elif gorila is not None and dqn is not None:
            ratio, bound = gorila / dqn, "="
        elif gorila is not None:  # DQN did not get there: the ratio is below this bound
            ratio, bound = gorila / args.max_seconds, "<"
        else:
            ratio, bound = None, "n/a"
        summary[env] = entry | {"ratio": ratio, "ratio_bound": bound}

    result = {
        "benchmark": args.name,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "params": vars(args) | {"out": str(args.out), "target_return": TARGET},
        "dqn_layouts": {name: DQN_LAYOUTS[name] for name in args.dqn_layouts},
        "gorila_layouts": {name: GORILA_LAYOUTS[name] for name in args.gorila_layouts},
        "runs": runs,
        "summary": summary,
        "targets": {"CartPole-v1": 0.3, "SlowCartPole-v1": 0.3},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")

    lines = [
        "# GorilaDQN vs RLlib DQN: wall-clock to greedy return >= 450 (10 episodes)",
        "",
        f"Seeds {args.seeds}, GorilaDQN with its defaults and RLlib DQN with its tuned CartPole "
        "settings, each in the layouts below; "
        f"learners in the driver, cap {args.max_seconds:.0f} s of training per run (evaluation "
        f"time excluded), {result['machine']['cpus']} CPUs, one run ({result['date']} UTC). "
        "SlowCartPole-v1 adds 2 ms per env step.",
        "",
        "DQN layouts: "
        + "; ".join(
            f"`{name}` = {DQN_LAYOUTS[name]['num_env_runners']} remote env runners, "
            f"{DQN_LAYOUTS[name]['num_envs_per_env_runner']} env(s) per runner"
            for name in args.dqn_layouts
        ),
        "",
        "GorilaDQN layouts: "
        + "; ".join(
            f"`{name}` = {GORILA_LAYOUTS[name]['num_env_runners']} env runners x "
            f"{GORILA_LAYOUTS[name]['num_envs_per_env_runner']} envs"
            for name in ([] if args.no_gorila else args.gorila_layouts)
        ),
        "",
        "| env | seed | " + " | ".join(f"{name} | env steps" for name in algos) + " |",
        "|---|---:|" + "---:|---:|" * len(algos),
    ]
    for env, by_algo in runs.items():
        for i, seed in enumerate(args.seeds):
            cells = [
                f"{fmt(by_algo[name][i]['seconds_to_target'])} | {by_algo[name][i]['env_steps']:,}"
                for name in algos
            ]
            lines.append(f"| {env} | {seed} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| env | " + " | ".join(f"{name} median" for name in algos) + " | ratio | target |",
        "|---|" + "---:|" * (len(algos) + 2),
    ]
    for env, entry in summary.items():
        ratio = "n/a" if entry["ratio"] is None else f"{entry['ratio_bound']} {entry['ratio']:.3f}"
        medians = " | ".join(fmt(entry["median_s"][name]) for name in algos)
        lines.append(
            f"| {env} | {medians} | {ratio} ({entry['best_gorila']} vs {entry['best_dqn']}) | "
            f"<= {result['targets'].get(env, float('nan'))} |"
        )
    lines += [
        "",
        "A median counts runs that never reached 450 as infinitely slow; the ratio compares the "
        "fastest GorilaDQN layout with the fastest DQN layout; when RLlib DQN's median is 'not "
        "reached', the ratio is bounded by GorilaDQN's median over the cap.",
    ]
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
