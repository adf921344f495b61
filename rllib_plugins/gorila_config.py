"""``GorilaDQNConfig``: RLlib's DQN config plus Gorila / Ape-X settings, validated before start."""

from __future__ import annotations

from typing import Any

import ray
from ray.rllib.algorithms.dqn import DQNConfig
from ray.rllib.utils.from_config import NotProvided

from rl_dist_ext.replay import snapshot
from rl_dist_ext.replay.compression import ObsCompression
from rl_dist_ext.replay.distributed import DistributedReplayConfig, check_snapshot_dir_reachable
from rl_dist_ext.validation import check_int
from rl_dist_ext.weight_compression import check_encoding
from rllib_plugins.central_inference import CentralInferenceSettingsMixin
from rllib_plugins.config_setters import set_provided
from rllib_plugins.multi_agent import trained_module_ids

try:
    from typing import Self
except ImportError:  # Python 3.10
    from typing_extensions import Self


#: DQN's target period (env steps) in GorilaDQN: never reached, its learner counts updates.
DQN_TARGET_SYNC_OFF = 2**62
DQN_DEFAULT_TARGET_PERIOD = DQNConfig().target_network_update_freq


class GorilaDQNConfig(CentralInferenceSettingsMixin, DQNConfig):
    """Configuration of :class:`rllib_plugins.GorilaDQN`.

    On top of :class:`~ray.rllib.algorithms.dqn.DQNConfig` (``lr``, ``gamma``, ``n_step``,
    ``dueling``, ``double_q``, ``td_error_loss_fn``, ``train_batch_size_per_learner``, ...):

    - ``.training(target_update_every_n_updates=250, weight_sync_every_n_steps=400,
      updates_per_iteration=64, env_steps_per_request=128, publish_every_n_updates=8,
      epsilon_base=0.4, epsilon_alpha=7.0)``: the target network is hard-updated every C
      *gradient updates*; env runners pull newer weights every K of their env steps; the learner
      publishes weights every ``publish_every_n_updates`` updates; runner ``i`` of ``N`` explores
      with Ape-X epsilon ``epsilon_base ** (1 + (i - 1) / (N - 1) * epsilon_alpha)``. DQN's
      ``lr`` defaults to 1e-3 and ``train_batch_size_per_learner`` to 128 here.
    - ``.replay(num_shards=2, capacity=100_000, prioritized=True, alpha=0.6, beta=0.4,
      samples_per_insert=16, batches_per_request=4, ...)``: the distributed replay (see
      :class:`rl_dist_ext.replay.distributed.DistributedReplayConfig`). ``samples_per_insert``
      is the replay ratio (sampled rows per inserted row) that the rate limiter holds, by
      making the runners or the learner wait; ``None`` lets both run free.
    - ``num_cpus_per_env_runner`` defaults to 0.2 (Ray's logical CPUs): 4 runners, the 2
      shards and the driver fit on a 2-core laptop. Runner connector states are not merged
      after each iteration (RLlib's blocking merge would wait behind the runners' requests).
    - ``.central_inference(enabled=False, max_batch_size=64, max_wait_ms=2.0, num_cpus=1.0,
      num_gpus="auto")``: SEED mode (``num_gpus="auto"``: 0.5 GPU for the
      server when the cluster has one, else 0). Runners send observations to one
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
                  .training(lr=1e-3, n_step=3, target_update_every_n_updates=250)
                  .replay(num_shards=2, capacity=100_000, samples_per_insert=16))
        algo = config.build_algo()
    """

    def __init__(self, algo_class: type | None = None) -> None:
        from rllib_plugins.gorila import GorilaDQN
        from rllib_plugins.gorila_env_runner import GorilaEnvRunner

        super().__init__(algo_class=algo_class or GorilaDQN)
        # RLlib settings with Gorila defaults, chosen so that the defaults learn CartPole on a
        # 2-core laptop and stay learned (benchmarks/results, README "Choosing the defaults").
        self.n_step = 3
        self.lr = 1e-3
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
        self.target_update_every_n_updates = 250
        self.weight_sync_every_n_steps = 400
        self.updates_per_iteration = 64
        self.env_steps_per_request = 128
        self.publish_every_n_updates = 8
        self.epsilon_base = 0.4
        self.epsilon_alpha = 7.0
        self.weights_encoding = "fp32"  # how weights travel to runners (exact by default)
        # Replay.
        self.replay_num_shards = 2
        self.replay_capacity = 100_000
        self.replay_prioritized = True
        self.replay_alpha = 0.6
        self.replay_beta = 0.4
        self.replay_eps = 1e-6
        # 16 sampled rows per inserted row, held by the replay's rate limiter. Left free
        # (None), the ratio is whatever the machine gives (about 8 on 2 cores) and the greedy
        # policy kept falling back after reaching 400-500.
        self.replay_samples_per_insert: float | None = 16.0
        self.replay_error_buffer: float | None = None
        self.replay_min_size_to_sample = 1_000
        self.replay_prefetch = 2
        self.replay_batches_per_request = 4
        self.replay_num_cpus_per_shard = 0.1
        self.replay_snapshot_every_inserts: int | None = None
        self.replay_snapshot_dir: str | None = None
        self.replay_compression: ObsCompression | None = None
        self.replay_shard_placement = "DEFAULT"
        self.checkpoint_replay = True

    def training(
        self,
        *,
        target_update_every_n_updates: int = NotProvided,
        weight_sync_every_n_steps: int = NotProvided,
        updates_per_iteration: int = NotProvided,
        env_steps_per_request: int = NotProvided,
        publish_every_n_updates: int = NotProvided,
        epsilon_base: float = NotProvided,
        epsilon_alpha: float = NotProvided,
        weights_encoding: str = NotProvided,
        **kwargs: Any,
    ) -> Self:
        """DQN's ``training()`` settings plus the Gorila ones (see the class docstring).

        ``weights_encoding``: how published weights travel to the runners: ``"fp32"`` (exact,
        the default), ``"fp16"`` or ``"int8"`` (see ``rl_dist_ext.weight_compression``)."""
        super().training(**kwargs)
        set_provided(
            self,
            {
                "target_update_every_n_updates": target_update_every_n_updates,
                "weight_sync_every_n_steps": weight_sync_every_n_steps,
                "updates_per_iteration": updates_per_iteration,
                "env_steps_per_request": env_steps_per_request,
                "publish_every_n_updates": publish_every_n_updates,
                "epsilon_base": epsilon_base,
                "epsilon_alpha": epsilon_alpha,
                "weights_encoding": weights_encoding,
            },
        )
        return self

    def replay(
        self,
        *,
        num_shards: int = NotProvided,
        capacity: int = NotProvided,
        prioritized: bool = NotProvided,
        alpha: float = NotProvided,
        beta: float = NotProvided,
        eps: float = NotProvided,
        samples_per_insert: float | None = NotProvided,
        error_buffer: float | None = NotProvided,
        min_size_to_sample: int = NotProvided,
        prefetch: int = NotProvided,
        batches_per_request: int = NotProvided,
        num_cpus_per_shard: float = NotProvided,
        snapshot_dir: str | None = NotProvided,
        snapshot_every_inserts: int | None = NotProvided,
        compression: ObsCompression | None = NotProvided,
        shard_placement: str = NotProvided,
        checkpoint: bool = NotProvided,
    ) -> Self:
        """Settings of the sharded replay; ``checkpoint=False`` leaves it out of checkpoints.

        ``shard_placement``: ``"DEFAULT"`` or ``"SPREAD"`` (shards on as many nodes as there
        are) for ``config.build_algo()``. Under Tune the trial's placement group holds the
        shards, placed by RLlib's ``config.resources(placement_strategy=...)`` ("PACK" by
        default; "SPREAD" spreads all of the trial's bundles).

        ``compression``: store pixel observations compressed (runners compress, shards
        decompress when sampling), e.g. ``ObsCompression(columns=("obs", "next_obs"))``; see
        ``rl_dist_ext.replay.compression``.

        ``batches_per_request``: learner batches one sample request serves (priority updates are
        sent as often); see ``rl_dist_ext.replay.distributed``.
        """
        values = {k: v for k, v in locals().items() if k != "self"}
        names = {k: "checkpoint_replay" if k == "checkpoint" else f"replay_{k}" for k in values}
        set_provided(self, values, names)
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
        if not 0.0 <= self.epsilon_base <= 1.0:
            raise ValueError(f"epsilon_base must be in [0, 1], got {self.epsilon_base!r}")
        if not self.epsilon_alpha >= 0.0:
            raise ValueError(f"epsilon_alpha must be >= 0, got {self.epsilon_alpha!r}")
        if not 0.0 <= self.replay_beta <= 1.0:
            raise ValueError(f"replay beta must be in [0, 1], got {self.replay_beta!r}")
        check_encoding(self.weights_encoding)
        if self.num_atoms != 1:
            raise ValueError(
                f"num_atoms={self.num_atoms}: distributional Q-learning is not supported by "
                "GorilaDQN; use num_atoms=1"
            )
        if self.noisy:
            raise ValueError("noisy=True is not supported by GorilaDQN (it explores by epsilon)")
        self.replay_config()  # raises ValueError naming a bad replay field
        if ray.is_initialized():  # else build_algo starts a one-node Ray: any path works
            check_snapshot_dir_reachable(self.replay_snapshot_dir)
        self.validate_central_inference()

    def _match_env_runner_to_env(self) -> None:
        """Gorila's single-agent runner for single-agent envs, the multi-agent one otherwise
        (a user's own runner class is left alone)."""
        from rllib_plugins.gorila_env_runner import GorilaEnvRunner, GorilaMultiAgentEnvRunner

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
        """The :class:`DistributedReplayConfig` these settings describe; with ``module`` (a
        multi-agent run), that module's: snapshots under ``snapshot_dir/<module>``, its own
        seeds."""
        snapshot_dir, seed = self.replay_snapshot_dir, self.seed
        if module is not None and self.is_multi_agent:
            index = self.trained_module_ids().index(module)
            if snapshot_dir is not None:
                snapshot_dir = snapshot.join(snapshot_dir, module)
            if seed is not None:
                seed += 1000 * index
        return DistributedReplayConfig(
            num_shards=self.replay_num_shards,
            capacity=self.replay_capacity,
            alpha=self.replay_alpha if self.replay_prioritized else 0.0,
            eps=self.replay_eps,
            min_size_to_sample=self.replay_min_size_to_sample,
            samples_per_insert=self.replay_samples_per_insert,
            error_buffer=self.replay_error_buffer,
            prefetch=self.replay_prefetch,
            batches_per_request=self.replay_batches_per_request,
            num_cpus_per_shard=self.replay_num_cpus_per_shard,
            placement_group=placement_group,
            bundle_indices=bundle_indices,
            snapshot_dir=snapshot_dir,
            snapshot_every_inserts=self.replay_snapshot_every_inserts,
            seed=seed,
            compression=self.replay_compression,
            shard_placement=self.replay_shard_placement if placement_group is None else "DEFAULT",
        )

    @property
    def effective_beta(self) -> float:
        """Importance-sampling exponent the learner uses (0 for uniform replay)."""
        return self.replay_beta if self.replay_prioritized else 0.0

    def get_default_learner_class(self):
        from rllib_plugins.gorila_learner import GorilaDQNTorchLearner

        if self.framework_str != "torch":
            raise ValueError(
                f"GorilaDQN supports framework='torch' only, got {self.framework_str!r}"
            )
        return GorilaDQNTorchLearner

    @property
    def num_trained_modules(self) -> int:
        """Replays the run starts (one per trained module; 1 for a single-agent env)."""
        return len(self.trained_module_ids()) if self.is_multi_agent else 1
