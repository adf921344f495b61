"""Tianshou's highlevel API builds and runs GorilaDQN and VTrace experiments (the builders)."""

from __future__ import annotations

import pytest


def test_builder_runs_gorila_experiment_and_closes_cleanly(ray_session, tmp_path):
    from conftest import alive_actor_ids, wait_until_not_alive
    from tianshou.highlevel.config import OffPolicyTrainingConfig
    from tianshou.highlevel.env import EnvFactoryRegistered, VectorEnvType
    from tianshou.highlevel.experiment import ExperimentConfig

    from tianshou_plugins import ActorFleet, DistributedReplayConfig, GorilaCollector, GorilaDQN
    from tianshou_plugins.highlevel import (
        GorilaDQNExperimentBuilder,
        GorilaDQNParams,
        GorilaParams,
        close_gorila_world,
    )

    actors_before = alive_actor_ids()
    experiment = (
        GorilaDQNExperimentBuilder(
            EnvFactoryRegistered(task="CartPole-v1", venv_type=VectorEnvType.DUMMY),
            ExperimentConfig(
                persistence_enabled=True, persistence_base_dir=str(tmp_path), watch=False, seed=0
            ),
            OffPolicyTrainingConfig(
                max_epochs=1,
                epoch_num_steps=1_500,
                batch_size=32,
                num_training_envs=1,
                num_test_envs=2,
                buffer_size=5_000,
                collection_step_num_env_steps=128,
                update_step_num_gradient_steps_per_sample=0.1,
                test_step_num_episodes=2,
            ),
        )
        .with_dqn_params(
            GorilaDQNParams(lr=1e-3, n_step_return_horizon=3, target_update_freq=1, tau=0.05)
        )
        .with_gorila_params(
            GorilaParams(
                actors=ActorFleet(num_actors=2, envs_per_actor=2, num_cpus_per_actor=0.05, seed=0),
                replay=DistributedReplayConfig(
                    num_cpus_per_shard=0.05, min_size_to_sample=300, seed=0
                ),
            )
        )
        .with_model_factory_default(hidden_sizes=(32,))
        .build()
    )
    result = experiment.run()
    world = result.world
    try:
        assert isinstance(world.algorithm, GorilaDQN)
        assert world.algorithm.target_tau == 0.05  # the params' tau reached the algorithm
        assert isinstance(world.training_collector, GorilaCollector)
        assert world.training_collector.collect_step >= 1_500
        assert world.algorithm.num_gradient_updates >= 100
        assert len(world.training_collector.buffer) > 0
        assert result.trainer_result is not None
    finally:
        close_gorila_world(world)
    # ray.kill is asynchronous: the closed actors are gone within a bounded time
    assert not wait_until_not_alive(alive_actor_ids() - actors_before)


def test_gorila_params_take_one_settings_object_per_concern():
    from tianshou.highlevel.env import EnvFactoryRegistered, VectorEnvType

    from tianshou_plugins import ActorFleet, CentralInference, DistributedReplayConfig
    from tianshou_plugins.highlevel import GorilaDQNExperimentBuilder, GorilaParams

    with pytest.raises(TypeError, match="actors must be an ActorFleet"):
        GorilaParams(actors={"num_actors": 2})
    with pytest.raises(TypeError, match="replay must be a DistributedReplayConfig"):
        GorilaParams(replay={"num_shards": 2})
    with pytest.raises(TypeError, match="central_inference must be a CentralInference"):
        GorilaParams(central_inference=True)
    params = GorilaParams(
        actors=ActorFleet(num_actors=3),
        replay=DistributedReplayConfig(num_shards=3, min_size_to_sample=10),
        central_inference=CentralInference(),
    )
    buffer = params.create_buffer(capacity=600)  # the experiment's buffer_size
    assert (buffer.config.capacity, buffer.config.num_shards) == (600, 3)
    assert buffer.config.min_size_to_sample == 10 and not buffer.started
    with pytest.raises(ValueError, match="min_size_to_sample"):
        GorilaParams(replay=DistributedReplayConfig(min_size_to_sample=900)).create_buffer(600)

    builder = GorilaDQNExperimentBuilder(
        EnvFactoryRegistered(task="CartPole-v1", venv_type=VectorEnvType.DUMMY)
    )
    with pytest.raises(TypeError, match="GorilaParams"):
        builder.with_gorila_params({"num_actors": 2})


def test_builder_runs_vtrace_experiment_in_seed_mode_and_closes_cleanly(ray_session, tmp_path):
    """SEED mode, the builder's wiring with the most parts (the builder hands
    ``central_inference`` to the collector as it is; the collector without a server is tested
    in test_tianshou_vtrace.py and learns in test_tianshou_vtrace_training.py)."""
    from conftest import alive_actor_ids, wait_until_not_alive
    from tianshou.highlevel.config import OnPolicyTrainingConfig
    from tianshou.highlevel.env import EnvFactoryRegistered, VectorEnvType
    from tianshou.highlevel.experiment import ExperimentConfig

    from tianshou_plugins import ActorFleet, CentralInference, VTrace, VTraceCollector
    from tianshou_plugins.highlevel import (
        VTraceActorParams,
        VTraceExperimentBuilder,
        VTraceParams,
        close_world,
    )

    actors_before = alive_actor_ids()
    experiment = (
        VTraceExperimentBuilder(
            EnvFactoryRegistered(task="CartPole-v1", venv_type=VectorEnvType.DUMMY),
            ExperimentConfig(
                persistence_enabled=True, persistence_base_dir=str(tmp_path), watch=False, seed=0
            ),
            OnPolicyTrainingConfig(
                max_epochs=1,
                epoch_num_steps=1_024,
                batch_size=128,
                num_training_envs=1,
                num_test_envs=2,
                collection_step_num_env_steps=128,
                test_step_num_episodes=2,
            ),
        )
        .with_vtrace_params(
            VTraceParams(
                lr=1e-3,
                vf_coef=0.5,
                ent_coef=0.01,
                eps_clip=0.2,
                clip_around="behaviour",
                targets_for="old",
            )
        )
        .with_vtrace_actors(
            VTraceActorParams(
                actors=ActorFleet(
                    num_actors=1,  # the builder's wiring, in the fewest processes
                    envs_per_actor=4,
                    steps_per_env=16,
                    num_cpus_per_actor=0.05,
                    seed=0,
                ),
                central_inference=CentralInference(num_cpus=0.05),
            )
        )
        .with_actor_factory_default(hidden_sizes=(32,))
        .with_critic_factory_default(hidden_sizes=(32,))
        .build()
    )
    result = experiment.run()
    world = result.world
    try:
        assert isinstance(world.algorithm, VTrace)
        algo = world.algorithm
        assert (algo.eps_clip, algo.clip_around, algo.targets_for) == (0.2, "behaviour", "old")
        assert isinstance(world.training_collector, VTraceCollector)
        assert world.training_collector.env.inference is not None
        assert world.training_collector.collect_step >= 1_024
        assert world.algorithm.num_gradient_updates >= 1_024 // 128
        assert result.trainer_result is not None
    finally:
        close_world(world)
    # ray.kill is asynchronous: the closed actors are gone within a bounded time
    assert not wait_until_not_alive(alive_actor_ids() - actors_before)


def test_vtrace_params_are_validated():
    from tianshou.highlevel.env import EnvFactoryRegistered, VectorEnvType

    from tianshou_plugins import VTRACE_FLEET, ActorFleet
    from tianshou_plugins.highlevel import VTraceActorParams, VTraceExperimentBuilder, VTraceParams

    assert VTraceActorParams().actors == VTRACE_FLEET
    with pytest.raises(TypeError, match="actors must be an ActorFleet"):
        VTraceActorParams(actors={"num_actors": 2})
    with pytest.raises(ValueError, match="max_trajectories_per_collect"):
        VTraceActorParams(actors=ActorFleet(num_actors=4), max_trajectories_per_collect=3)
    with pytest.raises(TypeError, match="CentralInference"):
        VTraceActorParams(central_inference={"max_batch_size": 8})
    # the clipped surrogate's settings are refused as the params are made, before any build
    with pytest.raises(ValueError, match="eps_clip"):
        VTraceParams(eps_clip=-0.1)
    with pytest.raises(ValueError, match="clip_around must be 'arrival' or 'behaviour'"):
        VTraceParams(eps_clip=0.1, clip_around="target")
    with pytest.raises(ValueError, match="clip_around='behaviour' needs eps_clip"):
        VTraceParams(eps_clip=None, clip_around="behaviour")
    with pytest.raises(
        ValueError, match="targets_for='old' needs the clipped surrogate: set eps_clip"
    ):
        VTraceParams(eps_clip=None, targets_for="old")
    builder = VTraceExperimentBuilder(
        EnvFactoryRegistered(task="CartPole-v1", venv_type=VectorEnvType.DUMMY)
    )
    with pytest.raises(TypeError, match="VTraceParams"):
        builder.with_vtrace_params({"lr": 1e-3})
    with pytest.raises(TypeError, match="VTraceActorParams"):
        builder.with_vtrace_actors({"num_actors": 2})
