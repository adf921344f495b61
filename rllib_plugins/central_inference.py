"""SEED-style central inference for RLlib algorithms (``.central_inference(...)``).

Pieces shared by :class:`~rllib_plugins.VTrace` and :class:`~rllib_plugins.GorilaDQN`:

- :class:`RLModuleInferencePolicy`: what the :class:`~rl_dist_ext.inference.InferenceServer`
  runs: an RLModule built from its spec on the server's device. ``kind="policy"`` samples
  actions from the module's action distribution and returns them with their log-probs (the
  behaviour log-probs V-trace needs); ``kind="q"`` returns Q-values and greedy actions.
- :class:`CentralInferenceRunnerMixin`: an env-runner mixin whose module forward passes go to
  the server instead of a local copy (the local module keeps its initial weights and is only
  used for its spaces and distribution classes); the weight version of every reply is logged.
  With ``num_env_groups = G > 1`` a runner's envs are split into G groups that take turns
  (Sample Factory's double-buffered sampling, G = 2): while one group's request is at the
  server, the next group steps its envs, so the round trip hides behind env stepping. One group
  runs at a time (a baton passed at each request), so env steps are not made parallel: only the
  wait for the server overlaps with them.
- :class:`InferenceServerClient`: the algorithm side: starts the server in the algorithm's
  placement group (its own bundle), pushes the learner's weights, reads the server's metrics.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import ray
import torch
from gymnasium.wrappers.vector import DictInfoToList
from ray.rllib.core.columns import Columns
from ray.rllib.utils.from_config import NotProvided
from ray.rllib.utils.numpy import convert_to_numpy

from rl_dist_ext.inference import InferenceServerConfig
from rl_dist_ext.ray_actors import start_inference_server
from rl_dist_ext.validation import check_int, check_real
from rllib_plugins.config_setters import set_provided

log = logging.getLogger(__name__)

WEIGHTS_VERSION_USED = "central_inference_weights_version"
REQUEST_RETRY_S = 60.0


class RLModuleInferencePolicy:
    """An RLModule on the inference server (see the module docstring for ``kind``)."""

    def __init__(self, module_spec: Any, device: str, kind: Literal["policy", "q"]) -> None:
        self.device = torch.device(device)
        self.kind = kind
        self.module = module_spec.build().to(self.device)
        self.module.eval()
        self.is_recurrent = bool(self.module.is_stateful())

    def __call__(self, obs: np.ndarray) -> dict[str, np.ndarray]:
        batch = {Columns.OBS: torch.as_tensor(obs, device=self.device)}
        with torch.no_grad():
            if self.kind == "q":
                q = self.module.compute_q_values(batch)["qf_preds"]
                return {"q_values": q.cpu().numpy(), "actions": q.argmax(-1).cpu().numpy()}
            logits = self.module.forward_exploration(batch)[Columns.ACTION_DIST_INPUTS]
            dist = self.module.get_exploration_action_dist_cls().from_logits(logits)
            actions = dist.sample()
            return {
                "actions": actions.cpu().numpy(),
                "action_logp": dist.logp(actions).cpu().numpy(),
                "action_dist_inputs": logits.cpu().numpy(),
                "greedy_actions": logits.argmax(-1).cpu().numpy(),
            }

    def set_weights(self, weights: Any) -> None:
        self.module.set_state(weights)


class _PolicyFactory:
    """Picklable ``device -> RLModuleInferencePolicy`` for the server actor."""

    def __init__(self, module_spec: Any, kind: Literal["policy", "q"]) -> None:
        self.module_spec = module_spec
        self.kind = kind

    def __call__(self, device: str) -> RLModuleInferencePolicy:
        return RLModuleInferencePolicy(self.module_spec, device, self.kind)


# Runner attributes that RLlib's ``SingleAgentEnvRunner._sample`` reads and writes per env set:
# each env group keeps its own copy, swapped in while the group holds the baton.
_GROUP_STATE = (
    "env",
    "num_envs",
    "_seed",
    "_ongoing_episodes",
    "_cached_to_module",
    "_needs_initial_reset",
    "_shared_data",
)


@dataclass
class _EnvGroup:
    """One group of a runner's envs (pipelined sampling): its server caller id and its
    ``_GROUP_STATE`` while another group runs."""

    caller: str
    state: dict[str, Any] = field(default_factory=dict)


class CentralInferenceRunnerMixin:
    """Mix into a ``SingleAgentEnvRunner`` subclass; call :meth:`connect_inference_server`."""

    _inference_server: Any = None
    _active_group: _EnvGroup | None = None
    _group_threads: ThreadPoolExecutor | None = None

    def connect_inference_server(self, server: Any) -> int:
        """Route this runner's module forward passes to ``server``; returns its restart count."""
        self._inference_server = server
        self._inference_caller = f"env-runner-{self.worker_index}"
        self._versions_used: list[int] = []
        self._env_groups: list[_EnvGroup] = []
        self._grouped_env: Any = None  # the full vector env the groups were cut from
        self._baton = threading.Lock()
        callers = self._group_callers()
        self._stop_group_threads()  # connected again: the groups are cut afresh
        if callers:
            self._group_threads = ThreadPoolExecutor(len(callers), thread_name_prefix="env-group")
        self.module.forward_exploration = self._central_forward_exploration
        self.module.forward_inference = self._central_forward_inference
        restarts = ray.get(server.register.remote(self._inference_caller))
        ray.get([server.register.remote(caller) for caller in callers])
        return restarts

    def stop(self) -> None:
        self._stop_group_threads()
        super().stop()

    def _stop_group_threads(self) -> None:
        if self._group_threads is not None:
            self._group_threads.shutdown(wait=False)
            self._group_threads = None

    def _group_callers(self) -> list[str]:
        groups = int(getattr(self.config, "central_inference_num_env_groups", 1))
        if groups < 2:
            return []
        return [f"{self._inference_caller}/envs-{g}" for g in range(groups)]

    # ---- pipelined sampling (num_env_groups > 1) ------------------------------------------------
    def _sample(self, *, num_timesteps=None, num_episodes=None, explore, **kwargs: Any):
        """RLlib's ``_sample``, run by each env group in turn when the runner has groups."""
        groups = self._groups_for_sampling()
        if not groups or num_timesteps is None:
            if groups:  # a whole-env sample (episodes) resets the envs under the groups
                for group in groups:
                    group.state["_needs_initial_reset"] = True
            return super()._sample(
                num_timesteps=num_timesteps, num_episodes=num_episodes, explore=explore, **kwargs
            )
        per_group = -(-num_timesteps // len(groups))
        own_state = {name: getattr(self, name) for name in _GROUP_STATE}
        futures = [
            self._group_threads.submit(self._sample_group, group, per_group, explore, kwargs)
            for group in groups
        ]
        wait(futures)  # every group has left the runner before its own state comes back
        for name, value in own_state.items():
            setattr(self, name, value)
        return [episode for future in futures for episode in future.result()]

    def _sample_group(self, group: _EnvGroup, num_timesteps: int, explore: bool, kwargs: dict):
        with self._baton:
            self._enter_group(group)
            try:
                return super()._sample(num_timesteps=num_timesteps, explore=explore, **kwargs)
            finally:
                self._leave_group(group)
                # Done before the other groups: their batches need not wait for this one.
                self._inference_server.idle.remote(group.caller)

    def _enter_group(self, group: _EnvGroup) -> None:
        for name, value in group.state.items():
            setattr(self, name, value)
        self._active_group = group

    def _leave_group(self, group: _EnvGroup) -> None:
        group.state = {name: getattr(self, name) for name in _GROUP_STATE}
        self._active_group = None

    def _groups_for_sampling(self) -> list[_EnvGroup]:
        """The env groups (cut from the runner's vector env; again if RLlib rebuilt it)."""
        if self._group_threads is None:  # not connected, or a single group
            return []
        if self._grouped_env is not self.env:
            self._env_groups = self._cut_env_into_groups(self._group_callers())
            self._grouped_env = self.env
        return self._env_groups

    def _cut_env_into_groups(self, callers: list[str]) -> list[_EnvGroup]:
        """Contiguous slices of the sub-envs, each a vector env of its own; env ``i`` keeps
        seed ``seed + i``, as in the undivided vector env."""
        vector_env = self.env.unwrapped
        if not isinstance(vector_env, gym.vector.SyncVectorEnv):
            raise TypeError(
                f"central_inference(num_env_groups={len(callers)}) needs RLlib's sync vector "
                f"env (env_runners(gym_env_vectorize_mode='sync')), got {type(vector_env)!r}"
            )
        size = self.num_envs // len(callers)
        groups = []
        for g, caller in enumerate(callers):
            sub_envs = vector_env.envs[g * size : (g + 1) * size]
            view = gym.vector.SyncVectorEnv(
                [lambda env=env: env for env in sub_envs],
                autoreset_mode=vector_env.autoreset_mode,
            )
            view.closed = True  # its sub-envs are the runner's vector env's, which closes them
            state = {
                "env": DictInfoToList(view),
                "num_envs": size,
                "_seed": None if self._seed is None else self._seed + g * size,
                "_ongoing_episodes": [None] * size,
                "_cached_to_module": None,
                "_needs_initial_reset": True,
                "_shared_data": None,
            }
            groups.append(_EnvGroup(caller, state))
        return groups

    @contextlib.contextmanager
    def _baton_passed_while_waiting(self):
        """In a group: hand the runner to the next group while this one waits for the server."""
        group = self._active_group
        if group is None:
            yield
            return
        self._leave_group(group)
        self._baton.release()
        try:
            yield
        finally:
            self._baton.acquire()
            self._enter_group(group)

    def _infer(self, obs: torch.Tensor) -> dict[str, np.ndarray]:
        """One request to the server; waits out a server restart (up to a minute)."""
        obs_np = convert_to_numpy(obs)
        group = self._active_group
        caller = group.caller if group is not None else self._inference_caller
        deadline = time.monotonic() + REQUEST_RETRY_S
        while True:
            try:
                with self._baton_passed_while_waiting():
                    reply = ray.get(self._inference_server.infer.remote(caller, obs_np))
                break
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self._versions_used.append(reply.version)
        return reply.outputs

    def pause_inference(self) -> None:
        """Tell the server this runner sends nothing until its next request (end of a sample),
        so that its batches do not wait for this runner meanwhile. (Env groups say so
        themselves when their share of a sample is done.)"""
        if self._inference_server is not None:
            self._inference_server.idle.remote(self._inference_caller)

    def _central_forward_exploration(self, batch: dict, **kwargs: Any) -> dict:
        return self._to_env_outputs(self._infer(batch[Columns.OBS]), explore=True)

    def _central_forward_inference(self, batch: dict, **kwargs: Any) -> dict:
        return self._to_env_outputs(self._infer(batch[Columns.OBS]), explore=False)

    def _to_env_outputs(self, outputs: dict[str, np.ndarray], *, explore: bool) -> dict:
        """The module outputs the runner's connectors expect (override per algorithm)."""
        raise NotImplementedError

    def log_versions_used(self) -> None:
        """Log the mean weight version of this sample's replies (for the policy lag metric).

        ``window=1``: the latest sample's version, not RLlib's default EMA (coefficient 0.01),
        which would stay near the first versions and make the reported lag grow with training.
        """
        if self._inference_server is not None and self._versions_used:
            self.metrics.log_value(
                WEIGHTS_VERSION_USED, float(np.mean(self._versions_used)), window=1
            )
            self._versions_used.clear()


AUTO = "auto"
#: GPU share the server takes with ``num_gpus="auto"`` on a cluster that has a GPU: SEED's layout
#: of the inference server and the learner sharing one accelerator.
AUTO_SERVER_GPUS = 0.5


def cluster_gpus() -> float:
    """GPUs in the running Ray cluster (0 when Ray is not started)."""
    return float(ray.cluster_resources().get("GPU", 0.0)) if ray.is_initialized() else 0.0


class CentralInferenceSettingsMixin:
    """``.central_inference(...)`` for an AlgorithmConfig (fields ``central_inference_*``)."""

    def _init_central_inference(self, *, enabled: bool | str) -> None:
        self.central_inference_enabled = enabled
        self.central_inference_max_batch_size = 64
        self.central_inference_max_wait_ms = 2.0
        self.central_inference_num_cpus = 1.0
        self.central_inference_num_gpus: float | str = AUTO
        self.central_inference_num_env_groups = 1

    def central_inference(
        self,
        *,
        enabled: bool | str = NotProvided,
        max_batch_size: int = NotProvided,
        max_wait_ms: float = NotProvided,
        num_cpus: float = NotProvided,
        num_gpus: float | str = NotProvided,
        num_env_groups: int = NotProvided,
    ):
        """SEED mode: env runners send observations to one batching inference server.

        Args:
            enabled: route the training env runners' forward passes to the server. ``"auto"``:
                on where it pays, when the Ray cluster has a GPU for the server (and there are
                remote env runners); on CPU only, a server round trip per env step costs more
                than the runner's own forward pass, so runners infer locally.
            max_batch_size: observations per server forward pass (at most).
            max_wait_ms: how long the oldest queued request may wait for a fuller batch.
            num_cpus, num_gpus: the server actor's resources (its own placement-group bundle);
                with ``num_gpus > 0`` the server's module runs on the GPU. ``num_gpus="auto"``
                (default): 0.5 GPU when the cluster has one (shared with the learner), else 0.
            num_env_groups: split each runner's ``num_envs_per_env_runner`` envs into this many
                groups that take turns, so that one group steps while another's request is at
                the server (2 = Sample Factory's double-buffered sampling). Must divide
                ``num_envs_per_env_runner``; 1 = one request per step of all the envs.
        """
        values = {k: v for k, v in locals().items() if k != "self"}
        set_provided(self, values, {k: f"central_inference_{k}" for k in values})
        return self

    def uses_central_inference(self) -> bool:
        """Whether this run has an inference server (``enabled`` resolved on this cluster)."""
        if self.central_inference_enabled == AUTO:
            return self.num_env_runners >= 1 and cluster_gpus() > 0
        return bool(self.central_inference_enabled)

    def central_inference_gpus(self) -> float:
        """The server's GPUs (``num_gpus`` resolved on this cluster)."""
        if self.central_inference_num_gpus == AUTO:
            return min(AUTO_SERVER_GPUS, cluster_gpus())
        return float(self.central_inference_num_gpus)

    def validate_central_inference(self) -> None:
        enabled = self.central_inference_enabled
        if not (isinstance(enabled, bool) or enabled == AUTO):
            raise ValueError(
                f"central_inference(enabled=...) must be True, False or 'auto', got {enabled!r}"
            )
        check_int("central_inference(max_batch_size)", self.central_inference_max_batch_size, 1)
        check_real("central_inference(max_wait_ms)", self.central_inference_max_wait_ms, low=0.0)
        check_real("central_inference(num_cpus)", self.central_inference_num_cpus, low=0.0)
        if self.central_inference_num_gpus != AUTO:
            check_real("central_inference(num_gpus)", self.central_inference_num_gpus, low=0.0)
        groups = self.central_inference_num_env_groups
        check_int("central_inference(num_env_groups)", groups, 1)
        if enabled is not False and groups > 1:
            self._validate_env_groups(groups)
        if enabled is True and self.num_env_runners < 1:
            raise ValueError(
                "central_inference(enabled=True) needs num_env_runners >= 1 (the server answers "
                "remote env runners); set env_runners(num_env_runners=...) or disable it"
            )

    def _validate_env_groups(self, groups: int) -> None:
        if self.num_envs_per_env_runner % groups:
            raise ValueError(
                f"central_inference(num_env_groups={groups}) must divide "
                f"env_runners(num_envs_per_env_runner={self.num_envs_per_env_runner})"
            )
        mode = self.gym_env_vectorize_mode
        if gym.VectorizeMode(mode) is not gym.VectorizeMode.SYNC:
            raise ValueError(
                f"central_inference(num_env_groups={groups}) cuts a runner's sync vector env "
                f"into groups; env_runners(gym_env_vectorize_mode={mode!r}) is not supported "
                f"(use 'sync', or num_env_groups=1)"
            )
        if self.restart_failed_sub_environments:
            raise ValueError(
                f"central_inference(num_env_groups={groups}) is not supported with "
                f"fault_tolerance(restart_failed_sub_environments=True): a rebuilt env would "
                f"leave the other groups' envs behind; use num_env_groups=1"
            )

    def inference_server_config(self) -> InferenceServerConfig:
        return InferenceServerConfig(
            max_batch_size=self.central_inference_max_batch_size,
            max_wait_ms=self.central_inference_max_wait_ms,
        )

    def inference_server_bundle(self) -> dict[str, float]:
        bundle = {"CPU": float(self.central_inference_num_cpus)}
        gpus = self.central_inference_gpus()
        if gpus > 0:
            bundle["GPU"] = gpus
        return bundle


class InferenceServerClient:
    """The algorithm's handle on its inference server (start, weights, metrics, stop)."""

    def __init__(
        self,
        *,
        module_spec: Any,
        kind: Literal["policy", "q"],
        server_config: InferenceServerConfig,
        num_cpus: float,
        num_gpus: float,
        placement_group: Any = None,
        bundle_index: int = -1,
    ) -> None:
        self.version = 0
        self.handle = start_inference_server(
            _PolicyFactory(module_spec, kind),
            server_config,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            placement_group=placement_group,
            bundle_index=bundle_index,
        )
        ray.get(self.handle.get_version.remote(), timeout=120)  # surfaces constructor errors

    def push_weights(self, learner_group: Any) -> int:
        """Send the learner's current module weights (fire and forget); return their version,
        the learner's count of gradient updates (``rl_dist_ext.params``)."""
        results = learner_group.foreach_learner(lambda learner: learner.versioned_weights())
        weights, self.version = results.result_or_errors[0].get()
        self.handle.set_weights.remote(weights, self.version)
        return self.version

    def stats(self) -> dict[str, float]:
        try:
            return ray.get(self.handle.stats.remote(), timeout=30)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as error:
            log.warning("inference server did not answer a stats request: %s", error)
            return {}

    def close(self) -> None:
        ray.kill(self.handle, no_restart=True)
