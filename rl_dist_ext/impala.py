"""The IMPALA actor step and the learner's batch of trajectories, written once for every adapter.

Espeholt et al. 2018, "IMPALA" (arXiv:1802.01561), section 3: actors run a local copy of the
policy for ``T`` steps in each of their envs, record the behaviour policy's log-probabilities
mu(a_t|x_t), and hand the ``[T, B]`` trajectories to the learner while they keep acting; they
pull the learner's newest weights every ``K`` env steps (here: between trajectories once ``K``
steps have passed). The learner corrects for the policy lag with V-trace.

- :class:`TrajectoryActorStep`: pull if due -> act (the framework's own sampling, a callable)
  -> check -> :class:`Trajectory`. In SEED mode an actor holds no weights and the inference
  server's replies carry the behaviour log-probs and the version that acted.
- :func:`time_major_batch`: trajectories -> one ``[T', B]`` batch in the final-observation
  layout of :mod:`rl_dist_ext.ops.vtrace_layout`, ready for
  :func:`rl_dist_ext.ops.vtrace_loss.vtrace_actor_critic_loss`.

Versions and policy lag: :mod:`rl_dist_ext.params`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from rl_dist_ext.gorila.transitions import check_finite
from rl_dist_ext.ops.vtrace_layout import FinalStepLayout, final_step_layout, gather_time_major
from rl_dist_ext.params import HoldsPulledWeights, WeightsPuller, WeightsSource

__all__ = [
    "TRAJECTORY_COLUMNS",
    "TimeMajorBatch",
    "Trajectory",
    "TrajectoryActorStep",
    "time_major_batch",
]

#: Column names of a trajectory: time-major ``[T, B, ...]`` arrays.
TRAJECTORY_COLUMNS = (
    "obs",
    "actions",
    "rewards",
    "next_obs",
    "terminated",
    "truncated",
    "behaviour_logp",
)


class Trajectory(NamedTuple):
    """``T`` steps of ``B`` envs: ``TRAJECTORY_COLUMNS`` -> ``[T, B, ...]`` arrays."""

    columns: dict[str, np.ndarray]
    #: Mean weights version that chose the actions (-1: initial weights, nothing pulled yet).
    acting_version: float


def check_trajectory(columns: dict[str, np.ndarray], *, source: str) -> tuple[int, int]:
    """Raise ``ValueError`` naming ``source`` unless ``columns`` is a whole, finite trajectory;
    returns its ``(T, B)``."""
    missing = [name for name in TRAJECTORY_COLUMNS if name not in columns]
    if missing:
        raise ValueError(f"{source}: the trajectory lacks columns {missing}")
    shape = np.shape(columns["rewards"])
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f"{source}: rewards must be [T, B] with T, B >= 1, got shape {shape}")
    for name in TRAJECTORY_COLUMNS:
        if np.shape(columns[name])[:2] != shape:
            raise ValueError(
                f"{source}: {name} has shape {np.shape(columns[name])}, expected {shape} + "
                f"per-step dims (the shape of rewards)"
            )
    check_finite({k: np.asarray(v) for k, v in columns.items()}, source=source)
    return shape


class TrajectoryActorStep(HoldsPulledWeights):
    """Pull if due -> act -> check -> trajectory; see the module docstring.

    Args:
        weights: the parameter server (``pull_if_newer``); ``None`` for a SEED actor.
        pull_every_n_steps: this actor's env steps between weight pulls (``K``).
        name: names this actor in errors.
    """

    def __init__(
        self,
        *,
        weights: WeightsSource | None = None,
        pull_every_n_steps: int = 400,
        name: str = "actor",
    ) -> None:
        self._weights = WeightsPuller(weights, pull_every_n_steps)
        self.name = name
        self.env_steps = 0

    def run(
        self,
        *,
        act: Callable[[], dict[str, np.ndarray]],
        load_weights: Callable[[Any], None],
        acting_version: Callable[[], float] | None = None,
    ) -> Trajectory:
        """One actor step.

        Args:
            act: steps every env ``T`` times with the local policy (or the server); returns
                ``TRAJECTORY_COLUMNS`` as ``[T, B, ...]`` arrays.
            load_weights: puts pulled weights into the local policy.
            acting_version: the mean version that acted, when the actor holds no weights
                (SEED: the server's replies say); ``None`` = the version this actor holds.
        """
        self._weights.pull_if_due(load_weights)
        columns = act()
        num_steps, num_envs = check_trajectory(columns, source=self.name)
        self._weights.count(num_steps * num_envs)
        self.env_steps += num_steps * num_envs
        version = self.weights_version if acting_version is None else acting_version()
        return Trajectory(columns, float(version))


class TimeMajorBatch(NamedTuple):
    """Trajectories in the final-observation layout: ``[T', B, ...]`` numpy arrays."""

    obs: np.ndarray  # the step's observation, or its episode piece's final one where masked
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray  # bool
    behaviour_logp: np.ndarray
    mask: np.ndarray  # bool, True at real steps
    layout: FinalStepLayout


def time_major_batch(trajectories: Sequence[Trajectory]) -> TimeMajorBatch:
    """Side by side (``B`` = the sum of their envs), laid out by
    :func:`~rl_dist_ext.ops.vtrace_layout.final_step_layout`.

    Raises:
        ValueError: no trajectory, or trajectories of different lengths ``T``.
    """
    if not trajectories:
        raise ValueError("time_major_batch needs at least one trajectory")
    lengths = {np.shape(t.columns["rewards"])[0] for t in trajectories}
    if len(lengths) != 1:
        raise ValueError(f"trajectories must share one length T, got lengths {sorted(lengths)}")
    columns = {
        name: np.concatenate([np.asarray(t.columns[name]) for t in trajectories], axis=1)
        for name in TRAJECTORY_COLUMNS
    }
    layout = final_step_layout(columns["terminated"], columns["truncated"])
    final = layout.final.reshape(layout.final.shape + (1,) * (columns["obs"].ndim - 2))
    obs = np.where(
        final,
        gather_time_major(columns["next_obs"], layout),
        gather_time_major(columns["obs"], layout),
    )
    return TimeMajorBatch(
        obs=obs,
        actions=gather_time_major(columns["actions"], layout),
        rewards=gather_time_major(columns["rewards"], layout),
        terminated=gather_time_major(columns["terminated"], layout).astype(bool),
        behaviour_logp=gather_time_major(columns["behaviour_logp"], layout),
        mask=layout.mask,
        layout=layout,
    )
