"""Multi-agent learning on RLlib within env-step budgets (seed 0), each showing first that the
untrained agent is below the threshold (tic-tac-toe against a random player learns in the
example script's ``--as-test`` run, ``tests/test_rllib_examples.py``):

- MPE simple_spread (2 agents, simultaneous moves, one shared module): GorilaDQN and VTrace;
  greedy team return over 20 episodes, at least -35: standing still scores -40.5, uniformly
  random actions -43.5, a hand-written go-to-your-own-landmark policy -21 (the threshold was
  -45 until an untrained agent that mostly stands still passed it: seed 1, -38.4).

Acting and learning run concurrently, so a run is not bit-for-bit repeatable even when seeded;
the agent is checked during training and a test passes as soon as one check reaches the
threshold inside the budget. Measured here (seeds 0-4, make test-long): spread -35 after 3-9k
env steps (GorilaDQN), after 10-61k for VTrace (one runner x 8 envs, its value head on layers
of its own; see its test).
"""

from __future__ import annotations

import pytest
from test_rllib_multi_agent import spread_config, vtrace_spread_config
from tiers import learning_seeds

from rl_dist_ext.games import team_return
from rllib_plugins.pettingzoo import greedy_act
from rllib_plugins.vtrace import IMPALA_LOSS

TEAM_RETURN = -35.0
GORILA_SPREAD_BUDGET = 30_000
VTRACE_SPREAD_BUDGET = 150_000


def spread_team_return(algorithm) -> float:
    from mpe2 import simple_spread_v3

    def env():
        return simple_spread_v3.parallel_env(N=2, max_cycles=25, continuous_actions=False)

    act = greedy_act(algorithm.get_module("shared"))
    return team_return(env, lambda agent, obs: act(obs), episodes=20, seed=500)


def train_until(checks: list, algorithm, score, threshold: float, budget: int, every: int) -> list:
    """Untrained below ``threshold``, then train until a check reaches it or the budget ends;
    records the checks in ``checks`` as (env steps, score) and returns them."""
    untrained = score(algorithm)
    assert untrained < threshold, f"the untrained agent already passes: {untrained}"
    steps, next_check = 0, every
    while steps < budget:
        result = algorithm.train()
        # IMPALA's train() may return before any runner reported (short iterations): no count.
        steps = result.get("env_runners", {}).get("num_env_steps_sampled_lifetime", steps)
        if steps >= next_check:
            next_check = steps + every
            checks.append((steps, score(algorithm)))
            if checks[-1][1] >= threshold:
                break
    return checks


@pytest.mark.parametrize("seed", learning_seeds())
def test_gorila_dqn_shared_module_improves_the_spread_team_return(envs, seed, learning_curve):
    config = spread_config(n_step=3, gamma=0.95, updates_per_iteration=32).debugging(seed=seed)
    # 64-unit layers instead of DQN's 256 (an 18-value observation, 5 actions): seeds 0-4
    # reached -35 after 3-9k env steps in 18-35 s, against 9-16k steps and 30-41 s at 256.
    config = config.rl_module(model_config={"fcnet_hiddens": [64, 64], "head_fcnet_hiddens": [64]})
    algorithm = config.replay(capacity=50_000, min_size_to_sample=1_000).build_algo()
    try:
        checks = train_until(
            learning_curve, algorithm, spread_team_return, TEAM_RETURN, GORILA_SPREAD_BUDGET, 3_000
        )
        assert set(algorithm.replays) == {"shared"}
        stats = algorithm.replay("shared").stats(wait=True)
        # two agents move in every env step: two rows per env step, while the rate limiter
        # is credited one count per env step
        assert stats["num_inserted"] == 2 * stats["counted_inserts"]
        assert algorithm.train()["gorila"]["replay_rate_limiter_ratio/shared"] > 0
    finally:
        algorithm.stop()
    assert max(s for _, s in checks) >= TEAM_RETURN, f"team returns by env steps: {checks}"


# make test-long only, all five seeds: in one make test-long (2026-12-04) seeds 0-4 reached -35
# after 62k, 31k, 10k, 71k and 30k env steps, and the CI seed (2) took 20 s in one make test
# and 97 s in the next, where the suite is within a minute of CI's limit. make test trains the
# shared VTrace module on an AEC env in SEED mode (test_rllib_multi_agent.py) and runs
# GorilaDQN's spread learning test.
@pytest.mark.long
@pytest.mark.parametrize("seed", learning_seeds(ci=2))
def test_vtrace_shared_module_improves_the_spread_team_return(envs, seed, learning_curve):
    # One runner x 8 envs: seeds 0-4 reached -35 after 30k, 61k, 10k, 51k and 51k env steps in
    # 22-74 s; with 2 runners x 4 envs after 10k, 61k, 61k, 61k and 111k (50-150 s in CI).
    config = vtrace_spread_config(runners=1).env_runners(num_envs_per_env_runner=8)
    config = config.debugging(seed=seed)
    # IMPALA's loss (one pass; VTraceConfig's default until 2026-12-08, which the figures
    # above measured) with the value head on layers of its own, at IMPALA's value-loss weight:
    # sharing the policy's layers (with weight 0.05 for CartPole), the value error of spread's
    # large negative returns pulled the policy back to standing still (seed 1 stayed at -38 to
    # -40 up to 250k env steps); apart, seeds 0-4 reached -35 after 41k to 81k.
    config = config.rl_module(model_config={"vf_share_layers": False}).training(
        **IMPALA_LOSS,
        train_batch_size_per_learner=400,
        lr=5e-4,
        gamma=0.95,
        entropy_coeff=0.01,
        vf_loss_coeff=0.5,
    )
    algorithm = config.build_algo()
    try:
        checks = train_until(
            learning_curve, algorithm, spread_team_return, TEAM_RETURN, VTRACE_SPREAD_BUDGET, 10_000
        )
    finally:
        algorithm.stop()
    assert max(s for _, s in checks) >= TEAM_RETURN, f"team returns by env steps: {checks}"
