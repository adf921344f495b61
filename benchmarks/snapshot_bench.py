"""Replay snapshots: save and restore time and peak memory, the current format (Arrow IPC + a JSON
header) against the pickle earlier versions wrote, side by side on the same replays.

Replays (``PrioritizedReplay``, full):

- ``cartpole``: ``--cartpole-rows`` (1,000,000) CartPole rows: obs and next_obs float32[4],
  action int64, reward and discount float32, done bool; priorities drawn at random.
- ``pong``: ``--pong-rows`` (100,000) compressed Pong rows (LZ4): real frames (``ALE/Pong-v5``,
  84x84 grey, 4-frame stacks, random actions; ``--pong-frames`` recorded rows cycled), obs and
  next_obs compressed into one blob per row.

Each (replay, format, save/restore) runs in a process of its own, so one measurement's freed
memory does not hide the next one's. A save starts with the replay built; a restore starts
with nothing and ends with the restored replay (it loads into a fresh one, as a restarting
shard does). Memory is the process's resident set (RSS, anonymous plus file-backed pages;
sampled every 2 ms): *extra* is the peak during the operation above its start (save) or its end
(restore: the restored replay), i.e. what the operation needs beyond the replay itself. The
pickle format is measured
as rl-dist-ext 0.x did it: ``pickle.dump(state_dict, protocol=5)`` into the file stream, and
``pickle.loads(stream.read())`` then ``load_state_dict``. Local disk, warm page cache.

Writes ``benchmarks/results/snapshot_bench.{json,md}``. Usage::

    .venv/bin/python benchmarks/snapshot_bench.py [--cartpole-rows 1000000] [--pong-rows 100000]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pickle
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from results_files import write_results

RESULTS = Path(__file__).parent / "results"


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """The highest RSS seen (every 2 ms) while the block runs."""

    def __enter__(self):
        self.start = self.peak = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.end = rss()
        self.peak = max(self.peak, self.end)


def build(kind: str, rows: int, frames: int):
    from rl_dist_ext.replay.compression import ObsCompression, pack
    from rl_dist_ext.replay.prioritized import PrioritizedReplay

    rng = np.random.default_rng(0)
    if kind == "cartpole":
        replay = PrioritizedReplay(rows, seed=0)
        for start in range(0, rows, 100_000):
            n = min(100_000, rows - start)
            obs = rng.standard_normal((n, 4)).astype(np.float32)
            replay.add(
                {
                    "obs": obs,
                    "next_obs": obs + 0.01,
                    "action": rng.integers(0, 2, n),
                    "reward": np.ones(n, np.float32),
                    "discount": np.full(n, 0.99, np.float32),
                    "done": rng.random(n) < 0.02,
                },
                rng.random(n),
            )
        return replay
    sys.path.insert(0, str(Path(__file__).parent))
    from pixel_replay_bench import chunks, pong_rows

    compression = ObsCompression(columns=("obs", "next_obs"), codec="lz4")
    replay = PrioritizedReplay(rows, seed=0, compression=compression)
    for part in chunks(pong_rows(frames, 3, 0), 1_000, rows):
        replay.add(pack(part, compression), rng.random(len(part["obs"])))
    return replay


def fresh(kind: str, rows: int):
    from rl_dist_ext.replay.compression import ObsCompression
    from rl_dist_ext.replay.prioritized import PrioritizedReplay

    if kind == "cartpole":
        return PrioritizedReplay(rows, seed=0)
    return PrioritizedReplay(
        rows, seed=0, compression=ObsCompression(columns=("obs", "next_obs"), codec="lz4")
    )


def measure(kind: str, fmt: str, op: str, path: str, rows: int, frames: int) -> dict:
    """One measurement, in this process (pyarrow imported before it, as in a shard that runs
    on Ray, which imports it)."""
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.ipc

    pa.array([1, 2]).to_numpy()

    from rl_dist_ext.replay import snapshot

    fs = pafs.LocalFileSystem()
    if op == "save":
        replay = build(kind, rows, frames)
        with PeakRss() as memory:
            start = time.perf_counter()
            if fmt == "arrow":
                state, columns = replay.snapshot()
                snapshot.write_snapshot(path, {"replay": state}, columns)
            else:
                with fs.open_output_stream(path) as stream:
                    pickle.dump({"replay": replay.state_dict()}, stream, protocol=5)
            seconds = time.perf_counter() - start
        size = sum(f.stat().st_size for f in Path(path).rglob("*")) if fmt == "arrow" else 0
        size = size or Path(path).stat().st_size
        stored = replay.nbytes
    else:
        with PeakRss() as memory:
            start = time.perf_counter()
            replay = fresh(kind, rows)
            if fmt == "arrow":
                loaded = snapshot.read_snapshot(path)
                replay.load_snapshot(loaded.state["replay"], loaded.columns)
                del loaded
            else:
                with fs.open_input_stream(path) as stream:
                    state = pickle.loads(stream.read())
                replay.load_state_dict(state["replay"])
                del state
            seconds = time.perf_counter() - start
        size, stored = 0, replay.nbytes
        assert len(replay) == rows
    # save: above where it started; restore: above the restored replay it ends with
    base = memory.start if op == "save" else memory.end
    return {
        "replay": kind,
        "format": fmt,
        "op": op,
        "seconds": round(seconds, 3),
        "peak_extra_mib": round((memory.peak - base) / 2**20, 1),
        "rss_start_mib": round(memory.start / 2**20, 1),
        "rss_end_mib": round(memory.end / 2**20, 1),
        "replay_mib": round(stored / 2**20, 1),
        "file_mib": round(size / 2**20, 1),
    }


def spread(runs: list[dict], key: str) -> str:
    """The median of the runs' ``key``, with their range."""
    values = sorted(r[key] for r in runs)
    median = values[len(values) // 2]
    return f"{median} ({values[0]}-{values[-1]})" if len(values) > 1 else f"{median}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cartpole-rows", type=int, default=1_000_000)
    parser.add_argument("--pong-rows", type=int, default=100_000)
    parser.add_argument("--pong-frames", type=int, default=4_000)
    parser.add_argument("--repeats", type=int, default=3, help="processes per measurement")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: kind,fmt,op,path,rows
    args = parser.parse_args()
    if args.one:
        kind, fmt, op, path, rows = args.one.split(",")
        print(json.dumps(measure(kind, fmt, op, path, int(rows), args.pong_frames)))
        return
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, rows in (("cartpole", args.cartpole_rows), ("pong", args.pong_rows)):
            for fmt in ("arrow", "pickle"):
                path = os.path.join(tmp, f"{kind}-{fmt}")
                for op, _ in itertools.product(("save", "restore"), range(args.repeats)):
                    out = subprocess.run(
                        [
                            sys.executable,
                            __file__,
                            "--one",
                            f"{kind},{fmt},{op},{path},{rows}",
                            "--pong-frames",
                            str(args.pong_frames),
                        ],
                        check=True,
                        capture_output=True,
                        text=True,
                    )
                    results.append(json.loads(out.stdout.strip().splitlines()[-1]))
                    print(results[-1], flush=True)
                shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.remove(path)
    rows_of = {"cartpole": args.cartpole_rows, "pong": args.pong_rows}
    lines = [
        "# Replay snapshots: Arrow IPC + JSON header vs the 0.x pickle",
        "",
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, local disk, warm "
        "page cache; each measurement in a fresh process (pyarrow imported), "
        f"median (range) of {args.repeats}. *Extra*: peak RSS "
        "during the operation above its start (save) or the restored replay (restore): what it "
        "needs beyond the replay. The current format's save includes flushing the file to disk.",
        "",
        "| replay | rows | replay MiB | format | file MiB | save s | save extra MiB "
        "| restore s | restore extra MiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for kind in ("cartpole", "pong"):
        for fmt in ("arrow", "pickle"):
            save, restore = (
                [r for r in results if (r["replay"], r["format"], r["op"]) == (kind, fmt, op)]
                for op in ("save", "restore")
            )
            lines.append(
                f"| {kind} | {rows_of[kind]:,} | {save[0]['replay_mib']} | {fmt} | "
                f"{save[0]['file_mib']} | {spread(save, 'seconds')} | "
                f"{spread(save, 'peak_extra_mib')} | {spread(restore, 'seconds')} | "
                f"{spread(restore, 'peak_extra_mib')} |"
            )
    report = {"args": vars(args), "machine": platform.platform(), "results": results}
    write_results(RESULTS / "snapshot_bench", report, lines)


if __name__ == "__main__":
    main()
