#!/usr/bin/env python3
"""GorilaDQN on MinAtar Breakout (10x10 pixel grids) with Tianshou, in Tianshou's example style.

Written as Tianshou 2.0's own examples are (``examples/atari/atari_dqn.py``): one ``main``
whose keyword arguments are the command line (``--task``, ``--seed``, ``--epoch_num_steps``,
...; ``--help``), Tianshou's ``OffPolicyTrainer`` through
``algorithm.run_training``, a TensorBoard logger, a ``save_checkpoint_fn`` and a ``watch``
mode. What differs is the data path: ``num_actors`` Ray actors step ``envs_per_actor`` MinAtar
envs each and push prioritized 3-step transitions of uint8 frames into an LZ4-compressed,
sharded replay; the learner in this process trains on the MinAtar paper's network and
publishes weights that the actors pull.

Every epoch ends with a greedy test (``num_test_envs`` episodes) and a checkpoint (the
algorithm's state and the whole replay) under ``<run>/checkpoint``; the run trains for
``epoch`` epochs (``--stop_at_target true``: to the first test at ``target_return``), says what
it kept after its first test at the target (how many later tests stayed at or above 80 % of it)
and writes its learning curve to ``<run>/learning_curve.png``. Restore and continue:
``--resume_path <run>`` loads the checkpoint, logs into the same run folder and goes on from its
last epoch and env step (Tianshou's ``resume_from_log``). ``--watch`` only plays
``num_test_envs`` greedy episodes of the checkpoint given by ``--resume_path``::

    .venv/bin/python examples/tianshou_gorila_minatar.py --seed 0
    .venv/bin/python examples/tianshou_gorila_minatar.py --epoch 80 \\
        --resume_path log/breakout/gorila/0/<time>

Its settings are the MinAtar race's (benchmarks/minatar_race.py): lr 5e-4, batch 32, 8
replayed samples per inserted one, target network every 1,000 updates, 100k rows, learning
from 5,000, two actors of four envs each with Ape-X epsilons.
"""

from __future__ import annotations

import datetime
import logging
import os
import time
from functools import partial
from pathlib import Path

import numpy as np
import ray
import torch
from ray_cluster import start_ray
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.trainer import OffPolicyTrainerParams
from tianshou_progress import (
    GORILA_PROGRESS_FIELDS,
    CurveLogger,
    greedy_collector,
    load_checkpoint,
    plot_curve,
    report_retention,
    run_cli,
    save_checkpoint,
    stop_at,
)
from torch.utils.tensorboard import SummaryWriter

from rl_dist_ext.pixel_envs import make_minatar
from rl_dist_ext.replay import ObsCompression
from tianshou_plugins import DistributedPrioritizedReplayBuffer, GorilaCollector, GorilaDQN
from tianshou_plugins.pixels import pixel_q_network

log = logging.getLogger(__name__)


def main(
    task: str = "breakout",
    seed: int = 0,
    buffer_size: int = 100_000,
    learning_starts: int = 5_000,
    lr: float = 5e-4,
    gamma: float = 0.99,
    n_step: int = 3,
    target_update_freq: int = 1_000,
    epoch: int = 50,
    epoch_num_steps: int = 20_000,
    batch_size: int = 32,
    update_per_step: float = 0.25,
    num_actors: int = 2,
    envs_per_actor: int = 4,
    num_shards: int = 1,
    num_test_envs: int = 10,
    target_return: float = 10.0,
    stop_at_target: bool = False,
    persistence_base_dir: str = "log",
    resume_path: str | None = None,
    watch: bool = False,
    show_progress: bool = True,
    address: str | None = None,
) -> float:
    """Train GorilaDQN on a MinAtar game; return the best greedy test return.

    :param task: the MinAtar game (breakout, asterix, freeway, seaquest, space_invaders).
    :param seed: seeds the network, the actors' envs and exploration, the test envs.
    :param buffer_size: replay capacity (rows, over all shards).
    :param learning_starts: rows the replay holds before the first gradient step.
    :param lr: Adam's learning rate.
    :param gamma: discount factor.
    :param n_step: the n of the n-step returns the actors compute.
    :param target_update_freq: gradient steps between target network syncs.
    :param epoch: epochs at most (each ends with a test and a checkpoint).
    :param epoch_num_steps: env steps per epoch.
    :param batch_size: rows per gradient step.
    :param update_per_step: gradient steps per env step (0.25 with batch 32: each row is
        replayed 8 times on average).
    :param num_actors: Ray actors that step envs.
    :param envs_per_actor: envs each actor steps.
    :param num_shards: replay shards (Ray actors).
    :param num_test_envs: greedy test episodes per epoch.
    :param target_return: the greedy test return the run is after.
    :param stop_at_target: stop at the first test at ``target_return`` (else train for
        ``epoch`` epochs).
    :param persistence_base_dir: runs go to ``<this>/<task>/gorila/<seed>/<time>``.
    :param resume_path: a run folder: restore its checkpoint and continue that run.
    :param watch: play ``num_test_envs`` greedy episodes of ``resume_path``'s checkpoint and stop.
    :param show_progress: Tianshou's progress bars.
    :param address: join this Ray cluster ('auto', 'ray://<head>:10001'); default: start Ray.
    """
    params_log_info = locals()
    if watch and resume_path is None:
        raise ValueError("watch=True plays a checkpoint: give resume_path, the run to watch")
    torch.set_num_threads(1)
    np.random.seed(seed)
    torch.manual_seed(seed)
    make_env = partial(make_minatar, task)
    env = make_env()
    policy = DiscreteQLearningPolicy(
        model=pixel_q_network(env.observation_space, env.action_space),
        action_space=env.action_space,
        eps_training=0.0,  # each actor explores with its own Ape-X epsilon
        eps_inference=0.0,
    )
    env.close()
    algorithm = GorilaDQN(
        policy=policy,
        optim=AdamOptimizerFactory(lr=lr),
        gamma=gamma,
        n_step_return_horizon=n_step,
        target_update_freq=target_update_freq,
    )
    if resume_path is None:
        now = datetime.datetime.now().strftime("%y%m%d-%H%M%S")
        log_path = Path(persistence_base_dir, task, "gorila", str(seed), now)
    else:
        log_path = Path(resume_path)
    checkpoint_dir = (log_path / "checkpoint").resolve()
    if resume_path is not None:
        if not (checkpoint_dir / "algorithm.pt").exists():
            raise ValueError(
                f"resume_path={resume_path!r} has no checkpoint/algorithm.pt: give the folder of "
                "a run of this script (<persistence_base_dir>/<task>/gorila/<seed>/<time>)"
            )
        load_checkpoint(algorithm, None, checkpoint_dir)  # the replay once it is up
        log.info(f"Loaded the algorithm from {checkpoint_dir}")
    test_collector = greedy_collector(policy, make_env, num_test_envs, seed=10_000 + seed)
    if watch:
        try:
            test_collector.reset()
            result = test_collector.collect(n_episode=num_test_envs)
            result.pprint_asdict()
            return float(result.returns_stat.mean)
        finally:
            test_collector.close()

    start_ray(address)
    buffer = DistributedPrioritizedReplayBuffer(
        buffer_size,
        num_shards=num_shards,
        min_size_to_sample=learning_starts,
        samples_per_insert=batch_size * update_per_step,  # the trainer's replay ratio
        compression=ObsCompression(),  # LZ4 frames: ~20x smaller rows
        seed=seed,
    )
    if resume_path is not None:
        buffer.restore(str(checkpoint_dir / "replay"))
        log.info(f"Restored {len(buffer)} replay rows from {checkpoint_dir / 'replay'}")
    logger = CurveLogger(
        SummaryWriter(str(log_path)),
        progress_fields=GORILA_PROGRESS_FIELDS,
        training_interval=2_000,
        save_interval=1,
    )
    logger.writer.add_text("args", str(params_log_info))

    def save_checkpoint_fn(epoch: int, env_step: int, gradient_step: int) -> str:
        save_checkpoint(algorithm, buffer, checkpoint_dir)
        log.info(f"Checkpoint of epoch {epoch} ({env_step} env steps): {checkpoint_dir}")
        return str(checkpoint_dir)

    collector = None
    try:
        collector = GorilaCollector(
            algorithm,
            env_factory=make_env,
            buffer=buffer,
            num_actors=num_actors,
            envs_per_actor=envs_per_actor,
            num_cpus_per_actor=0.5,
            seed=seed,
        )
        started = time.perf_counter()
        result = algorithm.run_training(
            OffPolicyTrainerParams(
                training_collector=collector,
                test_collector=test_collector,
                max_epochs=epoch,
                epoch_num_steps=epoch_num_steps,
                collection_step_num_env_steps=256,
                update_step_num_gradient_steps_per_sample=update_per_step,
                batch_size=batch_size,
                test_step_num_episodes=num_test_envs,
                stop_fn=stop_at(target_return, stop_at_target),
                save_checkpoint_fn=save_checkpoint_fn,
                logger=logger,
                resume_from_log=resume_path is not None,
                test_in_training=False,
                show_progress=show_progress,
                verbose=False,  # the logger prints a progress line per 2,000 env steps
            )
        )
        log.info(f"{result.train_step} env steps in {time.perf_counter() - started:.0f} s")
        result.pprint_asdict()
        report_retention(logger, target_return)
        title = f"GorilaDQN on MinAtar {task}"
        plot_curve(logger, log_path / "learning_curve.png", title, target=target_return)
        log.info(f"Learning curve: {log_path / 'learning_curve.png'}")
        return float(result.best_reward)
    finally:
        logger.finalize()
        test_collector.close()
        if collector is not None:
            collector.close()
        buffer.close()
        ray.shutdown()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    run_cli(main)
