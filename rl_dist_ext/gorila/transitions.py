"""What a Gorila actor pushes: n-step transitions with initial priorities.

An actor folds its rollout into n-step transitions and computes their initial priorities with its
local network before pushing them to replay (Horgan et al. 2018, section 3). The local network is
an online copy only, so the initial TD error uses it for both action selection and evaluation.
The learner-side loss is :func:`rl_dist_ext.ops.dqn.double_dqn_loss`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from rl_dist_ext.observations import observation_array
from rl_dist_ext.ops.dqn import double_dqn_td_error
from rl_dist_ext.ops.nstep import flatten_time_batch, fold_nstep

#: Column names of a Gorila replay row (what actors push and learners sample).
TRANSITION_COLUMNS = ("obs", "action", "reward", "discount", "next_obs")
#: Column names of an actor's time-major ``[T, B]`` rollout (what the framework's acting gives).
ROLLOUT_COLUMNS = ("obs", "actions", "rewards", "next_obs", "terminated", "truncated")
#: The optional column of envs with action masks: ``[T, B, A]`` bool in a rollout (the legal
#: actions at ``next_obs``), ``[N, A]`` in a replay row (at the bootstrap observation).
NEXT_ACTION_MASK = "next_action_mask"


class ActorBatch(NamedTuple):
    transitions: dict[str, np.ndarray]  # TRANSITION_COLUMNS -> [N, ...]
    priorities: np.ndarray  # [N] float64 |TD error| from the actor's local network


def nstep_batch_with_priorities(
    *,
    obs: np.ndarray,
    actions: np.ndarray,
    rewards: np.ndarray,
    next_obs: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    gamma: float,
    n_step: int,
    q_values: Callable[[torch.Tensor], torch.Tensor],
    next_action_mask: np.ndarray | None = None,
) -> ActorBatch:
    """Fold a ``[T, B]`` rollout into n-step transitions and attach initial priorities.

    Args:
        obs, actions, rewards, next_obs, terminated, truncated, next_action_mask: the rollout,
            time-major, as :func:`rl_dist_ext.ops.nstep.fold_nstep` takes it (with masks, the
            initial TD errors bootstrap from legal actions only, as the learner's do).
        gamma: discount per step.
        n_step: n of the n-step return.
        q_values: the actor's local network, ``[N, *obs_shape]`` tensor of the observations'
            dtype (float32, or uint8 pixels it converts itself) -> ``[N, A]``.
    """
    folded = fold_nstep(
        obs=obs,
        actions=actions,
        rewards=rewards,
        next_obs=next_obs,
        terminated=terminated,
        truncated=truncated,
        gamma=gamma,
        n=n_step,
        next_action_mask=next_action_mask,
    )
    transitions = flatten_time_batch(folded)
    with torch.no_grad():
        q_t = q_values(torch.as_tensor(observation_array(transitions["obs"])))
        q_tp1 = q_values(torch.as_tensor(observation_array(transitions["next_obs"])))
        td = double_dqn_td_error(
            q_online_t=q_t,
            actions=torch.as_tensor(transitions["action"]),
            rewards=torch.as_tensor(transitions["reward"]),
            discounts=torch.as_tensor(transitions["discount"]),
            q_online_tp1=q_tp1,
            q_target_tp1=q_tp1,
            next_action_mask=(
                None
                if NEXT_ACTION_MASK not in transitions
                else torch.as_tensor(transitions[NEXT_ACTION_MASK])
            ),
        ).td_error
    return ActorBatch(transitions, td.abs().double().cpu().numpy())


def check_finite(transitions: dict[str, np.ndarray], *, source: str) -> None:
    """Raise ``ValueError`` naming ``source`` and the column if a float column is not finite."""
    for name, column in transitions.items():
        if column.dtype.kind == "f" and not np.isfinite(column).all():
            raise ValueError(
                f"{source}: the environment produced non-finite values in {name!r}; nothing "
                "from this rollout was pushed to the replay"
            )
