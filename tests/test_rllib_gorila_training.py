"""GorilaDQN end to end: Tune and RLlib's evaluation.

The CartPole learning test is the example script's ``--as-test`` run
(``tests/test_rllib_examples.py``).

Tune runs GorilaDQN by name in the RLlib guide's snippet (``tests/test_doc_snippets.py``);
a 2-trial grid search runs in ``tests/test_rllib_vtrace_training.py`` (the same placement-group
path, for VTrace).
"""

from __future__ import annotations

import pytest
from test_rllib_gorila import small_config


def test_tune_sweeps_a_replay_setting(ray_session, tmp_path):
    """``.replay()`` takes a Tune search space (values are checked when each trial builds its
    algorithm), and each trial's rate limiters hold that trial's value.

    With ``samples_per_insert=2`` and one runner, a learning chunk (8 updates of 128 rows) asks
    for more rows than the runner's queued requests insert: the learner's sample waits on the
    rate limiter, and the runners must keep getting requests meanwhile (the learner lives in the
    driver, which hands them out), or the sample waits out ``timeout_s`` and ``train()`` raises
    ``RateLimitTimeout`` (it did, before the learner's wait kept the runners acting)."""
    from ray import tune

    # 0.6 CPU a trial (main 0.3, a runner 0.2, a shard 0.1): both trials run at once
    config = (
        small_config(runners=1)
        .resources(num_cpus_for_main_process=0.3)
        .replay(num_shards=1, timeout_s=10.0, samples_per_insert=tune.grid_search([2.0, 32.0]))
    )
    with pytest.raises(ValueError, match="samples_per_insert"):
        config.validate()  # a search space is no value: only Tune resolves it
    results = tune.Tuner(
        "GorilaDQN",
        param_space=config,
        run_config=tune.RunConfig(
            stop={"training_iteration": 2}, storage_path=str(tmp_path), verbose=0
        ),
    ).fit()
    assert not results.errors
    limits = {}
    for result in results:
        gorila = result.metrics["gorila"]
        limits[result.config["replay_settings"]["samples_per_insert"]] = gorila
        assert gorila["replay_samples_per_insert_limit"] == pytest.approx(
            result.config["replay_settings"]["samples_per_insert"]
        )
    assert sorted(limits) == [2.0, 32.0]


def test_rllib_evaluation_runs_the_learners_greedy_policy(ray_session):
    """RLlib's own ``.evaluation()`` with GorilaDQN: evaluation env runners get the learner's
    weights (GorilaDQN's runners pull theirs from a parameter server; RLlib pushes to these),
    act greedily (``explore=False``) and report ``evaluation/env_runners/...`` in the results,
    the metric an RLlib example's ``--as-test`` reads."""
    import torch

    config = small_config(runners=1).evaluation(
        evaluation_interval=1,
        evaluation_duration=3,
        evaluation_duration_unit="episodes",
        evaluation_num_env_runners=1,
        evaluation_config={"explore": False},
    )
    algorithm = config.build_algo()
    try:
        for _ in range(2):
            result = algorithm.train()
        evaluation = result["evaluation"]["env_runners"]
        assert evaluation["num_episodes"] >= 3
        assert evaluation["episode_return_mean"] > 0
        (evaluated,) = algorithm.eval_env_runner_group.foreach_env_runner(
            lambda runner: (runner.config.explore, runner.module.get_state()),
            local_env_runner=False,
        )
        explore, weights = evaluated
        assert explore is False
        learner = algorithm.get_module().get_state()
        for key, value in learner.items():
            torch.testing.assert_close(torch.as_tensor(weights[key]), torch.as_tensor(value))
    finally:
        algorithm.stop()
