"""Win rates in turn-based games against a uniformly random legal opponent.

Framework-free: any PettingZoo AEC env (``agent_iter``, ``last``, ``step``, ``reset``, and
observations ``{"observation": ..., "action_mask": ...}``, the layout of PettingZoo's classic
games) is driven through its own API, and the player under test is a callable
``act(observation) -> action``, so the RLlib and Tianshou adapters, the tests, the examples and
the benchmarks measure with the same games.

The player takes every seat in turn (game ``i`` in seat ``i % num_seats``), so a win rate is
not the first mover's advantage. Reference: in tic-tac-toe a random player wins about 58 % of
its games as the first mover and 29 % as the second (44 % over both seats).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np


class GameResults(NamedTuple):
    win_rate: float
    draw_rate: float
    loss_rate: float
    games: int


def random_legal_action(observation: Any, rng: np.random.Generator) -> int:
    """A uniformly random legal action of a masked observation."""
    legal = np.flatnonzero(np.asarray(observation["action_mask"]))
    return int(rng.choice(legal))


def play_against_random(
    env_fn: Callable[[], Any],
    act: Callable[[Any], int],
    *,
    games: int,
    seed: int = 0,
    seats: Sequence[str] | None = None,
) -> GameResults:
    """``act``'s results over ``games`` games against random legal moves (see the module doc).

    A game is won when the player's total reward is positive, lost when negative, drawn at 0
    (PettingZoo's classic games pay +1 / -1 / 0). ``seats``: the seats the player takes in
    turn (default: every seat of the env), e.g. ``["player_2"]`` for a player trained in one.
    """
    rng = np.random.default_rng(seed)
    env = env_fn()
    wins = draws = losses = 0
    try:
        for game in range(games):
            env.reset(seed=seed + game)
            turns = list(seats or env.possible_agents)
            player = turns[game % len(turns)]
            total = 0.0
            for agent in env.agent_iter():
                observation, reward, terminated, truncated, _ = env.last()
                if agent == player:
                    total += float(reward)
                if terminated or truncated:
                    env.step(None)
                    continue
                if agent == player:
                    env.step(int(act(observation)))
                else:
                    env.step(random_legal_action(observation, rng))
            wins += total > 0
            draws += total == 0
            losses += total < 0
    finally:
        env.close()
    return GameResults(wins / games, draws / games, losses / games, games)


def team_return(
    env_fn: Callable[[], Any],
    act: Callable[[Any, Any], int],
    *,
    episodes: int,
    seed: int = 0,
) -> float:
    """Mean over ``episodes`` of the summed return of every agent of a PettingZoo Parallel env
    whose agents all act with ``act(agent, observation)`` (a cooperative team)."""
    env = env_fn()
    totals = []
    try:
        for episode in range(episodes):
            observations, _ = env.reset(seed=seed + episode)
            total = 0.0
            while env.agents:
                actions = {agent: int(act(agent, observations[agent])) for agent in env.agents}
                observations, rewards, _, _, _ = env.step(actions)
                total += float(sum(rewards.values()))
            totals.append(total)
    finally:
        env.close()
    return float(np.mean(totals))
