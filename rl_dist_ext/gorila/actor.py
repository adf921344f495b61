"""The Gorila / Ape-X actor step, written once for every adapter.

One step: pull newer weights if ``pull_every_n_steps`` env steps have passed -> act (the
framework's own sampling, given as a callable) -> fold n-step transitions -> initial priorities
from the local network -> check they are finite -> push to the replay. The adapters
(``rllib_plugins.gorila_env_runner``, ``tianshou_plugins.actor``) only say how their framework
acts, loads weights and computes Q-values.

In SEED mode an actor holds no weights (``weights=None``): it never pulls, and the version that
acted is the one the inference server reports with its replies (``Rollout.acting_version``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from rl_dist_ext.gorila.transitions import (
    ROLLOUT_COLUMNS,
    check_finite,
    nstep_batch_with_priorities,
)
from rl_dist_ext.params import HoldsPulledWeights, WeightsPuller, WeightsSource
from rl_dist_ext.validation import check_int


class ReplayWriter(Protocol):
    def add(self, transitions: dict[str, np.ndarray], priorities: np.ndarray | None) -> Any: ...


class Rollout(NamedTuple):
    """What acting returns: ``ROLLOUT_COLUMNS`` -> time-major ``[T, B, ...]`` arrays."""

    columns: dict[str, np.ndarray]
    #: Mean weights version that chose the actions, when the actor did not hold the weights
    #: itself (SEED); ``None`` = the version this actor pulled.
    acting_version: float | None = None


class ActorStepResult(NamedTuple):
    env_steps: int  # T * B of this rollout
    weights_version: float  # the version that acted (-1: initial weights, nothing pulled yet)


class ActorStep(HoldsPulledWeights):
    """Pull if due -> act -> fold -> prioritise -> push; see the module docstring.

    Args:
        replay: where transitions go (a ``DistributedReplay`` client or a ``PrioritizedReplay``).
        gamma, n_step: discount and horizon of the n-step transitions.
        prioritized: push the local network's ``|TD|`` as initial priorities (else ``None``:
            the replay's default priority).
        weights: the parameter server (``pull_if_newer``); ``None`` for a SEED actor.
        pull_every_n_steps: this actor's env steps between weight pulls (Gorila's K).
        name: names this actor in errors.
    """

    def __init__(
        self,
        *,
        replay: ReplayWriter,
        gamma: float,
        n_step: int,
        prioritized: bool = True,
        weights: WeightsSource | None = None,
        pull_every_n_steps: int = 400,
        name: str = "actor",
    ) -> None:
        self._replay = replay
        self._gamma = gamma
        self._n_step = check_int("n_step", n_step, 1)
        self._prioritized = prioritized
        self._weights = WeightsPuller(weights, pull_every_n_steps)
        self.name = name
        self.env_steps = 0

    def run(
        self,
        *,
        act: Callable[[], Rollout],
        q_values: Callable[[torch.Tensor], torch.Tensor],
        load_weights: Callable[[Any], None],
    ) -> ActorStepResult:
        """One actor step.

        Args:
            act: steps the envs with the local policy and its epsilon; returns the rollout.
            q_values: the acting network, ``[N, *obs_shape]`` float tensor -> ``[N, A]``.
            load_weights: puts pulled weights into the acting network.
        """
        self._weights.pull_if_due(load_weights)
        rollout = act()
        return self.push(rollout, q_values)

    def push(
        self, rollout: Rollout, q_values: Callable[[torch.Tensor], torch.Tensor]
    ) -> ActorStepResult:
        """Fold ``rollout``, attach initial priorities, check and push it."""
        missing = set(ROLLOUT_COLUMNS) - set(rollout.columns)
        if missing:
            raise ValueError(f"{self.name}: the rollout lacks columns {sorted(missing)}")
        batch = nstep_batch_with_priorities(
            **rollout.columns, gamma=self._gamma, n_step=self._n_step, q_values=q_values
        )
        check_finite(batch.transitions, source=self.name)
        self._replay.add(batch.transitions, batch.priorities if self._prioritized else None)
        rewards = rollout.columns["rewards"]
        steps = int(rewards.shape[0] * rewards.shape[1])
        self._weights.count(steps)
        self.env_steps += steps
        version = self.weights_version if rollout.acting_version is None else rollout.acting_version
        return ActorStepResult(steps, float(version))
