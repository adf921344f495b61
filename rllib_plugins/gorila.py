"""``GorilaDQN`` and ``GorilaDQNConfig``: Gorila / Ape-X DQN as an RLlib (new API stack)
algorithm, and RLlib's DQN config plus the Gorila / Ape-X settings, validated before start.

Env runners (``GorilaEnvRunner``) act continuously with their own Ape-X epsilon, fold n-step
transitions, compute initial priorities and push them to a sharded, prioritized replay
(``rl_dist_ext.replay.distributed``). The central learner (``GorilaDQNTorchLearner``, inside
RLlib's LearnerGroup) samples from the replay with prefetch, trains double DQN and publishes
versioned weights to a parameter server, which runners pull every K env steps. A training
iteration never waits for a full sampling round: runner requests are asynchronous. While the
replay's rate limiter holds a learner in the driver (``num_learners=0``, the default), the
driver keeps handing the runners requests; learner actors (``num_learners >= 1``) get no such
help, so give their runners enough requests in flight to pay for a learning chunk
(``LEARN_CHUNK`` updates, at ``samples_per_insert``).

Multi-agent envs (RLlib's ``multi_agent(...)``): ``GorilaMultiAgentEnvRunner`` acts for every
agent; each trained module gets its own distributed replay (its priorities, its rate limiter)
and the learner samples a batch from each in every update (``rl_dist_ext.gorila.learner``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import ray
from ray.rllib.algorithms.dqn import DQN, DQNConfig
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.utils.from_config import NotProvided
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    LEARNER_RESULTS,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    TIMERS,
)
from ray.tune.execution.placement_groups import PlacementGroupFactory

from rl_dist_ext.exploration import EPSILON_ALPHA, EPSILON_BASE
from rl_dist_ext.params import policy_lag
from rl_dist_ext.ray_actors import start_parameter_server
from rl_dist_ext.replay import snapshot
from rl_dist_ext.replay.distributed import (
    DistributedReplay,
    DistributedReplayConfig,
    check_snapshot_dir_reachable,
)
from rl_dist_ext.validation import check_int, check_real, check_setting_names
from rl_dist_ext.weight_compression import check_encoding
from rl_dist_ext.weight_deltas import DEFAULT_TOLERANCE
from rllib_plugins.central_inference import (
    CentralInferenceSettingsMixin,
    InferenceServerClient,
    server_module_spec,
)
from rllib_plugins.env_checks import check_env_spaces
from rllib_plugins.gorila_env_runner import GorilaEnvRunner, GorilaMultiAgentEnvRunner
from rllib_plugins.gorila_learner import GorilaDQNTorchLearner
from rllib_plugins.multi_agent import trained_module_ids
from rllib_plugins.resources import CheckedTrialResources, check_cluster_fits
from rllib_plugins.runner_health import RunnerHealth

try:
    from typing import Self
except ImportError:  # Python 3.10
    from typing_extensions import Self

log = logging.getLogger(__name__)

ACT_TAG = "gorila_act"
LEARN_CHUNK = 8  # gradient updates between two polls of the env runners
REPLAY_DIR = "replay"


#: Where GorilaDQN's replay differs from DistributedReplayConfig's defaults, and why.
REPLAY_DEFAULTS: dict[str, Any] = {
    # 16 sampled rows per inserted row, held by the shards' rate limiters. Left free (None),
    # the ratio is whatever the machine gives (about 8 on 2 cores) and the greedy policy kept
    # falling back after reaching 400-500 on CartPole.
    "samples_per_insert": 16.0,
}
#: The DistributedReplayConfig fields replay() takes (the others are the algorithm's).
REPLAY_SETTINGS = frozenset(f.name for f in dataclasses.fields(DistributedReplayConfig)) - {
    "placement_group",
    "bundle_indices",
    "seed",
}

#: DQN's target period (env steps) in GorilaDQN: never reached, its learner counts updates.
DQN_TARGET_SYNC_OFF = 2**62
DQN_DEFAULT_TARGET_PERIOD = DQNConfig().target_network_update_freq


class GorilaDQNConfig(CentralInferenceSettingsMixin, DQNConfig):
    """Configuration of :class:`rllib_plugins.GorilaDQN`.

    On top of :class:`~ray.rllib.algorithms.dqn.DQNConfig` (``lr``, ``gamma``, ``n_step``,
    ``dueling``, ``double_q``, ``td_error_loss_fn``, ``train_batch_size_per_learner``, ...):

    - ``.training(target_update_every_n_updates=1, tau=None, weight_sync_every_n_steps=400,
      updates_per_iteration=64, updates_per_learner_call=1, env_steps_per_request=128,
      publish_every_n_updates=8, epsilon_base=0.4, epsilon_alpha=7.0)``: the target network is
      updated every C *gradient updates* to ``tau * online + (1 - tau) * target`` (DQN's
      ``tau``; ``None``, the default here, picks 0.008 for C = 1, a Polyak target about 124
      updates behind, and 1.0, a copy, for C > 1); env runners pull newer weights every K of
      their env steps; k gradient updates share one ``Learner.update``
      call (RLlib's per-call cost paid once per k); the learner publishes weights every
      ``publish_every_n_updates`` updates; runner ``i`` of ``N`` explores with Ape-X
      epsilon ``epsilon_base ** (1 + (i - 1) / (N - 1) * epsilon_alpha)``. DQN's ``lr``
      defaults to 1e-3, ``train_batch_size_per_learner`` to 128 and ``td_error_loss_fn`` to
      ``"mse"`` (the squared TD error, not Huber's) here; DQN's
      ``adam_epsilon`` is the learner's Adam epsilon (RLlib's own learner leaves it unused).
    - ``.replay(num_shards=..., capacity=..., samples_per_insert=..., prioritized=..., ...)``:
      the distributed replay; every field of
      :class:`rl_dist_ext.replay.distributed.DistributedReplayConfig`, with its defaults except
      where :data:`REPLAY_DEFAULTS` says otherwise (``samples_per_insert=16``: the replay
      ratio, sampled rows per inserted row, that the rate limiter holds by making the runners
      or the learner wait; ``None`` lets both run free).
    - ``num_cpus_per_env_runner`` defaults to 0.2 (Ray's logical CPUs): 4 runners, the 2
      shards and the driver fit on a 2-core laptop. Runner connector states are not merged
      after each iteration (RLlib's blocking merge would wait behind the runners' requests).
    - ``.central_inference(enabled=False, ...)``: SEED mode, with the fields of
      :class:`rl_dist_ext.inference.CentralInference` (batching, the server's CPUs and GPUs;
      ``num_gpus="auto"``: 0.5 GPU when the cluster has one). Runners send observations to one
      inference server that returns Q-values; each runner still applies its own epsilon and
      computes initial priorities from the server's Q-values. Weights go to the server, not to
      the runners.

    Multi-agent envs (PettingZoo through RLlib's ``PettingZooEnv`` / ``ParallelPettingZooEnv``)
    take RLlib's own ``.multi_agent(policies=..., policy_mapping_fn=..., policies_to_train=...)``:
    one shared module (parameter sharing) or one per agent group, each trained module with its
    own sharded replay (``num_shards`` each) and priorities, n-step folding per agent, the Ape-X
    epsilon per runner on every trained module. The rate limiters count env steps
    (``multi_agent(count_steps_by="env_steps")``, RLlib's default): ``samples_per_insert`` is
    then each module's sampled rows per env step; ``"agent_steps"`` (one trained module only)
    counts that module's rows. PettingZoo action masks (``{"observation", "action_mask"}``
    observations) are honoured when acting, in the initial priorities and in the double-DQN
    target: the default module is
    :class:`~rllib_plugins.action_masking.ActionMaskingDQNTorchRLModule`.

    Example::

        config = (GorilaDQNConfig().environment("CartPole-v1")
                  .env_runners(num_env_runners=4, num_envs_per_env_runner=4)
                  .training(lr=1e-3, n_step=3, target_update_every_n_updates=1)
                  .replay(num_shards=2, capacity=100_000, samples_per_insert=16))
        algo = config.build_algo()
    """

    def __init__(self, algo_class: type | None = None) -> None:
        super().__init__(algo_class=algo_class or GorilaDQN)
        # RLlib settings with Gorila defaults, chosen so that the defaults learn CartPole on a
        # 2-core laptop and stay learned (docs/benchmarks.md, "Choosing the defaults").
        self.n_step = 3
        self.lr = 1e-3
        # The squared TD error, not DQN's Huber: on CartPole the greedy policy kept more of its
        # tests after reaching the target, in no more env steps (docs/benchmarks.md).
        self.td_error_loss_fn = "mse"
        self.train_batch_size_per_learner = 128
        self.num_env_runners = 2
        # Ray's logical CPUs per runner: 4 runners, 2 shards and the driver fit in 2 CPUs (a
        # laptop). Runners step envs without pause; on a cluster, raise this to spread them.
        self.num_cpus_per_env_runner = 0.2
        self.env_runner_cls = GorilaEnvRunner
        # A second request queued per runner keeps it acting while the driver is learning.
        self.max_requests_in_flight_per_env_runner = 2
        # RLlib merges and broadcasts the runners' connector states after every iteration with
        # a blocking call per runner, which would queue behind the runners' acting requests
        # (up to sync_filters_on_rollout_workers_timeout_s = 10 s per iteration). Gorila
        # runners keep their own state; the replay holds raw observations.
        self.merge_env_runner_states = False
        self.broadcast_env_runner_states = False
        self.min_sample_timesteps_per_iteration = 1000
        self.min_time_s_per_iteration = None
        # The distributed replay replaces DQN's local one.
        self.replay_buffer_config = {"type": "EpisodeReplayBuffer", "no_local_replay_buffer": True}
        self._init_central_inference(enabled=False)
        # Gorila / Ape-X. The target period counts gradient updates (target_update_every_n_updates);
        # DQN's own period, in env steps, is set out of reach so that its learner never syncs.
        self.target_network_update_freq = DQN_TARGET_SYNC_OFF
        # A Polyak target moved after every update (tau None: picked from the period, see
        # rl_dist_ext.ops.dqn.target_tau): on CartPole it kept more of its greedy tests after
        # reaching the target than a copy every 250 updates (docs/benchmarks.md).
        self.target_update_every_n_updates = 1
        self.tau = None
        self.weight_sync_every_n_steps = 400
        self.updates_per_iteration = 64
        self.updates_per_learner_call = 1
        self.env_steps_per_request = 128
        self.publish_every_n_updates = 8
        self.epsilon_base = EPSILON_BASE
        self.epsilon_alpha = EPSILON_ALPHA
        self.weights_encoding = "fp32"  # how weights travel to runners (exact by default)
        self.weights_delta_tolerance = DEFAULT_TOLERANCE  # the bound of "delta" pulls
        # Replay: what .replay(...) set, over REPLAY_DEFAULTS; the rest are
        # DistributedReplayConfig's defaults (built and validated in validate()).
        self.replay_settings: dict[str, Any] = dict(REPLAY_DEFAULTS)
        self.replay_prioritized = True
        self.checkpoint_replay = True

    def training(
        self,
        *,
        target_update_every_n_updates: int = NotProvided,
        weight_sync_every_n_steps: int = NotProvided,
        updates_per_iteration: int = NotProvided,
        updates_per_learner_call: int = NotProvided,
        env_steps_per_request: int = NotProvided,
        publish_every_n_updates: int = NotProvided,
        epsilon_base: float = NotProvided,
        epsilon_alpha: float = NotProvided,
        weights_encoding: str = NotProvided,
        weights_delta_tolerance: float = NotProvided,
        **kwargs: Any,
    ) -> Self:
        """DQN's ``training()`` settings plus the Gorila ones.

        Args:
            target_update_every_n_updates: the target network is updated every C *gradient
                updates* (DQN's ``target_network_update_freq`` counts env steps and is
                refused), to ``tau * online + (1 - tau) * target`` with DQN's ``tau``. By
                default C = 1 and ``tau=None``, which picks 0.008 for C = 1 (a Polyak target,
                on average 124 updates behind) and 1.0 (a copy) for C > 1, so that setting C
                alone gives a copy every C updates; a ``tau`` given is used as it is, after
                every update unless C is set too (until 2026-12-07 the default was C = 250
                with DQN's ``tau`` of 1.0). The period is the algorithm's: a module's
                override of it is refused (a module may override ``tau``).
            weight_sync_every_n_steps: env runners pull newer weights every K of their env
                steps.
            updates_per_iteration: gradient updates per ``train()`` call.
            updates_per_learner_call: gradient updates fused into one learner call (k
                batches of ``train_batch_size_per_learner`` rows, sampled before the call,
                stepped in order); the target sync, the weights version and each batch's
                priorities stay per update. The learner's step does not go through RLlib's
                ``Learner.update`` (it runs RLlib's ``_update`` on each batch), so k = 1 is
                about as fast as larger k (``benchmarks/learner_bench.py``).
            env_steps_per_request: env steps per acting request to a runner.
            publish_every_n_updates: the learner publishes its weights every this many
                gradient updates.
            epsilon_base: the Ape-X epsilon ladder's base: runner ``i`` of ``N`` explores with
                ``epsilon_base ** (1 + (i - 1) / (N - 1) * epsilon_alpha)``.
            epsilon_alpha: the ladder's exponent.
            weights_encoding: how published weights travel to the runners: ``"fp32"`` (exact),
                ``"fp16"``, ``"int8"`` (see ``rl_dist_ext.weight_compression``) or ``"delta"``
                (each runner gets the change since the weights it holds, every weight within
                ``weights_delta_tolerance`` of the learner's; see ``rl_dist_ext.weight_deltas``).
            weights_delta_tolerance: the bound of ``"delta"`` pulls, as a fraction of each
                weight tensor's RMS (> 0) in the first weights the server sends.
        """
        super().training(**kwargs)
        if target_update_every_n_updates is not NotProvided:
            self.target_update_every_n_updates = target_update_every_n_updates
        if weight_sync_every_n_steps is not NotProvided:
            self.weight_sync_every_n_steps = weight_sync_every_n_steps
        if updates_per_iteration is not NotProvided:
            self.updates_per_iteration = updates_per_iteration
        if updates_per_learner_call is not NotProvided:
            self.updates_per_learner_call = updates_per_learner_call
        if env_steps_per_request is not NotProvided:
            self.env_steps_per_request = env_steps_per_request
        if publish_every_n_updates is not NotProvided:
            self.publish_every_n_updates = publish_every_n_updates
        if epsilon_base is not NotProvided:
            self.epsilon_base = epsilon_base
        if epsilon_alpha is not NotProvided:
            self.epsilon_alpha = epsilon_alpha
        if weights_encoding is not NotProvided:
            self.weights_encoding = weights_encoding
        if weights_delta_tolerance is not NotProvided:
            self.weights_delta_tolerance = weights_delta_tolerance
        return self

    def replay(
        self,
        *,
        prioritized: bool = NotProvided,
        checkpoint: bool = NotProvided,
        **settings: Any,
    ) -> Self:
        """Settings of the sharded replay: any field of
        :class:`~rl_dist_ext.replay.distributed.DistributedReplayConfig` (``num_shards``,
        ``capacity``, ``alpha``, ``beta``, ``samples_per_insert``, ``batches_per_request``,
        ``compression``, ``shard_placement``, ``snapshot_dir``, ...), whose defaults hold except
        where :data:`REPLAY_DEFAULTS` says otherwise. A value may be a Tune search space
        (``samples_per_insert=tune.grid_search([8, 16])``): values are checked when the
        algorithm is built (:meth:`validate`), names here.

        ``prioritized=False``: uniform replay (``alpha = beta = 0``). ``checkpoint=False``
        leaves the replay out of checkpoints. ``placement_group``, ``bundle_indices`` and
        ``seed`` are the algorithm's (its placement group under Tune, ``debugging(seed=...)``).

        ``shard_placement``: ``"DEFAULT"`` or ``"SPREAD"`` (shards on as many nodes as there
        are) for ``config.build_algo()``. Under Tune the trial's placement group holds the
        shards, placed by RLlib's ``config.resources(placement_strategy=...)`` ("PACK" by
        default; "SPREAD" spreads all of the trial's bundles).
        """
        check_setting_names("replay()", settings, REPLAY_SETTINGS | {"prioritized", "checkpoint"})
        if prioritized is not NotProvided:
            self.replay_prioritized = prioritized
        if checkpoint is not NotProvided:
            self.checkpoint_replay = checkpoint
        self.replay_settings = {**self.replay_settings, **settings}
        return self

    def get_default_rl_module_spec(self):
        """RLlib's DQN module, reading PettingZoo action masks where the observations have them
        (:class:`~rllib_plugins.action_masking.ActionMaskingDQNTorchRLModule`)."""
        from ray.rllib.core.rl_module.rl_module import RLModuleSpec

        from rllib_plugins.action_masking import ActionMaskingDQNTorchRLModule

        if self.framework_str != "torch":
            raise ValueError(
                f"GorilaDQN supports framework='torch' only, got {self.framework_str!r}"
            )
        return RLModuleSpec(
            module_class=ActionMaskingDQNTorchRLModule, model_config=self.model_config
        )

    def trained_module_ids(self) -> list[str]:
        """The modules that learn (and get a replay each); see
        :func:`rllib_plugins.multi_agent.trained_module_ids`."""
        return trained_module_ids(self)

    def validate(self) -> None:
        self._match_env_runner_to_env()
        super().validate()
        if self.in_evaluation:  # evaluation runners only act greedily; nothing Gorila to check
            return
        if self.is_multi_agent:
            self._validate_multi_agent()
        for name in (
            "target_update_every_n_updates",
            "weight_sync_every_n_steps",
            "updates_per_iteration",
            "updates_per_learner_call",
            "env_steps_per_request",
            "publish_every_n_updates",
            "train_batch_size_per_learner",
            "num_env_runners",
        ):
            check_int(name, getattr(self, name), 1)
        check_int("n_step", self.n_step, 1)  # GorilaDQN folds a fixed n on the actors
        if self.target_network_update_freq == DQN_DEFAULT_TARGET_PERIOD:
            # DQN's untouched default, as configs saved by rl-dist-ext 0.1 carry it.
            self.target_network_update_freq = DQN_TARGET_SYNC_OFF
        if self.target_network_update_freq != DQN_TARGET_SYNC_OFF:
            raise ValueError(
                f"target_network_update_freq={self.target_network_update_freq!r}: GorilaDQN "
                "counts its target period in gradient updates; set "
                "training(target_update_every_n_updates=...) instead"
            )
        check_real("epsilon_base", self.epsilon_base, low=0.0, high=1.0)
        check_real("epsilon_alpha", self.epsilon_alpha, low=0.0)
        # each module's learner builds its Adam and updates its target with its own values;
        # tau None (the default) is picked from the target period, which is the algorithm's
        overrides = self.algorithm_config_overrides_per_module or {}
        for module_id, values in overrides.items():
            for name in ("target_update_every_n_updates", "target_network_update_freq"):
                if name in values:
                    raise ValueError(
                        f"algorithm_config_overrides_per_module[{module_id!r}][{name!r}]="
                        f"{values[name]!r}: GorilaDQN updates every module's target on one "
                        "period, not per module; set "
                        "training(target_update_every_n_updates=...) (and a module's own "
                        "tau, if it needs another mix)"
                    )
        for name, high, may_be_none in (("adam_epsilon", None, False), ("tau", 1.0, True)):
            given = [(name, getattr(self, name))] + [
                (f"algorithm_config_overrides_per_module[{module_id!r}][{name!r}]", values[name])
                for module_id, values in overrides.items()
                if name in values
            ]
            for field_name, value in given:
                if value is not None or not may_be_none:
                    check_real(field_name, value, low=0.0, high=high, strict=True)
        check_encoding(self.weights_encoding)
        check_real("weights_delta_tolerance", self.weights_delta_tolerance, low=0.0, strict=True)
        if self.num_atoms != 1:
            raise ValueError(
                f"num_atoms={self.num_atoms}: distributional Q-learning is not supported by "
                "GorilaDQN; use num_atoms=1"
            )
        if self.noisy:
            raise ValueError("noisy=True is not supported by GorilaDQN (it explores by epsilon)")
        replay = self.replay_config()  # raises ValueError naming a bad replay field
        if ray.is_initialized():  # else build_algo starts a one-node Ray: any path works
            check_snapshot_dir_reachable(replay.snapshot_dir)
        self.validate_central_inference()

    def _match_env_runner_to_env(self) -> None:
        """Gorila's single-agent runner for single-agent envs, the multi-agent one otherwise
        (a user's own runner class is left alone)."""
        if self.env_runner_cls in (GorilaEnvRunner, GorilaMultiAgentEnvRunner):
            self.env_runner_cls = (
                GorilaMultiAgentEnvRunner if self.is_multi_agent else GorilaEnvRunner
            )

    def _validate_multi_agent(self) -> None:
        trained = self.trained_module_ids()
        if not trained:
            raise ValueError(
                f"multi_agent(policies_to_train={self.policies_to_train!r}) leaves no module of "
                f"{sorted(self.policies)} to train"
            )
        if self.count_steps_by not in ("env_steps", "agent_steps"):
            raise ValueError(
                f"multi_agent(count_steps_by={self.count_steps_by!r}) must be 'env_steps' or "
                "'agent_steps'"
            )
        if self.count_steps_by == "agent_steps" and len(trained) > 1:
            raise ValueError(
                f"multi_agent(count_steps_by='agent_steps') with {len(trained)} trained modules "
                f"{trained}: each module's rate limiter would count its own agent steps, and a "
                "learner that samples every module in each update can then be held by one "
                "module's limiter while the runners are held by another's. Use "
                "count_steps_by='env_steps' (the default), which credits every module's replay "
                "with each env step"
            )

    def replay_config(
        self,
        *,
        placement_group: Any = None,
        bundle_indices: tuple[int, ...] | None = None,
        module: str | None = None,
    ) -> DistributedReplayConfig:
        """The :class:`DistributedReplayConfig` these settings describe (raises ``ValueError``
        naming a bad field); with ``module`` (a multi-agent run), that module's: snapshots under
        ``snapshot_dir/<module>``, its own seeds."""
        settings = dict(self.replay_settings)
        seed = self.seed
        if module is not None and self.is_multi_agent:
            index = self.trained_module_ids().index(module)
            if settings.get("snapshot_dir") is not None:
                settings["snapshot_dir"] = snapshot.join(settings["snapshot_dir"], module)
            if seed is not None:
                seed += 1000 * index
        if not self.replay_prioritized:
            settings.update(alpha=0.0, beta=0.0)
        if placement_group is not None:  # the group's strategy places the shards
            settings["shard_placement"] = "DEFAULT"
        return DistributedReplayConfig(
            **settings,
            placement_group=placement_group,
            bundle_indices=bundle_indices,
            seed=seed,
        )

    def get_default_learner_class(self):
        if self.framework_str != "torch":
            raise ValueError(
                f"GorilaDQN supports framework='torch' only, got {self.framework_str!r}"
            )
        return GorilaDQNTorchLearner

    @property
    def num_trained_modules(self) -> int:
        """Replays the run starts (one per trained module; 1 for a single-agent env)."""
        return len(self.trained_module_ids()) if self.is_multi_agent else 1


class GorilaDQN(CheckedTrialResources, DQN):
    """See the module docstring; configure it with :class:`GorilaDQNConfig`."""

    @classmethod
    def get_default_config(cls) -> GorilaDQNConfig:
        return GorilaDQNConfig()

    @classmethod
    def resource_request(cls, config) -> PlacementGroupFactory:
        """A Tune trial's placement group (Tune's ``default_resource_request`` returns it after
        :func:`~rllib_plugins.resources.check_trial`): RLlib's bundles, one
        ``{"CPU": num_cpus_per_shard}`` bundle per replay shard and, in SEED mode, one for the
        inference server (last)."""
        base = cls.framework_resource_request(config)
        config = cls.get_default_config().update_from_dict(config)
        replay = config.replay_config()
        shard = {"CPU": replay.num_cpus_per_shard}
        server = [config.inference_server_bundle()] if config.uses_central_inference() else []
        shards = replay.num_shards * config.num_trained_modules
        return PlacementGroupFactory(
            bundles=[*base.bundles, *[shard] * shards, *server],
            strategy=base.strategy,
        )

    # ---- setup / teardown ---------------------------------------------------------------------
    def setup(self, config: GorilaDQNConfig) -> None:
        check_env_spaces(config)
        check_cluster_fits(GorilaDQN, config)
        self._replays: dict[str, DistributedReplay] = {}
        self._param_server = None
        self._inference: InferenceServerClient | None = None
        try:
            placement_group = ray.util.get_current_placement_group()
            modules = config.trained_module_ids() if config.is_multi_agent else [DEFAULT_MODULE_ID]
            num_shards = config.replay_config().num_shards
            server_bundle = -1
            first_shard_bundle = None
            if placement_group is not None:
                server_bundle = len(placement_group.bundle_specs) - 1
                first_shard_bundle = server_bundle + 1 - num_shards * len(modules)
                first_shard_bundle -= int(config.uses_central_inference())
            # The weights server and the shards start first and boot while RLlib waits for its
            # env runners (a build waits for the slowest process once, not for each in turn).
            self._param_server = start_parameter_server(
                weights_encoding=config.weights_encoding,
                delta_tolerance=config.weights_delta_tolerance,
            )
            for i, module in enumerate(modules):
                bundles = None
                if first_shard_bundle is not None:
                    start = first_shard_bundle + i * num_shards
                    bundles = tuple(range(start, start + num_shards))
                self._replays[module] = DistributedReplay(
                    config.replay_config(
                        placement_group=placement_group, bundle_indices=bundles, module=module
                    ),
                    wait=False,
                )
            super().setup(config)  # a failure here must not leave any actor running
            for replay in self._replays.values():
                replay.wait_until_started()
            if config.uses_central_inference():
                self._inference = InferenceServerClient(
                    module_spec=server_module_spec(
                        config,
                        self.env_runner_group.get_spaces(),
                        modules if config.is_multi_agent else None,
                    ),
                    kind="q",
                    server_config=config.inference_server_config(),
                    num_cpus=config.central_inference_config().num_cpus,
                    num_gpus=config.central_inference_gpus(),
                    placement_group=placement_group,
                    bundle_index=server_bundle,
                )
            self._connect_learner()
            self._connect_env_runners(None)
        except BaseException:
            self.cleanup()
            raise
        self._runner_versions: dict[int, int] = {}
        self._runner_epsilons: dict[int, float] = {}
        self._last_iteration = (time.monotonic(), 0)
        self._replay_ready = False
        self._runner_health = RunnerHealth("GorilaDQN", self.config.num_env_runners)
        if self.learner_group.is_local:
            # The learner samples in this process, and this process hands the runners their
            # requests: while the rate limiter holds a sample, keep handing them out, or the
            # learner waits for inserts from runners that have nothing to do (until timeout_s).
            for replay in self._replays.values():
                replay.while_waiting(self._act)

    @property
    def replays(self) -> dict[str, DistributedReplay]:
        """Trained module id -> its running distributed replay (single-agent: one entry)."""
        return dict(self._replays)

    def replay(self, module_id: str | None = None) -> DistributedReplay:
        """The running distributed replay (multi-agent: that of trained module ``module_id``)."""
        key = (
            DEFAULT_MODULE_ID if module_id is None and not self.config.is_multi_agent else module_id
        )
        try:
            return self._replays[key]
        except KeyError:
            raise KeyError(
                f"no replay for module {module_id!r}; the trained modules are "
                f"{sorted(self._replays)}"
            ) from None

    @property
    def _runner_replay(self):
        """What runners push to: the one replay, or (multi-agent) module id -> replay."""
        return self._replays if self.config.is_multi_agent else self._replays[DEFAULT_MODULE_ID]

    def _connect_learner(self) -> None:
        replays, params, server = self._replays, self._param_server, self._inference_handle()
        self.learner_group.foreach_learner(lambda learner: learner.connect(replays, params, server))

    def _connect_env_runners(self, runner_ids: list[int] | None) -> None:
        replay, params, server = self._runner_replay, self._param_server, self._inference_handle()
        self.env_runner_group.foreach_env_runner(
            lambda runner: runner.connect(replay, params, server),
            remote_worker_ids=runner_ids,
            local_env_runner=False,
        )

    def restore_env_runners(self, env_runner_group) -> list[int]:
        """RLlib's restart handling, then give restarted runners the replay and weights handles."""
        restored = super().restore_env_runners(env_runner_group)
        if restored and env_runner_group is self.env_runner_group and self._replays:
            log.warning("env runners %s restarted; reconnecting them to the replay", restored)
            self._connect_env_runners(restored)
        return restored

    def _inference_handle(self):
        return None if self._inference is None else self._inference.handle

    def cleanup(self) -> None:
        """Stop the runners and learners first (with the rate limiter off, so that none stays
        blocked on it), then the inference server, the replay shards and the weights server."""
        replays = getattr(self, "_replays", {})
        for replay in replays.values():
            replay.while_waiting(None)
            replay.stop_rate_limiting()
        super().cleanup()
        inference, self._inference = getattr(self, "_inference", None), None
        if inference is not None:
            inference.close()
        for replay in replays.values():
            replay.close()
        self._replays = {}
        if getattr(self, "_param_server", None) is not None:
            self._param_server.close()
            self._param_server = None

    # ---- one iteration ------------------------------------------------------------------------
    def training_step(self) -> None:
        with self.metrics.log_time((TIMERS, "gorila_act")):
            self._act()
        with self.metrics.log_time((TIMERS, "gorila_replay_stats")):
            # Until every replay first holds enough rows, ask the shards (nothing else to do
            # meanwhile); from then on, read the clients' statuses without waiting.
            replay_stats = {
                module: replay.stats(wait=not self._replay_ready)
                for module, replay in self._replays.items()
            }
        self._replay_ready |= all(
            stats["size"] >= self._replays[module].config.min_size_to_sample
            for module, stats in replay_stats.items()
        )
        learned = self._replay_ready
        if learned:
            with self.metrics.log_time((TIMERS, "gorila_learn")):
                self._learn()
            self._sync_local_module()
        else:  # nothing to learn from yet: let the runners fill the replay
            time.sleep(0.05)
        self._log_progress(replay_stats)

    def _act(self) -> None:
        """Keep one request in flight per runner; collect the ones that finished."""
        results = self.env_runner_group.foreach_env_runner_async_fetch_ready(
            func="collect_and_push",
            kwargs={"num_steps": self.config.env_steps_per_request},
            tag=ACT_TAG,
            timeout_seconds=0.0,
            return_actor_ids=True,
        )
        metrics = []
        for runner_id, result in results:
            metrics.append(result["metrics"])
            self._runner_versions[runner_id] = result["weights_version"]
            self._runner_epsilons[runner_id] = result["epsilon"]
        if metrics:
            self.metrics.aggregate(metrics, key=ENV_RUNNER_RESULTS)

    def _learn(self) -> None:
        """``updates_per_iteration`` gradient updates, polling the runners between chunks.

        Polling keeps every runner's request queue full while the learner works, so acting
        never waits for a whole learning phase.
        """
        remaining = self.config.updates_per_iteration
        while remaining > 0:
            # a chunk holds at least one fused learner call
            chunk = min(remaining, max(LEARN_CHUNK, self.config.updates_per_learner_call))
            timesteps = {
                NUM_ENV_STEPS_SAMPLED_LIFETIME: self.metrics.peek(
                    (ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0
                )
            }
            results = self.learner_group.foreach_learner(
                lambda learner, n=chunk, ts=timesteps: learner.train_from_replay(n, ts)
            )
            self.metrics.aggregate([r.get() for r in results.result_or_errors], key=LEARNER_RESULTS)
            remaining -= chunk
            self._act()

    def _sync_local_module(self) -> None:
        """Keep the driver's module (``algo.get_module()``) at the learner's weights."""
        if self.env_runner is not None and self.env_runner.module is not None:
            results = self.learner_group.foreach_learner(lambda learner: learner.actor_weights())
            self.env_runner.module.set_state(results.result_or_errors[0].get())

    def _log_progress(self, replay_stats: dict[str, dict[str, Any]]) -> None:
        now = time.monotonic()
        env_steps = self.metrics.peek(
            (ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0
        )
        last_time, last_steps = self._last_iteration
        self._last_iteration = (now, env_steps)
        learner_version = self._learner_weights_version()
        lag = policy_lag(learner_version, self._runner_versions.values())
        gorila = {
            "env_steps_per_s": (env_steps - last_steps) / max(now - last_time, 1e-9),
            **_replay_metrics(replay_stats, multi_agent=self.config.is_multi_agent),
            "learner_weights_version": learner_version,
            "policy_lag_mean": lag.mean,
            "policy_lag_max": lag.max,
            **self._runner_health.report(self.env_runner_group),
        }
        for runner_id, epsilon in sorted(self._runner_epsilons.items()):
            gorila[f"epsilon_runner_{runner_id}"] = epsilon
        self.metrics.log_dict(gorila, key="gorila", window=1)
        if self._inference is not None:
            self.metrics.log_dict(self._inference.stats(), key="central_inference", window=1)

    def _learner_weights_version(self) -> int:
        results = self.learner_group.foreach_learner(lambda learner: learner.weights_version)
        return int(results.result_or_errors[0].get())

    # ---- checkpoints --------------------------------------------------------------------------
    def save_to_path(self, path=None, *, state=None, filesystem=None, use_msgpack=False) -> str:
        """RLlib's checkpoint plus, unless ``replay(checkpoint=False)``, every replay shard."""
        path = super().save_to_path(
            path, state=state, filesystem=filesystem, use_msgpack=use_msgpack
        )
        if self.config.checkpoint_replay:
            for module, replay in self._replays.items():
                replay.save(str(self._replay_dir(path, module)))
        return path

    def _replay_dir(self, path, module: str) -> Path:
        """``<checkpoint>/replay`` (multi-agent: ``<checkpoint>/replay/<module id>``)."""
        base = Path(path) / REPLAY_DIR
        return base / module if self.config.is_multi_agent else base

    def restore_from_path(self, path, *args, **kwargs) -> None:
        """Restore RLlib's components, the replay (when saved) and re-publish the weights."""
        super().restore_from_path(path, *args, **kwargs)
        for module, replay in self._replays.items():
            replay_dir = self._replay_dir(path, module)
            if (replay_dir / "manifest.json").exists():
                replay.restore(str(replay_dir))
        if self._param_server is not None:
            # A new version even when only the module was restored (component=...), which
            # leaves the learner's counters alone.
            self.learner_group.foreach_learner(
                lambda learner: learner.publish_weights(new_version=True)
            )
        self._sync_local_module()


_REPLAY_METRICS = {
    "replay_size": "size",
    "replay_samples_per_insert": "samples_per_insert",
    "replay_rate_limiter_ratio": "rate_limiter_ratio",
    "replay_samples_per_insert_limit": "samples_per_insert_limit",
    "replay_insert_rate": "insert_rate",
    "replay_sample_rate": "sample_rate",
    "replay_sample_wait_s": "sample_wait_s",
    "replay_stale_updates": "stale_updates",
    "replay_items_lost": "items_lost",
    "replay_snapshots_rejected": "snapshots_rejected",
    "replay_shard_failures": "shard_failures",
    "replay_shards_alive": "shards_alive",
    "replay_bytes": "storage_bytes",
    "replay_bytes_per_transition": "bytes_per_transition",
    "replay_compression_ratio": "compression_ratio",
}
#: Replay metrics that add up over modules (the others are reported per module only).
_SUMMED = (
    "replay_size",
    "replay_items_lost",
    "replay_snapshots_rejected",
    "replay_shard_failures",
    "replay_stale_updates",
    "replay_bytes",
)


def _replay_metrics(stats: dict[str, dict[str, Any]], *, multi_agent: bool) -> dict[str, Any]:
    """The ``gorila/replay_*`` metrics; multi-agent: ``replay_<key>/<module>`` per module and
    the totals of sizes and counts."""
    if not multi_agent:
        (only,) = stats.values()
        return {name: only[key] for name, key in _REPLAY_METRICS.items()}
    out: dict[str, Any] = {name: 0 for name in _SUMMED}
    for module, module_stats in stats.items():
        for name, key in _REPLAY_METRICS.items():
            out[f"{name}/{module}"] = module_stats[key]
            if name in _SUMMED:
                out[name] += module_stats[key]
    return out
