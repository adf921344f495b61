"""Gorila / Ape-X DQN written once: the actor step and the learner step every adapter runs.

- :mod:`~rl_dist_ext.gorila.transitions`: n-step transitions with initial priorities (what actors
  push, what learners sample).
- :class:`~rl_dist_ext.gorila.actor.ActorStep`: pull if due -> act -> fold -> prioritise -> push.
- :class:`~rl_dist_ext.gorila.learner.GorilaLearner`: sample -> loss -> priorities back ->
  target every C -> publish every P.

Versions and policy lag: :mod:`rl_dist_ext.params`. Nothing here imports Ray: the replay client
and the parameter server come in as objects with the plain classes' methods.
"""

from rl_dist_ext.gorila.actor import (
    COUNT_STEPS_BY,
    ActorStep,
    ActorStepResult,
    ModuleRollouts,
    Rollout,
)
from rl_dist_ext.gorila.learner import GorilaLearner, GorilaLearnerCounters, UpdateStats
from rl_dist_ext.gorila.transitions import (
    NEXT_ACTION_MASK,
    ROLLOUT_COLUMNS,
    TRANSITION_COLUMNS,
    ActorBatch,
    check_finite,
    nstep_batch_with_priorities,
)

__all__ = [
    "COUNT_STEPS_BY",
    "NEXT_ACTION_MASK",
    "ROLLOUT_COLUMNS",
    "TRANSITION_COLUMNS",
    "ActorBatch",
    "ActorStep",
    "ActorStepResult",
    "GorilaLearner",
    "GorilaLearnerCounters",
    "ModuleRollouts",
    "Rollout",
    "UpdateStats",
    "check_finite",
    "nstep_batch_with_priorities",
]
