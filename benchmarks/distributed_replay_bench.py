"""Distributed replay throughput: learner cycles/s, inserts/s and learner waiting, 1/2/4 shards.

For each shard count, two Ray actors insert CartPole-shaped batches (64 transitions per add) as
fast as the replay lets them while the learner (this process) loops over [sample 256 + update
priorities], either bare ("no compute": the replay's own ceiling), with a real double-DQN
gradient step on the batch in between ("SGD": a CPU learner), or with that step plus 5 ms of
idle device time ("SGD + 5 ms device": an accelerator learner, which leaves the CPU free while
the device computes; about 100 cycles/s). Waiting is the time the learner spends in ``sample``,
as a fraction of its loop time (for the in-process shard that is the sampling work itself).
The in-process ``PrioritizedReplay`` runs the same loops in the same run as the reference.

Writes ``benchmarks/results/distributed_replay_bench.{json,md}``::

    .venv/bin/python benchmarks/distributed_replay_bench.py [--seconds 8] [--shards 1 2 4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import ray
import torch
from torch import nn

from rl_dist_ext.ops.dqn import double_dqn_loss
from rl_dist_ext.replay import PrioritizedReplay
from rl_dist_ext.replay.distributed import DistributedReplay, DistributedReplayConfig

RESULTS = Path(__file__).parent / "results"
BATCH = 256
INSERT_ROWS = 64


def transitions(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {
        "obs": rng.standard_normal((n, 4)).astype(np.float32),
        "action": rng.integers(0, 2, n).astype(np.int64),
        "reward": np.ones(n, dtype=np.float32),
        "discount": np.full(n, 0.99, dtype=np.float32),
        "next_obs": rng.standard_normal((n, 4)).astype(np.float32),
    }


class Learner:
    """A real double-DQN step on a 4-128-128-2 MLP (the CartPole learner's work per batch).

    ``device_ms`` adds that much idle time per step, standing in for accelerator compute.
    """

    def __init__(self, device_ms: float = 0.0) -> None:
        self.device_s = device_ms / 1000.0
        torch.manual_seed(0)
        self.online = nn.Sequential(
            nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2)
        )
        self.target = nn.Sequential(
            nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2)
        )
        self.optimizer = torch.optim.Adam(self.online.parameters(), lr=1e-3)

    def step(self, batch: dict[str, np.ndarray], weights: np.ndarray) -> np.ndarray:
        t = {k: torch.as_tensor(v) for k, v in batch.items()}
        with torch.no_grad():
            q_online_tp1 = self.online(t["next_obs"])
            q_target_tp1 = self.target(t["next_obs"])
        loss = double_dqn_loss(
            q_online_t=self.online(t["obs"]),
            actions=t["action"],
            rewards=t["reward"],
            discounts=t["discount"],
            q_online_tp1=q_online_tp1,
            q_target_tp1=q_target_tp1,
            weights=torch.as_tensor(weights),
        )
        self.optimizer.zero_grad()
        loss.loss.backward()
        self.optimizer.step()
        if self.device_s:
            time.sleep(self.device_s)
        return loss.td_error.abs().numpy()


@ray.remote(num_cpus=0.25)
class Inserter:
    def __init__(self, replay: DistributedReplay, seed: int) -> None:
        self.replay = replay
        self.rng = np.random.default_rng(seed)
        self.batches = [transitions(self.rng, INSERT_ROWS) for _ in range(16)]

    def run(self, seconds: float) -> int:
        rows = 0
        deadline = time.monotonic() + seconds
        i = 0
        while time.monotonic() < deadline:
            self.replay.add(self.batches[i % 16], self.rng.random(INSERT_ROWS))
            rows += INSERT_ROWS
            i += 1
        self.replay.flush()
        return rows


def learner_loop(replay, seconds: float, learner: Learner | None, rng) -> dict[str, float]:
    cycles = 0
    waited = 0.0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        t0 = time.monotonic()
        sample = replay.sample(BATCH, beta=0.4)
        waited += time.monotonic() - t0
        if learner is not None:
            td = learner.step(sample.batch, sample.weights)
        else:
            td = rng.random(BATCH)
        replay.update_priorities(sample.keys, td)
        cycles += 1
    elapsed = time.monotonic() - start
    return {"cycles_per_s": cycles / elapsed, "wait_fraction": waited / elapsed}


MODES = ("no compute", "SGD", "SGD + 5 ms device")


def learners() -> list[tuple[str, Learner | None]]:
    return list(zip(MODES, (None, Learner(), Learner(device_ms=5.0)), strict=True))


def bench_in_process(seconds: float, capacity: int) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(0)
    replay = PrioritizedReplay(capacity, alpha=0.6, seed=0)
    for _ in range(capacity // 1000):
        replay.add(transitions(rng, 1000), rng.random(1000))
    out = {}
    for mode, learner in learners():
        out[mode] = learner_loop(replay, seconds, learner, rng)
        out[mode]["insert_rows_per_s"] = float("nan")
    return out


def bench_distributed(num_shards: int, seconds: float, capacity: int, prefetch: int):
    rng = np.random.default_rng(0)
    replay = DistributedReplay(
        DistributedReplayConfig(
            num_shards=num_shards,
            capacity=capacity,
            min_size_to_sample=10_000,
            prefetch=prefetch,
            num_cpus_per_shard=0.25,
            seed=0,
        )
    )
    for _ in range(20_000 // 1000):  # warm start so sampling can begin at once
        replay.add(transitions(rng, 1000))
    replay.flush()
    out = {}
    try:
        for mode, learner in learners():
            inserters = [Inserter.remote(replay, seed) for seed in (1, 2)]
            runs = [a.run.remote(seconds) for a in inserters]
            result = learner_loop(replay, seconds, learner, rng)
            inserted = sum(ray.get(runs, timeout=seconds + 120))
            result["insert_rows_per_s"] = inserted / seconds
            for actor in inserters:
                ray.kill(actor)
            out[mode] = result
        out["stats"] = {
            k: v
            for k, v in replay.stats(wait=True).items()
            if k in ("size", "size_per_shard", "stale_updates", "items_lost")
        }
    finally:
        replay.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--capacity", type=int, default=100_000)
    parser.add_argument("--prefetch", type=int, default=4)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    ray.init(num_cpus=8, include_dashboard=False, configure_logging=False)

    rows = {"in-process PrioritizedReplay": bench_in_process(args.seconds, args.capacity)}
    for n in args.shards:
        rows[f"DistributedReplay, {n} shard{'s' if n > 1 else ''}"] = bench_distributed(
            n, args.seconds, args.capacity, args.prefetch
        )
    ray.shutdown()

    for name, row in rows.items():
        for mode in MODES:
            r = row[mode]
            print(
                f"{name:30s} {mode:17s} cycles/s {r['cycles_per_s']:8.1f}  "
                f"wait {100 * r['wait_fraction']:5.1f}%  inserts/s {r['insert_rows_per_s']:10,.0f}"
            )
    result = {
        "benchmark": "distributed_replay_bench",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "params": {
            "seconds": args.seconds,
            "capacity": args.capacity,
            "batch": BATCH,
            "insert_rows": INSERT_ROWS,
            "inserting_actors": 2,
            "prefetch": args.prefetch,
        },
        "results": rows,
        "target": "with prefetch, learner waits < 10% of its time at >= 100 cycles/s",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "distributed_replay_bench.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# Distributed replay: learner cycles/s, inserts/s, learner waiting",
        "",
        f"Learner loop of [sample {BATCH} + update priorities] for {args.seconds:g} s per row, "
        f"capacity {args.capacity:,}, prefetch {args.prefetch}; two Ray actors insert "
        f"{INSERT_ROWS}-row CartPole batches concurrently, unthrottled (the distributed rows). "
        "'SGD' adds a real double-DQN step (4-128-128-2 MLP, batch 256) per cycle; "
        "'SGD + 5 ms device' adds 5 ms of idle time per cycle, standing in for an accelerator. "
        f"{result['machine']['cpus']} CPUs, one run ({result['date']} UTC).",
        "",
        "| replay | learner | cycles/s | time in sample() | inserted rows/s |",
        "|---|---|---:|---:|---:|",
    ]
    for name, row in rows.items():
        for mode in MODES:
            r = row[mode]
            inserts = "-" if np.isnan(r["insert_rows_per_s"]) else f"{r['insert_rows_per_s']:,.0f}"
            lines.append(
                f"| {name} | {mode} | {r['cycles_per_s']:,.1f} | "
                f"{100 * r['wait_fraction']:.1f}% | {inserts} |"
            )
    lines += [
        "",
        "'time in sample()' is the learner's time blocked in `sample` as a share of its loop: for "
        "the distributed rows the wait for a reply (prefetched requests hide the round trip), "
        "for the in-process shard the sampling work itself.",
        "",
        f"Target: {result['target']}.",
    ]
    (args.out / "distributed_replay_bench.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / 'distributed_replay_bench.json'} and distributed_replay_bench.md")


if __name__ == "__main__":
    main()
