"""Tianshou's highlevel API for GorilaDQN: ``GorilaDQNExperimentBuilder``.

It is Tianshou's ``DQNExperimentBuilder`` with two changes: the algorithm is
:class:`~tianshou_plugins.GorilaDQN`, and the training collector is a
:class:`~tianshou_plugins.GorilaCollector` over a
:class:`~tianshou_plugins.DistributedPrioritizedReplayBuffer` of ``training_config.buffer_size``
rows (Tianshou's ``create_train_test_collectors`` hard-codes a local buffer). The actors build
their envs with the experiment's ``EnvFactory`` (``EnvMode.TRAINING``); the experiment's own
training envs only provide the spaces. Everything else (test collector, trainer, logger,
persistence) is Tianshou's.

    experiment = (
        GorilaDQNExperimentBuilder(env_factory, ExperimentConfig(...), OffPolicyTrainingConfig(...))
        .with_dqn_params(DQNParams(lr=1e-3, n_step_return_horizon=3, target_update_freq=250))
        .with_gorila_params(GorilaParams(num_actors=4, envs_per_actor=4, num_shards=2))
        .with_model_factory_default(hidden_sizes=(128, 128))
        .build()
    )
    result = experiment.run()
    close_gorila_world(result.world)   # stops the actors and the replay shards

Tianshou's experiment does not close collectors; :func:`close_gorila_world` does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

try:
    from typing import Self
except ImportError:  # Python 3.10
    from typing_extensions import Self

import gymnasium as gym
from tianshou.algorithm import Algorithm
from tianshou.data import BaseCollector
from tianshou.highlevel.algorithm import AlgorithmFactory, DQNAlgorithmFactory
from tianshou.highlevel.env import EnvFactory, Environments, EnvMode
from tianshou.highlevel.experiment import DQNExperimentBuilder
from tianshou.highlevel.world import World

from rl_dist_ext.validation import check_int, check_real
from tianshou_plugins.buffer import DistributedPrioritizedReplayBuffer
from tianshou_plugins.collector import GorilaCollector
from tianshou_plugins.gorila_dqn import GorilaDQN


@dataclass(frozen=True, kw_only=True)
class GorilaParams:
    """The distributed part of a GorilaDQN experiment (actors and replay shards)."""

    num_actors: int = 4
    envs_per_actor: int = 4
    weight_sync_every_n_steps: int = 400
    steps_per_env: int = 16
    num_cpus_per_actor: float = 0.25
    num_shards: int = 2
    alpha: float = 0.6
    beta: float = 0.4
    min_size_to_sample: int = 1_000
    samples_per_insert: float | None = None
    batches_per_request: int = 4
    num_cpus_per_shard: float = 0.1
    seed: int | None = None

    def __post_init__(self) -> None:
        check_int("num_actors", self.num_actors, 1)
        check_int("envs_per_actor", self.envs_per_actor, 1)
        check_int("weight_sync_every_n_steps", self.weight_sync_every_n_steps, 1)
        check_int("steps_per_env", self.steps_per_env, 1)
        check_int("num_shards", self.num_shards, 1)
        check_int("min_size_to_sample", self.min_size_to_sample, 1)
        check_int("batches_per_request", self.batches_per_request, 1)
        check_real("num_cpus_per_actor", self.num_cpus_per_actor, low=0.0)
        check_real("num_cpus_per_shard", self.num_cpus_per_shard, low=0.0)
        if self.seed is not None:
            check_int("seed", self.seed, 0)

    def create_buffer(self, capacity: int) -> DistributedPrioritizedReplayBuffer:
        return DistributedPrioritizedReplayBuffer(capacity, **self._settings(BUFFER_SETTINGS))

    def create_collector(
        self, algorithm: GorilaDQN, env_factory: Callable[[], gym.Env], capacity: int
    ) -> GorilaCollector:
        """The training collector: its actors, and the replay buffer they fill."""
        return GorilaCollector(
            algorithm,
            env_factory=env_factory,
            buffer=self.create_buffer(capacity),
            **self._settings(COLLECTOR_SETTINGS),
        )

    def _settings(self, names: tuple[str, ...]) -> dict[str, Any]:
        return {name: getattr(self, name) for name in names}


#: The GorilaParams fields that configure the replay buffer, and the collector's actors.
BUFFER_SETTINGS = (
    "num_shards", "alpha", "beta", "min_size_to_sample", "samples_per_insert",
    "batches_per_request", "num_cpus_per_shard", "seed",
)  # fmt: skip
COLLECTOR_SETTINGS = (
    "num_actors", "envs_per_actor", "weight_sync_every_n_steps", "steps_per_env",
    "num_cpus_per_actor", "seed",
)  # fmt: skip


def _make_training_env(env_factory: EnvFactory) -> gym.Env:
    return env_factory.create_env(EnvMode.TRAINING)


class GorilaDQNAlgorithmFactory(DQNAlgorithmFactory):
    """Tianshou's DQN factory building a GorilaDQN and its distributed collector."""

    def __init__(self, *args: Any, env_factory: EnvFactory, gorila: GorilaParams) -> None:
        super().__init__(*args)
        self.env_factory = env_factory
        self.gorila = gorila

    def _get_algorithm_class(self) -> type[GorilaDQN]:  # type: ignore[override]
        return GorilaDQN

    def create_train_test_collectors(
        self, algorithm: Algorithm, envs: Environments, reset_collectors: bool = True
    ) -> tuple[BaseCollector, BaseCollector]:
        training_collector = self.gorila.create_collector(
            algorithm,  # type: ignore[arg-type]
            functools.partial(_make_training_env, self.env_factory),
            self.training_config.buffer_size,
        )
        test_collector = self.collector_factory.create_collector(algorithm, envs.test_envs)
        if reset_collectors:
            test_collector.reset()
        return training_collector, test_collector


class GorilaDQNExperimentBuilder(DQNExperimentBuilder):
    """``DQNExperimentBuilder`` for GorilaDQN; add :meth:`with_gorila_params`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gorila_params = GorilaParams()

    def with_gorila_params(self, params: GorilaParams) -> Self:
        if not isinstance(params, GorilaParams):
            raise TypeError(f"params must be a GorilaParams, got {type(params).__name__}")
        self._gorila_params = params
        return self

    def _create_algorithm_factory(self) -> AlgorithmFactory:
        return GorilaDQNAlgorithmFactory(
            self._params,
            self._training_config,
            self._model_factory,
            self._get_optim_factory(),
            env_factory=self._env_factory,
            gorila=self._gorila_params,
        )


def close_gorila_world(world: World) -> None:
    """Stop the actors and the replay shards an experiment started."""
    collector = world.training_collector
    if isinstance(collector, GorilaCollector):
        collector.close()
        collector.buffer.close()
