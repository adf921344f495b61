"""V-trace off-policy value targets and policy-gradient advantages.

Implements the V-trace operator of Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL
with Importance Weighted Actor-Learner Architectures" (arXiv:1802.01561), eq. (1) and the
remark following it that gives the recursive form

    v_s = V(x_s) + delta_s V + gamma_s c_s (v_{s+1} - V(x_{s+1})),
    delta_s V = rho_s (r_s + gamma_s V(x_{s+1}) - V(x_s)),

with truncated importance weights rho_s = min(rho_bar, pi(a_s|x_s) / mu(a_s|x_s)) and trace
coefficients c_s = lambda * min(1, pi / mu) (lambda as in rlax; lambda = 1 is the paper's
c_bar = 1).

The policy-gradient advantage (section 4.2) is

    A_s = rho_s^pg (r_s + gamma_s q_{s+1} - V(x_s)),
    q_{s+1} = lambda v_{s+1} + (1 - lambda) V(x_{s+1})   (q_T = V(x_T), the bootstrap value),

with its own truncation threshold rho_s^pg = min(rho_bar^pg, pi / mu). With lambda = 1 this is
the paper's r_s + gamma_s v_{s+1}; with lambda < 1 ``q_{s+1}`` is the lambda-return's own
bootstrap (G_s = r_s + gamma_s ((1 - lambda) V(x_{s+1}) + lambda G_{s+1})), the form
``rlax.vtrace_td_error_and_advantage`` uses. With lambda = 1 the numbers match DeepMind's
``scalable_agent/vtrace.py``.

All tensors are time-major: ``[T, B, ...]``. Extra trailing dimensions are allowed; every
per-step input shares the shape of ``log_rhos`` and ``bootstrap_value`` has shape
``log_rhos.shape[1:]`` (the value estimate V(x_T) of the state after the last step).

Episode structure inside a row:

- A ``discount`` of 0 at step t marks a termination at t: the return is cut, nothing after t
  flows into t.
- A ``mask`` of 0 at step t marks a step that is not part of any trajectory (RLlib appends one
  such step after each episode piece, holding the piece's last observation; padding is another).
  A masked step contributes no TD error and passes no trace on: its target is ``v_t = V(x_t)``
  and its advantage 0. The real step before it therefore bootstraps from V(x_t), the value of
  the piece's final observation, which is what truncation (by the env, or at a rollout-fragment
  cut) needs. Inputs at masked steps other than ``values`` are ignored.
- The end of a row truncates the trace there and bootstraps from ``bootstrap_value``.

The returned tensors are targets: they are computed without autograd and carry no gradient.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = [
    "VTraceReturns",
    "vtrace_from_importance_weights",
    "vtrace_from_log_probs",
]


class VTraceReturns(NamedTuple):
    """Output of the V-trace functions (both detached, same dtype/device as the inputs)."""

    vs: torch.Tensor
    """``[T, B, ...]`` V-trace value targets v_s."""
    pg_advantages: torch.Tensor
    """``[T, B, ...]`` rho_s^pg * (r_s + gamma_s * q_{s+1} - V(x_s)) (0 at masked steps)."""


def _check_tensor(name: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def _check_threshold(name: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{name} must be None or > 0, got {value!r}")


def vtrace_from_importance_weights(
    *,
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    mask: torch.Tensor | None = None,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    lambda_: float = 1.0,
) -> VTraceReturns:
    """V-trace targets from log importance weights log(pi(a_t|x_t) / mu(a_t|x_t)).

    Args:
        log_rhos: ``[T, B, ...]`` float, log of the (untruncated) importance ratios pi/mu.
        discounts: ``[T, B, ...]`` float, gamma_t per step (0 where the episode ends at t).
        rewards: ``[T, B, ...]`` float, r_t.
        values: ``[T, B, ...]`` float, V(x_t) under the current value function.
        bootstrap_value: ``[B, ...]`` float, V(x_T).
        mask: ``[T, B, ...]`` bool (or 0/1 numbers), True at real steps; ``None`` = all real.
            See the module docstring for what a masked step means.
        clip_rho_threshold: rho_bar, truncation of the weights in delta_t V; ``None`` = no clip.
        clip_pg_rho_threshold: truncation of the weights in the pg advantage; ``None`` = no clip.
        lambda_: trace-cutting factor in [0, 1]; c_t = lambda_ * min(1, pi/mu).

    Returns:
        :class:`VTraceReturns` of ``[T, B, ...]`` tensors, detached, in the inputs' dtype/device.

    Raises:
        TypeError: an input is not a ``torch.Tensor``.
        ValueError: a shape does not match, a threshold is <= 0 or ``lambda_`` is outside [0, 1].
    """
    log_rhos = _check_tensor("log_rhos", log_rhos)
    discounts = _check_tensor("discounts", discounts)
    rewards = _check_tensor("rewards", rewards)
    values = _check_tensor("values", values)
    bootstrap_value = _check_tensor("bootstrap_value", bootstrap_value)

    if log_rhos.dim() < 2:
        raise ValueError(
            f"log_rhos must have rank >= 2 (time-major [T, B, ...]), got shape "
            f"{tuple(log_rhos.shape)}"
        )
    expected = tuple(log_rhos.shape)
    per_step = [("discounts", discounts), ("rewards", rewards), ("values", values)]
    if mask is not None:
        per_step.append(("mask", _check_tensor("mask", mask)))
    for name, x in per_step:
        if tuple(x.shape) != expected:
            raise ValueError(
                f"{name} has shape {tuple(x.shape)}, expected {expected} (the shape of log_rhos)"
            )
    if tuple(bootstrap_value.shape) != expected[1:]:
        raise ValueError(
            f"bootstrap_value has shape {tuple(bootstrap_value.shape)}, expected {expected[1:]} "
            f"(log_rhos.shape[1:])"
        )
    _check_threshold("clip_rho_threshold", clip_rho_threshold)
    _check_threshold("clip_pg_rho_threshold", clip_pg_rho_threshold)
    if not 0.0 <= lambda_ <= 1.0:
        raise ValueError(f"lambda_ must be in [0, 1], got {lambda_!r}")

    with torch.no_grad():
        log_rhos = log_rhos.detach()
        discounts = discounts.detach()
        rewards = rewards.detach()
        values = values.detach()
        bootstrap_value = bootstrap_value.detach()
        real = torch.ones_like(values, dtype=torch.bool) if mask is None else mask.detach() != 0
        zero = torch.zeros((), dtype=values.dtype, device=values.device)

        rhos = torch.exp(log_rhos)
        clipped_rhos = rhos if clip_rho_threshold is None else rhos.clamp(max=clip_rho_threshold)
        cs = lambda_ * rhos.clamp(max=1.0)

        # V(x_{t+1}) for t = 0..T-1, with V(x_T) = bootstrap_value.
        values_tp1 = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
        # where(), not a product: inputs at masked steps may be anything, inf and nan included.
        deltas = torch.where(real, clipped_rhos * (rewards + discounts * values_tp1 - values), zero)

        # acc_t = delta_t + gamma_t c_t acc_{t+1}, acc_T = 0; v_s = V(x_s) + acc_s. A masked
        # step holds acc = 0, so nothing flows through it into the step before.
        discounted_cs = torch.where(real, discounts * cs, zero)
        acc_tp1 = torch.zeros_like(bootstrap_value)
        accs = []
        for t in range(log_rhos.shape[0] - 1, -1, -1):
            acc_t = deltas[t] + discounted_cs[t] * acc_tp1
            accs.append(acc_t)
            acc_tp1 = acc_t
        accs.reverse()
        vs = values + torch.stack(accs, dim=0) if accs else values.clone()

        # q_{t+1} = lambda v_{t+1} + (1 - lambda) V(x_{t+1}); q_T = V(x_T).
        q_tp1 = torch.cat(
            [lambda_ * vs[1:] + (1.0 - lambda_) * values[1:], bootstrap_value.unsqueeze(0)], dim=0
        )
        clipped_pg_rhos = (
            rhos if clip_pg_rho_threshold is None else rhos.clamp(max=clip_pg_rho_threshold)
        )
        pg_advantages = torch.where(
            real, clipped_pg_rhos * (rewards + discounts * q_tp1 - values), zero
        )

    return VTraceReturns(vs=vs, pg_advantages=pg_advantages)


def vtrace_from_log_probs(
    *,
    behaviour_log_probs: torch.Tensor,
    target_log_probs: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    mask: torch.Tensor | None = None,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    lambda_: float = 1.0,
) -> VTraceReturns:
    """V-trace targets from the log-probabilities of the taken actions.

    Args:
        behaviour_log_probs: ``[T, B, ...]`` float, log mu(a_t|x_t) of the acting policy.
        target_log_probs: ``[T, B, ...]`` float, log pi(a_t|x_t) of the learner policy.
        discounts: as in :func:`vtrace_from_importance_weights`.
        rewards: as there.
        values: as there.
        bootstrap_value: as there.
        mask: as there.
        clip_rho_threshold: as there.
        clip_pg_rho_threshold: as there.
        lambda_: as there.

    Returns:
        :func:`vtrace_from_importance_weights` with ``log_rhos = target - behaviour``.
    """
    behaviour_log_probs = _check_tensor("behaviour_log_probs", behaviour_log_probs)
    target_log_probs = _check_tensor("target_log_probs", target_log_probs)
    if behaviour_log_probs.shape != target_log_probs.shape:
        raise ValueError(
            f"behaviour_log_probs has shape {tuple(behaviour_log_probs.shape)}, expected "
            f"{tuple(target_log_probs.shape)} (the shape of target_log_probs)"
        )
    log_rhos = target_log_probs.detach() - behaviour_log_probs.detach()
    return vtrace_from_importance_weights(
        log_rhos=log_rhos,
        discounts=discounts,
        rewards=rewards,
        values=values,
        bootstrap_value=bootstrap_value,
        mask=mask,
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
        lambda_=lambda_,
    )
