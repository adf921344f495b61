"""GorilaDQN end to end: learning within an env-step budget, and a 2-trial Tune run.

Kept apart from test_rllib_gorila.py so that module's shared algorithm has released its CPUs
before Tune asks for a placement group.
"""

from __future__ import annotations

import pytest
from test_rllib_gorila import greedy_return, small_config

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_learns_cartpole_within_env_step_budget(ray_session):
    """Greedy return >= 150 within 40k env steps (seed 0)."""
    algorithm = small_config(updates_per_iteration=64).build_algo()
    try:
        env_steps = 0
        while env_steps < 40_000:
            result = algorithm.train()
            env_steps = result["env_runners"]["num_env_steps_sampled_lifetime"]
        score = greedy_return(algorithm.get_module())
        assert score >= 150, f"greedy return {score} after {env_steps} env steps"
    finally:
        algorithm.stop()


def test_tune_runs_two_trials_by_name(ray_session, tmp_path):
    from ray import tune

    config = small_config().training(lr=tune.grid_search([1e-3, 5e-4]))
    tuner = tune.Tuner(
        "GorilaDQN",
        param_space=config,
        run_config=tune.RunConfig(
            stop={"training_iteration": 2}, storage_path=str(tmp_path), verbose=0
        ),
    )
    results = tuner.fit()
    assert len(results) == 2
    assert not results.errors
    for result in results:
        assert result.metrics["training_iteration"] == 2
        assert "gorila" in result.metrics
