"""The importance-weighted double-DQN loss every Gorila / Ape-X learner trains.

References:
- van Hasselt et al. 2016, "Deep Reinforcement Learning with Double Q-learning"
  (arXiv:1509.06461): the online network selects ``a* = argmax_a Q_online(s', a)``, the target
  network evaluates it.
- Horgan et al. 2018, "Distributed Prioritized Experience Replay" (arXiv:1803.00933): n-step
  targets ``G = r^(n) + gamma_n * Q_target(s_{t+n}, a*)`` where ``gamma_n`` already carries
  ``gamma ** n`` and the termination mask (see :mod:`rl_dist_ext.ops.nstep`).

Batch-major ``[B]`` (replayed transitions have no time axis); Q-values are ``[B, A]``.

Action masks (turn-based games, e.g. PettingZoo's classic envs): ``next_action_mask[b, a]`` says
whether action ``a`` is legal at ``s_{t+n}``. Only legal actions may be selected for the
bootstrap (:func:`masked_argmax`); the target network's value of the selected action is used
as it is, so a state with no legal action (a terminal board, whose discount is 0) still gives a
finite target. :func:`mask_q_values` is the one place the masking rule lives; acting
(greedy and epsilon-greedy, :func:`epsilon_greedy_masked`) uses it too.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F

from rl_dist_ext.validation import check_choice

LOSS_TYPES = ("huber", "mse")


def mask_q_values(q_values: torch.Tensor, action_mask: torch.Tensor | None) -> torch.Tensor:
    """``q_values`` (``[B, A]``) with illegal actions (``action_mask[b, a]`` false or 0) set to
    the dtype's lowest finite value, so that no argmax picks them while any legal action exists.
    ``action_mask=None`` returns ``q_values`` unchanged."""
    if action_mask is None:
        return q_values
    if tuple(action_mask.shape) != tuple(q_values.shape):
        raise ValueError(
            f"action_mask must have the shape of the Q-values {tuple(q_values.shape)}, got "
            f"{tuple(action_mask.shape)}"
        )
    lowest = torch.finfo(q_values.dtype).min
    return torch.where(action_mask.to(q_values.device).bool(), q_values, lowest)


def masked_argmax(q_values: torch.Tensor, action_mask: torch.Tensor | None) -> torch.Tensor:
    """``[B]`` greedy actions among the legal ones (all actions when ``action_mask`` is None)."""
    return mask_q_values(q_values, action_mask).argmax(dim=-1)


def epsilon_greedy_masked(
    q_values: torch.Tensor,
    action_mask: torch.Tensor | None,
    epsilon: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``[B]`` epsilon-greedy actions: with probability ``epsilon`` a uniformly random legal
    action, else the greedy legal one. A row with no legal action gets the greedy index (0)."""
    greedy = masked_argmax(q_values, action_mask)
    batch, num_actions = q_values.shape
    legal = (
        torch.ones_like(q_values, dtype=torch.bool)
        if action_mask is None
        else action_mask.to(q_values.device).bool()
    )
    # A uniform legal action: the argmax of uniform noise over the legal actions.
    noise = torch.rand((batch, num_actions), generator=generator, device=q_values.device)
    random_legal = torch.where(legal, noise, -1.0).argmax(dim=-1)
    explore = torch.rand((batch,), generator=generator, device=q_values.device) < epsilon
    return torch.where(explore & legal.any(dim=-1), random_legal, greedy)


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
    next_action_mask: torch.Tensor | None = None,
) -> DQNTargets:
    """Double-DQN n-step TD error.

    Args:
        q_online_t: ``[B, A]`` float, online Q-values at ``s_t`` (with gradient).
        actions: ``[B]`` integer actions ``a_t``.
        rewards: ``[B]`` float n-step discounted reward sums ``r^(n)``.
        discounts: ``[B]`` float ``gamma ** m`` (0 where the window terminated).
        q_online_tp1: ``[B, A]`` online Q-values at ``s_{t+n}`` (used only to select the action).
        q_target_tp1: ``[B, A]`` target-network Q-values at ``s_{t+n}``.
        next_action_mask: ``[B, A]`` bool, the legal actions at ``s_{t+n}`` (``None``: all);
            the selection ``argmax_a`` runs over legal actions only.
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
        best_next = masked_argmax(q_online_tp1, next_action_mask).unsqueeze(1)
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
    next_action_mask: torch.Tensor | None = None,
) -> DQNLoss:
    """Importance-weighted double-DQN loss; the weights apply on every loss path.

    Args:
        q_online_t: as in :func:`double_dqn_td_error`.
        actions: as there.
        rewards: as there.
        discounts: as there.
        q_online_tp1: as there.
        q_target_tp1: as there.
        next_action_mask: as there.
        weights: ``[B]`` importance-sampling weights (``None`` = all ones).
        loss_type: ``"huber"`` (smooth L1 with ``huber_delta``) or ``"mse"`` (``0.5 * td ** 2``).
        huber_delta: the Huber transition point, ``> 0``.

    Returns:
        :class:`DQNLoss` whose ``loss`` is ``mean_i(w_i * l(td_i))``.
    """
    check_choice("loss_type", loss_type, LOSS_TYPES)
    if not huber_delta > 0:
        raise ValueError(f"huber_delta must be > 0, got {huber_delta!r}")
    q = double_dqn_td_error(
        q_online_t=q_online_t,
        actions=actions,
        rewards=rewards,
        discounts=discounts,
        q_online_tp1=q_online_tp1,
        q_target_tp1=q_target_tp1,
        next_action_mask=next_action_mask,
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


def polyak_update(online: torch.nn.Module, target: torch.nn.Module, tau: float) -> None:
    """``target <- tau * online + (1 - tau) * target`` in place, for every floating-point entry
    of the two networks' state (parameters and buffers); other entries (counters) are copied.
    ``tau = 1`` copies ``online``. The two modules must have the same state keys and shapes."""
    source = online.state_dict()
    with torch.no_grad():
        for name, tensor in target.state_dict(keep_vars=True).items():
            if tensor.is_floating_point():
                tensor.lerp_(source[name].to(tensor.device, tensor.dtype), tau)
            else:
                tensor.copy_(source[name])


#: The Polyak factor of a target moved after every gradient update: it lags ``(1 - tau) /
#: tau`` = 124 updates behind on average, as a copy every 250 updates does (124.5), but never
#: jumps. On CartPole this kept more of its greedy tests after the target than the copy
#: (docs/benchmarks.md, "Retention after the target").
POLYAK_TAU = 0.008


def target_tau(tau: float | None, every_n_updates: int) -> float:
    """The share of the online network mixed into the target at each target update: ``tau``
    where one is given; ``None`` picks it from the period: :data:`POLYAK_TAU` for a target
    moved after every update, 1.0 (a copy) for a longer period, so that a period set alone
    keeps its meaning of a copy every C updates."""
    if tau is not None:
        return tau
    return POLYAK_TAU if every_n_updates == 1 else 1.0
