"""The Gorila / Ape-X actor step, written once for every adapter.

One step: pull newer weights if ``pull_every_n_steps`` env steps have passed -> act (the
framework's own sampling, given as a callable) -> fold n-step transitions -> initial priorities
from the local network -> check they are finite -> push to the replay. The adapters
(``rllib_plugins.gorila_env_runner``, ``tianshou_plugins.actor``) only say how their framework
acts, loads weights and computes Q-values.

In SEED mode an actor holds no weights (``weights=None``): it never pulls, and the version that
acted is the one the inference server reports with its replies (``Rollout.acting_version``).

Multi-agent actors (``replays=``, one replay per trained module) act once for every agent and
push each module's steps, folded per agent, to that module's replay: :meth:`ActorStep.run_modules`.
The replays' rate limiters count **env steps** by default (``count_steps_by="env_steps"``, as
RLlib's ``multi_agent(count_steps_by=...)``): every module's replay is credited with each env
step once, whatever number of that module's agent steps it held (a module with no steps in a
rollout carries the credit to its next insert). Every module's replay then holds the same
ratio of sampled rows per env step, so a learner that samples every module in each update is
never held by one module's limiter while the actors are held by another's.
``count_steps_by="agent_steps"`` counts each module's own rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple, Protocol

import numpy as np
import torch

from rl_dist_ext.gorila.transitions import (
    ROLLOUT_COLUMNS,
    check_finite,
    nstep_batch_with_priorities,
)
from rl_dist_ext.params import HoldsPulledWeights, WeightsPuller, WeightsSource
from rl_dist_ext.validation import check_choice, check_int


class ReplayWriter(Protocol):
    def add(self, transitions: dict[str, np.ndarray], priorities: np.ndarray | None) -> Any: ...


class CountingReplayWriter(Protocol):
    """A replay whose rate limiter can be told what an insert counts (multi-agent runs)."""

    def add(
        self,
        transitions: dict[str, np.ndarray],
        priorities: np.ndarray | None,
        *,
        count: int | None = None,
    ) -> Any: ...


COUNT_STEPS_BY = ("env_steps", "agent_steps")


class Rollout(NamedTuple):
    """What acting returns: ``ROLLOUT_COLUMNS`` -> time-major ``[T, B, ...]`` arrays."""

    columns: dict[str, np.ndarray]
    #: Mean weights version that chose the actions, when the actor did not hold the weights
    #: itself (SEED); ``None`` = the version this actor pulled.
    acting_version: float | None = None


class ModuleRollouts(NamedTuple):
    """What multi-agent acting returns: each trained module's agent steps and the env steps."""

    #: module id -> the steps of the agents it acts for, ``[T, B]`` (an agent's steps in a
    #: column or end to end, each piece ending terminated or truncated; see ``fold_nstep``).
    by_module: dict[str, Rollout]
    env_steps: int
    #: as :attr:`Rollout.acting_version` (SEED: the server's mean version), for all modules.
    acting_version: float | None = None


class ActorStepResult(NamedTuple):
    env_steps: int  # T * B of this rollout (multi-agent: env steps, not agent steps)
    weights_version: float  # the version that acted (-1: initial weights, nothing pulled yet)
    #: multi-agent: module id -> agent steps pushed to its replay in this step
    agent_steps: dict[str, int] | None = None


class ActorStep(HoldsPulledWeights):
    """Pull if due -> act -> fold -> prioritise -> push; see the module docstring.

    Args:
        replay: where transitions go (a ``DistributedReplay`` client or a ``PrioritizedReplay``).
        replays: multi-agent, instead of ``replay``: module id -> that module's replay (the
            trained modules only).
        count_steps_by: multi-agent: what the replays' rate limiters count (module docstring).
        gamma: discount of the n-step transitions.
        n_step: horizon of the n-step transitions.
        prioritized: push the local network's ``|TD|`` as initial priorities (else ``None``:
            the replay's default priority).
        weights: the parameter server (``pull_if_newer``); ``None`` for a SEED actor.
        pull_every_n_steps: this actor's env steps between weight pulls (Gorila's K).
        name: names this actor in errors.
    """

    def __init__(
        self,
        *,
        replay: ReplayWriter | None = None,
        replays: Mapping[str, CountingReplayWriter] | None = None,
        count_steps_by: Literal["env_steps", "agent_steps"] = "env_steps",
        gamma: float,
        n_step: int,
        prioritized: bool = True,
        weights: WeightsSource | None = None,
        pull_every_n_steps: int = 400,
        name: str = "actor",
    ) -> None:
        if (replay is None) == (replays is None):
            raise ValueError("ActorStep needs exactly one of replay= and replays=")
        check_choice("count_steps_by", count_steps_by, COUNT_STEPS_BY)
        self._replay = replay
        self._replays = dict(replays or {})
        self._count_env_steps = count_steps_by == "env_steps"
        self._credit = dict.fromkeys(self._replays, 0)  # env steps not yet told to a module
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
        if self._replay is None:
            raise RuntimeError(f"{self.name} has one replay per module: use push_modules()")
        steps = self._push_to(self._replay, rollout, q_values, count=None)
        return self._counted(steps, rollout.acting_version)

    def run_modules(
        self,
        *,
        act: Callable[[], ModuleRollouts],
        q_values: Mapping[str, Callable[[torch.Tensor], torch.Tensor]],
        load_weights: Callable[[Any], None],
    ) -> ActorStepResult:
        """One multi-agent actor step; ``q_values`` maps each trained module to its network."""
        self._weights.pull_if_due(load_weights)
        return self.push_modules(act(), q_values)

    def push_modules(
        self,
        rollouts: ModuleRollouts,
        q_values: Mapping[str, Callable[[torch.Tensor], torch.Tensor]],
    ) -> ActorStepResult:
        """Fold, prioritise, check and push each module's steps to that module's replay."""
        if not self._replays:
            raise RuntimeError(f"{self.name} has a single replay: use push()")
        unknown = set(rollouts.by_module) - set(self._replays)
        if unknown:
            raise ValueError(
                f"{self.name}: steps of modules {sorted(unknown)} that have no replay (trained "
                f"modules: {sorted(self._replays)})"
            )
        agent_steps = {}
        for module, replay in self._replays.items():
            if self._count_env_steps:
                self._credit[module] += rollouts.env_steps
            rollout = rollouts.by_module.get(module)
            if rollout is None or rollout.columns["rewards"].size == 0:
                agent_steps[module] = 0
                continue
            count = self._credit[module] if self._count_env_steps else None
            agent_steps[module] = self._push_to(replay, rollout, q_values[module], count=count)
            self._credit[module] = 0
        result = self._counted(rollouts.env_steps, rollouts.acting_version)
        return result._replace(agent_steps=agent_steps)

    def _push_to(
        self,
        replay: Any,
        rollout: Rollout,
        q_values: Callable[[torch.Tensor], torch.Tensor],
        *,
        count: int | None,
    ) -> int:
        """Fold, prioritise, check and add ``rollout`` to ``replay``; returns its rows."""
        missing = set(ROLLOUT_COLUMNS) - set(rollout.columns)
        if missing:
            raise ValueError(f"{self.name}: the rollout lacks columns {sorted(missing)}")
        batch = nstep_batch_with_priorities(
            **rollout.columns, gamma=self._gamma, n_step=self._n_step, q_values=q_values
        )
        check_finite(batch.transitions, source=self.name)
        priorities = batch.priorities if self._prioritized else None
        if count is None:
            replay.add(batch.transitions, priorities)
        else:
            replay.add(batch.transitions, priorities, count=count)
        return int(rollout.columns["rewards"].size)

    def _counted(self, env_steps: int, acting_version: float | None) -> ActorStepResult:
        self._weights.count(env_steps)
        self.env_steps += env_steps
        version = self.weights_version if acting_version is None else acting_version
        return ActorStepResult(env_steps, float(version))
