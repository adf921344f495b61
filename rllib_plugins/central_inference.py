"""SEED-style central inference for RLlib algorithms (``.central_inference(...)``).

Pieces shared by :class:`~rllib_plugins.VTrace` and :class:`~rllib_plugins.GorilaDQN`:

- :class:`RLModuleInferencePolicy`: what the :class:`~rl_dist_ext.inference.InferenceServer`
  runs: an RLModule built from its spec on the server's device. ``kind="policy"`` samples
  actions from the module's action distribution and returns them with their log-probs (the
  behaviour log-probs V-trace needs); ``kind="q"`` returns Q-values and greedy actions.
- :class:`CentralInferenceRunnerMixin`: an env-runner mixin whose module forward passes go to
  the server instead of a local copy (the local module keeps its initial weights and is only
  used for its spaces and distribution classes); the weight version of every reply is logged.
- :class:`InferenceServerClient`: the algorithm side: starts the server in the algorithm's
  placement group (its own bundle), pushes the learner's weights, reads the server's metrics.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Literal

import numpy as np
import ray
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
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


class CentralInferenceRunnerMixin:
    """Mix into a ``SingleAgentEnvRunner`` subclass; call :meth:`connect_inference_server`."""

    _inference_server: Any = None

    def connect_inference_server(self, server: Any) -> int:
        """Route this runner's module forward passes to ``server``; returns its restart count."""
        self._inference_server = server
        self._inference_caller = f"env-runner-{self.worker_index}"
        self._versions_used: list[int] = []
        self.module.forward_exploration = self._central_forward_exploration
        self.module.forward_inference = self._central_forward_inference
        return ray.get(server.register.remote(self._inference_caller))

    def _infer(self, obs: torch.Tensor) -> dict[str, np.ndarray]:
        """One request to the server; waits out a server restart (up to a minute)."""
        obs_np = convert_to_numpy(obs)
        deadline = time.monotonic() + REQUEST_RETRY_S
        while True:
            try:
                reply = ray.get(self._inference_server.infer.remote(self._inference_caller, obs_np))
                break
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self._versions_used.append(reply.version)
        return reply.outputs

    def pause_inference(self) -> None:
        """Tell the server this runner sends nothing until its next request (end of a sample),
        so that its batches do not wait for this runner meanwhile."""
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


class CentralInferenceSettingsMixin:
    """``.central_inference(...)`` for an AlgorithmConfig (fields ``central_inference_*``)."""

    def _init_central_inference(self, *, enabled: bool) -> None:
        self.central_inference_enabled = enabled
        self.central_inference_max_batch_size = 64
        self.central_inference_max_wait_ms = 2.0
        self.central_inference_num_cpus = 1.0
        self.central_inference_num_gpus = 0.0

    def central_inference(
        self,
        *,
        enabled: bool = NotProvided,
        max_batch_size: int = NotProvided,
        max_wait_ms: float = NotProvided,
        num_cpus: float = NotProvided,
        num_gpus: float = NotProvided,
    ):
        """SEED mode: env runners send observations to one batching inference server.

        Args:
            enabled: route the training env runners' forward passes to the server.
            max_batch_size: observations per server forward pass (at most).
            max_wait_ms: how long the oldest queued request may wait for a fuller batch.
            num_cpus, num_gpus: the server actor's resources (its own placement-group bundle);
                with ``num_gpus > 0`` the server's module runs on the GPU.
        """
        values = {k: v for k, v in locals().items() if k != "self"}
        set_provided(self, values, {k: f"central_inference_{k}" for k in values})
        return self

    def validate_central_inference(self) -> None:
        if not isinstance(self.central_inference_enabled, bool):
            raise ValueError(
                f"central_inference(enabled=...) must be a bool, got "
                f"{self.central_inference_enabled!r}"
            )
        check_int("central_inference(max_batch_size)", self.central_inference_max_batch_size, 1)
        check_real("central_inference(max_wait_ms)", self.central_inference_max_wait_ms, low=0.0)
        check_real("central_inference(num_cpus)", self.central_inference_num_cpus, low=0.0)
        check_real("central_inference(num_gpus)", self.central_inference_num_gpus, low=0.0)
        if self.central_inference_enabled and self.num_env_runners < 1:
            raise ValueError(
                "central_inference(enabled=True) needs num_env_runners >= 1 (the server answers "
                "remote env runners); set env_runners(num_env_runners=...) or disable it"
            )

    def inference_server_config(self) -> InferenceServerConfig:
        return InferenceServerConfig(
            max_batch_size=self.central_inference_max_batch_size,
            max_wait_ms=self.central_inference_max_wait_ms,
        )

    def inference_server_bundle(self) -> dict[str, float]:
        bundle = {"CPU": float(self.central_inference_num_cpus)}
        if self.central_inference_num_gpus > 0:
            bundle["GPU"] = float(self.central_inference_num_gpus)
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
        """Send the learner's current module weights (fire and forget); return their version."""
        weights = learner_group.get_weights(module_ids=[DEFAULT_MODULE_ID])[DEFAULT_MODULE_ID]
        self.version += 1
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
