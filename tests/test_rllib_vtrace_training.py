"""VTrace (local inference, as a new user runs it) and GorilaDQN in SEED mode end to end:
learning within an env-step budget, and a Tune run of "VTrace" by name. VTrace in SEED
mode learns in the example script's ``--as-test`` run (``tests/test_rllib_examples.py``).

Kept apart from test_rllib_vtrace.py so that module's shared algorithm has released its CPUs
before Tune asks for placement groups.

Acting and learning run concurrently, so a run is not bit-for-bit repeatable even when seeded;
the greedy policy (5 episodes, fixed seeds) is therefore checked during training, and a test
passes as soon as one check reaches the threshold inside the budget.
"""

from __future__ import annotations

import pytest
import test_rllib_gorila
from test_rllib_vtrace import small_config
from tiers import learning_seeds

from rllib_plugins.evaluation import greedy_return

THRESHOLD = 150.0
GORILA_BUDGET_ENV_STEPS = 50_000
GORILA_EVAL_EVERY_ENV_STEPS = 5_000


def env_steps(result: dict) -> int:
    return int(result.get("env_runners", {}).get("num_env_steps_sampled_lifetime", 0))


def greedy(algorithm) -> float:
    return greedy_return(algorithm.get_module(), "CartPole-v1", episodes=5, seed=1000)


def train_until_threshold(
    scores: list, algorithm, budget_env_steps: int, eval_every_env_steps: int = 0
) -> tuple[list[tuple[int, float]], dict]:
    """Check that the untrained greedy policy is below THRESHOLD, then train until a greedy
    check (after every iteration, or every ``eval_every_env_steps``) reaches it or the budget
    is spent; record the checks in ``scores`` as (env steps, return) and return them with the
    last ``train()`` result."""
    untrained = greedy(algorithm)
    assert untrained < THRESHOLD, f"the untrained policy already passes: {untrained}"
    steps, next_eval = 0, eval_every_env_steps
    while steps < budget_env_steps:
        result = algorithm.train()
        steps = env_steps(result)
        if steps >= next_eval:
            next_eval += eval_every_env_steps
            scores.append((steps, greedy(algorithm)))
            if scores[-1][1] >= THRESHOLD:
                break
    return scores, result


DEFAULTS_BUDGET_ENV_STEPS = 300_000
DEFAULTS_EVAL_EVERY_ENV_STEPS = 10_000


@pytest.mark.parametrize("seed", learning_seeds())
def test_vtrace_defaults_learn_cartpole_on_a_laptop(ray_session, seed, learning_curve):
    """What a new user runs: ``VTraceConfig().environment("CartPole-v1")`` with 2 env runners
    and every other setting at its default, on the 2-CPU session (no GPU: central inference
    stays off). Greedy return >= 150 within 300k env steps, checked every 10k; the old
    defaults (central inference on the CPU, 1 env per runner) reached 70.8 in 300 s. With the
    PPO form's loss (the default since 2026-12-08) seeds 0-2 passed at 52k (394), 19k (500)
    and 33k (500) env steps."""
    from test_rllib_vtrace import actors_left_since, alive_actor_classes

    from rllib_plugins import VTraceConfig

    before = alive_actor_classes()
    config = VTraceConfig().environment("CartPole-v1").env_runners(num_env_runners=2)
    algorithm = config.debugging(seed=seed).build_algo()
    try:
        # no GPU here: the runners infer locally, and no server starts
        assert algorithm._inference is None
        servers = algorithm.env_runner_group.foreach_env_runner(
            lambda r: r._inference_server, local_env_runner=False
        )
        assert servers == [None, None]
        started = [name for i, name in alive_actor_classes().items() if i not in before]
        assert started.count("VTraceEnvRunner") == 2 and "InferenceServer" not in started
        scores, result = train_until_threshold(
            learning_curve, algorithm, DEFAULTS_BUDGET_ENV_STEPS, DEFAULTS_EVAL_EVERY_ENV_STEPS
        )
        assert "central_inference" not in result
    finally:
        algorithm.stop()
    assert actors_left_since(before) == []
    assert max(score for _, score in scores) >= THRESHOLD, f"greedy returns by env steps: {scores}"


@pytest.mark.parametrize("seed", learning_seeds())
def test_gorila_dqn_in_seed_mode_learns_cartpole_within_env_step_budget(
    ray_session, seed, learning_curve
):
    """GorilaDQN with central inference: greedy return >= 150 within 50k env steps (the budget
    of its local-inference test), checked every 5k env steps. One runner with 8 envs: on the
    2-CPU box 23-25 s to the threshold against 38-42 s with 2 x 4 (two runs each)."""
    config = (
        test_rllib_gorila.small_config(updates_per_iteration=64)
        .env_runners(num_env_runners=1, num_envs_per_env_runner=8)
        .central_inference(enabled=True, num_cpus=0.2)
        .debugging(seed=seed)
    )
    algorithm = config.build_algo()
    try:
        scores, result = train_until_threshold(
            learning_curve, algorithm, GORILA_BUDGET_ENV_STEPS, GORILA_EVAL_EVERY_ENV_STEPS
        )
        # One caller id per runner: its actions and its priorities' Q-values.
        assert result["central_inference"]["num_callers"] == 1
        assert result["central_inference"]["version"] > 0
    finally:
        algorithm.stop()
    assert max(score for _, score in scores) >= THRESHOLD, f"greedy returns by env steps: {scores}"


def test_tune_runs_a_vtrace_trial_by_name(ray_session, tmp_path):
    """A trial asks for 0.8 CPU (main 0.3, 2 runners x 0.2, server 0.1): two fit in 2 CPUs.
    One trial runs, in SEED mode (the PBT sweep example runs two with local inference)."""
    from ray import tune

    from rllib_plugins import VTrace

    config = small_config().env_runners(num_env_runners=1)  # a runner per trial is enough
    config = config.training(lr=tune.grid_search([1e-3]))
    bundles = VTrace.default_resource_request(small_config()).bundles
    assert sum(b["CPU"] for b in bundles) <= 1.0
    assert bundles[-1] == {"CPU": 0.1}  # the inference server's own bundle

    def served(trial_id: str, result: dict) -> bool:
        """Stop once the trial's inference server has answered its runner (an iteration can
        end before the first answer: IMPALA samples asynchronously; a run here failed so),
        or after 5 iterations."""
        return result["central_inference"]["num_requests"] > 0 or result["training_iteration"] >= 5

    tuner = tune.Tuner(
        "VTrace",
        param_space=config,
        run_config=tune.RunConfig(stop=served, storage_path=str(tmp_path), verbose=0),
    )
    results = tuner.fit()
    assert len(results) == 1
    assert not results.errors
    assert [result.config["lr"] for result in results] == [1e-3]
    for result in results:
        assert 1 <= result.metrics["training_iteration"] <= 5
        assert result.metrics["central_inference"]["num_callers"] == 1
        assert result.metrics["central_inference"]["requests_per_s"] > 0
