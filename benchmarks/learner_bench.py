"""RLlib GorilaDQN's learner alone: gradient updates per second, and where an update's time goes.

The learner runs in this process on batches drawn from an in-memory stand-in for the replay
(pre-made rows, so that what is measured is the learner: batch conversion, RLlib's
``Learner.update``, the loss, the optimizer, the priorities), for the CartPole MLP and the
MinAtar network, at several batch sizes, with ``updates_per_learner_call`` (k updates fused
into one ``Learner.update`` call) at 1 (one call per update) and more. Each setting runs
``--rounds`` times, the settings interleaved within a round; the table gives the median.

    .venv/bin/python benchmarks/learner_bench.py                 # the table
    .venv/bin/python benchmarks/learner_bench.py --profile       # plus a profile of k=1, B=128

Writes ``benchmarks/results/learner_bench.{json,md}``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import platform
import pstats
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from results_files import write_results

RESULTS = Path(__file__).resolve().parent / "results"
NETS = ("mlp", "minatar")


class PooledReplay:
    """``sample`` hands out pre-made batches in turn (no replay cost in the measurement);
    ``update_priorities`` takes the priorities and drops them."""

    def __init__(self, space, batch_size: int, pool: int = 16, seed: int = 0) -> None:
        from rl_dist_ext.replay.prioritized import ReplaySample

        rng = np.random.default_rng(seed)

        def observations() -> np.ndarray:
            if space.dtype == np.uint8:
                return rng.integers(0, 2, size=(batch_size, *space.shape), dtype=np.uint8)
            return rng.normal(size=(batch_size, *space.shape)).astype(np.float32)

        self._pool = [
            ReplaySample(
                {
                    "obs": observations(),
                    "action": rng.integers(0, 2, size=batch_size),
                    "reward": rng.normal(size=batch_size).astype(np.float32),
                    "discount": rng.choice([0.0, 0.97], size=batch_size).astype(np.float32),
                    "next_obs": observations(),
                },
                np.arange(batch_size) + i * batch_size,
                rng.uniform(0.2, 1.0, size=batch_size).astype(np.float32),
            )
            for i in range(pool)
        ]
        self._next = 0

    def sample(self, batch_size: int, *, beta: float):
        self._next = (self._next + 1) % len(self._pool)
        return self._pool[self._next]

    def update_priorities(self, keys, priorities) -> None:
        pass


def build_learner(net: str, batch_size: int, k: int):
    """GorilaDQN's learner for ``net`` with batch ``batch_size`` and k updates per call,
    connected to a :class:`PooledReplay`."""
    import gymnasium as gym
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_plugins import GorilaDQNConfig

    config = (
        GorilaDQNConfig()
        .learners(num_learners=0)
        .training(train_batch_size_per_learner=batch_size, updates_per_learner_call=k)
    )
    if net == "mlp":
        env = gym.make("CartPole-v1")
        config = config.environment("CartPole-v1")
    else:
        from minatar_race import rllib_model_config

        from rllib_plugins.pixels import PixelEnvCreator, pixel_env

        env = PixelEnvCreator("minatar:breakout")()
        config = config.environment(pixel_env("minatar:breakout")).rl_module(
            model_config=rllib_model_config()
        )
    learner = config.build_learner(env=env)
    replay = PooledReplay(env.observation_space, batch_size)
    learner.gorila.connect(replays={DEFAULT_MODULE_ID: replay}, weights=None)
    return learner


def updates_per_s(learner, seconds: float, chunk: int = 16) -> float:
    """Updates per second over at least ``seconds`` of ``train_from_replay(chunk)`` calls."""
    learner.train_from_replay(chunk, {})  # warm-up (first-call paths)
    done, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        learner.train_from_replay(chunk, {})
        done += chunk
    return done / elapsed


def profile(learner, updates: int = 400) -> str:
    """The functions taking most of ``updates`` updates' time (own time), as pstats prints."""
    learner.train_from_replay(16, {})
    profiler = cProfile.Profile()
    profiler.enable()
    learner.train_from_replay(updates, {})
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
    return out.getvalue()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nets", nargs="+", choices=NETS, default=list(NETS))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--k", type=int, nargs="+", default=[1, 4, 8], help="updates per call")
    parser.add_argument("--seconds", type=float, default=3.0, help="per setting and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="profile k=1, B=128 (MLP)")
    parser.add_argument("--profile-updates", type=int, default=400)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    settings = [(n, b, k) for n in args.nets for b in args.batch_sizes for k in args.k]
    learners = {setting: build_learner(*setting) for setting in settings}
    rates: dict[tuple, list[float]] = {setting: [] for setting in settings}
    for round_ in range(args.rounds):
        for setting in settings:  # interleaved: a slow spell hits every setting alike
            rates[setting].append(updates_per_s(learners[setting], args.seconds))
            print(f"round {round_}: {setting}: {rates[setting][-1]:.0f} updates/s", flush=True)
    rows = []
    for net, batch, k in settings:
        median = statistics.median(rates[(net, batch, k)])
        base = statistics.median(rates[(net, batch, args.k[0])])
        rows.append(
            {
                "net": net,
                "batch_size": batch,
                "updates_per_call": k,
                "updates_per_s": round(median, 1),
                "rounds": [round(r, 1) for r in rates[(net, batch, k)]],
                "vs_first_k": round(median / base, 2),
            }
        )
    report = {
        "benchmark": "learner_bench",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "rows": rows,
    }
    lines = [
        "# GorilaDQN's RLlib learner: gradient updates per second",
        "",
        f"In-process learner, one torch thread, batches from a pre-made pool; median of "
        f"{args.rounds} rounds of {args.seconds:g} s per setting (interleaved). "
        f"`k`: updates fused into one `Learner.update` call (1 = one call per update).",
        "",
        f"| net | batch | k | updates/s | rounds | vs k={args.k[0]} |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r['net']} | {r['batch_size']} | {r['updates_per_call']} | "
            f"{r['updates_per_s']:.0f} | {', '.join(f'{x:.0f}' for x in r['rounds'])} | "
            f"{r['vs_first_k']:.2f}x |"
            for r in rows
        ),
    ]
    if args.profile:
        learner = learners.get(("mlp", 128, 1)) or build_learner("mlp", 128, 1)
        text = profile(learner, args.profile_updates)
        report["profile_mlp_b128_k1"] = text
        lines += [
            "",
            f"## Profile: MLP, batch 128, k = 1 ({args.profile_updates} updates, own time)",
            "",
            "```",
        ]
        lines += [line.rstrip() for line in text.strip().splitlines()] + ["```"]
    for learner in learners.values():
        learner.shutdown()
    write_results(args.out / "learner_bench", report, lines)


if __name__ == "__main__":
    main()
