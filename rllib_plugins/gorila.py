"""``GorilaDQN``: Gorila / Ape-X DQN as an RLlib (new API stack) algorithm.

Env runners (``GorilaEnvRunner``) act continuously with their own Ape-X epsilon, fold n-step
transitions, compute initial priorities and push them to a sharded, prioritized replay
(``rl_dist_ext.replay.distributed``). The central learner (``GorilaDQNTorchLearner``, inside
RLlib's LearnerGroup) samples from the replay with prefetch, trains double DQN and publishes
versioned weights to a parameter server, which runners pull every K env steps. A training
iteration never waits for a full sampling round: runner requests are asynchronous.

Multi-agent envs (RLlib's ``multi_agent(...)``): ``GorilaMultiAgentEnvRunner`` acts for every
agent; each trained module gets its own distributed replay (its priorities, its rate limiter)
and the learner samples a batch from each in every update (``rl_dist_ext.gorila.learner``).
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
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    LEARNER_RESULTS,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    TIMERS,
)
from ray.tune.execution.placement_groups import PlacementGroupFactory

from rl_dist_ext.params import policy_lag
from rl_dist_ext.ray_actors import start_parameter_server
from rl_dist_ext.replay.distributed import DistributedReplay
from rllib_plugins.action_masking import is_masked_space
from rllib_plugins.central_inference import InferenceServerClient, server_module_spec
from rllib_plugins.gorila_config import GorilaDQNConfig
from rllib_plugins.resources import check_cluster_fits
from rllib_plugins.runner_health import RunnerHealth

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
        shards = config.replay_num_shards * config.num_trained_modules
        return PlacementGroupFactory(
            bundles=[*base.bundles, *[shard] * shards, *server],
            strategy=base.strategy,
        )

    # ---- setup / teardown ---------------------------------------------------------------------
    def setup(self, config: GorilaDQNConfig) -> None:
        _check_env_spaces(config)
        check_cluster_fits(GorilaDQN, config)
        self._replays: dict[str, DistributedReplay] = {}
        self._param_server = None
        self._inference: InferenceServerClient | None = None
        try:
            super().setup(config)  # a failure here must not leave the env runners running
            placement_group = ray.util.get_current_placement_group()
            modules = config.trained_module_ids() if config.is_multi_agent else [DEFAULT_MODULE_ID]
            num_shards = config.replay_num_shards
            server_bundle = -1
            first_shard_bundle = None
            if placement_group is not None:
                server_bundle = len(placement_group.bundle_specs) - 1
                first_shard_bundle = server_bundle + 1 - num_shards * len(modules)
                first_shard_bundle -= int(config.uses_central_inference())
            self._param_server = start_parameter_server(weights_encoding=config.weights_encoding)
            for i, module in enumerate(modules):
                bundles = None
                if first_shard_bundle is not None:
                    start = first_shard_bundle + i * num_shards
                    bundles = tuple(range(start, start + num_shards))
                self._replays[module] = DistributedReplay(
                    config.replay_config(
                        placement_group=placement_group, bundle_indices=bundles, module=module
                    )
                )
            if config.uses_central_inference():
                self._inference = InferenceServerClient(
                    module_spec=server_module_spec(
                        config,
                        self.env_runner_group.get_spaces(),
                        modules if config.is_multi_agent else None,
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
        self._runner_health = RunnerHealth("GorilaDQN", self.config.num_env_runners)

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
        config: GorilaDQNConfig = self.config
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
            stats["size"] >= config.replay_min_size_to_sample for stats in replay_stats.values()
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
    "replay_insert_rate": "insert_rate",
    "replay_sample_rate": "sample_rate",
    "replay_sample_wait_s": "sample_wait_s",
    "replay_stale_updates": "stale_updates",
    "replay_items_lost": "items_lost",
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


def _check_env_spaces(config: GorilaDQNConfig) -> None:
    """Discrete actions and Box (or PettingZoo masked) observations, and, multi-agent, a
    mapping onto the configured modules under which agents sharing a module share their spaces:
    checked on one env before any actor starts."""
    if config.is_multi_agent:
        _check_multi_agent_spaces(config)
        return
    observation_space, action_space = config.observation_space, config.action_space
    if observation_space is None or action_space is None:
        env = _make_env(config)
        try:
            observation_space = observation_space or env.observation_space
            action_space = action_space or env.action_space
        finally:
            env.close()
    _check_module_spaces(f"env {config.env!r}", observation_space, action_space)


def _make_env(config: GorilaDQNConfig):
    _, creator = Algorithm._get_env_id_and_creator(config.env, config)
    return creator(config.env_config)


def _check_module_spaces(what: str, observation_space, action_space) -> None:
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"GorilaDQN needs a Discrete action space; {what} has {action_space}")
    if not (isinstance(observation_space, gym.spaces.Box) or is_masked_space(observation_space)):
        raise ValueError(
            f"GorilaDQN needs a Box observation space (or PettingZoo's Dict of 'observation' "
            f"and 'action_mask'); {what} has {observation_space} (wrap it, e.g. with "
            "gymnasium.wrappers.FlattenObservation)"
        )


#: Episodes the policy mapping is probed with (mappings that alternate seats by episode).
MAPPING_PROBES = 16


def _check_multi_agent_spaces(config: GorilaDQNConfig) -> None:
    env = _make_env(config)
    try:
        agents = sorted(getattr(env, "possible_agents", None) or env.agents)
        spaces = {
            agent: (env.get_observation_space(agent), env.get_action_space(agent))
            for agent in agents
        }
    finally:
        env.close()
    agents_of: dict[str, set[str]] = {}
    for _ in range(MAPPING_PROBES):
        episode = MultiAgentEpisode()
        for agent in agents:
            try:
                module = config.policy_mapping_fn(agent, episode)
            except Exception as error:
                raise ValueError(
                    f"multi_agent(policy_mapping_fn=...) failed for agent {agent!r}: "
                    f"{type(error).__name__}: {error}"
                ) from error
            if module not in config.policies:
                raise ValueError(
                    f"multi_agent(policy_mapping_fn=...) maps agent {agent!r} to {module!r}, "
                    f"which is not among the policies {sorted(config.policies)}"
                )
            agents_of.setdefault(module, set()).add(agent)
    for module in config.trained_module_ids():
        mapped = sorted(agents_of.get(module, ()))
        if not mapped:
            log.warning("trained module %r gets no agent from policy_mapping_fn", module)
            continue
        first = mapped[0]
        for agent in mapped:
            _check_module_spaces(f"agent {agent!r} (module {module!r})", *spaces[agent])
            if spaces[agent] != spaces[first]:
                raise ValueError(
                    f"agents {first!r} and {agent!r} share module {module!r} but have different "
                    f"spaces: {spaces[first]} vs {spaces[agent]}; map them to different modules"
                )
