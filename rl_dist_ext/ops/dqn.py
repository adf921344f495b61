"""The importance-weighted double-DQN loss every Gorila / Ape-X learner trains.

References:
- van Hasselt et al. 2016, "Deep Reinforcement Learning with Double Q-learning"
  (arXiv:1509.06461): the online network selects ``a* = argmax_a Q_online(s', a)``, the target
  network evaluates it.
- Horgan et al. 2018, "Distributed Prioritized Experience Replay" (arXiv:1803.00933): n-step
  targets ``G = r^(n) + gamma_n * Q_target(s_{t+n}, a*)`` where ``gamma_n`` already carries
  ``gamma ** n`` and the termination mask (see :mod:`rl_dist_ext.ops.nstep`).

Batch-major ``[B]`` (replayed transitions have no time axis); Q-values are ``[B, A]``.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F

LOSS_TYPES = ("huber", "mse")


class DQNTargets(NamedTuple):
    """Result of :func:`double_dqn_td_error`; every field is ``[B]``."""

    q_selected: torch.Tensor  # Q_online(s, a), carries gradient
    target: torch.Tensor  # r^(n) + gamma_n * Q_target(s', argmax_a Q_online(s', a)); no gradient
    td_error: torch.Tensor  # target - q_selected, detached


class DQNLoss(NamedTuple):
    """Result of :func:`double_dqn_loss`."""

    loss: torch.Tensor  # scalar, importance-weighted mean
    td_error: torch.Tensor  # [B] detached, for new priorities
    q_selected: torch.Tensor  # [B] detached, for metrics
    target: torch.Tensor  # [B] detached, for metrics


def double_dqn_td_error(
    *,
    q_online_t: torch.Tensor,
    actions: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    q_online_tp1: torch.Tensor,
    q_target_tp1: torch.Tensor,
) -> DQNTargets:
    """Double-DQN n-step TD error.

    Args:
        q_online_t: ``[B, A]`` float, online Q-values at ``s_t`` (with gradient).
        actions: ``[B]`` integer actions ``a_t``.
        rewards: ``[B]`` float n-step discounted reward sums ``r^(n)``.
        discounts: ``[B]`` float ``gamma ** m`` (0 where the window terminated).
        q_online_tp1: ``[B, A]`` online Q-values at ``s_{t+n}`` (used only to select the action).
        q_target_tp1: ``[B, A]`` target-network Q-values at ``s_{t+n}``.
    """
    if q_online_t.ndim != 2:
        raise ValueError(f"q_online_t must have shape [B, A], got {tuple(q_online_t.shape)}")
    batch, num_actions = q_online_t.shape
    for name, value in (("q_online_tp1", q_online_tp1), ("q_target_tp1", q_target_tp1)):
        if tuple(value.shape) != (batch, num_actions):
            raise ValueError(
                f"{name} must have shape {(batch, num_actions)} like q_online_t, "
                f"got {tuple(value.shape)}"
            )
    for name, value in (("actions", actions), ("rewards", rewards), ("discounts", discounts)):
        if tuple(value.shape) != (batch,):
            raise ValueError(f"{name} must have shape [B]=({batch},), got {tuple(value.shape)}")
    q_selected = q_online_t.gather(1, actions.long().unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        best_next = q_online_tp1.argmax(dim=1, keepdim=True)
        q_next = q_target_tp1.gather(1, best_next).squeeze(1)
        target = rewards.to(q_next.dtype) + discounts.to(q_next.dtype) * q_next
    return DQNTargets(q_selected, target, (target - q_selected).detach())


def double_dqn_loss(
    *,
    q_online_t: torch.Tensor,
    actions: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    q_online_tp1: torch.Tensor,
    q_target_tp1: torch.Tensor,
    weights: torch.Tensor | None = None,
    loss_type: Literal["huber", "mse"] = "huber",
    huber_delta: float = 1.0,
) -> DQNLoss:
    """Importance-weighted double-DQN loss; the weights apply on every loss path.

    Args:
        q_online_t, actions, rewards, discounts, q_online_tp1, q_target_tp1: as in
            :func:`double_dqn_td_error`.
        weights: ``[B]`` importance-sampling weights (``None`` = all ones).
        loss_type: ``"huber"`` (smooth L1 with ``huber_delta``) or ``"mse"`` (``0.5 * td ** 2``).
        huber_delta: the Huber transition point, ``> 0``.

    Returns:
        :class:`DQNLoss` whose ``loss`` is ``mean_i(w_i * l(td_i))``.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    if not huber_delta > 0:
        raise ValueError(f"huber_delta must be > 0, got {huber_delta!r}")
    q = double_dqn_td_error(
        q_online_t=q_online_t,
        actions=actions,
        rewards=rewards,
        discounts=discounts,
        q_online_tp1=q_online_tp1,
        q_target_tp1=q_target_tp1,
    )
    if loss_type == "huber":
        per_item = F.huber_loss(q.q_selected, q.target, reduction="none", delta=huber_delta)
    else:
        per_item = 0.5 * (q.target - q.q_selected) ** 2
    if weights is not None:
        if tuple(weights.shape) != tuple(per_item.shape):
            raise ValueError(
                f"weights must have shape [B]={tuple(per_item.shape)}, got {tuple(weights.shape)}"
            )
        per_item = per_item * weights.to(per_item.dtype)
    return DQNLoss(per_item.mean(), q.td_error, q.q_selected.detach(), q.target)
