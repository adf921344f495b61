"""RLlib GorilaDQN's learner alone: gradient updates per second, and where an update's time goes.

The learner runs in this process on batches drawn from an in-memory stand-in for the replay
(pre-made rows, so that what is measured is the learner: batch conversion, RLlib's
``Learner.update``, the loss, the optimizer, the priorities), for the CartPole MLP and the
MinAtar network, at several batch sizes, with ``updates_per_learner_call`` (k updates fused
into one call) at 1 (one call per update) and more, each on the learner's lean step and on
RLlib's own step (:func:`rllib_step_classes`, the learner as it was before the lean path). Each
setting runs ``--rounds`` times, the settings interleaved within a round; the table gives the
median and the ratio to RLlib's step at the first k.

    .venv/bin/python benchmarks/learner_bench.py                 # the table
    .venv/bin/python benchmarks/learner_bench.py --profile       # plus a profile (lean, k=1, B=128)

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


def rllib_step_classes():
    """``(learner class, module class)``: GorilaDQN's learner and module on RLlib's own
    gradient step, as they were before the lean path (the baseline here, and the reference
    the lean path is tested against): the DQN module's training forward (the online network
    over observations and next observations stacked, with gradients; RLlib's dueling
    combination; ``train()`` on every call), RLlib's clipping and NaN/inf checks, Adam's
    per-tensor loop, and one ``Learner.update`` per fused call (RLlib's minibatch iterator splits
    k batches back, its hooks and steps-trained metrics run per call)."""
    from ray.rllib.algorithms.dqn.default_dqn_rl_module import QF_PREDS
    from ray.rllib.algorithms.dqn.torch.default_dqn_torch_rl_module import (
        DefaultDQNTorchRLModule,
    )
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.learner.learner import Learner
    from ray.rllib.core.learner.torch.torch_learner import TorchLearner
    from ray.rllib.policy.sample_batch import MultiAgentBatch

    from rl_dist_ext.ops.dqn import mask_q_values
    from rllib_plugins.action_masking import ActionMaskingDQNTorchRLModule, split_masked
    from rllib_plugins.gorila_learner import GorilaDQNTorchLearner, replay_rows_to_batch
    from rllib_plugins.pixels import to_network_input

    class RLlibStepModule(ActionMaskingDQNTorchRLModule):
        _forward_train = DefaultDQNTorchRLModule._forward_train
        train = torch.nn.Module.train

        def _qf_forward_helper(self, batch, encoder, head):  # RLlib's, masked after
            obs, mask = split_masked(batch[Columns.OBS])
            batch = {**batch, Columns.OBS: to_network_input(obs, self._pixel_scale)}
            out = DefaultDQNTorchRLModule._qf_forward_helper(self, batch, encoder, head)
            out[QF_PREDS] = mask_q_values(out[QF_PREDS], mask)
            return out

    class RLlibStepLearner(GorilaDQNTorchLearner):
        postprocess_gradients_for_module = Learner.postprocess_gradients_for_module
        apply_gradients = TorchLearner.apply_gradients

        def configure_optimizers_for_module(self, module_id, config=None) -> None:
            TorchLearner.configure_optimizers_for_module(self, module_id, config)

        def fused_update(self, batches, timesteps) -> None:
            def concat(name: str, module: str) -> np.ndarray:
                return np.concatenate([samples[module].batch[name] for samples in batches])

            modules = list(batches[0])
            fused = MultiAgentBatch(
                {
                    module: replay_rows_to_batch(
                        {name: concat(name, module) for name in batches[0][module].batch},
                        np.concatenate([samples[module].weights for samples in batches]),
                    )
                    for module in modules
                },
                env_steps=sum(max(len(s.keys) for s in samples.values()) for samples in batches),
            )
            self.update(
                batch=fused,
                timesteps=timesteps,
                minibatch_size=self.config.train_batch_size_per_learner
                if len(batches) > 1
                else None,
                num_epochs=1,
                _no_metrics_reduce=True,
            )

    return RLlibStepLearner, RLlibStepModule


def build_learner(net: str, batch_size: int, k: int, path: str = "lean"):
    """GorilaDQN's learner for ``net`` with batch ``batch_size`` and k updates per call,
    connected to a :class:`PooledReplay`; ``path="rllib"``: on RLlib's own step
    (:func:`rllib_step_classes`)."""
    import gymnasium as gym
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from rllib_plugins import GorilaDQNConfig

    config = (
        GorilaDQNConfig()
        .learners(num_learners=0)
        .training(train_batch_size_per_learner=batch_size, updates_per_learner_call=k)
    )
    if path == "rllib":
        learner_class, module_class = rllib_step_classes()
        config = config.learners(learner_class=learner_class).rl_module(
            rl_module_spec=RLModuleSpec(module_class=module_class)
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


PATHS = ("rllib", "lean")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nets", nargs="+", choices=NETS, default=list(NETS))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--k", type=int, nargs="+", default=[1, 4], help="updates per call")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--seconds", type=float, default=3.0, help="per setting and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="profile k=1, B=128 (MLP)")
    parser.add_argument("--profile-updates", type=int, default=400)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    settings = [
        (n, b, k, p)
        for n in args.nets
        for b in args.batch_sizes
        for k in args.k
        for p in args.paths
    ]
    learners = {setting: build_learner(*setting) for setting in settings}
    rates: dict[tuple, list[float]] = {setting: [] for setting in settings}
    for round_ in range(args.rounds):
        for setting in settings:  # interleaved: a slow spell hits every setting alike
            rates[setting].append(updates_per_s(learners[setting], args.seconds))
            print(f"round {round_}: {setting}: {rates[setting][-1]:.0f} updates/s", flush=True)
    rows = []
    for net, batch, k, path in settings:
        median = statistics.median(rates[(net, batch, k, path)])
        base = statistics.median(rates[(net, batch, args.k[0], args.paths[0])])
        rows.append(
            {
                "net": net,
                "batch_size": batch,
                "updates_per_call": k,
                "path": path,
                "updates_per_s": round(median, 1),
                "rounds": [round(r, 1) for r in rates[(net, batch, k, path)]],
                "vs_baseline": round(median / base, 2),
            }
        )
    report = {
        "benchmark": "learner_bench",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "rows": rows,
    }
    baseline = f"{args.paths[0]}, k={args.k[0]}"
    lines = [
        "# GorilaDQN's RLlib learner: gradient updates per second",
        "",
        f"In-process learner, one torch thread, batches from a pre-made pool; median of "
        f"{args.rounds} rounds of {args.seconds:g} s per setting (interleaved). "
        f"`k`: updates fused into one call (1 = one call per update). `path`: `rllib` is "
        f"RLlib's own gradient step (the learner before the lean path: the module's forward "
        f"over observations and next observations with gradients, RLlib's clipping and NaN "
        f"checks, Adam's per-tensor loop, one `Learner.update` per call); `lean` is the "
        f"learner's step (`rllib_plugins/lean_gradients.py`, `GorilaDQNTorchLearner."
        f"fused_update`, the module's `_forward_train`). Ratios are to `{baseline}` of the "
        f"same net and batch, measured in the same run.",
        "",
        f"| net | batch | k | path | updates/s | rounds | vs {baseline} |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {r['net']} | {r['batch_size']} | {r['updates_per_call']} | {r['path']} | "
            f"{r['updates_per_s']:.0f} | {', '.join(f'{x:.0f}' for x in r['rounds'])} | "
            f"{r['vs_baseline']:.2f}x |"
            for r in rows
        ),
    ]
    if args.profile:
        setting = ("mlp", 128, 1, "lean")
        learner = learners.get(setting) or build_learner(*setting)
        text = profile(learner, args.profile_updates)
        report["profile_mlp_b128_k1"] = text
        lines += [
            "",
            f"## Profile: MLP, batch 128, k = 1, lean ({args.profile_updates} updates, own time)",
            "",
            "```",
        ]
        lines += [line.rstrip() for line in text.strip().splitlines()] + ["```"]
    for learner in learners.values():
        learner.shutdown()
    write_results(args.out / "learner_bench", report, lines)


if __name__ == "__main__":
    main()
