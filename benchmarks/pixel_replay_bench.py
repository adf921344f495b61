"""Pixel observations in the replay: memory per stored transition and throughput, raw vs compressed.

Data: real Pong frames (``ALE/Pong-v5`` through gymnasium's ``AtariPreprocessing`` -- 84x84 grey,
frame skip 4 -- and a 4-frame ``FrameStackObservation``), random actions, episodes ending as
they do; rows are n-step transitions with ``obs`` and ``next_obs`` ``[4, 84, 84]`` uint8 (56,448
bytes together) plus action, reward and discount.

1. Codecs (``--codecs``): bytes per row, pack (actor side) and unpack (shard side) time per row.
2. Memory: a ``PrioritizedReplay`` of capacity ``--capacity`` (default 100,000) filled with
   Pong rows (the recorded rows cycled), compressed with each codec: its accounted bytes per
   row and the process RSS growth; raw uint8 is what ``ColumnarStorage`` allocates for the same
   rows (``capacity x row bytes``, not allocated here). 1M capacity is extrapolated linearly
   (per-row costs do not depend on capacity), and says so.
3. Throughput at ``--throughput-capacity`` rows: insert (chunks of ``--chunk``, packing
   included for compressed rows: actors pay it, not shards) and sample(32) + update_priorities.

Writes ``benchmarks/results/pixel_replay_bench.{json,md}``. Usage::

    .venv/bin/python benchmarks/pixel_replay_bench.py [--capacity 100000] [--frames 4000]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import time
from pathlib import Path

import numpy as np
from results_files import write_results

RESULTS = Path(__file__).parent / "results"
TARGET_FRACTION = 1 / 20


def pong_rows(num_steps: int, n_step: int, seed: int) -> dict[str, np.ndarray]:
    """``num_steps`` rows of Pong with random actions; ``next_obs`` is ``n_step`` steps on (the
    episode's last observation near its end, as n-step folding does)."""
    import ale_py
    import gymnasium as gym
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.25)
    env = FrameStackObservation(AtariPreprocessing(env, frame_skip=4, noop_max=30), 4)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    episode = [obs]
    rows: dict[str, list] = {"obs": [], "next_obs": [], "action": [], "reward": [], "discount": []}

    def flush(episode_obs: list, terminal: bool) -> None:
        last = len(episode_obs) - 1
        for t in range(last):
            rows["obs"].append(episode_obs[t])
            rows["next_obs"].append(episode_obs[min(t + n_step, last)])
            rows["action"].append(int(rng.integers(6)))
            rows["reward"].append(0.0)
            rows["discount"].append(0.0 if terminal and t + n_step >= last else 0.99**n_step)

    while len(rows["obs"]) < num_steps:
        obs, _, terminated, truncated, _ = env.step(int(rng.integers(6)))
        episode.append(obs)
        if terminated or truncated or len(episode) > num_steps:
            flush(episode, terminated)
            obs, _ = env.reset()
            episode = [obs]
    flush(episode, False)
    env.close()
    return {
        "obs": np.stack(rows["obs"][:num_steps]),
        "next_obs": np.stack(rows["next_obs"][:num_steps]),
        "action": np.asarray(rows["action"][:num_steps], dtype=np.int64),
        "reward": np.asarray(rows["reward"][:num_steps], dtype=np.float32),
        "discount": np.asarray(rows["discount"][:num_steps], dtype=np.float32),
    }


def rss_bytes() -> int:
    """Resident memory after handing freed heap pages back to the OS (glibc ``malloc_trim``)."""
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def chunks(data: dict[str, np.ndarray], size: int, total: int):
    """``total`` rows in chunks of ``size``, cycling through ``data``."""
    n = len(data["obs"])
    done = 0
    while done < total:
        take = min(size, total - done)
        idx = (np.arange(done, done + take)) % n
        yield {k: v[idx] for k, v in data.items()}
        done += take


def bench_codecs(data, codecs: list[str]) -> list[dict]:
    from rl_dist_ext.replay.compression import ObsCompression, pack, unpack

    out = []
    for name in codecs:
        codec, _, level = name.partition(":")
        compression = ObsCompression(codec=codec, level=int(level) if level else None)
        warm = pack({k: v[:8] for k, v in data.items()}, compression)  # imports, contexts
        unpack(warm.blobs, warm.layout, codec)
        pack_s = unpack_s = 0.0
        sizes = []
        for part in chunks(data, 256, len(data["obs"])):  # an actor's push, a shard's sample
            start = time.perf_counter()
            packed = pack(part, compression)
            pack_s += time.perf_counter() - start
            start = time.perf_counter()
            back = unpack(packed.blobs[:32], packed.layout, codec)
            unpack_s += (time.perf_counter() - start) * len(packed) / 32
            assert np.array_equal(back["obs"], part["obs"][:32])
            assert np.array_equal(back["next_obs"], part["next_obs"][:32])
            sizes.extend(len(b) for b in packed.blobs)
        rows = len(sizes)
        out.append(
            {
                "codec": name,
                "blob_bytes_per_row": float(np.mean(sizes)),
                "pack_us_per_row": pack_s / rows * 1e6,
                "unpack_us_per_row": unpack_s / rows * 1e6,
            }
        )
        print(out[-1], flush=True)
    return out


def bench_memory(data, capacity: int, codec: str) -> dict:
    from rl_dist_ext.replay import ObsCompression, PrioritizedReplay

    warm = PrioritizedReplay(8, seed=0, compression=ObsCompression(codec=codec))
    warm.add({k: v[:8] for k, v in data.items()})  # imports and JIT outside the measurement
    warm.update_priorities(*warm.sample(4)[1:2], np.ones(4))
    del warm
    before = rss_bytes()
    replay = PrioritizedReplay(capacity, seed=0, compression=ObsCompression(codec=codec))
    start = time.perf_counter()
    for chunk in chunks(data, 500, capacity):
        replay.add(chunk)
    fill_s = time.perf_counter() - start
    grown = rss_bytes() - before
    result = {
        "codec": codec,
        "capacity": capacity,
        "bytes_per_row": replay.nbytes / len(replay),
        "rss_growth_bytes_per_row": grown / len(replay),
        "raw_row_bytes": replay.uncompressed_row_bytes,
        "fill_rows_per_s": capacity / fill_s,
    }
    del replay
    print(result, flush=True)
    return result


def bench_throughput(data, capacity: int, chunk: int, codec: str | None, cycles: int) -> dict:
    from rl_dist_ext.replay import ObsCompression, PrioritizedReplay

    compression = None if codec is None else ObsCompression(codec=codec)
    replay = PrioritizedReplay(capacity, seed=0, compression=compression)
    replay.add({k: v[:1] for k, v in data.items()})  # schema and JIT outside the clock
    start = time.perf_counter()
    for part in chunks(data, chunk, capacity):
        replay.add(part)
    insert_rate = capacity / (time.perf_counter() - start)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for _ in range(cycles):
        sample = replay.sample(32)
        replay.update_priorities(sample.keys, rng.random(32))
    cycle_rate = cycles / (time.perf_counter() - start)
    result = {
        "storage": codec or "raw uint8",
        "insert_rows_per_s": insert_rate,
        "sample_update_cycles_per_s": cycle_rate,
        "sampled_rows_per_s": cycle_rate * 32,
        "bytes_per_row": replay.nbytes / len(replay),
    }
    print(result, flush=True)
    return result


def markdown(report: dict) -> list[str]:
    raw = report["raw_obs_bytes_per_row"]
    lines = [
        "# Pixel replay: bytes per transition and throughput, raw vs compressed",
        "",
        f"Pong (ALE/Pong-v5, 84x84 grey, frame skip 4, 4-frame stacks, random actions), "
        f"{report['n_step']}-step rows, {report['recorded_rows']:,} recorded rows cycled; "
        f"{report['cpus']} CPUs, one run ({report['when']}). Raw obs+next_obs: {raw:,} bytes "
        f"per row (uint8). Target: <= 1/20 of that ({raw * TARGET_FRACTION:,.0f} bytes).",
        "",
        "## Codecs (one blob per row: obs then next_obs; packed in chunks of 256 rows, "
        "unpacked 32 at a time)",
        "",
        "| codec | bytes/row | pack us/row (actor) | unpack us/row (shard) |",
        "|---|---:|---:|---:|",
    ]
    for c in report["codecs"]:
        lines.append(
            f"| {c['codec']} | {c['blob_bytes_per_row']:,.0f} | {c['pack_us_per_row']:.1f} "
            f"| {c['unpack_us_per_row']:.1f} |"
        )
    lines += [
        "",
        f"## Replay memory at {report['capacity']:,} rows (1M extrapolated linearly)",
        "",
        "| storage | bytes/row (accounted) | RSS growth/row | fraction of raw obs | "
        f"at {report['capacity']:,} | at 1M (extrapolated) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    raw_row = report["memory"][0]["raw_row_bytes"]
    lines.append(
        f"| raw uint8 (ColumnarStorage) | {raw_row:,} | - | 1.0 | "
        f"{raw_row * report['capacity'] / 1e9:.2f} GB | {raw_row * 1e6 / 1e9:.1f} GB |"
    )
    for m in report["memory"]:
        lines.append(
            f"| {m['codec']} | {m['bytes_per_row']:,.0f} | {m['rss_growth_bytes_per_row']:,.0f} "
            f"| 1/{raw / m['bytes_per_row']:.0f} | "
            f"{m['bytes_per_row'] * report['capacity'] / 1e9:.3f} GB | "
            f"{m['bytes_per_row'] * 1e6 / 1e9:.2f} GB |"
        )
    lines += [
        "",
        f"## Throughput at {report['throughput_capacity']:,} rows (insert chunks of "
        f"{report['chunk']}, packing included; sample 32 + update priorities)",
        "",
        "| storage | insert rows/s | sample+update cycles/s | sampled rows/s |",
        "|---|---:|---:|---:|",
    ]
    for t in report["throughput"]:
        lines.append(
            f"| {t['storage']} | {t['insert_rows_per_s']:,.0f} | "
            f"{t['sample_update_cycles_per_s']:,.0f} | {t['sampled_rows_per_s']:,.0f} |"
        )
    lines += ["", report["note"]]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=4000, help="Pong rows recorded")
    parser.add_argument("--n-step", type=int, default=3)
    parser.add_argument("--capacity", type=int, default=100_000)
    parser.add_argument("--throughput-capacity", type=int, default=20_000)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--cycles", type=int, default=500)
    parser.add_argument("--codecs", nargs="+", default=["lz4", "zstd", "zstd:3"])
    parser.add_argument("--out", type=Path, default=RESULTS / "pixel_replay_bench")
    args = parser.parse_args()

    data = pong_rows(args.frames, args.n_step, seed=0)
    raw_obs = int(data["obs"][0].nbytes + data["next_obs"][0].nbytes)
    codecs = bench_codecs(data, args.codecs)
    memory = [bench_memory(data, args.capacity, c) for c in ("lz4", "zstd")]
    throughput = [
        bench_throughput(data, args.throughput_capacity, args.chunk, c, args.cycles)
        for c in (None, "lz4", "zstd")
    ]
    best = min(memory, key=lambda m: m["bytes_per_row"])
    report = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "n_step": args.n_step,
        "recorded_rows": len(data["obs"]),
        "raw_obs_bytes_per_row": raw_obs,
        "capacity": args.capacity,
        "throughput_capacity": args.throughput_capacity,
        "chunk": args.chunk,
        "codecs": codecs,
        "memory": memory,
        "throughput": throughput,
        "target_met": all(m["bytes_per_row"] <= raw_obs * TARGET_FRACTION for m in memory),
        "note": (
            f"Smallest: {best['codec']} at {best['bytes_per_row']:,.0f} bytes per row "
            f"(1/{raw_obs / best['bytes_per_row']:.0f} of raw obs+next_obs). Accounted bytes "
            "count the blobs, their Python object headers and pointers, and the numeric columns; "
            "RSS growth also counts allocator slack. Raw uint8 rows are not allocated here: "
            "ColumnarStorage pre-allocates exactly capacity x row bytes."
        ),
    }
    write_results(args.out, report, markdown(report))


if __name__ == "__main__":
    main()
