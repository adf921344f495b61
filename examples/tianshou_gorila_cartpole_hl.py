#!/usr/bin/env python3
"""GorilaDQN on CartPole-v1 through Tianshou's high-level API (``ExperimentBuilder``).

Written as Tianshou 2.0's own high-level examples are (``examples/discrete/discrete_dqn_hl.py``):
an env factory, an ``ExperimentConfig``, an ``OffPolicyTrainingConfig`` and a builder, with
``main``'s keyword arguments as the command line (``--task``, ``--seed``, ...; ``--help``).
The builder is :class:`tianshou_plugins.highlevel.GorilaDQNExperimentBuilder`: Tianshou's
``DQNExperimentBuilder`` whose algorithm is GorilaDQN and whose training collector is a fleet of
Ray actors (``num_actors`` x ``envs_per_actor`` envs, Ape-X epsilons) feeding a sharded,
prioritized replay. Everything else is Tianshou's: the test collector, the trainer, the
TensorBoard logger and the experiment folder under ``persistence_base_dir`` (its log, the
policy of the best test, the events).

The run trains for ``max_epochs`` epochs (``--stop_at_target true``: to the first test whose
mean return reaches ``target_return``; Tianshou's ``EpochStopCallbackRewardThreshold``).
``--policy_restore_directory <experiment folder> --train false`` plays
``watch_num_episodes`` greedy episodes of a saved policy (Tianshou's own restore)::

    .venv/bin/python examples/tianshou_gorila_cartpole_hl.py --seed 0
    .venv/bin/python examples/tianshou_gorila_cartpole_hl.py --train false \\
        --policy_restore_directory log/CartPole-v1/<experiment>
"""

from __future__ import annotations

import logging
import os

from ray_cluster import start_ray
from tianshou.highlevel.config import OffPolicyTrainingConfig
from tianshou.highlevel.env import EnvFactoryRegistered, VectorEnvType
from tianshou.highlevel.experiment import ExperimentConfig
from tianshou.highlevel.params.algorithm_params import DQNParams
from tianshou.highlevel.persistence import PolicyPersistence
from tianshou.highlevel.trainer import EpochStopCallbackRewardThreshold
from tianshou_progress import run_cli

from tianshou_plugins import ActorFleet, DistributedReplayConfig
from tianshou_plugins.highlevel import GorilaDQNExperimentBuilder, GorilaParams, close_world

log = logging.getLogger(__name__)


def main(
    task: str = "CartPole-v1",
    seed: int = 0,
    persistence_base_dir: str = "log",
    max_epochs: int = 20,
    epoch_num_steps: int = 10_000,
    num_actors: int = 2,
    envs_per_actor: int = 4,
    num_shards: int = 2,
    buffer_size: int = 200_000,
    learning_starts: int = 1_000,
    num_test_envs: int = 10,
    target_return: float = 475.0,
    stop_at_target: bool = False,
    train: bool = True,
    policy_restore_directory: str | None = None,
    watch_num_episodes: int = 10,
    address: str | None = None,
) -> float | None:
    """Run one GorilaDQN experiment; return its best test return (None when not training).

    :param task: a registered gymnasium env with discrete actions.
    :param seed: the experiment's seed (network, actors' envs and exploration, test envs).
    :param persistence_base_dir: experiments go to ``<this>/<task>/<experiment name>``.
    :param max_epochs: epochs at most (each ends with a greedy test).
    :param epoch_num_steps: env steps per epoch.
    :param num_actors: Ray actors that step envs.
    :param envs_per_actor: envs each actor steps.
    :param num_shards: replay shards (Ray actors).
    :param buffer_size: replay capacity (rows, over all shards; the default keeps the whole
        default run of 20 epochs of 10k env steps: the last 50k rows kept 82 % of the greedy
        tests after the target over 10 seeds, the whole run 95 %).
    :param learning_starts: rows the replay holds before the first gradient step.
    :param num_test_envs: greedy test episodes per epoch.
    :param target_return: the greedy test return the run is after.
    :param stop_at_target: stop at the first test at ``target_return`` (else train for
        ``max_epochs`` epochs).
    :param train: train (False: only watch the restored policy).
    :param policy_restore_directory: an earlier experiment's folder whose policy to load.
    :param watch_num_episodes: greedy episodes to play after training (0: none).
    :param address: join this Ray cluster ('auto', 'ray://<head>:10001'); default: start Ray.
    """
    start_ray(address)
    experiment_config = ExperimentConfig(
        persistence_base_dir=os.path.abspath(os.path.join(persistence_base_dir, task)),
        seed=seed,
        device="cpu",
        train=train,
        policy_restore_directory=policy_restore_directory,
        watch=watch_num_episodes > 0,
        watch_num_episodes=watch_num_episodes,
        # the state dict (Tianshou's default pickles the whole algorithm, which torch.load
        # refuses since torch 2.6 unless told to run the file's code)
        policy_persistence_mode=PolicyPersistence.Mode.POLICY_STATE_DICT,
    )
    training_config = OffPolicyTrainingConfig(
        max_epochs=max_epochs,
        epoch_num_steps=epoch_num_steps,
        batch_size=128,
        num_training_envs=1,  # only gives the spaces: the actors step their own envs
        num_test_envs=num_test_envs,
        test_step_num_episodes=num_test_envs,
        buffer_size=buffer_size,
        collection_step_num_env_steps=256,
        update_step_num_gradient_steps_per_sample=0.25,
    )
    env_factory = EnvFactoryRegistered(
        task=task,
        venv_type=VectorEnvType.DUMMY,
        render_mode_watch=None,  # no window
    )
    builder = (
        GorilaDQNExperimentBuilder(env_factory, experiment_config, training_config)
        .with_dqn_params(
            DQNParams(
                lr=1e-3,
                gamma=0.99,
                n_step_return_horizon=3,
                target_update_freq=250,
                eps_training=0.0,  # each actor explores with its own Ape-X epsilon
                eps_inference=0.0,
            )
        )
        .with_gorila_params(
            GorilaParams(
                actors=ActorFleet(num_actors=num_actors, envs_per_actor=envs_per_actor, seed=seed),
                replay=DistributedReplayConfig(
                    num_shards=num_shards, min_size_to_sample=learning_starts, seed=seed
                ),
            )
        )
        .with_model_factory_default(hidden_sizes=(128, 128))
    )
    if stop_at_target:
        builder = builder.with_epoch_stop_callback(EpochStopCallbackRewardThreshold(target_return))
    experiment = builder.build()
    result = experiment.run()
    try:
        if result.trainer_result is None:  # watched a restored policy only
            return None
        log.info(
            f"Best test return {result.trainer_result.best_reward:.1f} after "
            f"{result.trainer_result.train_step} env steps"
        )
        return float(result.trainer_result.best_reward)
    finally:
        close_world(result.world)  # the actors and the replay shards


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    run_cli(main)
