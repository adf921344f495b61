"""Prioritized-replay math: priorities from TD errors and importance-sampling weights.

References:
- Schaul et al. 2016, "Prioritized Experience Replay" (arXiv:1511.05952): priorities
  ``p_i = (|delta_i| + eps) ** alpha``, sampling probability ``P(i) = p_i / sum_k p_k`` and
  importance-sampling weights ``w_i = (N * P(i)) ** -beta`` normalised by ``max_j w_j``.

Priorities accept numpy arrays or torch tensors and return the same kind. The loss whose TD
errors become priorities is :mod:`rl_dist_ext.ops.dqn`.
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from rl_dist_ext.validation import is_torch_tensor

if TYPE_CHECKING:
    import torch

# torch is not imported at run time: the replay shards use these functions on numpy arrays.
ArrayT = TypeVar("ArrayT", np.ndarray, "torch.Tensor")

#: The paper's proportional-variant settings (Schaul et al. 2016, table 3; Ape-X uses them too):
#: the defaults of every replay in rl-dist-ext (``DistributedReplayConfig`` and below).
PER_ALPHA = 0.6
PER_BETA = 0.4
#: added to every priority so that none is zero
PER_EPS = 1e-6


def td_priorities(td_errors: ArrayT, *, alpha: float = PER_ALPHA, eps: float = PER_EPS) -> ArrayT:
    """Priorities ``(|td_errors| + eps) ** alpha`` (Schaul et al. 2016, proportional variant).

    Args:
        td_errors: ``[...]`` float array or tensor of TD errors (or any non-negative magnitude).
        alpha: prioritization exponent, ``>= 0``; ``0`` gives uniform priorities.
        eps: small positive constant so that no item gets zero probability.

    Returns:
        Same shape and kind (numpy or torch) as ``td_errors``.
    """
    validate_alpha_eps(alpha, eps)
    if is_torch_tensor(td_errors):
        return (td_errors.detach().abs() + eps) ** alpha
    return (np.abs(np.asarray(td_errors, dtype=np.float64)) + eps) ** alpha


def importance_weights(
    priorities: np.ndarray,
    *,
    total_priority: float,
    size: int,
    beta: float,
    min_priority: float | None = None,
) -> np.ndarray:
    """Importance-sampling weights ``(N * P(i)) ** -beta`` normalised by their maximum.

    Args:
        priorities: ``[B]`` float, the (already exponentiated) priorities ``p_i`` of the sampled
            items.
        total_priority: ``sum_k p_k`` over the whole replay (all shards), so ``P(i) = p_i / total``.
        size: ``N``, the number of items in the replay (all shards).
        beta: correction exponent in ``[0, 1]``; ``0`` means no correction (all weights 1).
        min_priority: the smallest priority in the whole replay. When given, weights are normalised
            by the largest possible weight ``(N * p_min / total) ** -beta`` (Schaul et al.);
            otherwise by the largest weight in the batch.

    Returns:
        ``[B]`` float32 weights in ``(0, 1]``.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta!r}")
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size!r}")
    if not total_priority > 0.0:
        raise ValueError(f"total_priority must be > 0, got {total_priority!r}")
    priorities = np.asarray(priorities, dtype=np.float64)
    if priorities.ndim != 1:
        raise ValueError(f"priorities must have shape [B], got {priorities.shape}")
    weights = (size * priorities / total_priority) ** -beta
    if min_priority is not None:
        if not min_priority > 0.0:
            raise ValueError(f"min_priority must be > 0, got {min_priority!r}")
        max_weight = (size * min_priority / total_priority) ** -beta
    else:
        max_weight = weights.max()
    return (weights / max_weight).astype(np.float32)


def validate_alpha_eps(alpha: float, eps: float) -> None:
    """Raise ``ValueError`` unless ``alpha`` is a finite real >= 0 and ``eps`` one > 0 (the
    priority exponents)."""
    if not _real(alpha) or not 0.0 <= alpha < math.inf:
        raise ValueError(f"alpha must be a finite real number >= 0, got {alpha!r}")
    if not _real(eps) or not 0.0 < eps < math.inf:
        raise ValueError(f"eps must be a finite real number > 0, got {eps!r}")


def _real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
