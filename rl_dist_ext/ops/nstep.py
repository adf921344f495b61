"""Fold a time-major rollout into n-step transitions on the actor, before they go to replay.

Ape-X (Horgan et al. 2018, "Distributed Prioritized Experience Replay", arXiv:1803.00933) has
every actor accumulate its experience locally and push ready-made n-step transitions to the
shared replay, so the learner never has to reassemble trajectories. The n-step Q-learning
target (Sutton & Barto, "Reinforcement Learning: An Introduction", 2nd ed., ch. 7; Mnih et al.
2016, "Asynchronous Methods for Deep Reinforcement Learning", arXiv:1602.01783) of a
transition folded over ``m`` steps is::

    y_t = sum_{k=0}^{m-1} gamma^k r_{t+k}  +  discount_t * max_a Q(next_obs_t, a)

and this module produces ``sum_{k} gamma^k r_{t+k}`` (``rewards``), ``discount_t`` and
``next_obs_t`` so the learner's loss is ``rewards + discounts * bootstrap(next_obs)``.

Contract (all inputs numpy, time-major, ``T`` steps of ``B`` parallel environments):

* ``obs[t, b]`` is the observation at which ``actions[t, b]`` was taken; ``rewards[t, b]`` the
  reward received after it; ``next_obs[t, b]`` the *true* next observation (at an episode end
  the final observation, not the observation the environment was reset to).
* ``terminated[t, b]``: the episode ended at step ``t`` in a terminal state, so nothing is
  bootstrapped past it. ``truncated[t, b]``: the episode was cut at step ``t`` (time limit), so
  the value of ``next_obs[t, b]`` is bootstrapped. A step flagged both is treated as terminated.
* Every input step yields exactly one transition (none is dropped). The transition starting at
  ``t`` folds ``m_t`` steps, where ``m_t`` is the smallest of ``n``, the number of steps up to
  and including the first step ``k >= t`` that is terminated or truncated, and the number of
  steps left in the rollout (``T - t``).
* **The end of the rollout is treated like a truncation**: the last ``n - 1`` steps of each
  rollout get a shorter horizon and bootstrap from ``next_obs`` at the rollout's last step
  (``T - 1``), with discount ``gamma ** m_t``. The next rollout of the same actor therefore does
  not need to be stitched to this one; the targets stay unbiased, only their horizon shrinks.
* ``discounts[t] = 0`` if the window ended in a termination, else ``gamma ** m_t``;
  ``next_obs_n[t] = next_obs[t + m_t - 1]``; ``obs`` and ``actions`` are passed through.
* ``next_action_mask`` (optional, ``[T, B, A]``: the legal actions at ``next_obs[t]``, for
  envs with action masks) is folded like ``next_obs``: the mask of the observation the
  transition bootstraps from.

The folding is vectorised: a loop over ``k in range(n)`` (``n`` is small) of whole-``[T, B]``
array operations, with no Python loop over time or environments.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

__all__ = ["NStepTransitions", "flatten_time_batch", "fold_nstep"]


class NStepTransitions(NamedTuple):
    """One n-step transition per input step, all arrays with leading dims ``[T, B]``."""

    obs: np.ndarray
    """``[T, B, ...]`` observation at which the first action of the window was taken."""
    actions: np.ndarray
    """``[T, B, ...]`` that first action."""
    rewards: np.ndarray
    """``[T, B]`` discounted reward sum ``sum_{k<m} gamma^k r[t + k]`` (float)."""
    discounts: np.ndarray
    """``[T, B]`` bootstrap multiplier: ``gamma ** m``, or 0 if the window ended terminated."""
    next_obs: np.ndarray
    """``[T, B, ...]`` observation to bootstrap from: ``next_obs[t + m - 1]``."""
    horizons: np.ndarray
    """``[T, B]`` int64 number of steps ``m`` folded into each transition (1 <= m <= n)."""
    next_action_mask: np.ndarray | None = None
    """``[T, B, A]`` legal actions at the bootstrap observation (``None`` without masks)."""


def _check_leading(name: str, arr: np.ndarray, tb: tuple[int, int]) -> None:
    if arr.ndim < 2 or tuple(arr.shape[:2]) != tb:
        raise ValueError(
            f"{name} has shape {tuple(arr.shape)}; expected leading dims [T, B] = {tb} "
            f"(time-major [T, B, ...], matching rewards)"
        )


def _check_exact(name: str, arr: np.ndarray, tb: tuple[int, int]) -> None:
    if tuple(arr.shape) != tb:
        raise ValueError(
            f"{name} has shape {tuple(arr.shape)}; expected exactly [T, B] = {tb} "
            f"(matching rewards)"
        )


def _check_gamma(gamma: float) -> float:
    if isinstance(gamma, (bool, np.bool_)) or not isinstance(gamma, numbers.Real):
        raise ValueError(f"gamma must be a real number in [0, 1], got {gamma!r}")
    g = float(gamma)
    if not 0.0 <= g <= 1.0:  # also rejects NaN
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    return g


def _check_n(n: int) -> int:
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    return int(n)


def fold_nstep(
    *,
    obs: np.ndarray,
    actions: np.ndarray,
    rewards: np.ndarray,
    next_obs: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    gamma: float,
    n: int,
    next_action_mask: np.ndarray | None = None,
) -> NStepTransitions:
    """Fold a time-major ``[T, B]`` rollout into ``T * B`` n-step transitions.

    See the module docstring for the exact contract. ``rewards`` keeps its float dtype (integer
    or bool rewards become float32); ``discounts`` has the same dtype; ``horizons`` is int64.

    Raises:
        ValueError: if an array's shape does not match ``[T, B]`` (``rewards``, ``terminated``,
            ``truncated`` exactly; ``obs``, ``actions``, ``next_obs`` and ``next_action_mask``
            as leading dims), if
            ``T == 0``, if ``gamma`` is outside ``[0, 1]`` or if ``n`` is not an int >= 1.
    """
    gamma = _check_gamma(gamma)
    n = _check_n(n)

    rewards = np.asarray(rewards)
    if rewards.ndim < 2:
        raise ValueError(
            f"rewards has shape {tuple(rewards.shape)} (rank {rewards.ndim}); expected "
            f"time-major [T, B] (rank 2)"
        )
    if rewards.ndim != 2:
        raise ValueError(
            f"rewards has shape {tuple(rewards.shape)}; expected exactly [T, B] = "
            f"{tuple(rewards.shape[:2])}"
        )
    T, B = rewards.shape
    tb = (T, B)
    if T == 0:
        raise ValueError(f"rewards has shape {tb}; expected T >= 1 steps in [T, B]")

    obs = np.asarray(obs)
    actions = np.asarray(actions)
    next_obs = np.asarray(next_obs)
    terminated = np.asarray(terminated)
    truncated = np.asarray(truncated)
    _check_leading("obs", obs, tb)
    _check_leading("actions", actions, tb)
    _check_leading("next_obs", next_obs, tb)
    if next_action_mask is not None:
        next_action_mask = np.asarray(next_action_mask)
        _check_leading("next_action_mask", next_action_mask, tb)
    _check_exact("terminated", terminated, tb)
    _check_exact("truncated", truncated, tb)
    terminated = terminated.astype(bool, copy=False)
    truncated = truncated.astype(bool, copy=False)

    out_dtype = np.dtype(rewards.dtype if np.issubdtype(rewards.dtype, np.floating) else np.float32)
    r = rewards.astype(out_dtype, copy=False)
    done = terminated | truncated

    rewards_n = np.zeros(tb, dtype=out_dtype)
    horizons = np.zeros(tb, dtype=np.int64)
    ended_terminal = np.zeros(tb, dtype=bool)
    # open_[t, b]: the window starting at t still extends to step t + k.
    open_ = np.ones(tb, dtype=bool)
    zero = out_dtype.type(0)
    for k in range(min(n, T)):
        L = T - k  # windows t in [0, L) can reach step t + k; the rest closed at the rollout end
        o = open_[:L]
        # np.where (not a multiply by the mask) so a non-finite reward outside a window is ignored
        rewards_n[:L] += np.where(o, r[k:] * (gamma**k), zero)
        horizons[:L] += o
        ended_terminal[:L] |= o & terminated[k:]
        o &= ~done[k:]  # in-place on the view: an episode boundary at t + k closes the window
        o[L - 1] = False  # t + k == T - 1: the rollout ends here (treated as a truncation)

    discounts = np.where(ended_terminal, 0.0, np.power(gamma, horizons, dtype=np.float64))
    discounts = discounts.astype(out_dtype, copy=False)
    last = np.arange(T)[:, None] + horizons - 1  # [T, B] time index of the window's last step
    env = np.arange(B)[None, :]
    next_obs_n = next_obs[last, env]

    return NStepTransitions(
        obs=obs,
        actions=actions,
        rewards=rewards_n,
        discounts=discounts,
        next_obs=next_obs_n,
        horizons=horizons,
        next_action_mask=None if next_action_mask is None else next_action_mask[last, env],
    )


def flatten_time_batch(transitions: NStepTransitions) -> dict[str, np.ndarray]:
    """Flatten ``[T, B, ...]`` transitions to the replay's schema with leading dim ``T * B``.

    Row ``t * B + b`` holds the transition of environment ``b`` starting at step ``t``
    (time-major, C order). Keys: ``obs``, ``action``, ``reward``, ``discount``, ``next_obs``
    and, with masks, ``next_action_mask``; ``horizons`` is not stored.
    """
    T, B = transitions.rewards.shape

    def flat(a: np.ndarray) -> np.ndarray:
        return np.reshape(a, (T * B, *a.shape[2:]))

    rows = {
        "obs": flat(transitions.obs),
        "action": flat(transitions.actions),
        "reward": flat(transitions.rewards),
        "discount": flat(transitions.discounts),
        "next_obs": flat(transitions.next_obs),
    }
    if transitions.next_action_mask is not None:
        rows["next_action_mask"] = flat(transitions.next_action_mask)
    return rows
