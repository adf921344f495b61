"""benchmarks/tianshou_actor_bench.py on a tiny budget (fast tier: one actor in this process,
no Ray): a row per setting with both ways timed, and the table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_the_actor_bench_times_both_ways_for_every_setting(tmp_path):
    import tianshou_actor_bench

    argv = ["--envs", "1", "3", "--stepping", "sequential", "threads"]
    argv += ["--rounds", "2", "--trajectories", "1", "--out", str(tmp_path)]
    tianshou_actor_bench.main(argv)
    report = json.loads((tmp_path / "tianshou_actor_bench.json").read_text())
    settings = {(row["envs"], row["stepping"]) for row in report["rows"]}
    assert settings == {(e, s) for e in (1, 3) for s in ("sequential", "threads")}
    for row in report["rows"]:
        assert row["sampled_ms"] > 0 and row["collector_ms"] > 0
        assert row["ratio"] == pytest.approx(row["collector_ms"] / row["sampled_ms"])
    assert "| 3 | threads |" in (tmp_path / "tianshou_actor_bench.md").read_text()
