"""benchmarks/learner_bench.py on a tiny budget (fast tier: the learner runs in this process):
every setting gets a row with its rounds and the ratio to RLlib's step at the first k, and the
profile; the baseline classes are RLlib's step (checked against the lean step in
tests/test_rllib_gorila.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_the_learner_bench_measures_every_setting_and_profiles(tmp_path):
    import learner_bench

    argv = ["--nets", "mlp", "--batch-sizes", "16", "--k", "1", "2", "--seconds", "0.05"]
    argv += ["--rounds", "2", "--profile", "--profile-updates", "8", "--out", str(tmp_path)]
    learner_bench.main(argv)
    report = json.loads((tmp_path / "learner_bench.json").read_text())
    rows = {
        (r["net"], r["batch_size"], r["updates_per_call"], r["path"]): r for r in report["rows"]
    }
    assert set(rows) == {("mlp", 16, k, p) for k in (1, 2) for p in ("rllib", "lean")}
    for row in rows.values():
        assert len(row["rounds"]) == 2 and row["updates_per_s"] > 0
    assert rows[("mlp", 16, 1, "rllib")]["vs_baseline"] == 1.0
    assert "run_backward" in report["profile_mlp_b128_k1"]  # the gradient step was profiled
    assert "| mlp | 16 | 2 | lean |" in (tmp_path / "learner_bench.md").read_text()
