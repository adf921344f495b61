"""SEED-style central inference for RLlib algorithms (``.central_inference(...)``).

Pieces shared by :class:`~rllib_plugins.VTrace` and :class:`~rllib_plugins.GorilaDQN`:

- :class:`RLModuleInferencePolicy`: what the :class:`~rl_dist_ext.inference.InferenceServer`
  runs: an RLModule built from its spec on the server's device. ``kind="policy"`` samples
  actions from the module's action distribution and returns them with their log-probs (the
  behaviour log-probs V-trace needs); ``kind="q"`` returns Q-values and greedy actions.
- :class:`ServerInferenceRLModule` and :class:`CentralInferenceRunnerMixin`: in SEED mode an env
  runner's module is an RLModule whose forward passes ask the server (RLlib's own sampling loop
  calls it like any module); the runner's local module keeps its initial weights and serves its
  spaces and distribution classes. The weight version of every reply is logged. Only public
  RLlib hooks are used: ``make_module`` and the RLModule forward methods.
- :class:`InferenceServerClient`: the algorithm side: starts the server in the algorithm's
  placement group (its own bundle), pushes the learner's weights, reads the server's metrics.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np
import ray
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.rl_module import RLModule
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from ray.rllib.utils.from_config import NotProvided
from ray.rllib.utils.numpy import convert_to_numpy

from rl_dist_ext.inference import AUTO, CentralInference, InferenceServerConfig
from rl_dist_ext.ray_actors import (
    InferenceCaller,
    InferenceServerHandle,
    cluster_gpus,
    start_inference_server,
)
from rl_dist_ext.validation import check_setting_names
from rllib_plugins.action_masking import split_masked

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
    """Picklable ``device -> RLModuleInferencePolicy`` for the server actor (multi-agent:
    ``module_spec`` is module id -> spec, and the server gets module id -> policy)."""

    def __init__(self, module_spec: Any, kind: Literal["policy", "q"]) -> None:
        self.module_spec = module_spec
        self.kind = kind

    def __call__(self, device: str) -> Any:
        if isinstance(self.module_spec, Mapping):
            return {
                module: RLModuleInferencePolicy(spec, device, self.kind)
                for module, spec in self.module_spec.items()
            }
        return RLModuleInferencePolicy(self.module_spec, device, self.kind)


class ServerInferenceRLModule(TorchRLModule):
    """An env runner's RLModule in SEED mode: its exploration and inference forward passes ask
    the inference server; spaces, distribution classes and state are those of the runner's own
    module (``unwrapped()``), which keeps its initial weights. RLlib's ``TorchDDPRLModule`` wraps
    a module the same way.

    Args:
        local: the module RLlib built for the runner.
        caller: this runner's :class:`~rl_dist_ext.ray_actors.InferenceCaller` (shared by the
            modules of a multi-agent runner).
        module: the module id the server knows this module by (multi-agent; ``""``: the
            server's only policy).
        to_env_outputs: the server's outputs -> the module outputs the runner's connectors expect
            (``explore`` says which forward pass asked; ``action_mask`` is the batch's action
            mask, or ``None``).
    """

    def __init__(
        self,
        local: RLModule,
        *,
        caller: InferenceCaller,
        to_env_outputs: Callable[..., dict[str, Any]],
        module: str = "",
    ) -> None:
        super().__init__(
            observation_space=local.observation_space,
            action_space=local.action_space,
            inference_only=True,
            model_config=local.model_config,
        )
        self.local = local
        self.caller = caller
        self.module_id = module
        self._to_env_outputs = to_env_outputs

    def setup(self) -> None:
        """Nothing to build: the networks are the local module's (and the server's)."""

    def infer(self, obs: Any) -> dict[str, np.ndarray]:
        """One request to the server; waits out a server restart (up to a minute)."""
        return self.caller.infer(convert_to_numpy(obs), self.module_id).outputs

    def pause(self) -> None:
        """Tell the server this caller sends nothing until its next request, so that its
        batches do not wait for it meanwhile."""
        self.caller.idle()

    def _forward_exploration(self, batch: dict, **kwargs: Any) -> dict:
        return self._ask_server(batch, explore=True)

    def _forward_inference(self, batch: dict, **kwargs: Any) -> dict:
        return self._ask_server(batch, explore=False)

    def _ask_server(self, batch: dict, *, explore: bool) -> dict:
        """The server answers for the (flattened) observations; action masks, if any, stay
        with the runner and apply to the reply there."""
        obs, mask = split_masked(batch[Columns.OBS])
        return self._to_env_outputs(self.infer(obs), explore=explore, action_mask=mask)

    def _forward(self, batch: dict, **kwargs: Any) -> dict:
        return self._forward_inference(batch, **kwargs)

    def get_inference_action_dist_cls(self, *args: Any, **kwargs: Any):
        return self.local.get_inference_action_dist_cls(*args, **kwargs)

    def get_exploration_action_dist_cls(self, *args: Any, **kwargs: Any):
        return self.local.get_exploration_action_dist_cls(*args, **kwargs)

    def get_initial_state(self) -> Any:
        return self.local.get_initial_state()

    def is_stateful(self) -> bool:
        return self.local.is_stateful()

    def get_state(self, *args: Any, **kwargs: Any):
        return self.local.get_state(*args, **kwargs)

    def set_state(self, *args: Any, **kwargs: Any) -> None:
        self.local.set_state(*args, **kwargs)

    def save_to_path(self, *args: Any, **kwargs: Any) -> Any:
        return self.local.save_to_path(*args, **kwargs)

    def restore_from_path(self, *args: Any, **kwargs: Any) -> None:
        self.local.restore_from_path(*args, **kwargs)

    def get_metadata(self, *args: Any, **kwargs: Any) -> Any:
        return self.local.get_metadata(*args, **kwargs)

    def get_ctor_args_and_kwargs(self) -> Any:
        return self.local.get_ctor_args_and_kwargs()

    def unwrapped(self) -> RLModule:
        return self.local


class CentralInferenceRunnerMixin:
    """Mix into an env runner class; :meth:`connect_inference_server` makes its module (a
    multi-agent runner: each trained module) a :class:`ServerInferenceRLModule`, again whenever
    RLlib rebuilds the module. One :class:`~rl_dist_ext.ray_actors.InferenceCaller` per runner
    carries every request (the server batches per module)."""

    _inference_server: Any = None
    inference_caller: InferenceCaller | None = None

    @property
    def _inference_caller_id(self) -> str:
        return f"env-runner-{self.worker_index}"

    def connect_inference_server(self, server: Any) -> int:
        """Route this runner's module forward passes to ``server``; returns its restart count."""
        self._inference_server = server
        self.inference_caller = InferenceCaller(
            server, self._inference_caller_id, retry_s=REQUEST_RETRY_S
        )
        self._wrap_module()
        return self.inference_caller.register()

    def make_module(self) -> None:
        super().make_module()
        if self._inference_server is not None:
            self._wrap_module()

    def _server_module_ids(self) -> list[str] | None:
        """Multi-agent runners: the modules the server acts for (``None``: single-agent)."""
        return None

    def _wrap_module(self) -> None:
        if self.module is None:
            return
        module_ids = self._server_module_ids()
        if module_ids is None:
            self.module = self._server_module(self.module.unwrapped(), "")
            return
        for module_id in module_ids:
            local = self.module[module_id].unwrapped()
            self.module.add_module(module_id, self._server_module(local, module_id), override=True)

    def _server_module(self, local: RLModule, module_id: str) -> ServerInferenceRLModule:
        return ServerInferenceRLModule(
            local,
            caller=self.inference_caller,
            to_env_outputs=self._to_env_outputs,
            module=module_id,
        )

    def pause_inference(self) -> None:
        """Tell the server this runner sends nothing until its next request (end of a
        sample), so that its batches do not wait for this runner meanwhile."""
        if self.inference_caller is not None:
            self.inference_caller.idle()

    def _to_env_outputs(
        self, outputs: dict[str, np.ndarray], *, explore: bool, action_mask: Any = None
    ) -> dict:
        """The module outputs the runner's connectors expect (override per algorithm)."""
        raise NotImplementedError

    def log_versions_used(self) -> None:
        """Log the mean weight version of this sample's replies (for the policy lag metric).

        ``window=1``: the latest sample's version, not RLlib's default EMA (coefficient 0.01),
        which would stay near the first versions and make the reported lag grow with training.
        """
        caller = self.inference_caller
        used = caller.take_versions_used() if caller is not None else []
        if used:
            self.metrics.log_value(WEIGHTS_VERSION_USED, float(np.mean(used)), window=1)


def server_module_spec(config: Any, spaces: Any, modules: list[str] | None) -> Any:
    """What the inference server builds: the module's spec, or (multi-agent, ``modules``
    given) module id -> spec of each module it acts for (the trained ones)."""
    if modules is None:
        return config.get_rl_module_spec(spaces=spaces, inference_only=True)
    multi = config.get_multi_rl_module_spec(spaces=spaces, inference_only=True)
    return {module: multi.rl_module_specs[module] for module in modules}


#: The settings ``.central_inference()`` takes besides ``enabled``: CentralInference's fields.
CENTRAL_INFERENCE_SETTINGS = frozenset(f.name for f in dataclasses.fields(CentralInference))


class CentralInferenceSettingsMixin:
    """``.central_inference(...)`` for an AlgorithmConfig: ``central_inference_enabled`` and the
    :class:`~rl_dist_ext.inference.CentralInference` fields that were set
    (``central_inference_settings``), built and validated by :meth:`central_inference_config`."""

    def _init_central_inference(self, *, enabled: bool | str) -> None:
        self.central_inference_enabled = enabled
        self.central_inference_settings: dict[str, Any] = {}

    def central_inference(self, *, enabled: bool | str = NotProvided, **settings: Any):
        """SEED mode: env runners send observations to one batching inference server.

        Args:
            enabled: route the training env runners' forward passes to the server. ``"auto"``:
                on where it pays, when the Ray cluster has a GPU for the server (and there are
                remote env runners); on CPU only, a server round trip per env step costs more
                than the runner's own forward pass, so runners infer locally.
            settings: fields of :class:`~rl_dist_ext.inference.CentralInference`
                (``max_batch_size``, ``max_wait_ms``, ``num_cpus``, ``num_gpus``; the server
                gets its own placement-group bundle, and runs its module on the GPU with
                ``num_gpus > 0``; ``num_gpus="auto"``: 0.5 of a GPU when the cluster has one).
                Values may be Tune search spaces: they are checked when the algorithm is built.
        """
        check_setting_names(
            "central_inference()", settings, CENTRAL_INFERENCE_SETTINGS | {"enabled"}
        )
        if enabled is not NotProvided:
            self.central_inference_enabled = enabled
        self.central_inference_settings = {**self.central_inference_settings, **settings}
        return self

    def central_inference_config(self) -> CentralInference:
        """The server's settings (raises ``ValueError`` naming a bad field)."""
        return CentralInference(**self.central_inference_settings)

    def uses_central_inference(self) -> bool:
        """Whether this run has an inference server (``enabled`` resolved on this cluster)."""
        if self.central_inference_enabled == AUTO:
            return self.num_env_runners >= 1 and cluster_gpus() > 0
        return bool(self.central_inference_enabled)

    def central_inference_gpus(self) -> float:
        """The server's GPUs (``num_gpus`` resolved on this cluster)."""
        return self.central_inference_config().gpus(cluster_gpus())

    def validate_central_inference(self) -> None:
        enabled = self.central_inference_enabled
        if not (isinstance(enabled, bool) or enabled == AUTO):
            raise ValueError(
                f"central_inference(enabled=...) must be True, False or 'auto', got {enabled!r}"
            )
        try:
            self.central_inference_config()
        except ValueError as error:
            raise ValueError(f"central_inference(...): {error}") from None
        if enabled is True and self.num_env_runners < 1:
            raise ValueError(
                "central_inference(enabled=True) needs num_env_runners >= 1 (the server answers "
                "remote env runners); set env_runners(num_env_runners=...) or disable it"
            )

    def inference_server_config(self) -> InferenceServerConfig:
        return self.central_inference_config().server_config()

    def inference_server_bundle(self) -> dict[str, float]:
        return self.central_inference_config().bundle(cluster_gpus())


class InferenceServerClient(InferenceServerHandle):
    """The algorithm's handle on its inference server: started in the algorithm's placement
    group (its own bundle), the learner's weights pushed, metrics read, stopped."""

    def __init__(
        self,
        *,
        module_spec: Any,  # RLModuleSpec, or (multi-agent) module id -> RLModuleSpec
        kind: Literal["policy", "q"],
        server_config: InferenceServerConfig,
        num_cpus: float,
        num_gpus: float,
        placement_group: Any = None,
        bundle_index: int = -1,
    ) -> None:
        super().__init__(
            start_inference_server(
                _PolicyFactory(module_spec, kind),
                server_config,
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                placement_group=placement_group,
                bundle_index=bundle_index,
            )
        )
        self.version = 0
        ray.get(self.handle.get_version.remote(), timeout=120)  # surfaces constructor errors

    def push_weights(self, learner_group: Any) -> int:
        """Send the learner's current module weights (fire and forget); return their version
        (``rl_dist_ext.params``: one per gradient update, moved on by restores)."""
        results = learner_group.foreach_learner(lambda learner: learner.versioned_weights())
        weights, version = results.result_or_errors[0].get()
        self.push(weights, version)
        return version
