"""Multi-agent GorilaDQN on Tianshou learns within env-step budgets (Tianshou's own trainer,
seed 0), each first showing the untrained agent below the threshold:

- tic-tac-toe (turn-based, action masks): the learner in the second seat against Tianshou's
  random masked opponent; the test is the learner's mean game return (+1 win, -1 loss) over
  50 games, reduced from Tianshou's per-agent returns with ``multi_agent_return_reduction``;
- MPE simple_spread (2 agents, simultaneous moves through ``parallel_to_aec``, one shared
  module): the team's return (both agents' returns summed) over 10 episodes, at least -35
  (standing still scores -40.5, random actions -43.5; seeds 0-4 reached it in 12k env steps).

The greedy policy is tested after every epoch; training stops at the first test that passes.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_tianshou_multi_agent import (
    TICTACTOE,
    gorila,
    make_buffer,
    make_collector,
    spread_factory,
    tictactoe_algorithm,
)
from tianshou.data import Collector
from tianshou.env import DummyVectorEnv
from tiers import learning_seeds

from tianshou_plugins import MultiAgentGorilaDQN

EPOCH_ENV_STEPS = 3_000


def train(
    tests: list,
    algorithm,
    env_factory,
    *,
    budget: int,
    threshold: float,
    reduction,
    episodes: int,
    seed: int,
):
    """Train until a test (one per epoch, recorded in ``tests``) reaches ``threshold``."""
    from tianshou.trainer import OffPolicyTrainerParams

    np.random.seed(seed)
    buffer = make_buffer(capacity=50_000, min_size_to_sample=500, seed=seed)
    test_envs = DummyVectorEnv([env_factory] * 5)
    test_envs.seed(list(range(1_000, 1_005)))

    def stop_fn(mean_return: float) -> bool:
        tests.append(round(float(mean_return), 2))
        return mean_return >= threshold

    collector = None
    try:
        collector = make_collector(
            algorithm,
            buffer,
            env_factory=env_factory,
            envs_per_actor=4,
            weight_sync_every_n_steps=128,
            seed=seed,
        )
        result = algorithm.run_training(
            OffPolicyTrainerParams(
                training_collector=collector,
                test_collector=Collector(algorithm.policy, test_envs),
                max_epochs=budget // EPOCH_ENV_STEPS,
                epoch_num_steps=EPOCH_ENV_STEPS,
                collection_step_num_env_steps=256,
                update_step_num_gradient_steps_per_sample=0.25,
                batch_size=128,
                test_step_num_episodes=episodes,
                multi_agent_return_reduction=reduction,
                stop_fn=stop_fn,
                show_progress=False,
            )
        )
    finally:
        if collector is not None:
            collector.close()
        buffer.close()
        test_envs.close()
    assert tests[0] < threshold, f"the untrained agent already passes: {tests}"
    assert result.best_reward >= threshold, f"test returns, one per epoch: {tests}"


@pytest.mark.parametrize("seed", learning_seeds())
def test_gorila_dqn_beats_a_random_tictactoe_player_from_the_second_seat(
    cluster, seed, learning_curve
):
    train(
        learning_curve,
        tictactoe_algorithm(learner_seat=1, seed=seed),
        TICTACTOE,
        budget=45_000,
        threshold=0.6,
        reduction=lambda returns: returns[:, 1],  # the learner's (player_2's) game results
        episodes=50,
        seed=seed,
    )


@pytest.mark.parametrize("seed", learning_seeds())
def test_gorila_dqn_shared_module_improves_the_spread_team_return(cluster, seed, learning_curve):
    env = spread_factory()()
    shared = gorila((12,), 5, seed, gamma=0.95, n_step_return_horizon=3, target_update_freq=250)
    train(
        learning_curve,
        MultiAgentGorilaDQN(algorithms=[shared, shared], env=env),
        spread_factory(),
        budget=45_000,
        threshold=-35.0,
        reduction=lambda returns: returns.sum(axis=1),  # the team's return
        episodes=10,
        seed=seed,
    )
