"""Multi-agent GorilaDQN on Tianshou (PettingZoo envs): errors before any actor starts, legal
actions only, each agent's own transitions pushed to its module's replay, Tianshou's trainer
and logger with per-agent returns, checkpoints of every module's replay.

The learning tests are in test_tianshou_multi_agent_training.py.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import alive_actor_ids

pytest.importorskip("pettingzoo")

from pettingzoo.classic import tictactoe_v3
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.algorithm.random import MARLRandomDiscreteMaskedOffPolicyAlgorithm
from tianshou.utils.net.common import Net

from tianshou_plugins import (
    GorilaCollector,
    GorilaDQN,
    MultiAgentDistributedReplayBuffer,
    MultiAgentGorilaDQN,
    PettingZooFactory,
)

TICTACTOE = PettingZooFactory(tictactoe_v3.env)


def spread_factory(**kwargs):
    from mpe2 import simple_spread_v3

    settings = {"N": 2, "max_cycles": 25, "continuous_actions": False}
    settings.update(kwargs)
    return PettingZooFactory(simple_spread_v3.parallel_env, parallel=True, **settings)


def gorila(obs_shape, num_actions, seed=0, **overrides) -> GorilaDQN:
    torch.manual_seed(seed)
    net = Net(state_shape=obs_shape, action_shape=num_actions, hidden_sizes=[64, 64])
    policy = DiscreteQLearningPolicy(model=net, action_space=gym.spaces.Discrete(num_actions))
    settings = {"gamma": 0.9, "n_step_return_horizon": 1, "target_update_freq": 100}
    settings.update(overrides)
    return GorilaDQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), **settings)


def tictactoe_algorithm(learner_seat: int = 1, seed: int = 0) -> MultiAgentGorilaDQN:
    """A GorilaDQN learner in ``learner_seat`` against Tianshou's random masked opponent."""
    env = TICTACTOE()
    random = MARLRandomDiscreteMaskedOffPolicyAlgorithm(action_space=env.action_space)
    algorithms = [random, random]
    algorithms[learner_seat] = gorila((3, 3, 2), 9, seed)
    return MultiAgentGorilaDQN(algorithms=algorithms, env=env)


def make_buffer(capacity: int = 4_000, **overrides) -> MultiAgentDistributedReplayBuffer:
    settings = {
        "num_shards": 2,
        "min_size_to_sample": 64,
        "num_cpus_per_shard": 0.05,
        "timeout_s": 30.0,
        "seed": 0,
    }
    settings.update(overrides)
    return MultiAgentDistributedReplayBuffer(capacity, **settings)


def make_collector(algorithm, buffer, env_factory=TICTACTOE, **overrides) -> GorilaCollector:
    settings = {
        "env_factory": env_factory,
        "buffer": buffer,
        "num_actors": 2,
        "envs_per_actor": 2,
        "steps_per_env": 16,
        "weight_sync_every_n_steps": 32,
        "num_cpus_per_actor": 0.1,
        "seed": 0,
    }
    settings.update(overrides)
    return GorilaCollector(algorithm, **settings)


# ---- without Ray --------------------------------------------------------------------------------
def test_one_module_per_gorila_object_named_by_its_first_agent():
    env = spread_factory()()
    shared = gorila((12,), 5)
    algorithm = MultiAgentGorilaDQN(algorithms=[shared, shared], env=env)
    assert list(algorithm.learning_modules) == ["agent_0"]
    assert algorithm.module_of_agent == {"agent_0": "agent_0", "agent_1": "agent_0"}
    separate = MultiAgentGorilaDQN(algorithms=[gorila((12,), 5), gorila((12,), 5)], env=env)
    assert list(separate.learning_modules) == ["agent_0", "agent_1"]
    assert list(tictactoe_algorithm().learning_modules) == ["player_2"]


def test_bad_multi_agent_algorithms_raise():
    env = TICTACTOE()
    random = MARLRandomDiscreteMaskedOffPolicyAlgorithm(action_space=env.action_space)
    with pytest.raises(ValueError, match="at least one GorilaDQN"):
        MultiAgentGorilaDQN(algorithms=[random, random], env=env)
    with pytest.raises(ValueError, match="one algorithm per agent"):
        MultiAgentGorilaDQN(algorithms=[random], env=env)
    with pytest.raises(ValueError, match="share gamma and the n-step horizon"):
        MultiAgentGorilaDQN(
            algorithms=[gorila((3, 3, 2), 9), gorila((3, 3, 2), 9, gamma=0.5)], env=env
        )


class RecordingReplay:
    def __init__(self):
        self.added = []

    def add(self, transitions, priorities=None, *, count=None):
        self.added.append((transitions, priorities, count))


def test_the_actor_acts_legally_and_pushes_each_agents_own_transitions():
    """The real actor class in this process (Tianshou's collector over PettingZooEnv, the
    multi-agent policy with epsilon 0.5 for the learner, a random masked opponent): every
    action is legal, only the learner's transitions are pushed, with the mask of their next
    observation, rewards of +-1 only where a game ended, and env-step credit."""
    from rl_dist_ext.params import ParameterServer
    from tianshou_plugins.actor import MultiAgentGorilaActor
    from tianshou_plugins.weights import cpu_state_dict

    algorithm = tictactoe_algorithm()
    server = ParameterServer()
    server.publish(cpu_state_dict(algorithm.policy), 0)
    replay = RecordingReplay()
    actor = MultiAgentGorilaActor(
        policy=algorithm.policy,
        env_factory=TICTACTOE,
        num_envs=2,
        epsilon=0.5,
        gamma=0.9,
        n_step=1,
        replays={"player_2": replay},
        module_of_agent=algorithm.module_of_agent,
        agents=algorithm.agents,
        weights_server=server,
        weight_sync_every_n_steps=64,
        steps_per_env=16,
        actor_index=0,
        seed=0,
    )
    episodes = 0
    for _ in range(20):
        result = actor.collect_and_push()
        steps = actor._buffer[np.arange(len(actor._buffer))]
        masks = np.asarray(steps.obs.mask, dtype=bool)
        assert masks[np.arange(len(steps.act)), steps.act.astype(int)].all()
        episodes += result["episodes"]
        assert result["env_steps"] == 32 and result["returns"].shape[1] == 2
    assert episodes > 20
    rows = np.concatenate([t["reward"] for t, _, _ in replay.added])
    assert set(np.unique(rows)) <= {-1.0, 0.0, 1.0} and (rows != 0).any()
    assert sum(count for _, _, count in replay.added) <= 20 * 32  # env steps, not rows
    first = replay.added[0][0]
    assert first["next_action_mask"].shape[1] == 9 and first["obs"].shape[1:] == (3, 3, 2)
    # after a non-terminal step the learner's next observation has a legal move
    alive = first["discount"] > 0
    assert first["next_action_mask"][alive].any(axis=1).all()


def test_each_rollout_reports_the_transitions_it_dropped_at_truncations():
    """``dropped_at_truncation`` is what one rollout dropped (the collector sums the returned
    rollouts' counts), so the rollouts' counts add up to what the actor dropped in all."""
    from rl_dist_ext.params import ParameterServer
    from tianshou_plugins.actor import MultiAgentGorilaActor
    from tianshou_plugins.weights import cpu_state_dict

    env = spread_factory(max_cycles=5)()
    shared = gorila((12,), 5)
    algorithm = MultiAgentGorilaDQN(algorithms=[shared, shared], env=env)
    server = ParameterServer()
    server.publish(cpu_state_dict(algorithm.policy), 0)
    actor = MultiAgentGorilaActor(
        policy=algorithm.policy,
        env_factory=spread_factory(max_cycles=5),
        num_envs=2,
        epsilon=0.5,
        gamma=0.9,
        n_step=1,
        replays={module: RecordingReplay() for module in algorithm.learning_modules},
        module_of_agent=algorithm.module_of_agent,
        agents=algorithm.agents,
        weights_server=server,
        weight_sync_every_n_steps=64,
        steps_per_env=16,
        actor_index=0,
        seed=0,
    )
    reported = [actor.collect_and_push()["dropped_at_truncation"] for _ in range(4)]
    dropped = sum(turns.dropped for turns in actor._turns)
    assert dropped > 0 and all(count >= 0 for count in reported)
    assert sum(reported) == dropped, reported


# ---- with Ray -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"env_factory": lambda: gym.make("CartPole-v1")}, TypeError, "PettingZooEnv"),
        ({"env_factory": spread_factory()}, ValueError, "agents"),
        ({"buffer": "x"}, TypeError, "MultiAgentDistributedReplayBuffer"),
        ({"central_inference": object()}, ValueError, "central_inference is not supported"),
    ],
)
def test_collector_errors_raise_before_any_actor_starts(cluster, overrides, error, match):
    from tianshou_plugins import CentralInference

    if "central_inference" in overrides:
        overrides = {"central_inference": CentralInference(num_cpus=0.1)}
    buffer = make_buffer()
    before = alive_actor_ids()
    with pytest.raises(error, match=match):
        make_collector(tictactoe_algorithm(), overrides.pop("buffer", buffer), **overrides)
    assert not buffer.started
    assert alive_actor_ids() <= before


def test_continuous_actions_raise_before_any_actor_starts(cluster):
    env = spread_factory()()
    algorithm = MultiAgentGorilaDQN(algorithms=[gorila((12,), 5), gorila((12,), 5)], env=env)
    before = alive_actor_ids()
    with pytest.raises(TypeError, match="Discrete action space; agent 'agent_0'"):
        make_collector(
            algorithm, make_buffer(), env_factory=spread_factory(continuous_actions=True)
        )
    assert alive_actor_ids() <= before


def test_trainer_runs_logs_agent_returns_and_checkpoints_each_module_replay(cluster, tmp_path):
    from tianshou.trainer import OffPolicyTrainerParams

    env = spread_factory()()
    shared = gorila((12,), 5)
    algorithm = MultiAgentGorilaDQN(algorithms=[shared, shared], env=env)
    buffer = make_buffer()
    collector = make_collector(algorithm, buffer, env_factory=spread_factory())
    try:
        stats = collector.collect(n_step=200)
        assert set(stats.agent_returns) == {"agent_0", "agent_1"}
        assert stats.replay["size/agent_0"] >= 64
        result = algorithm.run_training(
            OffPolicyTrainerParams(
                training_collector=collector,
                max_epochs=1,
                epoch_num_steps=400,
                collection_step_num_env_steps=100,
                update_step_num_gradient_steps_per_sample=0.25,
                batch_size=32,
                test_step_num_episodes=0,
                test_in_training=False,
                show_progress=False,
            )
        )
        assert result.update_step > 0
        assert algorithm.num_gradient_updates > 0 and shared.num_gradient_updates > 0
        replays = buffer.stats(wait=True)
        # both agents move every cycle: about two rows per two env steps (agent turns), and
        # the rate limiter was credited one count per env step
        assert replays["agent_0"]["num_inserted"] > 0
        buffer.save(str(tmp_path / "replay"))
        saved = replays["agent_0"]["size"]
    finally:
        collector.close()
        buffer.close()
    restored = make_buffer()
    try:
        restored.restore(str(tmp_path / "replay"), modules=["agent_0"])
        assert len(restored) >= saved
    finally:
        restored.close()


def test_agents_with_different_spaces_raise_before_any_actor_starts(cluster):
    """Tianshou's PettingZooEnv holds one space for all agents: an env whose agents differ is
    refused when the collector builds its probe env, before anything starts."""
    from mpe2 import simple_speaker_listener_v4

    factory = PettingZooFactory(
        simple_speaker_listener_v4.parallel_env, parallel=True, continuous_actions=False
    )
    env = spread_factory()()
    algorithm = MultiAgentGorilaDQN(algorithms=[gorila((12,), 5), gorila((12,), 5)], env=env)
    buffer = make_buffer()
    before = alive_actor_ids()
    with pytest.raises(ValueError, match=r"env_factory failed.*spaces for all agents"):
        make_collector(algorithm, buffer, env_factory=factory)
    assert not buffer.started
    assert alive_actor_ids() <= before
