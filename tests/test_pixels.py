"""Pixel observations end to end: the Atari and MinAtar env makers, uint8 from the env through
actors, replay (stored compressed) and learner to the network's first layer, and short training
runs of GorilaDQN on Atari and MinAtar in both frameworks (tiny budgets: they check wiring, not
learning). RLlib's MinAtar runs are the example scripts' smoke runs
(``tests/test_rllib_examples.py::test_minatar_example_runs_an_iteration_with_a_greedy_evaluation``)."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
import torch

from rl_dist_ext.pixel_envs import make_atari, make_minatar
from rl_dist_ext.replay import ObsCompression

pytest.importorskip("ale_py")
pytest.importorskip("minatar")


def assert_nature_convs(network: torch.nn.Module) -> None:
    """The Nature DQN convolutions (Mnih et al. 2015): 32 8x8/4, 64 4x4/2, 64 3x3/1 (first, in
    networks with a second encoder, e.g. a separate value encoder)."""
    convs = [m for m in network.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs][:3] == [
        (32, (8, 8), (4, 4)),
        (64, (4, 4), (2, 2)),
        (64, (3, 3), (1, 1)),
    ]


# ---- env makers ----------------------------------------------------------------------------------
def test_atari_frames_are_uint8_stacks_and_training_rewards_are_clipped():
    env = make_atari("ALE/Pong-v5")
    obs, _ = env.reset(seed=0)
    assert env.observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert obs.dtype == np.uint8 and obs.shape == (4, 84, 84)
    rewards = []
    for _ in range(300):
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        rewards.append(reward)
        if terminated or truncated:
            break
    assert set(rewards) <= {-1.0, 0.0, 1.0}
    # consecutive stacks share three frames (the stack moves by one each step)
    prev = obs
    obs, *_ = env.step(0)
    np.testing.assert_array_equal(obs[:3], prev[1:])
    env.close()
    last = make_atari("ALE/Pong-v5", channels_last=True)
    assert last.observation_space.shape == (84, 84, 4)
    assert last.reset(seed=0)[0].shape == (84, 84, 4)
    last.close()


def test_minatar_observations_are_uint8_channels():
    env = make_minatar("breakout")
    obs, _ = env.reset(seed=0)
    assert env.observation_space == gym.spaces.Box(0, 1, (4, 10, 10), np.uint8)
    assert obs.dtype == np.uint8 and set(np.unique(obs)) <= {0, 1}
    env.close()
    assert make_minatar("breakout", channels_last=True).observation_space.shape == (10, 10, 4)


def test_env_makers_refuse_unknown_games():
    with pytest.raises(ValueError, match="ALE id"):
        make_atari("Pong-v5")
    with pytest.raises(ValueError, match="game must be one of"):
        make_minatar("pong")


# ---- Tianshou ------------------------------------------------------------------------------------
def test_tianshou_pixel_networks_scale_uint8_at_the_first_layer():
    from tianshou_plugins.pixels import MinAtarNet, pixel_q_network

    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    net = pixel_q_network(space, gym.spaces.Discrete(6))
    assert_nature_convs(net)
    frames = np.random.default_rng(0).integers(0, 256, (2, 4, 84, 84), dtype=np.uint8)
    q_uint8, _ = net(torch.as_tensor(frames))
    q_float, _ = net.module(torch.as_tensor(frames / 255.0, dtype=torch.float32))
    torch.testing.assert_close(q_uint8, q_float)
    small = pixel_q_network(gym.spaces.Box(0, 1, (4, 10, 10), np.uint8), gym.spaces.Discrete(3))
    assert isinstance(small.module, MinAtarNet)
    assert small(np.zeros((5, 4, 10, 10), np.uint8))[0].shape == (5, 3)
    with pytest.raises(ValueError, match="uint8 Box"):
        pixel_q_network(gym.spaces.Box(0, 1, (4,), np.float32), gym.spaces.Discrete(2))


def test_tianshou_pixel_actor_critic_shares_one_trunk_and_scales_uint8_at_the_first_layer():
    from tianshou.utils.net.common import ActorCritic

    from tianshou_plugins.pixels import MinAtarNet, pixel_actor_critic

    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    actor, critic = pixel_actor_critic(space, gym.spaces.Discrete(6))
    assert actor.preprocess is critic.preprocess  # one trunk, both losses train it
    assert_nature_convs(actor)
    frames = np.random.default_rng(0).integers(0, 256, (2, 4, 84, 84), dtype=np.uint8)
    logits, _ = actor(frames)
    assert logits.shape == (2, 6) and critic(frames).shape == (2, 1)
    trunk = actor.preprocess.module
    features, _ = actor.preprocess(frames)
    expected, _ = trunk(torch.as_tensor(frames / 255.0, dtype=torch.float32))
    torch.testing.assert_close(features, expected)
    both = ActorCritic(actor, critic)
    shared = sum(p.numel() for p in trunk.parameters())
    heads = sum(p.numel() for p in actor.last.parameters()) + sum(
        p.numel() for p in critic.last.parameters()
    )
    assert sum(p.numel() for p in both.parameters()) == shared + heads  # trunk counted once

    small_actor, small_critic = pixel_actor_critic(
        gym.spaces.Box(0, 1, (4, 10, 10), np.uint8), gym.spaces.Discrete(3)
    )
    assert isinstance(small_actor.preprocess.module, MinAtarNet)
    assert small_actor.preprocess.get_output_dim() == 128
    grids = np.ones((5, 4, 10, 10), np.uint8)
    assert small_actor(grids)[0].shape == (5, 3) and small_critic(grids).shape == (5, 1)
    with pytest.raises(ValueError, match="pixel_actor_critic needs a Discrete action space"):
        pixel_actor_critic(space, gym.spaces.Box(-1, 1, (2,), np.float32))


def test_tianshou_vtrace_trains_on_minatar_with_the_pixel_actor_critic(ray_session):
    """VTrace (SEED-free, IMPALA mode) on MinAtar Breakout through Tianshou's on-policy
    trainer: the actors' trajectories keep uint8 frames, and gradient steps update the shared
    trunk."""
    from tianshou.algorithm.modelfree.reinforce import ProbabilisticActorPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.trainer import OnPolicyTrainerParams

    from tianshou_plugins import VTrace, VTraceCollector
    from tianshou_plugins.pixels import pixel_actor_critic
    from tianshou_plugins.vtrace import categorical_from_logits

    env_factory = functools.partial(make_minatar, "breakout")
    env = env_factory()
    torch.manual_seed(0)
    actor, critic = pixel_actor_critic(env.observation_space, env.action_space)
    policy = ProbabilisticActorPolicy(
        actor=actor,
        dist_fn=categorical_from_logits,
        action_scaling=False,
        action_bound_method=None,
        action_space=env.action_space,
        observation_space=env.observation_space,
        deterministic_eval=True,
    )
    env.close()
    algo = VTrace(policy=policy, critic=critic, optim=AdamOptimizerFactory(lr=5e-4))
    before = [p.detach().clone() for p in actor.preprocess.parameters()]
    collector = None
    try:
        collector = VTraceCollector(
            algo,
            env_factory=env_factory,
            num_actors=2,
            envs_per_actor=2,
            steps_per_env=16,
            weight_sync_every_n_steps=64,
            num_cpus_per_actor=0.1,
            seed=0,
        )
        result = algo.run_training(
            OnPolicyTrainerParams(
                training_collector=collector,
                max_epochs=1,
                epoch_num_steps=512,
                collection_step_num_env_steps=128,
                batch_size=128,
                show_progress=False,
            )
        )
        assert result.train_step >= 512 and result.update_step > 0
        assert collector.buffer.obs.dtype == np.uint8
    finally:
        if collector is not None:
            collector.close()
    after = list(actor.preprocess.parameters())
    assert any(not torch.equal(b, a) for b, a in zip(before, after, strict=True))


@pytest.mark.parametrize(
    ("env_factory", "num_actors"),
    [
        # one actor: what MinAtar and Atari add is their env (and network); the crashed actor's
        # restart with a pixel policy above Ray's inline limit (520 KiB) is end to end in make
        # test-long (a restart imports Tianshou and torch again: 14 s here); make test keeps
        # its mechanism in test_actor_pool's large-constructor-arguments restart
        (functools.partial(make_minatar, "breakout"), 1),
        (functools.partial(make_atari, "ALE/Pong-v5"), 1),
        pytest.param(functools.partial(make_minatar, "breakout"), 2, marks=pytest.mark.long),
    ],
    ids=["minatar", "atari", "minatar-crashed-actor"],
)
def test_tianshou_gorila_trains_on_pixels_with_compressed_uint8_replay(
    ray_session, env_factory, num_actors
):
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.trainer import OffPolicyTrainerParams

    from tianshou_plugins import DistributedPrioritizedReplayBuffer, GorilaCollector, GorilaDQN
    from tianshou_plugins.pixels import pixel_q_network

    env = env_factory()
    torch.manual_seed(0)
    policy = DiscreteQLearningPolicy(
        model=pixel_q_network(env.observation_space, env.action_space),
        action_space=env.action_space,
    )
    env.close()
    algo = GorilaDQN(
        policy=policy, optim=AdamOptimizerFactory(lr=1e-4), gamma=0.99, n_step_return_horizon=3
    )
    buffer = DistributedPrioritizedReplayBuffer(
        2_000,
        num_shards=1,
        min_size_to_sample=100,
        num_cpus_per_shard=0.05,
        seed=0,
        compression=ObsCompression(),
    )
    collector = None
    try:
        collector = GorilaCollector(
            algo,
            env_factory=env_factory,
            buffer=buffer,
            num_actors=num_actors,
            envs_per_actor=1,
            steps_per_env=32,
            weight_sync_every_n_steps=64,
            num_cpus_per_actor=0.1,
            seed=0,
        )
        result = algo.run_training(
            OffPolicyTrainerParams(
                training_collector=collector,
                max_epochs=1,
                epoch_num_steps=256,
                collection_step_num_env_steps=64,
                update_step_num_gradient_steps_per_sample=0.1,
                batch_size=16,
                show_progress=False,
            )
        )
        assert result.train_step >= 256 and result.update_step > 0
        sample = buffer.client.sample(8)
        assert sample.batch["obs"].dtype == np.uint8
        assert sample.batch["next_obs"].dtype == np.uint8
        stats = buffer.client.stats(wait=True)
        assert stats["compression_ratio"] > 5, stats
        if num_actors > 1:
            assert_a_crashed_actor_comes_back(collector, algo, buffer)
    finally:
        if collector is not None:
            collector.close()
        buffer.close()


def assert_a_crashed_actor_comes_back(collector, algo, buffer) -> None:
    """Kill actor 0 while the learner trains on: the rollout it had in flight is lost and
    counted, and Ray's restart of it delivers rollouts again, acting with weights it pulled
    after the restart. Its constructor takes the pickled pixel policy, above Ray's 100 KiB
    inline limit, which Ray had released once the actor was up (ray#53727): the restart failed
    in the creation task until the starter kept the arguments."""
    import time

    import ray
    from test_tianshou_gorila import gradient_steps

    pool = collector._actor_pool
    gradient_steps(algo, buffer, 2, batch_size=16)
    version_at_kill = collector.collect(n_step=32).weights_version  # published
    assert version_at_kill == algo.num_gradient_updates
    ray.kill(pool.handles[0], no_restart=False)
    from_restarted: list = []
    noticed = False
    deadline = time.monotonic() + 120  # a restart imports Tianshou and torch again
    while time.monotonic() < deadline:
        results = collector._gather(n_step=32, n_episode=None)
        gradient_steps(algo, buffer, 1, batch_size=16)
        if noticed:  # only rollouts started after the loss was seen come from the new process
            from_restarted += [r for r in results if r["actor_index"] == 0]
            if from_restarted:
                break
        noticed = pool.stats.failures_per_actor[0] >= 1
    assert noticed, "the killed actor's lost rollout was never counted"
    assert from_restarted, "the killed actor never delivered a rollout again"
    assert from_restarted[0]["weights_version"] >= version_at_kill
    assert algo.num_gradient_updates > version_at_kill  # the learner kept training
    stats = collector.collect(n_step=32)
    assert stats.actors["failures"] >= 1 and stats.actors["rollouts_lost"] >= 1
    assert stats.actors["num_actors"] == 2


# ---- RLlib ---------------------------------------------------------------------------------------
def test_rllib_module_gets_the_nature_cnn_and_scales_uint8_inside():
    from ray.rllib.core.columns import Columns

    from rllib_plugins import GorilaDQNConfig

    space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    config = GorilaDQNConfig().environment(
        observation_space=space, action_space=gym.spaces.Discrete(6)
    )
    module = config.get_rl_module_spec().build()
    assert_nature_convs(module)
    frames = np.random.default_rng(0).integers(0, 256, (2, 84, 84, 4), dtype=np.uint8)
    with torch.no_grad():
        q_uint8 = module.compute_q_values({Columns.OBS: torch.as_tensor(frames)})
        as_floats = torch.as_tensor(frames / 255.0, dtype=torch.float32)
        q_float = module.compute_q_values({Columns.OBS: as_floats})
    torch.testing.assert_close(q_uint8["qf_preds"], q_float["qf_preds"])


# MinAtar's run is the example script's (tests/test_rllib_examples.py)
@pytest.mark.parametrize("env", ["ALE/Pong-v5"], ids=["atari"])
def test_rllib_gorila_trains_on_pixels_with_compressed_uint8_replay(ray_session, env):
    from rllib_plugins import GorilaDQNConfig
    from rllib_plugins.pixels import pixel_env

    config = (
        GorilaDQNConfig()
        .environment(pixel_env(env))
        .env_runners(num_env_runners=2, num_cpus_per_env_runner=0.1, num_envs_per_env_runner=1)
        .learners(num_learners=0)
        .resources(num_cpus_for_main_process=0.2)
        .training(
            lr=1e-4,
            n_step=3,
            train_batch_size=16,
            env_steps_per_request=64,
            updates_per_iteration=4,
            weight_sync_every_n_steps=128,
        )
        .replay(
            num_shards=1,
            capacity=2_000,
            min_size_to_sample=100,
            num_cpus_per_shard=0.05,
            samples_per_insert=None,
            compression=ObsCompression(),
        )
        .reporting(min_sample_timesteps_per_iteration=128)
    )
    algo = config.build_algo()
    try:
        for _ in range(2):
            result = algo.train()
        gorila = result["gorila"]
        assert gorila["learner_weights_version"] > 0
        assert gorila["replay_compression_ratio"] > 5, gorila
        assert 0 < gorila["replay_bytes_per_transition"] < 2 * 4 * 84 * 84 / 5
        sample = algo.replays[next(iter(algo.replays))].sample(4)
        assert sample.batch["obs"].dtype == np.uint8
    finally:
        algo.stop()


@pytest.mark.parametrize("env", ["ALE/Pong-v5", "minatar:breakout"], ids=["atari", "minatar"])
def test_rllib_vtrace_default_module_scales_uint8_inside_on_each_pixel_env(env):
    """VTrace's default module on each pixel env's own spaces (no model config: what a user
    gets from ``VTraceConfig().environment(pixel_env(...))``): the Nature CNN for Atari's 84x84
    frames, RLlib's catalog encoder for MinAtar's 10x10 grids."""
    from ray.rllib.core.columns import Columns

    from rllib_plugins import VTraceConfig
    from rllib_plugins.pixels import PixelEnvCreator, PixelPPOTorchRLModule

    made = PixelEnvCreator(env)()
    try:
        space, actions = made.observation_space, made.action_space
    finally:
        made.close()
    config = VTraceConfig().environment(observation_space=space, action_space=actions)
    module = config.get_rl_module_spec().build()
    assert isinstance(module, PixelPPOTorchRLModule)
    if env.startswith("ALE/"):
        assert_nature_convs(module)
    else:  # a convolutional encoder still, not an MLP over the flattened grid
        assert any(isinstance(m, torch.nn.Conv2d) for m in module.modules())
    high = int(space.high.max())  # 255 for Atari frames, 1 for MinAtar's 0/1 channels
    frames = np.random.default_rng(0).integers(0, high + 1, (2, *space.shape), dtype=np.uint8)
    as_floats = torch.as_tensor(frames / high, dtype=torch.float32)
    with torch.no_grad():
        a = module.forward_train({Columns.OBS: torch.as_tensor(frames)})
        b = module.forward_train({Columns.OBS: as_floats})
        values = module.compute_values({Columns.OBS: torch.as_tensor(frames)})
    torch.testing.assert_close(a[Columns.ACTION_DIST_INPUTS], b[Columns.ACTION_DIST_INPUTS])
    torch.testing.assert_close(values, module.compute_values({Columns.OBS: as_floats}))
