"""Each agent's own transitions from the step stream of a turn-taking (AEC) env.

An AEC env (PettingZoo's agent-environment cycle; its Parallel envs through
``parallel_to_aec``) steps one agent at a time. A framework that records the env's steps in
order (Tianshou's ``PettingZooEnv``: each step holds the acting agent, its observation and
action mask, the action, the rewards of *every* agent after the step, and the next agent's
observation) mixes the agents' experience; an agent's transition is::

    (its observation, its action, the sum of its rewards until its next turn,
     its observation at its next turn, the legal actions there)

which is what :class:`TurnAssembler` builds, one env at a time (RLlib's ``MultiAgentEpisode``
does the same for RLlib). An agent's transition stays pending until its next turn, across calls
(rollouts). When the episode ends:

- terminated: every pending transition ends terminated (nothing is bootstrapped, so its next
  observation is a placeholder: its own observation, no legal action);
- truncated: the next agent's pending transition ends truncated at the observation the env
  reported; the other agents' pending transitions are dropped (the env did not report their
  final observations, and bootstrapping from anything else would bias the target), and counted
  in :attr:`TurnAssembler.dropped`.

Rewards an agent receives before its first action of an episode belong to no transition.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from rl_dist_ext.observations import observation_array


class AgentTransition(NamedTuple):
    """One completed transition of one agent."""

    agent: Any
    obs: np.ndarray
    action: Any
    reward: float
    next_obs: np.ndarray
    next_action_mask: np.ndarray  # [A] bool: legal actions at next_obs
    terminated: bool
    truncated: bool


@dataclass
class _Pending:
    obs: np.ndarray
    action: Any
    reward: float = 0.0


class TurnAssembler:
    """One env's step stream -> each agent's transitions; see the module docstring.

    Args:
        agents: every agent id, in the order of the env's reward vector.
    """

    def __init__(self, agents: Sequence[Any]) -> None:
        self.agents = list(agents)
        self._index = {agent: i for i, agent in enumerate(self.agents)}
        if len(self._index) != len(self.agents):
            raise ValueError(f"agent ids must be unique, got {self.agents!r}")
        self._pending: dict[Any, _Pending] = {}
        self.dropped = 0

    def step(
        self,
        *,
        agent: Any,
        obs: np.ndarray,
        action: Any,
        rewards: np.ndarray,
        terminated: bool,
        truncated: bool,
        next_agent: Any,
        next_obs: np.ndarray,
        next_action_mask: np.ndarray,
    ) -> list[AgentTransition]:
        """Record one env step (``agent`` acted ``action`` at ``obs``; ``rewards[i]`` is agent
        ``i``'s reward after it; then it is ``next_agent``'s turn at ``next_obs``, unless the
        episode ended); returns the transitions this step completed."""
        if agent not in self._index:
            raise ValueError(f"unknown agent {agent!r}; agents are {self.agents!r}")
        rewards = np.asarray(rewards, dtype=np.float64).reshape(-1)
        if rewards.shape != (len(self.agents),):
            raise ValueError(
                f"rewards must hold one value per agent ({len(self.agents)}), got shape "
                f"{rewards.shape}"
            )
        self._pending[agent] = _Pending(np.asarray(obs), action)
        for pending_agent, pending in self._pending.items():
            pending.reward += float(rewards[self._index[pending_agent]])
        next_obs = np.asarray(next_obs)
        next_action_mask = np.asarray(next_action_mask, dtype=bool)
        done: list[AgentTransition] = []
        if terminated:
            no_legal_action = np.zeros_like(next_action_mask)
            for pending_agent, pending in self._pending.items():
                # nothing is bootstrapped: the agent's own observation is a placeholder
                done.append(
                    _complete(pending_agent, pending, pending.obs, no_legal_action, terminated=True)
                )
            self._pending.clear()
        elif truncated:
            for pending_agent, pending in self._pending.items():
                if pending_agent == next_agent:
                    done.append(
                        _complete(
                            pending_agent, pending, next_obs, next_action_mask, truncated=True
                        )
                    )
                else:
                    self.dropped += 1
            self._pending.clear()
        elif next_agent in self._pending:
            pending = self._pending.pop(next_agent)
            done.append(_complete(next_agent, pending, next_obs, next_action_mask))
        return done

    def reset(self) -> None:
        """Forget pending transitions (the env was reset outside :meth:`step`)."""
        self.dropped += len(self._pending)
        self._pending.clear()


def _complete(
    agent: Any,
    pending: _Pending,
    next_obs: np.ndarray,
    next_action_mask: np.ndarray,
    *,
    terminated: bool = False,
    truncated: bool = False,
) -> AgentTransition:
    return AgentTransition(
        agent,
        pending.obs,
        pending.action,
        pending.reward,
        next_obs,
        next_action_mask,
        terminated,
        truncated,
    )


def transitions_to_rollout(transitions: Sequence[AgentTransition]) -> dict[str, np.ndarray]:
    """One agent group's transitions (each agent's in order) -> a ``[T, 1]`` rollout for
    ``fold_nstep``: every agent's run of transitions end to end, the last of each run marked
    truncated unless it ended the episode (the rollout's end bootstraps; n-step windows never
    cross from one agent's run into another's)."""
    if not transitions:
        raise ValueError("no transitions")
    by_agent: dict[Any, list[AgentTransition]] = {}
    for transition in transitions:
        by_agent.setdefault(transition.agent, []).append(transition)
    ordered: list[AgentTransition] = []
    for run in by_agent.values():
        last = run[-1]
        if not (last.terminated or last.truncated):
            run = [*run[:-1], last._replace(truncated=True)]
        ordered.extend(run)

    def column(values: list[Any], dtype: Any) -> np.ndarray:
        array = np.asarray(values, dtype=dtype)
        return array.reshape(len(values), 1, *array.shape[1:])

    return {
        "obs": observation_array(column([t.obs for t in ordered], None)),
        "actions": column([t.action for t in ordered], np.int64),
        "rewards": column([t.reward for t in ordered], np.float32),
        "next_obs": observation_array(column([t.next_obs for t in ordered], None)),
        "terminated": column([t.terminated for t in ordered], bool),
        "truncated": column([t.truncated for t in ordered], bool),
        "next_action_mask": column([t.next_action_mask for t in ordered], bool),
    }
