"""Tianshou's highlevel API: ``GorilaDQNExperimentBuilder`` and ``VTraceExperimentBuilder``.

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
        .with_dqn_params(GorilaDQNParams(lr=1e-3, n_step_return_horizon=3, target_update_freq=250))
        .with_gorila_params(GorilaParams(actors=ActorFleet(num_actors=4, envs_per_actor=4),
                                         replay=DistributedReplayConfig(num_shards=2)))
        .with_model_factory_default(hidden_sizes=(128, 128))
        .build()
    )
    result = experiment.run()
    close_gorila_world(result.world)   # stops the actors and the replay shards

``VTraceExperimentBuilder`` is Tianshou's ``A2CExperimentBuilder`` (its actor and critic
factories) with the algorithm :class:`~tianshou_plugins.VTrace` (``.with_vtrace_params(
VTraceParams(...))``) and a :class:`~tianshou_plugins.VTraceCollector` as the training collector
(``.with_vtrace_actors(VTraceActorParams(actors=ActorFleet(...)))``;
``central_inference=CentralInference()`` for SEED mode); run it with an
``OnPolicyTrainingConfig``.

Tianshou's experiment does not close collectors; :func:`close_world` (or its older name
:func:`close_gorila_world`) does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

try:
    from typing import Self
except ImportError:  # Python 3.10
    from typing_extensions import Self

import gymnasium as gym
from tianshou.algorithm import Algorithm
from tianshou.data import BaseCollector
from tianshou.highlevel.algorithm import (
    ActorCriticOnPolicyAlgorithmFactory,
    AlgorithmFactory,
    DQNAlgorithmFactory,
)
from tianshou.highlevel.env import EnvFactory, Environments, EnvMode
from tianshou.highlevel.experiment import A2CExperimentBuilder, DQNExperimentBuilder
from tianshou.highlevel.params.algorithm_params import DQNParams, OnPolicyAlgorithmParams
from tianshou.highlevel.world import World

from rl_dist_ext.replay.distributed import DistributedReplayConfig
from tianshou_plugins.actor_collector import VTRACE_FLEET, ActorFleet, RayActorCollector
from tianshou_plugins.buffer import DistributedPrioritizedReplayBuffer
from tianshou_plugins.central_inference import CentralInference
from tianshou_plugins.collector import GorilaCollector
from tianshou_plugins.gorila_dqn import GorilaDQN
from tianshou_plugins.vtrace import DEFAULT_EPS_CLIP, VTrace, resolve_clip_settings
from tianshou_plugins.vtrace_collector import VTraceCollector, check_trajectories_per_collect


@dataclass(kw_only=True)
class GorilaDQNParams(DQNParams):
    """Tianshou's ``DQNParams`` with GorilaDQN's ``tau`` (a plain ``DQNParams`` works too).

    Attributes:
        tau: the share of the online network mixed into the target at each target update, in
            (0, 1]; ``None`` picks it from ``target_update_freq``: 0.008 for a period of 1 (a
            Polyak target), a copy for a longer one (:class:`~tianshou_plugins.GorilaDQN`).
    """

    tau: float | None = None


@dataclass(frozen=True, kw_only=True)
class GorilaParams:
    """The distributed part of a GorilaDQN experiment: its actors, its replay and (SEED mode)
    the inference server, each one settings object.

    Attributes:
        actors: the collector's actors.
        replay: the distributed replay; its ``capacity`` is the experiment's
            ``training_config.buffer_size``, as for every Tianshou experiment.
        central_inference: SEED mode's inference server; ``None``: the actors infer locally.
    """

    actors: ActorFleet = field(default_factory=ActorFleet)
    replay: DistributedReplayConfig = field(default_factory=DistributedReplayConfig)
    central_inference: CentralInference | None = None

    def __post_init__(self) -> None:
        _check_type("actors", self.actors, ActorFleet)
        _check_type("replay", self.replay, DistributedReplayConfig)
        if self.central_inference is not None:
            _check_type("central_inference", self.central_inference, CentralInference)

    def create_buffer(self, capacity: int) -> DistributedPrioritizedReplayBuffer:
        return DistributedPrioritizedReplayBuffer(capacity, config=self.replay)

    def create_collector(
        self, algorithm: GorilaDQN, env_factory: Callable[[], gym.Env], capacity: int
    ) -> GorilaCollector:
        """The training collector: its actors, and the replay buffer they fill."""
        return GorilaCollector(
            algorithm,
            env_factory=env_factory,
            buffer=self.create_buffer(capacity),
            fleet=self.actors,
            central_inference=self.central_inference,
        )


def _check_type(name: str, value: Any, wanted: type) -> None:
    if not isinstance(value, wanted):
        article = "an" if wanted.__name__[0] in "AEIOU" else "a"
        raise TypeError(f"{name} must be {article} {wanted.__name__}, got {type(value).__name__}")


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


# ---- VTrace ----------------------------------------------------------------------------------
@dataclass(kw_only=True)
class VTraceParams(OnPolicyAlgorithmParams):
    """:class:`~tianshou_plugins.VTrace`'s settings, in the form of Tianshou's ``A2CParams``
    (``lr``/``optim``, ``gamma``, ``deterministic_eval``, action scaling as Tianshou's).

    Attributes:
        vf_coef: weight of the value loss.
        ent_coef: weight of the entropy bonus.
        max_grad_norm: gradients are clipped to this global norm; ``None``: no clipping.
        clip_rho_threshold: V-trace's rho-bar (clips the importance weights of the value
            targets); ``None``: no clipping.
        clip_pg_rho_threshold: the clip of the policy-gradient importance weights; ``None``: no
            clipping.
        vtrace_lambda: V-trace's lambda (1: the paper's targets).
        advantage_normalization: standardize each gradient step's policy-gradient advantages
            (mean 0, standard deviation 1), as Tianshou's PPO does.
        eps_clip: PPO's clipped surrogate on the V-trace advantages, ratios to the
            ``clip_around`` policy clipped to ``[1 - eps_clip, 1 + eps_clip]`` (default 0.1);
            ``None``: the plain IMPALA policy gradient.
        clip_around: ``"arrival"`` (the learner's policy as the batch arrived) or
            ``"behaviour"`` (the actors' that acted): the policy ``eps_clip``'s ratios are to;
            ``None``: ``"behaviour"`` with a clip, ``"arrival"`` without.
        targets_for: ``"current"`` (the learner's policy) or ``"old"`` (the one
            ``clip_around`` names, APPO's form; needs ``eps_clip``): the policy V-trace's
            targets and advantages are computed for; ``None``: ``"old"`` with a clip,
            ``"current"`` without.
    """

    vf_coef: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float | None = 40.0
    clip_rho_threshold: float | None = 1.0
    clip_pg_rho_threshold: float | None = 1.0
    vtrace_lambda: float = 1.0
    advantage_normalization: bool = False
    eps_clip: float | None = DEFAULT_EPS_CLIP
    clip_around: str | None = None
    targets_for: str | None = None

    def __post_init__(self) -> None:
        resolve_clip_settings(self.eps_clip, self.clip_around, self.targets_for)


@dataclass(frozen=True, kw_only=True)
class VTraceActorParams:
    """The distributed part of a VTrace experiment: the actors (and, for SEED, the server).

    Attributes:
        actors: the collector's actors (V-trace's defaults: ``VTRACE_FLEET``).
        max_trajectories_per_collect: trajectories one ``collect()`` writes at most (the rest
            wait for the next call).
        central_inference: SEED mode's inference server; ``None``: the actors infer locally.
    """

    actors: ActorFleet = VTRACE_FLEET
    max_trajectories_per_collect: int = 16
    central_inference: CentralInference | None = None

    def __post_init__(self) -> None:
        _check_type("actors", self.actors, ActorFleet)
        check_trajectories_per_collect(self.max_trajectories_per_collect, self.actors)
        if self.central_inference is not None:
            _check_type("central_inference", self.central_inference, CentralInference)

    def create_collector(
        self, algorithm: VTrace, env_factory: Callable[[], gym.Env]
    ) -> VTraceCollector:
        return VTraceCollector(
            algorithm,
            env_factory=env_factory,
            fleet=self.actors,
            max_trajectories_per_collect=self.max_trajectories_per_collect,
            central_inference=self.central_inference,
        )


class VTraceAlgorithmFactory(ActorCriticOnPolicyAlgorithmFactory[VTraceParams, VTrace]):
    """Tianshou's actor-critic factory building a VTrace and its asynchronous collector."""

    def __init__(self, *args: Any, env_factory: EnvFactory, actors: VTraceActorParams) -> None:
        super().__init__(*args)
        self.env_factory = env_factory
        self.actors = actors

    def _get_algorithm_class(self) -> type[VTrace]:
        return VTrace

    def create_train_test_collectors(
        self, algorithm: Algorithm, envs: Environments, reset_collectors: bool = True
    ) -> tuple[BaseCollector, BaseCollector]:
        training_collector = self.actors.create_collector(
            algorithm,  # type: ignore[arg-type]
            functools.partial(_make_training_env, self.env_factory),
        )
        test_collector = self.collector_factory.create_collector(algorithm, envs.test_envs)
        if reset_collectors:
            test_collector.reset()
        return training_collector, test_collector


class VTraceExperimentBuilder(A2CExperimentBuilder):
    """``A2CExperimentBuilder`` for VTrace; add :meth:`with_vtrace_params` and
    :meth:`with_vtrace_actors`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._params = VTraceParams()  # type: ignore[assignment]
        self._vtrace_actors = VTraceActorParams()

    def with_vtrace_params(self, params: VTraceParams) -> Self:
        if not isinstance(params, VTraceParams):
            raise TypeError(f"params must be a VTraceParams, got {type(params).__name__}")
        self._params = params  # type: ignore[assignment]
        return self

    def with_vtrace_actors(self, params: VTraceActorParams) -> Self:
        if not isinstance(params, VTraceActorParams):
            raise TypeError(f"params must be a VTraceActorParams, got {type(params).__name__}")
        self._vtrace_actors = params
        return self

    def _create_algorithm_factory(self) -> AlgorithmFactory:
        return VTraceAlgorithmFactory(
            self._params,
            self._training_config,
            self._get_actor_factory(),
            self._get_critic_factory(0),
            self._get_optim_factory(),
            env_factory=self._env_factory,
            actors=self._vtrace_actors,
        )


def close_world(world: World) -> None:
    """Stop the actors (and the replay shards or inference server) an experiment started."""
    collector = world.training_collector
    if isinstance(collector, RayActorCollector):
        collector.close()
    if isinstance(collector, GorilaCollector):
        collector.buffer.close()


#: The name of :func:`close_world` from when only GorilaDQN had a builder.
close_gorila_world = close_world
