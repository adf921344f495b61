"""The race harness (benchmarks/harness.py): each run in a fresh process, resumable, failures
recorded without stopping the race, and a report whose figures come from the runs.

The arms here are real but tiny: random search over linear CartPole policies (finds a policy
with a greedy return of 500 within a second), and a random policy (never does)."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import harness

pytestmark = pytest.mark.subprocess  # every run is a process of its own


def _episode(env, weights, seed: int) -> tuple[float, int]:
    obs, _ = env.reset(seed=seed)
    total, steps, done = 0.0, 0, False
    while not done:
        action = int(obs @ weights > 0) if weights is not None else env.action_space.sample()
        obs, reward, terminated, truncated, _ = env.step(action)
        total, steps, done = total + reward, steps + 1, terminated or truncated
    return total, steps


def _train(env_id: str, seed: int, cap_s: float, target: float, search: bool) -> dict:
    """Random search (``search``) or a random policy, evaluated greedily after each try on 3
    episodes (not counted as training time)."""
    import gymnasium as gym

    env = gym.make(env_id)
    env.action_space.seed(seed)
    rng = np.random.default_rng(seed)
    best, best_weights = -1.0, None
    trained, env_steps, curve = 0.0, 0, []
    while trained < cap_s:
        started = time.perf_counter()
        weights = rng.normal(size=4) if search else None
        score, steps = _episode(env, weights, seed=int(rng.integers(1 << 30)))
        env_steps += steps
        if score > best:
            best, best_weights = score, weights
        trained += time.perf_counter() - started
        greedy = np.mean([_episode(env, best_weights, seed=10_000 + i)[0] for i in range(3)])
        curve.append([round(trained, 4), env_steps, float(greedy)])
        if greedy >= target:
            break
        time.sleep(0.01)  # a random policy's tries are fast: keep its curve short
        trained += 0.01
    return {"curve": curve, "best_try": best}


def random_search(env: str, seed: int, cap_s: float, target: float) -> dict:
    return _train(env, seed, cap_s, target, search=True)


def random_policy(env: str, seed: int, cap_s: float, target: float) -> dict:
    return _train(env, seed, cap_s, target, search=False)


def broken(env: str, seed: int, cap_s: float, target: float) -> dict:
    raise RuntimeError(f"broken arm on seed {seed}")


def in_ray(env: str, seed: int, cap_s: float, target: float) -> dict:
    import ray

    cpus = ray.cluster_resources()["CPU"]
    return {"curve": [[0.1, 1, float(target)]], "ray_cpus": cpus}


def race(**changes) -> harness.Race:
    fields = {
        "name": "tiny_race",
        "title": "random search vs a random policy (harness test)",
        "envs": ("CartPole-v1",),
        "target": 200.0,
        "cap_s": 1.5,
        "arms": (
            harness.Arm("search", random_search, "random search over linear policies", False),
            harness.Arm("random", random_policy, "uniform random actions", False),
        ),
        "baseline": "random",
        "seeds": (0, 1, 2),
    }
    return harness.Race(**{**fields, **changes})


def test_a_race_runs_each_seed_and_arm_once_resumes_and_reports(tmp_path):
    lines: list[str] = []
    the_race = race()
    records = harness.run_race(the_race, tmp_path, log=lines.append)
    assert [(r["arm"], r["seed"]) for r in records] == [
        ("search", 0),
        ("random", 0),
        ("search", 1),
        ("random", 1),
        ("search", 2),
        ("random", 2),
    ]  # arms interleaved within a seed
    assert all("error" not in r and r["curve"] for r in records), lines
    assert all(r["machine_pace_s"] > 0 for r in records)
    assert any("not reached (1.5 s cap)" in line for line in lines), lines

    saved = harness.run_path(tmp_path, the_race, "CartPole-v1", "search", 1)
    stamp = saved.stat().st_mtime_ns
    assert harness.run_race(the_race, tmp_path, log=lines.append) == []  # all finished: skipped
    assert saved.stat().st_mtime_ns == stamp

    summary = harness.write_report(the_race, tmp_path)["CartPole-v1"]
    assert summary["search"]["reached"] == 3 and summary["random"]["reached"] == 0
    assert summary["random"]["times_s"] == [1.5, 1.5, 1.5]  # unreached: at the cap
    search_times = summary["search"]["times_s"]
    # 3 runs: floor(3 / 4) = 0 cut off each end, so the IQM is their mean
    assert summary["search"]["iqm_s"] == pytest.approx(np.mean(search_times), abs=0.01)
    assert summary["search"]["ratio_interval"][1] < 1.0 and summary["search"]["faster"]
    assert summary["search"]["probability_of_improvement"] == 1.0
    table = (tmp_path / "tiny_race.md").read_text()
    assert "| random | 0/3 |" in table and "| search | 3/3 |" in table and "| yes |" in table
    report = json.loads((tmp_path / "tiny_race.json").read_text())
    assert len(report["runs"]["CartPole-v1"]["search"]) == 3
    assert (tmp_path / "tiny_race.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_failed_run_is_reported_and_tried_again_next_time(tmp_path):
    the_race = race(
        arms=(
            harness.Arm("broken", broken, "raises", False),
            harness.Arm("random", random_policy, "uniform random actions", False),
        ),
        seeds=(0,),
        cap_s=0.2,
    )
    lines: list[str] = []
    records = harness.run_race(the_race, tmp_path, log=lines.append)
    assert "broken arm on seed 0" in records[0]["error"]
    assert "error" not in records[1]  # the race went on
    assert any("broken seed 0: FAILED" in line for line in lines)
    assert not harness.run_path(tmp_path, the_race, "CartPole-v1", "broken", 0).exists()
    again = harness.run_race(the_race, tmp_path, log=lines.append)
    assert [r.get("arm", "broken") for r in again] == ["broken"]  # only the failed run


def test_an_arm_that_uses_ray_gets_a_fresh_ray_of_the_races_size(tmp_path):
    the_race = race(
        arms=(harness.Arm("ray", in_ray, "checks its Ray", True),),
        baseline="ray",
        seeds=(0,),
        ray_cpus=1,
    )
    (record,) = harness.run_race(the_race, tmp_path, log=lambda line: None)
    assert record["ray_cpus"] == 1.0


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"baseline": "dqn"}, "baseline 'dqn' is not an arm"),
        (
            {"arms": (harness.Arm("a", random_policy, ""), harness.Arm("a", broken, ""))},
            "two arms share a name",
        ),
        ({"seeds": ()}, "must not be empty"),
        ({"cap_s": 0}, "cap_s must be > 0"),
    ],
)
def test_a_race_that_cannot_run_is_refused_when_defined(changes, match):
    with pytest.raises(ValueError, match=match):
        race(**changes)


def test_runs_of_other_settings_are_not_mixed_into_a_race(tmp_path):
    def one_arm(depth: int) -> harness.Race:
        arm = harness.Arm("random", partial(random_policy_capped, depth=depth), "", False)
        return race(arms=(arm,), baseline="random", seeds=(0,), cap_s=0.2)

    harness.run_race(one_arm(1), tmp_path, log=lambda line: None)
    (record,) = harness.load_runs(one_arm(1), tmp_path)["CartPole-v1"]["random"]
    assert record["arm_settings"] == {"depth": 1}
    assert harness.run_race(one_arm(1), tmp_path, log=lambda line: None) == []
    with pytest.raises(ValueError, match="other settings of arm 'random'"):
        harness.run_race(one_arm(2), tmp_path, log=lambda line: None)


def random_policy_capped(env: str, seed: int, cap_s: float, target: float, depth: int) -> dict:
    return _train(env, seed, cap_s, target, search=False)


def test_a_retention_race_runs_past_the_target_and_reports_what_each_arm_kept(tmp_path):
    the_race = harness.retention_race(race(seeds=(1,)))
    assert the_race.name == "tiny_race_retention" and harness.retention_race(the_race) is the_race
    records = harness.run_race(the_race, tmp_path, log=lambda line: None)
    assert all("error" not in r for r in records), records
    for record in records:  # nobody stopped at the target: every run went on to its cap
        assert record["curve"][-1][0] >= 1.5 - 0.1, record["curve"][-3:]
    assert harness.run_path(tmp_path, the_race, "CartPole-v1", "search", 1).exists()

    summary = harness.write_report(the_race, tmp_path)["CartPole-v1"]
    search, random = summary["search"], summary["random"]
    assert search["reached"] == 1 and random["reached"] == 0
    # pooled from the curves, as written from the definition
    later = kept = 0
    for record in records:
        if record["arm"] != "search":
            continue
        points = [(p[0], p[2]) for p in record["curve"]]
        first = next(t for t, v in points if v >= 200.0)
        after = [v for t, v in points if first < t <= 1.5]
        later, kept = later + len(after), kept + sum(v >= 160.0 for v in after)
    assert search["retention"]["later_evaluations"] == later > 0
    assert search["retention"]["kept"] == kept
    assert search["retention"]["share"] == pytest.approx(kept / later)
    assert random["retention"] == {
        "runs": 0,
        "later_evaluations": 0,
        "kept": 0,
        "share": None,
        "worst": None,
        "keep_line": 160.0,
    }
    table = (tmp_path / "tiny_race_retention.md").read_text()
    assert "| random | 0/1 | 0 | n/a | n/a |" in table


def test_an_ablation_race_changes_one_setting_per_arm_over_the_first_arms():
    the_race = harness.ablation_race(
        "tiny_ablation",
        "depth, one change at a time",
        partial(random_policy_capped, depth=1),
        "a random policy",
        (("as is", {}, "the base"), ("deeper", {"depth": 3}, "a suspect")),
        envs=("CartPole-v1",),
        target=200.0,
        cap_s=0.2,
        notes=("tiny",),
    )
    assert the_race.baseline == "as is" and the_race.retention and the_race.seeds == (0, 1, 2, 3, 4)
    assert [harness.arm_settings(arm) for arm in the_race.arms] == [{"depth": 1}, {"depth": 3}]
    assert [arm.note for arm in the_race.arms] == [
        "a random policy; the base",
        "a random policy; a suspect",
    ]
    with pytest.raises(ValueError, match="ablations must name at least the baseline's arm"):
        harness.ablation_race(
            "none",
            "none",
            random_policy_capped,
            "",
            (),
            envs=("CartPole-v1",),
            target=1.0,
            cap_s=1.0,
            notes=(),
        )


def test_a_report_speaks_for_the_arms_that_ran_and_names_the_others(tmp_path):
    import race_tables  # beside harness in benchmarks/, on the path set above

    queued = harness.Arm("queued", random_policy, "an arm with no runs yet", False)
    the_race = race(arms=(*race().arms, queued), seeds=(0,), cap_s=0.5)
    harness.run_race(the_race, tmp_path, arms=["search", "random"], log=lambda line: None)

    summary = harness.write_report(the_race, tmp_path)["CartPole-v1"]
    assert sorted(summary) == ["random", "search"]
    report = json.loads((tmp_path / "tiny_race.json").read_text())
    assert sorted(report["arms"]) == ["random", "search"]
    assert report["not_run"] == ["queued"]
    assert "queued" not in report["runs"]["CartPole-v1"]
    assert race_tables.runs_done(report) == (2, 2)  # not 2 of 3
    assert race_tables.uneven_arms(report) == []
    table = (tmp_path / "tiny_race.md").read_text()
    assert "- **queued**" not in table and "- Not run yet: **queued**." in table
    assert "- Not run yet: **queued**." in race_tables.page([report])

    # a baseline with no runs stays in the race (its ratios are n/a) and is named as not run
    harness.write_report(dataclasses.replace(the_race, baseline="queued"), tmp_path)
    report = json.loads((tmp_path / "tiny_race.json").read_text())
    assert sorted(report["arms"]) == ["queued", "random", "search"]
    assert report["not_run"] == ["queued"]
    assert race_tables.runs_done(report) == (2, 3)
