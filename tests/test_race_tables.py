"""The README's and the benchmarks page's race tables (benchmarks/race_tables.py): generated from
the committed reports, in sync with them, and saying which races are not yet complete."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import harness
import race_tables


def test_the_committed_tables_are_what_the_committed_reports_say():
    for relative, text in race_tables.render().items():
        assert (race_tables.ROOT / relative).read_text() == text, (
            f"{relative}'s race tables are out of date: run python benchmarks/race_tables.py"
        )


def _noop(env, seed, cap_s, target):  # never run: the records below stand for its runs
    raise AssertionError


def _race(**changes) -> harness.Race:
    fields = {
        "name": "toy",
        "title": "Toy race",
        "envs": ("CartPole-v1",),
        "target": 450.0,
        "cap_s": 100.0,
        "arms": (
            harness.Arm("ours", _noop, "ours, tuned here"),
            harness.Arm("theirs", _noop, "theirs, tuned here"),
        ),
        "baseline": "theirs",
        "seeds": (0, 1, 2, 3),
    }
    return harness.Race(**{**fields, **changes})


def _write_runs(folder: Path, race: harness.Race, seconds: dict[str, list[float | None]]) -> None:
    """Run records as the runner keeps them: each arm reaches the target at the given training
    seconds (None: never, the run ends at the cap)."""
    for arm, times in seconds.items():
        for seed, reached in enumerate(times):
            end = race.cap_s if reached is None else reached
            curve = [[end / 2, 1000, 100.0], [end, 2000, 100.0 if reached is None else 480.0]]
            record = {
                "curve": curve,
                "cap_s": race.cap_s,
                "wall_seconds": 900.0,
                "machine_pace_s": 0.25 + 0.1 * seed,
            }
            path = harness.run_path(folder, race, "CartPole-v1", arm, seed)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record))


def test_a_finished_race_gets_a_headline_row_with_its_intervals(tmp_path):
    race = _race()
    _write_runs(tmp_path, race, {"ours": [10, 11, 12, 13], "theirs": [40, 42, None, 44]})
    summary = harness.write_report(race, tmp_path)["CartPole-v1"]
    (report,) = race_tables.load_reports(tmp_path)

    (row,) = race_tables.headline([report]).splitlines()[2:]
    ours, theirs = summary["ours"], summary["theirs"]
    assert row.startswith("| toy | CartPole-v1 | ours | ")
    assert f"{ours['iqm_s']:.3g} s [" in row and f"{theirs['iqm_s']:.3g} s [" in row
    low, high = ours["ratio_interval"]
    assert f"{ours['ratio_to_baseline']:.2f} [{low:.2f}, {high:.2f}]" in row
    assert row.endswith("| yes | 8/8 |")  # every arm faster in every run: the interval < 1

    section = race_tables.page([report])
    assert "### Toy race" in section and "the runs took 2.0 h of wall time" in section
    assert "median 0.45, 0.25-0.55 over the runs" in section  # 8 runs of paces 0.25-0.55
    assert "| theirs | 3/4 |" in section  # one run of the baseline never reached the target
    assert "- **ours**: ours, tuned here." in section


def test_a_race_not_yet_complete_says_how_many_runs_are_in(tmp_path):
    race = _race()
    _write_runs(tmp_path, race, {"ours": [10, 11], "theirs": [40]})
    harness.write_report(race, tmp_path)
    (report,) = race_tables.load_reports(tmp_path)
    assert race_tables.headline([report]).splitlines()[2].endswith("| 3/8 (partial) |")
    assert "not 4 runs for every arm, runs in: `ours`: 2; `theirs`: 1" in race_tables.page([report])


def test_a_race_with_more_seeds_for_some_arms_says_which(tmp_path):
    race = _race()
    _write_runs(tmp_path, race, {"ours": [10, 11, 12, 13, 14, 15], "theirs": [40, 41, 42, 43]})
    harness.write_report(race, tmp_path)
    (report,) = race_tables.load_reports(tmp_path)
    assert "not 4 runs for every arm, runs in: `ours`: 6." in race_tables.page([report])


def test_no_table_claims_faster_before_every_seed_of_both_arms_is_in(tmp_path):
    """Two seeds of four, ours far ahead in both: the interval is below 1, but the claim waits
    for the race's seeds (the README, the benchmarks page and the race's own report)."""
    race = _race()
    _write_runs(tmp_path, race, {"ours": [10, 11], "theirs": [None, None]})
    harness.write_report(race, tmp_path)
    (report,) = race_tables.load_reports(tmp_path)
    assert report["summary"]["CartPole-v1"]["ours"]["ratio_interval"][1] < 1
    assert race_tables.headline([report]).splitlines()[2].endswith("| pending | 4/8 (partial) |")
    for text in (race_tables.page([report]), (tmp_path / "toy.md").read_text()):
        assert "| ours | 2/2 |" in text and "| pending |" in text and "| yes |" not in text
    _write_runs(tmp_path, race, {"ours": [10, 11, 12, 13], "theirs": [None] * 4})
    harness.write_report(race, tmp_path)
    (report,) = race_tables.load_reports(tmp_path)
    assert race_tables.headline([report]).splitlines()[2].endswith("| yes | 8/8 |")
    assert "| yes |" in (tmp_path / "toy.md").read_text()


def test_an_env_without_runs_yet_says_so(tmp_path):
    race = _race(envs=("CartPole-v1", "SlowCartPole-v1"))
    _write_runs(tmp_path, race, {"ours": [10], "theirs": [40]})
    harness.write_report(race, tmp_path)
    (report,) = race_tables.load_reports(tmp_path)
    assert "**SlowCartPole-v1**: no runs yet." in race_tables.page([report])
    assert "## SlowCartPole-v1\n\nNo runs yet." in (tmp_path / "toy.md").read_text()
    assert len(race_tables.headline([report]).splitlines()) == 3  # one row: CartPole-v1


def test_a_table_is_written_between_its_markers_and_nowhere_else():
    begin, end = race_tables.begin("headline"), race_tables.end("headline")
    text = f"intro\n{begin}\n\nold\n\n{end}\noutro\n"
    assert race_tables.replace_block(text, "headline", "new\n") == (
        f"intro\n{begin}\n\nnew\n\n{end}\noutro\n"
    )
    with pytest.raises(ValueError, match="expected one"):
        race_tables.replace_block("no markers here", "headline", "new")


def test_a_retention_race_shows_what_each_arm_kept_on_the_page_only(tmp_path):
    race = harness.retention_race(_race(seeds=(0,)))
    curves = {
        "ours": [[10, 1, 460.0], [20, 2, 500.0], [30, 3, 200.0], [40, 4, 470.0]],
        "theirs": [[50, 1, 100.0], [100, 2, 300.0]],
    }
    for arm, curve in curves.items():
        path = harness.run_path(tmp_path, race, "CartPole-v1", arm, 0)
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"curve": curve, "cap_s": 100.0, "wall_seconds": 100.0}))
    harness.write_report(race, tmp_path)
    (report,) = race_tables.load_reports(tmp_path)
    section = race_tables.page([report])
    # ours: after its first 460 at 10 s, 500, 200 and 470: two of three at >= 360, worst 200
    assert "| ours | 1/1 | 3 | 67% | 200 |" in section
    assert "| theirs | 0/1 | 0 | n/a | n/a |" in section
    assert race_tables.headline([report]).splitlines()[2:] == []
