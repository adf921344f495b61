"""Prioritized replay, side by side: rl-dist-ext's shard vs Tianshou's and RLlib's buffers.

Same data for all three: ``--size`` CartPole-shaped transitions (obs [4] float32, int action,
reward, next obs) into a replay of capacity ``--size``, then ``--cycles`` x [sample 256 + update
priorities] with the same pre-drawn |TD error| arrays. Each buffer is filled through its own API:

- rl-dist-ext ``PrioritizedReplay.add``: columnar batches of ``--insert-chunk`` transitions (an
  actor's folded rollout);
- Tianshou ``PrioritizedReplayBuffer.add``: one transition per call (its single-buffer API, as
  a one-env collector does);
- RLlib ``PrioritizedEpisodeReplayBuffer.add``: 100-step ``SingleAgentEpisode`` objects.

Then where one rl-dist-ext cycle's time goes (:func:`profile_cycle`): each stage of
``sample`` and ``update_priorities`` timed alone on the filled replay (the sum tree's
stratified descent, the key and row gathers, the importance weights, the priority check and
exponent, the tree's leaf update), the rest of the two calls being their Python: argument
checks, allocations, the result tuples.

Writes ``benchmarks/results/replay_bench.{json,md}``. Usage::

    .venv/bin/python benchmarks/replay_bench.py [--size 100000] [--cycles 1000]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results"
BATCH = 256
#: the stages :func:`profile_cycle` times alone
STAGES = (
    "uniforms (numpy Generator)",
    "sum-tree descent (stratified)",
    "keys gather",
    "rows gather (5 columns)",
    "importance weights",
    "priority check, staleness, exponent",
    "sum-tree leaf update",
)
EPISODE_LEN = 100


def make_data(size: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.standard_normal((size, 4)).astype(np.float32),
        "action": rng.integers(0, 2, size).astype(np.int64),
        "reward": np.ones(size, dtype=np.float32),
        "discount": np.full(size, 0.99, dtype=np.float32),
        "next_obs": rng.standard_normal((size, 4)).astype(np.float32),
    }


def time_cycles(cycles: int, step: Callable[[int], None]) -> float:
    """``step(i)`` calls per second over ``cycles`` calls, after one not counted (JIT, caches)."""
    return 1e6 / best_mean_us(step, cycles, rounds=1)


def bench_rl_dist_ext(data, td, cycles, chunk):
    from rl_dist_ext.replay import PrioritizedReplay

    size = len(data["obs"])
    replay = PrioritizedReplay(size, alpha=0.6, seed=0)
    replay.add({k: v[:1] for k, v in data.items()})  # compile outside the timed fill
    replay = PrioritizedReplay(size, alpha=0.6, seed=0)
    start = time.perf_counter()
    for lo in range(0, size, chunk):
        replay.add({k: v[lo : lo + chunk] for k, v in data.items()})
    insert_rate = size / (time.perf_counter() - start)

    def step(i: int) -> None:
        sample = replay.sample(BATCH, beta=0.4)
        replay.update_priorities(sample.keys, td[i % len(td)])

    return insert_rate, time_cycles(cycles, step), len(replay)


def best_mean_us(call: Callable[[int], object], calls: int, rounds: int = 5) -> float:
    """The fastest of ``rounds`` rounds of ``calls`` calls of ``call(i)``: microseconds a call."""
    call(0)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for i in range(calls):
            call(i)
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def profile_cycle(data, td, calls: int, chunk: int) -> dict[str, float]:
    """Microseconds a call of each stage of one sample + update cycle of ``PrioritizedReplay``
    (filled with ``data``; less the cost of the timing loop's own call), the two calls whole,
    and the Python around the stages (the whole calls less their stages). The update stages
    take other draws' keys, so they find less of the tree in cache than a cycle's update,
    which follows its own sample. Reaches into the replay's private parts: a benchmark's
    probe."""
    from rl_dist_ext.replay import PrioritizedReplay
    from rl_dist_ext.replay.prioritized import _live_updates

    size = len(data["obs"])
    replay = PrioritizedReplay(size, alpha=0.6, seed=0)
    for lo in range(0, size, chunk):
        replay.add({k: v[lo : lo + chunk] for k, v in data.items()})
    tree, storage, rng = replay._tree, replay._storage, replay._rng
    # every call of a stage takes another draw's inputs, as the cycles do: the same inputs
    # again would find the tree's nodes and the rows in cache
    uniforms = [rng.random(BATCH) for _ in range(calls)]
    draws = [tree.sample_stratified(u) for u in uniforms]
    keys = [storage.insert_ids[slots] for slots, _ in draws]
    updates = [(np.empty(BATCH, dtype=np.int64), np.empty(BATCH)) for _ in range(calls)]

    def live_updates(i: int) -> tuple[int, float, int]:
        i %= calls
        return _live_updates(
            keys[i],
            td[i % len(td)],
            storage.insert_ids,
            storage.next_id,
            0.6,
            replay._eps,
            *updates[i],
        )

    for i in range(calls):  # every key live: the leaf update's inputs are all written
        live, _, bad = live_updates(i)
        assert bad == -1 and live == BATCH, (live, bad)
    sample_stages = {
        "uniforms (numpy Generator)": lambda i: rng.random(BATCH),
        "sum-tree descent (stratified)": lambda i: tree.sample_stratified(uniforms[i % calls]),
        "keys gather": lambda i: storage.insert_ids[draws[i % calls][0]],
        "rows gather (5 columns)": lambda i: storage.gather(draws[i % calls][0]),
        "importance weights": lambda i: np.power(
            draws[i % calls][1] * (1.0 / tree.min), -0.4, dtype=np.float32
        ),
    }
    update_stages = {
        "priority check, staleness, exponent": live_updates,
        "sum-tree leaf update": lambda i: tree.update(*updates[i % calls], validate=False),
    }
    assert set(sample_stages) | set(update_stages) == set(STAGES)
    # a stage's (and a whole call's) own time: less the benchmark's call and indexing
    empty = best_mean_us(lambda i: uniforms[i % calls], calls)
    stages = {
        name: best_mean_us(call, calls) - empty
        for name, call in (sample_stages | update_stages).items()
    }
    sampled = [replay.sample(BATCH, beta=0.4).keys for _ in range(calls)]
    whole = {
        "sample()": best_mean_us(lambda i: replay.sample(BATCH, beta=0.4), calls) - empty,
        "update_priorities()": best_mean_us(
            lambda i: replay.update_priorities(sampled[i % calls], td[i % len(td)]), calls
        )
        - empty,
    }
    python = whole["sample()"] - sum(stages[name] for name in sample_stages)
    python += whole["update_priorities()"] - sum(stages[name] for name in update_stages)
    return {**stages, "Python around the stages": python, **whole}


def bench_tianshou(data, td, cycles):
    from tianshou.data import Batch, PrioritizedReplayBuffer

    size = len(data["obs"])
    buffer = PrioritizedReplayBuffer(size, alpha=0.6, beta=0.4)
    obs, act, rew, nxt = data["obs"], data["action"], data["reward"], data["next_obs"]
    start = time.perf_counter()
    for j in range(size):
        buffer.add(
            Batch(
                obs=obs[j],
                act=act[j],
                rew=rew[j],
                terminated=False,
                truncated=(j + 1) % EPISODE_LEN == 0,
                obs_next=nxt[j],
                info={},
            )
        )
    insert_rate = size / (time.perf_counter() - start)

    def step(i: int) -> None:
        _, indices = buffer.sample(BATCH)
        buffer.update_weight(indices, td[i % len(td)])

    return insert_rate, time_cycles(cycles, step), len(buffer)


def bench_rllib(data, td, cycles):
    import gymnasium as gym
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode
    from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import (
        PrioritizedEpisodeReplayBuffer,
    )

    size = len(data["obs"])
    obs_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    episodes = []
    for lo in range(0, size, EPISODE_LEN):
        hi = lo + EPISODE_LEN
        episodes.append(
            SingleAgentEpisode(
                observations=[*data["obs"][lo:hi], data["next_obs"][hi - 1]],
                actions=list(data["action"][lo:hi]),
                rewards=list(data["reward"][lo:hi]),
                observation_space=obs_space,
                action_space=gym.spaces.Discrete(2),
                truncated=True,
                len_lookback_buffer=0,
            )
        )
    buffer = PrioritizedEpisodeReplayBuffer(capacity=size, alpha=0.6)
    start = time.perf_counter()
    for lo in range(0, len(episodes), 10):
        buffer.add(episodes[lo : lo + 10])
    insert_rate = size / (time.perf_counter() - start)

    def step(i: int) -> None:
        buffer.sample(num_items=BATCH, beta=0.4, n_step=1, gamma=0.99)
        buffer.update_priorities(td[i % len(td)])

    return insert_rate, time_cycles(cycles, step), buffer.get_num_timesteps()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--insert-chunk", type=int, default=1000)
    parser.add_argument("--skip-rllib", action="store_true")
    parser.add_argument("--profile-calls", type=int, default=2000, help="calls per round")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    data = make_data(args.size, seed=0)
    td = np.abs(np.random.default_rng(1).standard_normal((args.cycles, BATCH)))
    runs = {
        "rl-dist-ext PrioritizedReplay": lambda: bench_rl_dist_ext(
            data, td, args.cycles, args.insert_chunk
        ),
        "tianshou PrioritizedReplayBuffer": lambda: bench_tianshou(data, td, args.cycles),
    }
    if not args.skip_rllib:
        runs["rllib PrioritizedEpisodeReplayBuffer"] = lambda: bench_rllib(data, td, args.cycles)

    rows = {}
    for name, run in runs.items():
        insert_rate, cycle_rate, stored = run()
        rows[name] = {
            "insert_transitions_per_s": insert_rate,
            "sample_update_cycles_per_s": cycle_rate,
            "stored": stored,
        }
        print(f"{name:40s} insert {insert_rate:12,.0f} /s   cycles {cycle_rate:10,.1f} /s")

    profile = profile_cycle(data, td, args.profile_calls, args.insert_chunk)
    for stage, us in profile.items():
        print(f"  {stage:40s} {us:8.2f} us")
    ours = rows["rl-dist-ext PrioritizedReplay"]
    for row in rows.values():
        row["cycles_ratio_ours_over_this"] = (
            ours["sample_update_cycles_per_s"] / row["sample_update_cycles_per_s"]
        )
        row["insert_ratio_ours_over_this"] = (
            ours["insert_transitions_per_s"] / row["insert_transitions_per_s"]
        )
    result = {
        "benchmark": "replay_bench",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": __import__("os").cpu_count(), "platform": platform.platform()},
        "params": {
            "size": args.size,
            "cycles": args.cycles,
            "batch": BATCH,
            "insert_chunk": args.insert_chunk,
            "alpha": 0.6,
            "beta": 0.4,
        },
        "results": rows,
        "profile_us": profile,
        "targets": {"cycles_vs_tianshou": 5.0, "cycles_vs_rllib": 100.0},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "replay_bench.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# Prioritized replay: rl-dist-ext vs Tianshou vs RLlib",
        "",
        f"{args.size:,} CartPole-shaped transitions, capacity {args.size:,}, then "
        f"{args.cycles} x [sample {BATCH} + update priorities]; alpha 0.6, beta 0.4; "
        f"{result['machine']['cpus']} CPUs, one run ({result['date']} UTC). "
        "Ratios are rl-dist-ext's rate divided by the row's.",
        "",
        "| replay | insert transitions/s | sample+update cycles/s | cycles ratio | insert ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, row in rows.items():
        lines.append(
            f"| {name} | {row['insert_transitions_per_s']:,.0f} | "
            f"{row['sample_update_cycles_per_s']:,.1f} | "
            f"{row['cycles_ratio_ours_over_this']:.1f}x | "
            f"{row['insert_ratio_ours_over_this']:.1f}x |"
        )
    lines += [
        "",
        "Targets: >= 5x Tianshou's cycles/s and >= 100x RLlib's. Insert paths differ by API: "
        f"rl-dist-ext adds columnar chunks of {args.insert_chunk}, Tianshou one transition per "
        f"call, RLlib {EPISODE_LEN}-step episodes in lists of 10.",
    ]
    tianshou_us = 1e6 / rows["tianshou PrioritizedReplayBuffer"]["sample_update_cycles_per_s"]
    trees = profile["sum-tree descent (stratified)"] + profile["sum-tree leaf update"]
    stages = sum(us for stage, us in profile.items() if stage in STAGES)
    ours_us = 1e6 / ours["sample_update_cycles_per_s"]
    lines += [
        "",
        f"Where an rl-dist-ext cycle's time goes: each stage timed alone ({args.profile_calls} "
        "calls, each on another draw's inputs, the fastest of 5 rounds), microseconds a call:",
        "",
        "| stage | us |",
        "|---|---:|",
        *(f"| {stage} | {us:.2f} |" for stage, us in profile.items()),
        "",
        f"A cycle took {ours_us:.1f} us here and {tianshou_us:.1f} us in Tianshou; 5x "
        f"Tianshou's is {tianshou_us / 5:.1f} us a cycle. The stages alone, with no Python "
        f"around them, take {stages:.1f} us (Tianshou's cycle is {tianshou_us / stages:.1f}x "
        f"that), the two sum-tree walks {trees:.1f} us of it ({tianshou_us / trees:.1f}x); the "
        "update stages ran on other draws' keys, colder in cache than a cycle's update.",
    ]
    (args.out / "replay_bench.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / 'replay_bench.json'} and replay_bench.md")


if __name__ == "__main__":
    main()
