"""``VTrace``: IMPALA with the shared V-trace learner and SEED central inference.

``VTraceConfig`` extends RLlib's ``IMPALAConfig`` (same async sampling, learner group, connectors):

- the learner is :class:`~rllib_plugins.vtrace_learner.VTraceTorchLearner`
  (``rl_dist_ext.ops.vtrace``; ``.training(vtrace_clip_rho_threshold=...,
  vtrace_clip_pg_rho_threshold=..., vtrace_lambda=...)``; a threshold of ``None`` = no clip);
- ``.central_inference(enabled=..., max_batch_size=..., max_wait_ms=..., num_cpus=...,
  num_gpus=...)``: SEED mode. Env runners only step envs; one
  :class:`~rl_dist_ext.inference.InferenceServer` (its own bundle in the algorithm's placement
  group; on a GPU when it has one) batches their observations, samples the actions and returns
  their log-probs. The learner's weights go to the server after every training step and never
  to the runners. ``enabled="auto"`` (default): on when the Ray cluster has a GPU for the server,
  else runners infer locally (IMPALA mode, as with ``enabled=False``).
- laptop defaults (see ``VTraceConfig.__init__``): learner in the driver, 8 envs and 0.2 Ray
  CPUs per runner, value loss weight 0.05.

Metrics in ``train()`` results under ``"central_inference"``: server requests/s, mean batch size
and fill, queueing latency p50/p99, weights version and policy lag (server version minus the
mean version the runners' last samples were acted with; versions count the learner's gradient
updates, ``rl_dist_ext.params``).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import gymnasium as gym
import ray
import torch
from ray.rllib.algorithms.impala import IMPALA, IMPALAConfig
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.utils.from_config import NotProvided
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    NUM_TRAINING_STEP_CALLS_SINCE_LAST_SYNCH_WORKER_WEIGHTS,
)
from ray.tune.execution.placement_groups import PlacementGroupFactory

from rl_dist_ext.ops.vtrace_loss import resolve_targets_for
from rl_dist_ext.params import policy_lag
from rl_dist_ext.validation import check_real
from rllib_plugins.central_inference import (
    WEIGHTS_VERSION_USED,
    CentralInferenceRunnerMixin,
    CentralInferenceSettingsMixin,
    InferenceServerClient,
    server_module_spec,
)
from rllib_plugins.multi_agent import trained_module_ids
from rllib_plugins.resources import CheckedTrialResources, check_cluster_fits
from rllib_plugins.runner_health import RunnerHealth

log = logging.getLogger(__name__)

METRICS_KEY = "central_inference"
#: Results key of the env runners' health (``degraded`` while some are down).
HEALTH_KEY = "vtrace"
#: How long an iteration waits when every env runner is down (lost node, restarting).
NO_RUNNER_WAIT_S = 0.5
#: ``training()`` settings of IMPALA's own loss, which ``VTraceConfig``'s defaults replaced: the
#: plain policy gradient on V-trace's targets for the learner's policy, one pass over each
#: batch; without a clip the value head shares the policy's layers too, unless ``model_config``
#: sets ``vf_share_layers``. (A clip set on top of it keeps the learner's targets:
#: ``targets_for="current"``.)
IMPALA_LOSS = {"clip_param": None, "targets_for": "current", "num_epochs": 1}


class _VTraceServerActing(CentralInferenceRunnerMixin):
    """SEED mode for V-trace runners: actions, log-probs and logits come from the server."""

    def _to_env_outputs(self, outputs, *, explore: bool, action_mask=None) -> dict:
        if action_mask is not None:
            raise ValueError(
                "VTrace's central inference samples actions on the server, which never sees "
                "action masks: use central_inference(enabled=False) with masked observations"
            )
        if not explore:
            return {Columns.ACTIONS: torch.as_tensor(outputs["greedy_actions"])}
        return {
            Columns.ACTIONS: torch.as_tensor(outputs["actions"]),
            Columns.ACTION_LOGP: torch.as_tensor(outputs["action_logp"]),
            Columns.ACTION_DIST_INPUTS: torch.as_tensor(outputs["action_dist_inputs"]),
        }

    def sample(self, *args: Any, **kwargs: Any):
        episodes = super().sample(*args, **kwargs)
        self.pause_inference()
        self.log_versions_used()
        return episodes


class VTraceEnvRunner(_VTraceServerActing, SingleAgentEnvRunner):
    """RLlib's env runner; in SEED mode its actions and log-probs come from the server."""


class VTraceMultiAgentEnvRunner(_VTraceServerActing, MultiAgentEnvRunner):
    """RLlib's multi-agent env runner; in SEED mode every trained module acts on the server
    (the untrained ones, e.g. a fixed opponent, act here)."""

    def _server_module_ids(self) -> list[str]:
        return trained_module_ids(self.config)


class VTraceConfig(CentralInferenceSettingsMixin, IMPALAConfig):
    """IMPALA's config with the V-trace learner and SEED central inference (see module doc)."""

    def __init__(self, algo_class: type | None = None) -> None:
        super().__init__(algo_class=algo_class or VTrace)
        self.vtrace_lambda = 1.0
        self.env_runner_cls = VTraceEnvRunner
        # The loss: APPO's form around the runners' behaviour policy (PPO's clipped surrogate,
        # ratios pi/mu clipped to [0.9, 1.1], on V-trace's targets for mu: lambda-returns),
        # 4 passes over each batch and the value head on layers of its own
        # (_model_config_auto_includes: with the clip, as RLlib's PPO and APPO have it). In
        # CartPole's retention race (docs/benchmarks.md, 10 seeds) these defaults kept 97 % of
        # the greedy screens after the target and reached it in 0.49x RLlib IMPALA's time;
        # IMPALA's loss (one pass, shared layers) kept 47 %. IMPALA_LOSS trains it.
        self.clip_param = 0.1
        self.targets_for = None  # follows clip_param: "old" with a clip, "current" without
        self.num_epochs = 4
        # Defaults for a first run on a laptop (IMPALA's own are for a cluster):
        # - central inference only where it pays: with a GPU in the cluster for the server. On
        #   CPU a server round trip per env step costs more than the runner's own forward pass
        #   (benchmarks/results/central_inference_bench.md), so runners infer locally.
        self._init_central_inference(enabled="auto")
        # - 8 envs per runner: RLlib's per-step overhead is paid once per vector step, so a
        #   runner samples several times faster than with IMPALA's 1 (and a server request,
        #   where there is one, carries 8 observations).
        self.num_envs_per_env_runner = 8
        # - 0.2 of Ray's logical CPUs per runner: 4 runners and the driver fit in 2 CPUs.
        self.num_cpus_per_env_runner = 0.2
        # - the learner in the driver (IMPALA's default of one learner actor never returned
        #   from its first train() on a 2-core machine); use num_learners=1 for a GPU learner.
        self.num_learners = 0
        # - value loss weight 0.05 (RLlib's tuned IMPALA CartPole example; IMPALA's 0.5 is for
        #   Atari): with the value head sharing the policy's layers (RLlib's default), 0.5 let
        #   the value error drown the policy gradient. Greedy CartPole return after ~300k env
        #   steps, 3 seeds: 136 / 405 / 433 best of 6 checks with 0.5; >= 150 within 60k steps
        #   in every seed with 0.05.
        self.vf_loss_coeff = 0.05

    @property
    def _model_config_auto_includes(self) -> dict[str, Any]:
        # The value head on layers of its own under the clipped surrogate (as RLlib's PPO and
        # APPO), on the policy's under IMPALA's loss (clip_param=None, as RLlib's IMPALA; and
        # as VTrace checkpoints from before 2026-12-08 hold it, so they restore as they were)
        return super()._model_config_auto_includes | {"vf_share_layers": self.clip_param is None}

    def get_default_rl_module_spec(self):
        """IMPALA's actor-critic module, taking uint8 pixels (floats from its encoder on) and the
        Nature CNN for 84x84 frames (:class:`~rllib_plugins.pixels.PixelPPOTorchRLModule`)."""
        from ray.rllib.core.rl_module.rl_module import RLModuleSpec

        from rllib_plugins.pixels import PixelPPOTorchRLModule

        if self.framework_str != "torch":
            raise ValueError(f"VTrace supports framework='torch' only, got {self.framework_str!r}")
        return RLModuleSpec(module_class=PixelPPOTorchRLModule)

    def get_default_learner_class(self):
        from rllib_plugins.vtrace_learner import VTraceTorchLearner

        return VTraceTorchLearner

    def training(
        self,
        *,
        vtrace_lambda: float = NotProvided,
        clip_param: float | None = NotProvided,
        targets_for: str | None = NotProvided,
        **kwargs: Any,
    ):
        """IMPALA's ``training()`` settings plus V-trace's lambda and a clipped surrogate.

        Args:
            vtrace_lambda: V-trace's trace factor in [0, 1] (1: the paper's targets; below 1 the
                policy-gradient advantage bootstraps as rlax does).
            clip_param: PPO's clipped surrogate on the V-trace advantages, with ratios
                pi/mu to the behaviour policy that acted clipped to
                ``[1 - clip_param, 1 + clip_param]`` (default 0.1); ``None``: the plain IMPALA
                policy gradient (with ``num_epochs=1`` and shared value layers, IMPALA's loss).
            targets_for: the policy V-trace's targets and advantages are computed for:
                ``"current"`` (the learner's, IMPALA's) or ``"old"`` (the behaviour policy
                ``clip_param`` bounds the step around; needs ``clip_param``); ``None`` (the
                default): ``"old"`` with a clip, ``"current"`` without. ``"old"`` is
                APPO's form with the behaviour policy where APPO has a target network: every
                importance weight in the targets is 1, so the value targets get no off-policy
                correction (and the rho thresholds, at 1 or above, change nothing); the loss
                is PPO's objective on the runners' (stale) data, the clipped ratio pi/mu its
                only correction for policy lag.
        """
        super().training(**kwargs)
        if vtrace_lambda is not NotProvided:
            self.vtrace_lambda = vtrace_lambda
        if clip_param is not NotProvided:
            self.clip_param = clip_param
        if targets_for is not NotProvided:
            self.targets_for = targets_for
        return self

    def validate(self) -> None:
        # The V-trace runner fitting the env (a user's own runner class is left alone).
        if self.env_runner_cls in (VTraceEnvRunner, VTraceMultiAgentEnvRunner):
            self.env_runner_cls = (
                VTraceMultiAgentEnvRunner if self.is_multi_agent else VTraceEnvRunner
            )
        self._check_passes_keep_rows_whole()  # before IMPALA's, which allows some minibatches
        super().validate()
        if self.is_multi_agent and not trained_module_ids(self):
            raise ValueError(
                f"multi_agent(policies_to_train={self.policies_to_train!r}) leaves no module of "
                f"{sorted(self.policies)} to train"
            )
        self._check_loss_settings()
        if not self.in_evaluation:
            self.validate_central_inference()
            if self.uses_central_inference():
                # IMPALA's EnvRunnerStateServer actor carries the learner's weights to the
                # runners; in SEED mode they hold none and nothing is ever pushed to it, so it
                # would be a process (an RLlib import, several seconds of CPU) for nothing.
                self.use_env_runner_state_server = False
        self._check_each_learner_gets_episodes()

    def _check_loss_settings(self) -> None:
        """The loss's settings, the algorithm's and each module's: the learner trains a module
        on its ``get_config_for_module`` (this config updated with the module's overrides),
        which RLlib's validate never sees. A module's error names its overrides; a module may
        not change the rollout fragment length, along whose rows V-trace runs (the runners
        sample the algorithm's)."""
        fragment = self.get_rollout_fragment_length()
        per_module = (self.algorithm_config_overrides_per_module or {}).items()
        for module_id, changes in [(None, {}), *per_module]:
            try:
                # as get_config_for_module builds it, without caching a copy made mid-validate
                config = (
                    self
                    if module_id is None
                    else self.copy(copy_frozen=False).update_from_dict(changes)
                )
                check_real("vtrace_lambda", config.vtrace_lambda, low=0.0, high=1.0)
                if config.clip_param is not None:
                    check_real("clip_param", config.clip_param, low=0.0, strict=True)
                resolve_targets_for(config.targets_for, config.clip_param, clip_name="clip_param")
                for name in ("vtrace_clip_rho_threshold", "vtrace_clip_pg_rho_threshold"):
                    if getattr(config, name) is not None:  # None: no clipping
                        check_real(name, getattr(config, name), low=0.0, strict=True)
                if config.get_rollout_fragment_length() != fragment:
                    raise ValueError(
                        f"the module's settings give rollout fragments of "
                        f"{config.get_rollout_fragment_length()} steps, not {fragment} as the "
                        "runners sample them: a module may not change the fragment length "
                        "(V-trace runs along each fragment's steps)"
                    )
            except ValueError as error:
                if module_id is None:
                    raise
                raise ValueError(
                    f"algorithm_config_overrides_per_module[{module_id!r}] = {changes!r}: {error}"
                ) from None

    def _check_passes_keep_rows_whole(self) -> None:
        """The learner runs V-trace along rows of ``rollout_fragment_length`` steps cut from
        the whole batch, each row's last step bootstrapping from the first of the next. RLlib's
        minibatches and its shuffle between passes would cut those rows: each of
        ``num_epochs`` passes takes the whole batch, in order
        (``VTraceTorchLearner._create_iterator_if_necessary``)."""
        if self.minibatch_size is not None:
            raise ValueError(
                f"minibatch_size={self.minibatch_size!r}: VTrace trains on whole batches (a "
                "minibatch would cut the rows V-trace runs along, and bootstrap a row from the "
                "wrong one); leave it None, and each of num_epochs passes takes the whole batch"
            )
        if self.shuffle_batch_per_epoch and self.num_epochs > 1:
            raise ValueError(
                f"shuffle_batch_per_epoch=True with num_epochs={self.num_epochs}: RLlib would "
                "shuffle the batch's steps between passes, and V-trace runs along each row's "
                "steps in order; set shuffle_batch_per_epoch=False (or num_epochs=1)"
            )

    def _check_each_learner_gets_episodes(self) -> None:
        """IMPALA packs the runners' sample lists (``num_envs_per_env_runner x
        rollout_fragment_length`` steps each) into train batches of ``total_train_batch_size``
        steps, and RLlib hands each learner a share of a batch's lists: fewer lists than
        learners leaves a learner without episodes in every update, and all of them skip it."""
        if self.num_learners < 2 or self.num_aggregator_actors_per_learner > 0:
            return
        fragment = self.get_rollout_fragment_length()
        steps_per_list = self.num_envs_per_env_runner * fragment
        lists = math.ceil(self.total_train_batch_size / steps_per_list)
        if lists < self.num_learners:
            raise ValueError(
                f"num_learners={self.num_learners} needs a sample list for each learner in "
                f"every train batch, but total_train_batch_size={self.total_train_batch_size} "
                f"holds {lists} list(s) of num_envs_per_env_runner="
                f"{self.num_envs_per_env_runner} x rollout_fragment_length={fragment} steps: "
                f"raise train_batch_size_per_learner, or lower rollout_fragment_length or "
                f"num_envs_per_env_runner so that a list is at most "
                f"{self.total_train_batch_size // self.num_learners} steps"
            )


class VTrace(CheckedTrialResources, IMPALA):
    """IMPALA with the shared V-trace learner and SEED central inference."""

    @classmethod
    def get_default_config(cls) -> VTraceConfig:
        return VTraceConfig()

    @classmethod
    def resource_request(cls, config) -> PlacementGroupFactory:
        """A Tune trial's placement group (Tune's ``default_resource_request`` returns it after
        :func:`~rllib_plugins.resources.check_trial`): RLlib's bundles plus one for the
        inference server (when enabled)."""
        base = cls.framework_resource_request(config)
        config = cls.get_default_config().update_from_dict(config)
        if not config.uses_central_inference():
            return base
        return PlacementGroupFactory(
            bundles=[*base.bundles, config.inference_server_bundle()], strategy=base.strategy
        )

    def setup(self, config: VTraceConfig) -> None:
        self._inference: InferenceServerClient | None = None
        self._runner_health = RunnerHealth("VTrace", config.num_env_runners)
        if config.uses_central_inference():
            _check_discrete_actions(config)
        check_cluster_fits(VTrace, config)
        try:
            super().setup(config)  # a failure here must not leave the env runners running
            if not config.uses_central_inference():
                return
            placement_group = ray.util.get_current_placement_group()
            bundle = -1 if placement_group is None else len(placement_group.bundle_specs) - 1
            self._inference = InferenceServerClient(
                module_spec=server_module_spec(
                    self.config,
                    self.env_runner_group.get_spaces(),
                    trained_module_ids(config) if config.is_multi_agent else None,
                ),
                kind="policy",
                server_config=config.inference_server_config(),
                num_cpus=config.central_inference_config().num_cpus,
                num_gpus=config.central_inference_gpus(),
                placement_group=placement_group,
                bundle_index=bundle,
            )
            self._inference.push_weights(self.learner_group)
            self._connect_runners(None)
        except BaseException:
            self.cleanup()
            raise

    def _connect_runners(self, runner_ids: list[int] | None) -> None:
        server = self._inference.handle
        self.env_runner_group.foreach_env_runner(
            lambda runner: runner.connect_inference_server(server),
            remote_worker_ids=runner_ids,
            local_env_runner=False,
        )

    def training_step(self) -> None:
        health = self._runner_health.report(self.env_runner_group)
        self.metrics.log_dict(health, key=HEALTH_KEY, window=1)
        if self._runner_health.none_up(health):
            # IMPALA would sample on the driver's env runner, which has no env: wait for RLlib
            # to restart a runner (each iteration probes them) instead of failing the run.
            time.sleep(NO_RUNNER_WAIT_S)
            return None
        if self._inference is None:
            return super().training_step()
        # SEED mode: the runners hold no weights, so IMPALA never broadcasts them; the
        # learner's weights go to the inference server instead, after every step.
        self._counters[NUM_TRAINING_STEP_CALLS_SINCE_LAST_SYNCH_WORKER_WEIGHTS] = 0
        super().training_step()
        if self._learner_version() > self._inference.version:  # the learner updated
            self._inference.push_weights(self.learner_group)
        version = self._inference.version
        stats = self._inference.stats()
        used = self.metrics.peek((ENV_RUNNER_RESULTS, WEIGHTS_VERSION_USED), default=float("nan"))
        stats["policy_lag"] = policy_lag(version, [used]).mean  # nan until a runner reported
        self.metrics.log_dict(stats, key=METRICS_KEY, window=1)

    def _learner_version(self) -> int:
        """The learners' weights version (with several learners, all in lock step: the first
        one's), asked of the learner itself: with remote learners IMPALA reports their results
        asynchronously, so the trained-steps metric can lag or be absent."""
        results = self.learner_group.foreach_learner(lambda learner: learner.weights_clock.version)
        return int(results.result_or_errors[0].get())

    def restore_env_runners(self, env_runner_group) -> list[int]:
        restored = super().restore_env_runners(env_runner_group)
        if restored and env_runner_group is self.env_runner_group and self._inference:
            log.warning("env runners %s restarted; reconnecting them to the server", restored)
            self._connect_runners(restored)
        return restored

    def restore_from_path(self, *args: Any, **kwargs: Any) -> None:
        super().restore_from_path(*args, **kwargs)
        if getattr(self, "_inference", None) is not None:
            # Restored weights are a new version, also when only the module was restored.
            self.learner_group.foreach_learner(lambda learner: learner.weights_clock.bump())
            self._inference.push_weights(self.learner_group)

    def get_module(self, module_id: str = DEFAULT_MODULE_ID):
        """The driver's copy of the module, brought up to the learner's weights first.

        IMPALA never sends weights to the driver's (local) env runner, whose module RLlib's
        ``get_module`` returns: without this it keeps the initial weights in both modes. Synced
        here, on demand, so that no weights travel during training.
        """
        module = super().get_module(module_id)
        if module is not None:
            module.set_state(self.learner_group.get_weights(module_ids=[module_id])[module_id])
        return module

    def cleanup(self) -> None:
        inference, self._inference = getattr(self, "_inference", None), None
        # IMPALA starts an EnvRunnerStateServer actor and never kills it: it would outlive
        # stop() for as long as this object is referenced.
        state_server = getattr(self, "_env_runner_state_server", None)
        self._env_runner_state_server = None
        super().cleanup()  # runners first, so none is mid-request when the server goes
        if inference is not None:
            inference.close()
        if state_server is not None:
            ray.kill(state_server, no_restart=True)


def _check_discrete_actions(config: VTraceConfig) -> None:
    """Central inference samples from a categorical distribution: Discrete actions only."""
    env = config.env
    if not isinstance(env, str):
        return  # an env class or creator: checked when the runners report their spaces
    try:
        probe = gym.make(env)
    except gym.error.Error:
        return  # a Tune-registered name: RLlib builds it; nothing to check here
    try:
        if not isinstance(probe.action_space, gym.spaces.Discrete):
            raise ValueError(
                f"central_inference(enabled=True) supports Discrete action spaces only; "
                f"{env!r} has {probe.action_space!r}. Use central_inference(enabled=False)."
            )
    finally:
        probe.close()
