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
        tianshou_gorila_vs_dqn.make_race(),
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
