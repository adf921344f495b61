"""The race definitions in benchmarks/ (fast tier: nothing runs): each race is well formed, its
arms carry settings a report can keep, and every RLlib arm's config passes RLlib's validation
on every env of its race, so a race fails here rather than an hour into a run.

The runs themselves (one tiny seed of each arm, each in a process of its own) are the races'
smoke runs in ``tests/test_examples_smoke.py``."""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import harness
import minatar_race
import multi_agent_tictactoe
import rllib_gorila_vs_dqn
import rllib_vtrace_vs_appo
import run_races
import tianshou_gorila_vs_dqn
import tianshou_vtrace_vs_ppo

#: the RLlib race scripts and their races
RLLIB_RACES = [
    (module, kind)
    for module in (rllib_gorila_vs_dqn, rllib_vtrace_vs_appo)
    for kind in module.RACES
]


def all_races() -> list[harness.Race]:
    return [
        *(module.make_race(kind) for module, kind in RLLIB_RACES),
        *(tianshou_gorila_vs_dqn.make_race(kind) for kind in tianshou_gorila_vs_dqn.RACES),
        *(tianshou_vtrace_vs_ppo.make_race(kind) for kind in tianshou_vtrace_vs_ppo.RACES),
        *(multi_agent_tictactoe.make_race(kind) for kind in multi_agent_tictactoe.RACES),
        *(minatar_race.make_race(kind) for kind in minatar_race.RACES),
    ]


@pytest.mark.parametrize("race", all_races(), ids=lambda race: race.name)
def test_each_race_names_its_arms_settings_and_notes(race):
    names = [arm.name for arm in race.arms]
    assert race.baseline in names and len(set(names)) == len(names)
    assert len(race.seeds) >= 3 and race.cap_s > 0
    for arm in race.arms:
        assert len(arm.note) > 20, arm.name  # how the configuration was chosen
        settings = harness.arm_settings(arm)
        assert json.loads(json.dumps(settings)) == settings
        # the arm's settings are exactly what its function takes, on every env of the race
        for env in race.envs:
            inspect.signature(arm.run).bind(env, 0, race.cap_s, race.target)
    # the report's file names stay apart
    assert len({race.name for race in all_races()}) == len(all_races())


@pytest.mark.parametrize(
    ("module", "kind"),
    RLLIB_RACES,
    ids=[module.make_race(kind).name for module, kind in RLLIB_RACES],
)
def test_every_rllib_arm_config_validates_on_every_env_of_its_race(module, kind):
    import rllib_plugins  # noqa: F401  (registers GorilaDQN and VTrace)

    race = module.make_race(kind)
    for arm in race.arms:
        settings = dict(arm.run.keywords)
        algorithm = settings.pop("algorithm")
        settings.pop("eval_every_s")
        for env in race.envs:
            config = module.arm_config(algorithm, env, 0, settings)
            config.validate()
            if env == "SlowCartPole-v1" and "slow_runners" in settings:
                assert config.num_env_runners == settings["slow_runners"]
            else:
                assert config.num_env_runners == settings["runners"]


def test_the_rllib_tictactoe_arms_configs_validate():
    import rllib_plugins  # noqa: F401  (registers GorilaDQN)

    for arm in multi_agent_tictactoe.make_race("rllib").arms:
        keywords = arm.run.keywords
        config = multi_agent_tictactoe.rllib_config(
            keywords["algorithm"], 0, keywords.get("dqn_envs", 1)
        )
        config.validate()
        assert set(config.policies) == {"learner", "random"}


def test_the_minatar_rllib_arms_configs_validate():
    import rllib_plugins  # noqa: F401  (registers GorilaDQN)

    builders = {"GorilaDQN": minatar_race.gorila_rllib_config, "DQN": minatar_race.dqn_rllib_config}
    for arm in minatar_race.make_race("all").arms:
        if arm.run.func is not minatar_race.rllib_arm:
            continue
        config = dict(arm.run.keywords)
        build = builders[config.pop("algorithm")]
        for unused in ("eval_every_s", "eval_max_steps"):
            config.pop(unused)
        built = build(0, **config)
        built.validate()
        assert built.train_batch_size_per_learner == minatar_race.BATCH


def test_each_tianshou_baseline_has_a_vector_env_layout_for_every_env_of_its_race():
    for kind in tianshou_vtrace_vs_ppo.RACES:
        race = tianshou_vtrace_vs_ppo.make_race(kind)
        for arm in race.arms:
            layouts = arm.run.keywords.get("layouts")
            if layouts is None:
                continue
            for env in race.envs:
                vector_env, _, envs = layouts[env].partition(":")
                assert vector_env in ("dummy", "subproc") and int(envs) >= 1, (arm.name, env)


def test_a_tianshou_vtrace_race_refuses_an_env_its_arms_have_no_layout_for():
    """The ``slower`` race's PPO arms have a layout for SlowerCartPole-v1 only: another env is
    refused before any run starts, naming it and the race's envs."""
    with pytest.raises(ValueError, match=r"envs \['SlowCartPole-v1'\]: the 'slower' race runs on"):
        tianshou_vtrace_vs_ppo.make_race("slower", envs=["SlowCartPole-v1"])
    with pytest.raises(ValueError, match=r"envs \['SlowerCartPole-v1'\]: the 'slow' race"):
        tianshou_vtrace_vs_ppo.make_race("slow", envs=["SlowerCartPole-v1"])
    assert tianshou_vtrace_vs_ppo.make_race("slower").envs == ("SlowerCartPole-v1",)


@pytest.mark.parametrize(
    "module",
    [
        rllib_gorila_vs_dqn,
        rllib_vtrace_vs_appo,
        tianshou_vtrace_vs_ppo,
        multi_agent_tictactoe,
        minatar_race,
    ],
)
def test_an_unknown_race_is_refused_with_the_choices(module):
    with pytest.raises(ValueError, match=r"race 'pong': choose one of") as error:
        module.make_race("pong")
    assert all(repr(kind) in str(error.value) for kind in module.RACES)


def test_the_race_queue_runs_every_race_once_with_a_command_its_script_takes(tmp_path):
    """``run_races.py`` is how the evidence is run across sessions: a race missing from its
    queue would never run, and each queued command is one its script takes (here with
    ``--report-only``: the report of a race with no runs yet)."""
    queued = [item.race().name for item in run_races.QUEUE if not item.retention]
    assert sorted(queued) == sorted(race.name for race in all_races())
    for item in run_races.QUEUE:  # a retention race runs a race of the queue past its target
        if item.retention:
            assert item.race().name.removesuffix("_retention") in queued
            if item.arms:  # a subset of the race's arms; none named: all of them
                assert {arm.name for arm in item.race().arms} == set(item.arms)
    for item in run_races.QUEUE:
        module = sys.modules[item.script.removesuffix(".py")]
        module.main([*item.argv(), "--report-only", "--out", str(tmp_path)])
        report = json.loads((tmp_path / "races" / f"{item.race().name}.json").read_text())
        assert report["race"] == item.race().name


def test_the_race_plan_counts_the_runs_in_and_estimates_the_rest_from_them(tmp_path):
    race = run_races.QUEUE[0].race()  # Tianshou GorilaDQN's headline race: 2 envs x 2 arms
    assert race.name == "tianshou_gorila_vs_dqn" and len(race.arms) == 2
    assert "0/40" in run_races.plan_line(race, tmp_path)
    assert f"{40 * (race.cap_s + 60) / 3600:5.1f} h left (worst case" in run_races.plan_line(
        race, tmp_path
    )
    for seed, wall in ((0, 1800.0), (1, 1800.0)):
        path = harness.run_path(tmp_path, race, race.envs[0], race.arms[0].name, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"curve": [], "wall_seconds": wall}))
    line = run_races.plan_line(race, tmp_path)
    assert "2/40" in line and "  1.0 h spent" in line and " 19.0 h left (at their mean)" in line
