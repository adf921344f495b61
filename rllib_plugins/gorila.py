"""``GorilaDQN``: Gorila / Ape-X DQN as an RLlib (new API stack) algorithm.

Env runners (``GorilaEnvRunner``) act continuously with their own Ape-X epsilon, fold n-step
transitions, compute initial priorities and push them to a sharded, prioritized replay
(``rl_dist_ext.replay.distributed``). The central learner (``GorilaDQNTorchLearner``, inside
RLlib's LearnerGroup) samples from the replay with prefetch, trains double DQN and publishes
versioned weights to a parameter server, which runners pull every K env steps. A training
iteration never waits for a full sampling round: runner requests are asynchronous.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import ray
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.dqn import DQN
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    LEARNER_RESULTS,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    TIMERS,
)
from ray.rllib.utils.numpy import convert_to_numpy
from ray.tune.execution.placement_groups import PlacementGroupFactory

from rl_dist_ext.params import policy_lag
from rl_dist_ext.ray_actors import start_parameter_server
from rl_dist_ext.replay.distributed import DistributedReplay
from rllib_plugins.central_inference import InferenceServerClient
from rllib_plugins.gorila_config import GorilaDQNConfig
from rllib_plugins.resources import check_cluster_fits

log = logging.getLogger(__name__)

ACT_TAG = "gorila_act"
LEARN_CHUNK = 8  # gradient updates between two polls of the env runners
REPLAY_DIR = "replay"


class GorilaDQN(DQN):
    """See the module docstring; configure it with :class:`GorilaDQNConfig`."""

    @classmethod
    def get_default_config(cls) -> GorilaDQNConfig:
        return GorilaDQNConfig()

    @classmethod
    def default_resource_request(cls, config) -> PlacementGroupFactory:
        """RLlib's bundles, one ``{"CPU": num_cpus_per_shard}`` bundle per replay shard and, in
        SEED mode, one for the inference server (last)."""
        base = super().default_resource_request(config)
        config = cls.get_default_config().update_from_dict(config)
        shard = {"CPU": config.replay_num_cpus_per_shard}
        server = [config.inference_server_bundle()] if config.uses_central_inference() else []
        return PlacementGroupFactory(
            bundles=[*base.bundles, *[shard] * config.replay_num_shards, *server],
            strategy=base.strategy,
        )

    # ---- setup / teardown ---------------------------------------------------------------------
    def setup(self, config: GorilaDQNConfig) -> None:
        _check_env_spaces(config)
        check_cluster_fits(GorilaDQN, config)
        self._replay: DistributedReplay | None = None
        self._param_server = None
        self._inference: InferenceServerClient | None = None
        super().setup(config)
        try:
            placement_group = ray.util.get_current_placement_group()
            bundle_indices = None
            server_bundle = -1
            if placement_group is not None:
                server_bundle = len(placement_group.bundle_specs) - 1
                first = server_bundle + 1 - config.replay_num_shards
                first -= int(config.uses_central_inference())
                bundle_indices = tuple(range(first, first + config.replay_num_shards))
            self._param_server = start_parameter_server()
            self._replay = DistributedReplay(
                config.replay_config(placement_group=placement_group, bundle_indices=bundle_indices)
            )
            if config.uses_central_inference():
                self._inference = InferenceServerClient(
                    module_spec=config.get_rl_module_spec(
                        spaces=self.env_runner_group.get_spaces(), inference_only=True
                    ),
                    kind="q",
                    server_config=config.inference_server_config(),
                    num_cpus=config.central_inference_num_cpus,
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

    def _connect_learner(self) -> None:
        replay, params, server = self._replay, self._param_server, self._inference_handle()
        self.learner_group.foreach_learner(lambda learner: learner.connect(replay, params, server))

    def _connect_env_runners(self, runner_ids: list[int] | None) -> None:
        replay, params, server = self._replay, self._param_server, self._inference_handle()
        self.env_runner_group.foreach_env_runner(
            lambda runner: runner.connect(replay, params, server),
            remote_worker_ids=runner_ids,
            local_env_runner=False,
        )

    def restore_env_runners(self, env_runner_group) -> list[int]:
        """RLlib's restart handling, then give restarted runners the replay and weights handles."""
        restored = super().restore_env_runners(env_runner_group)
        if restored and env_runner_group is self.env_runner_group and self._replay is not None:
            log.warning("env runners %s restarted; reconnecting them to the replay", restored)
            self._connect_env_runners(restored)
        return restored

    def _inference_handle(self):
        return None if self._inference is None else self._inference.handle

    def cleanup(self) -> None:
        """Stop the runners and learners first (with the rate limiter off, so that none stays
        blocked on it), then the inference server, the replay shards and the weights server."""
        replay = getattr(self, "_replay", None)
        if replay is not None:
            replay.stop_rate_limiting()
        super().cleanup()
        inference, self._inference = getattr(self, "_inference", None), None
        if inference is not None:
            inference.close()
        if replay is not None:
            replay.close()
            self._replay = None
        if getattr(self, "_param_server", None) is not None:
            self._param_server.close()
            self._param_server = None

    # ---- one iteration ------------------------------------------------------------------------
    def training_step(self) -> None:
        config: GorilaDQNConfig = self.config
        with self.metrics.log_time((TIMERS, "gorila_act")):
            self._act()
        with self.metrics.log_time((TIMERS, "gorila_replay_stats")):
            # Until the replay first holds enough rows, ask the shards (nothing else to do
            # meanwhile); from then on, read the client's statuses without waiting.
            replay_stats = self._replay.stats(wait=not self._replay_ready)
        self._replay_ready |= replay_stats["size"] >= config.replay_min_size_to_sample
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
            chunk = min(remaining, LEARN_CHUNK)
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
            results = self.learner_group.foreach_learner(
                lambda learner: convert_to_numpy(
                    learner.module[DEFAULT_MODULE_ID].get_state(inference_only=True)
                )
            )
            self.env_runner.module.set_state(results.result_or_errors[0].get())

    def _log_progress(self, replay_stats: dict[str, Any]) -> None:
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
            "replay_size": replay_stats["size"],
            "replay_samples_per_insert": replay_stats["samples_per_insert"],
            "replay_insert_rate": replay_stats["insert_rate"],
            "replay_sample_rate": replay_stats["sample_rate"],
            "replay_sample_wait_s": replay_stats["sample_wait_s"],
            "replay_stale_updates": replay_stats["stale_updates"],
            "replay_items_lost": replay_stats["items_lost"],
            "replay_shard_failures": replay_stats["shard_failures"],
            "learner_weights_version": learner_version,
            "policy_lag_mean": lag.mean,
            "policy_lag_max": lag.max,
            "num_healthy_env_runners": self.env_runner_group.num_healthy_remote_workers(),
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
        if self.config.checkpoint_replay and self._replay is not None:
            self._replay.save(str(Path(path) / REPLAY_DIR))
        return path

    def restore_from_path(self, path, *args, **kwargs) -> None:
        """Restore RLlib's components, the replay (when saved) and re-publish the weights."""
        super().restore_from_path(path, *args, **kwargs)
        replay_dir = Path(path) / REPLAY_DIR
        if self._replay is not None and (replay_dir / "manifest.json").exists():
            self._replay.restore(str(replay_dir))
        if self._param_server is not None:
            # A new version even when only the module was restored (component=...), which
            # leaves the learner's counters alone.
            self.learner_group.foreach_learner(
                lambda learner: learner.publish_weights(new_version=True)
            )
        self._sync_local_module()


def _check_env_spaces(config: GorilaDQNConfig) -> None:
    """Discrete actions and Box observations, checked on one env before any actor starts."""
    observation_space, action_space = config.observation_space, config.action_space
    if observation_space is None or action_space is None:
        _, creator = Algorithm._get_env_id_and_creator(config.env, config)
        env = creator(config.env_config)
        try:
            observation_space = observation_space or env.observation_space
            action_space = action_space or env.action_space
        finally:
            env.close()
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(
            f"GorilaDQN needs a Discrete action space; env {config.env!r} has {action_space}"
        )
    if not isinstance(observation_space, gym.spaces.Box):
        raise ValueError(
            f"GorilaDQN needs a Box observation space; env {config.env!r} has "
            f"{observation_space} (wrap it, e.g. with gymnasium.wrappers.FlattenObservation)"
        )
