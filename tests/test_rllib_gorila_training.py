"""GorilaDQN end to end with RLlib's evaluation and Tune (failed trials, sweeps that cannot run).

The CartPole learning test is the example script's ``--as-test`` run, and a 2-trial Tune grid
over a replay setting is the ASHA sweep example's run (both ``tests/test_rllib_examples.py``);
Tune runs GorilaDQN by name in the RLlib guide's snippet (``tests/test_doc_snippets.py``).
"""

from __future__ import annotations

import pytest
from test_rllib_gorila import small_config


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


@pytest.mark.long  # 30-40 s; make test keeps the checkpoint's replay restore (test_rllib_gorila)
def test_a_failed_tune_trial_restarts_from_its_last_checkpoint_with_its_replay(
    ray_session, tmp_path
):
    """``FailureConfig(max_failures=1)``: a trial that fails after its checkpoint at iteration
    2 restarts from it, the replay included: right after the restore the replay holds at least
    the checkpoint's rows (a fresh replay would hold one iteration's), and the learner's
    counters go on from the checkpoint's."""
    from ray import tune
    from ray.rllib.callbacks.callbacks import RLlibCallback

    failed = tmp_path / "failed_once"

    class FailOnceAtIteration3(RLlibCallback):  # pickled by value into the trial's process
        def on_train_result(self, *, algorithm, result, **kwargs) -> None:
            if result["training_iteration"] == 3 and not failed.exists():
                failed.touch()
                raise RuntimeError("an injected trial failure")

    config = small_config(runners=1).callbacks(FailOnceAtIteration3)
    results = tune.Tuner(
        "GorilaDQN",
        param_space=config,
        run_config=tune.RunConfig(
            stop={"training_iteration": 4},
            storage_path=str(tmp_path / "results"),
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=2),
            failure_config=tune.FailureConfig(max_failures=1),
            verbose=0,
        ),
    ).fit()
    assert failed.exists()
    assert not results.errors
    frame = results[0].metrics_dataframe.set_index("training_iteration")
    assert list(frame.index) == [1, 2, 3, 4]  # the failed iteration 3 never reported
    size = frame["gorila/replay_size"]
    updates = frame["learners/__all_modules__/num_gradient_updates"]
    assert size[3] >= size[2] > size[1], list(size)
    assert updates[3] > updates[2], list(updates)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("more CPUs than the cluster", r"a GorilaDQN trial asks for [\d.]+ CPUs but there are 2"),
        ("an unknown key", r"GorilaDQN has no config key 'lrr' \(value 0.001\).*'lr'"),
        ("a refused value", r"samples_per_insert must be > 0 or None, got -1.0"),
        ("VTrace: more CPUs than the cluster", r"a VTrace trial asks for [\d.]+ CPUs"),
    ],
    ids=["too-big", "unknown-key", "refused-value", "vtrace-too-big"],
)
def test_a_sweep_that_cannot_run_fails_before_any_trial_starts(
    ray_session, tmp_path, case, message
):
    """Tune calls ``default_resource_request`` in the driver as it creates each trial: the
    algorithm's checks there end ``Tuner.fit()`` with the project's error, and no actor
    starts (without them the oversized trial waits forever and the unknown key is ignored)."""
    from conftest import alive_actor_ids
    from ray import tune
    from test_rllib_vtrace import small_config as vtrace_config

    spaces = {
        "more CPUs than the cluster": small_config(runners=12),
        "an unknown key": {**small_config(runners=1).to_dict(), "lrr": 1e-3},
        "a refused value": small_config(runners=1).replay(
            samples_per_insert=tune.grid_search([-1.0, 4.0])
        ),
        "VTrace: more CPUs than the cluster": vtrace_config().env_runners(num_env_runners=12),
    }
    before = alive_actor_ids()
    tuner = tune.Tuner(
        "VTrace" if case.startswith("VTrace") else "GorilaDQN",
        param_space=spaces[case],
        run_config=tune.RunConfig(
            stop={"training_iteration": 1}, storage_path=str(tmp_path), verbose=0
        ),
    )
    with pytest.raises(ValueError, match=message):
        tuner.fit()
    assert alive_actor_ids() - before == set()
