"""A torch learner's gradient bookkeeping in fewer passes over the parameters.

RLlib's ``TorchLearner`` checks every gradient tensor for NaN/inf twice per step (once to zero
bad values, once more before ``optimizer.step()``), clips by global norm with one norm kernel per
tensor, and builds ``torch.optim.Adam`` with its per-tensor loop. On a small network each of
these is a kernel launch or a Python loop per parameter tensor per step, which adds up to about a
quarter of a GorilaDQN update on CartPole (``benchmarks/learner_bench.py --profile``).
:class:`LeanGradients` keeps RLlib's results and takes them in fewer passes:

- global-norm clipping: one foreach norm over the module's gradients
  (``torch.nn.utils.get_total_norm``) and RLlib's coefficient, ``min(1, clip / (norm + 1e-6))``,
  the norm logged under RLlib's key;
- one finiteness check per step (a finite global norm means every gradient is finite), none
  more where the clipping norm already showed it;
- Adam with ``fused=True`` where torch has the fused kernel for the parameters, and with the
  config's ``adam_epsilon`` where it has one (DQN's config documents it as Adam's epsilon;
  RLlib's own torch learner builds Adam with torch's default and leaves it unused).

Whenever a gradient is not finite, or RLlib's mixed-precision scalers or torch LR schedulers are
configured, or a module has several optimizers, RLlib's own methods run instead, so their
handling of bad gradients is unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

#: Devices whose Adam has a fused kernel for float parameters.
FUSED_ADAM_DEVICES = ("cpu", "cuda")
#: torch's Adam epsilon: the optimizer's for configs without an ``adam_epsilon``.
TORCH_ADAM_EPSILON = 1e-8


def fused_adam_supported(params: list[torch.Tensor]) -> bool:
    """Whether torch's fused Adam takes ``params``: float tensors on one supported device."""
    devices = {p.device.type for p in params}
    return (
        bool(params)
        and all(p.is_floating_point() for p in params)
        and len(devices) == 1
        and devices <= set(FUSED_ADAM_DEVICES)
    )


def all_finite(grads: list[torch.Tensor]) -> bool:
    """Whether every element of every tensor in ``grads`` is finite (one foreach norm; a norm
    that overflows on finite values also answers ``False``, and the caller then checks the slow
    way)."""
    if not grads:
        return True
    return bool(torch.isfinite(torch.nn.utils.get_total_norm(grads, foreach=True)))


class LeanGradients:
    """Mixin for an RLlib ``TorchLearner`` (listed before it): see the module docstring."""

    #: Set by :meth:`postprocess_gradients` when every module's gradients were clipped here
    #: with a finite norm (so they are finite); read and reset by :meth:`apply_gradients`.
    _gradients_known_finite = False

    def postprocess_gradients(self, gradients_dict: dict[Any, Any]) -> dict[Any, Any]:
        self._gradients_known_finite = True  # until a module's gradients are not checked here
        return super().postprocess_gradients(gradients_dict)

    def configure_optimizers_for_module(self, module_id, config=None) -> None:
        """RLlib's default optimizer (Adam at ``config.lr``, its schedule included), fused, with
        the config's ``adam_epsilon``."""
        params = self.get_parameters(self.module[module_id])
        eps = getattr(config, "adam_epsilon", TORCH_ADAM_EPSILON)
        self.register_optimizer(
            module_id=module_id,
            optimizer=torch.optim.Adam(params, eps=eps, fused=fused_adam_supported(params)),
            params=params,
            lr_or_lr_schedule=config.lr,
        )

    def postprocess_gradients_for_module(
        self, *, module_id, config=None, module_gradients_dict: dict[Any, Any]
    ) -> dict[Any, Any]:
        optimizers = self.get_optimizers_for_module(module_id)
        grads = [g for g in module_gradients_dict.values() if g is not None]
        clipped_here = config.grad_clip and config.grad_clip_by == "global_norm"
        norm = None
        if clipped_here and len(optimizers) == 1 and grads:
            norm = torch.nn.utils.get_total_norm(grads, foreach=True)
        if norm is None or not torch.isfinite(norm):
            self._gradients_known_finite &= not grads
            return super().postprocess_gradients_for_module(
                module_id=module_id, config=config, module_gradients_dict=module_gradients_dict
            )
        coefficient = torch.clamp(config.grad_clip / (norm + 1e-6), max=1.0)
        for grad in grads:
            grad.mul_(coefficient)
        [(optimizer_name, _)] = optimizers
        self.metrics.log_value(
            key=(module_id, f"gradients_{optimizer_name}_global_norm"), value=norm, window=1
        )
        return dict(module_gradients_dict)

    def apply_gradients(self, gradients_dict: dict[Any, Any]) -> None:
        known_finite, self._gradients_known_finite = self._gradients_known_finite, False
        if (
            self._grad_scalers is not None
            or self._lr_scheduler_classes is not None
            or not (
                known_finite or all_finite([g for g in gradients_dict.values() if g is not None])
            )
        ):
            return super().apply_gradients(gradients_dict)
        for param_ref, grad in gradients_dict.items():
            self._params[param_ref].grad = grad
        for module_id, optimizer_names in self._module_optimizers.items():
            for optimizer_name in optimizer_names:
                self.get_optimizer(module_id, optimizer_name).step()
        return None
