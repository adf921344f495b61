"""GorilaDQN end to end: learning within an env-step budget.

Tune runs GorilaDQN by name in the README's RLlib snippet (``tests/test_readme_snippets.py``);
a 2-trial grid search runs in ``tests/test_rllib_vtrace_training.py`` (the same placement-group
path, for VTrace).
"""

from __future__ import annotations

import pytest
from test_rllib_gorila import small_config

from rllib_plugins.evaluation import greedy_return

pytestmark = [pytest.mark.ray, pytest.mark.slow]


BUDGET_ENV_STEPS = 50_000
EVAL_EVERY_ENV_STEPS = 5_000


def test_learns_cartpole_within_env_step_budget(ray_session):
    """The greedy policy reaches a return >= 150 (5 episodes) within 50k env steps (seed 0).

    Acting and learning run concurrently, so a run is not bit-for-bit repeatable even when
    seeded; the greedy policy is therefore checked every 5k env steps, and the test passes as
    soon as one check reaches 150 inside the budget.
    """
    algorithm = small_config(updates_per_iteration=64).build_algo()
    scores = []
    try:
        untrained = greedy_return(algorithm.get_module(), "CartPole-v1", episodes=5, seed=1000)
        assert untrained < 150, f"the untrained policy already passes: {untrained}"
        env_steps, next_eval = 0, EVAL_EVERY_ENV_STEPS
        while env_steps < BUDGET_ENV_STEPS:
            result = algorithm.train()
            env_steps = result["env_runners"]["num_env_steps_sampled_lifetime"]
            if env_steps >= next_eval:
                next_eval += EVAL_EVERY_ENV_STEPS
                scores.append(
                    (
                        env_steps,
                        greedy_return(algorithm.get_module(), "CartPole-v1", episodes=5, seed=1000),
                    )
                )
                if scores[-1][1] >= 150:
                    break
    finally:
        algorithm.stop()
    assert max(score for _, score in scores) >= 150, f"greedy returns by env steps: {scores}"
