"""The IMPALA actor-critic loss every V-trace learner trains (RLlib and Tianshou adapters).

Espeholt et al. 2018, "IMPALA" (arXiv:1802.01561), section 4.2: with V-trace targets ``v_s`` and
policy-gradient advantages ``A_s`` (:mod:`rl_dist_ext.ops.vtrace`), the learner minimises

    L = - mean_s[ log pi(a_s|x_s) A_s ]                           (policy gradient)
        + vf_loss_coeff * mean_s[ 0.5 (V(x_s) - v_s)^2 ]          (value)
        - entropy_coeff * mean_s[ H(pi(.|x_s)) ]                  (entropy bonus)

where the means run over the real (unmasked) steps of a time-major ``[T, B]`` batch; masked
steps (an episode piece's final observation, padding) add nothing. With
``normalize_advantages``, ``A_s`` is shifted and scaled to mean 0 and standard deviation 1 over
the batch's real steps first (as Tianshou's PPO does per minibatch): the policy's step no
longer grows with the scale of the returns.

With ``ratio_clip`` (epsilon), the policy-gradient term is PPO's clipped surrogate (Schulman et
al. 2017, arXiv:1707.06347, eq. 7) on the V-trace advantages above:

    - mean_s[ min(r_s A_s, clip(r_s, 1 - epsilon, 1 + epsilon) A_s) ],
    r_s = pi(a_s|x_s) / pi_old(a_s|x_s),

where ``pi_old`` is the policy the step is bounded around (``old_log_probs``). Where
``r_s = 1`` its gradient is the plain term's; once a step has moved ``pi`` past the band in the
direction ``A_s`` favours, that step adds no more gradient. ``A_s`` keeps V-trace's weight
``min(rho_bar_pg, pi/mu)`` for the current ``pi``, so inside the band a step's gradient is
weighted ``r_s min(rho_bar_pg, pi/mu)``: about ``pi/mu`` when ``pi_old`` is the learner's policy
as the batch arrived (Tianshou's ``clip_around="arrival"``), ``(pi/mu) min(1, pi/mu)`` when it
is the behaviour policy ``mu`` itself.

With ``targets_for="old"`` the V-trace targets (``v_s`` and ``A_s``) are computed for ``pi_old``
instead, as RLlib's APPO computes them for its target network: a step's gradient is weighted
``r_s min(rho_bar_pg, pi_old/mu)``, about ``pi/mu`` truncated once (APPO also caps
``mu/pi_old`` at 2 in its ratio; here the ratio is ``pi/pi_old`` as it is). Around the
behaviour policy (``pi_old = mu``) every importance weight is 1: with the thresholds at 1 or
above (or ``None``), the defaults, no trace is cut, the thresholds change nothing, ``v_s`` are
lambda-returns and ``A_s`` is GAE(lambda), so the loss is PPO's objective on the actors' data
and the clipped ratio ``pi/mu`` is its only correction for policy lag.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rl_dist_ext.ops.vtrace import vtrace_from_log_probs

__all__ = [
    "TARGETS_FOR",
    "VTraceLoss",
    "check_targets_for",
    "resolve_targets_for",
    "vtrace_actor_critic_loss",
]

#: the policies V-trace's targets can be computed for: the learner's, or the clip's ``pi_old``
TARGETS_FOR = ("current", "old")


class VTraceLoss(NamedTuple):
    """Result of :func:`vtrace_actor_critic_loss`; every field is a scalar tensor."""

    total: torch.Tensor  # carries gradient
    pi_loss: torch.Tensor  # the terms below are detached, for metrics
    vf_loss: torch.Tensor
    entropy: torch.Tensor
    mean_rho: torch.Tensor  # mean pi/mu over real steps (1 = no policy lag)


def check_targets_for(
    targets_for: object, ratio_clip: float | None, clip_name: str = "ratio_clip"
) -> None:
    """Refuse a ``targets_for`` that is not one of ``TARGETS_FOR``, or ``"old"`` without a clip
    (there is no ``pi_old`` then); ``clip_name`` is the clip's name where the user set it.
    Adapters call it as their settings are made."""
    if targets_for not in TARGETS_FOR:
        raise ValueError(f"targets_for must be 'current' or 'old', got {targets_for!r}")
    if targets_for == "old" and ratio_clip is None:
        raise ValueError(
            f"targets_for='old' needs the clipped surrogate: set {clip_name} (its pi_old is the "
            f"policy the targets are computed for; {clip_name}=None has no old policy)"
        )


def resolve_targets_for(
    targets_for: object, ratio_clip: float | None, clip_name: str = "ratio_clip"
) -> str:
    """``targets_for`` checked (:func:`check_targets_for`), and ``None`` (the adapters' default)
    resolved by the clip: ``"old"`` with one (APPO's form, the one that kept its target in the
    retention races), ``"current"`` without (IMPALA's loss)."""
    if targets_for is None:
        return "current" if ratio_clip is None else "old"
    check_targets_for(targets_for, ratio_clip, clip_name)
    return targets_for


def vtrace_actor_critic_loss(
    *,
    target_log_probs: torch.Tensor,
    behaviour_log_probs: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    mask: torch.Tensor,
    vf_loss_coeff: float,
    entropy_coeff: float,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    lambda_: float = 1.0,
    normalize_advantages: bool = False,
    ratio_clip: float | None = None,
    old_log_probs: torch.Tensor | None = None,
    targets_for: str = "current",
) -> VTraceLoss:
    """The IMPALA loss on one time-major batch (see the module docstring).

    Args:
        target_log_probs: ``[T, B]`` float, log pi(a_t|x_t) of the learner (with gradient).
        behaviour_log_probs: ``[T, B]`` float, log mu(a_t|x_t) recorded when acting.
        entropy: ``[T, B]`` float, H(pi(.|x_t)) (with gradient).
        values: ``[T, B]`` float, V(x_t) (with gradient).
        bootstrap_value: ``[B]`` float, V(x_T).
        rewards: ``[T, B]`` float.
        discounts: ``[T, B]`` float, gamma (0 where the episode terminated at t).
        mask: ``[T, B]`` 0/1 or bool, 1 at real steps; at least one must be real.
        vf_loss_coeff, entropy_coeff: weights of the value and entropy terms.
        clip_rho_threshold, clip_pg_rho_threshold, lambda_: as in
            :func:`~rl_dist_ext.ops.vtrace.vtrace_from_importance_weights`.
        normalize_advantages: standardize the policy-gradient advantages over the real steps
            (mean 0, standard deviation 1; a batch of one real step is only centred).
        ratio_clip: epsilon > 0 of the clipped surrogate (``None``: the plain term).
        old_log_probs: ``[T, B]`` float, log pi_old(a_t|x_t), no gradient; needed exactly when
            ``ratio_clip`` is given.
        targets_for: the policy V-trace's targets and advantages are computed for:
            ``"current"`` (pi, IMPALA's) or ``"old"`` (``pi_old``, APPO's; needs
            ``ratio_clip``).

    Raises:
        ValueError: no real step, ``ratio_clip`` without ``old_log_probs`` (or the other way
            round), ``targets_for`` not one of the two or ``"old"`` without ``ratio_clip``, or
            shapes as in the V-trace functions.
    """
    mask = mask.to(values.dtype)
    num_real = mask.sum()
    if not num_real > 0:
        raise ValueError("mask has no real step: the loss would be empty")
    if (ratio_clip is None) != (old_log_probs is None):
        raise ValueError(
            "ratio_clip and old_log_probs go together: the clipped surrogate needs the policy it "
            f"bounds the step around (ratio_clip={ratio_clip!r}, old_log_probs "
            f"{'given' if old_log_probs is not None else 'missing'})"
        )
    if ratio_clip is not None and (isinstance(ratio_clip, bool) or not ratio_clip > 0):
        raise ValueError(f"ratio_clip must be None or > 0, got {ratio_clip!r}")
    check_targets_for(targets_for, ratio_clip)
    shaped = [("entropy", entropy), ("values", values)]
    if old_log_probs is not None:
        shaped.append(("old_log_probs", old_log_probs))
    for name, x in shaped:
        if tuple(x.shape) != tuple(target_log_probs.shape):
            raise ValueError(
                f"{name} has shape {tuple(x.shape)}, expected {tuple(target_log_probs.shape)} "
                f"(the shape of target_log_probs)"
            )
    targets = vtrace_from_log_probs(
        behaviour_log_probs=behaviour_log_probs,
        target_log_probs=target_log_probs if targets_for == "current" else old_log_probs,
        discounts=discounts,
        rewards=rewards,
        values=values,
        bootstrap_value=bootstrap_value,
        mask=mask,
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
        lambda_=lambda_,
    )
    real = mask != 0

    def mean(x: torch.Tensor) -> torch.Tensor:
        """Over the real steps. where(), not a product: a masked step's log-prob may be -inf
        (padding, invalid actions)."""
        return (
            torch.where(real, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum() / num_real
        )

    advantages = targets.pg_advantages
    if normalize_advantages:  # mean 0, standard deviation 1 over the real steps
        centred = torch.where(real, advantages - mean(advantages), 0.0)
        advantages = centred / (mean(centred.square()).sqrt() + 1e-8)
    if ratio_clip is None:
        pi_loss = -mean(target_log_probs * advantages)
    else:
        # where(), as in mean(): a masked step's log-probs may be -inf on both sides; the cap
        # keeps exp() finite (a step whose ratio passes e^20 takes no gradient)
        log_ratio = torch.where(real, target_log_probs - old_log_probs.detach(), 0.0)
        ratio = log_ratio.clamp(max=20.0).exp()
        clipped = ratio.clamp(1.0 - ratio_clip, 1.0 + ratio_clip)
        pi_loss = -mean(torch.minimum(ratio * advantages, clipped * advantages))
    vf_loss = 0.5 * mean((values - targets.vs) ** 2)
    mean_entropy = mean(entropy)
    total = pi_loss + vf_loss_coeff * vf_loss - entropy_coeff * mean_entropy
    with torch.no_grad():
        mean_rho = mean((target_log_probs - behaviour_log_probs).exp())
    return VTraceLoss(
        total=total,
        pi_loss=pi_loss.detach(),
        vf_loss=vf_loss.detach(),
        entropy=mean_entropy.detach(),
        mean_rho=mean_rho,
    )
