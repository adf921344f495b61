"""PettingZoo envs for RLlib runners: picklable creators and acting with a module.

``register_env(name, PettingZooCreator(tictactoe_v3.env))`` works like RLlib's usual
``lambda cfg: PettingZooEnv(tictactoe_v3.env())``, but the creator pickles by reference to
PettingZoo, so it reaches env runners in other processes from anywhere (a test module, a
notebook) without being importable there. ``parallel=True`` wraps a Parallel env
(``ParallelPettingZooEnv``). ``env_config`` entries become keyword arguments of ``env_fn``
on top of ``kwargs``.

Policy mappings for ``multi_agent(policy_mapping_fn=...)`` that pickle the same way:
:class:`ShareOneModule` (parameter sharing: every agent acts with one module) and
:class:`AlternatingSeats` (a learner against a fixed opponent, swapping seats between
episodes so that it learns every seat of a turn-based game).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv, PettingZooEnv


class PettingZooCreator:
    """``env_config -> PettingZooEnv(env_fn(**kwargs, **env_config))`` (or the Parallel
    wrapper with ``parallel=True``); see the module docstring."""

    def __init__(self, env_fn: Callable[..., Any], *, parallel: bool = False, **kwargs: Any):
        self.env_fn = env_fn
        self.parallel = parallel
        self.kwargs = kwargs

    def __call__(self, env_config: dict | None = None) -> PettingZooEnv | ParallelPettingZooEnv:
        env = self.env_fn(**{**self.kwargs, **dict(env_config or {})})
        return ParallelPettingZooEnv(env) if self.parallel else PettingZooEnv(env)

    def raw(self) -> Any:
        """The PettingZoo env itself (for evaluation through its own API)."""
        return self.env_fn(**self.kwargs)


def greedy_act(module) -> Callable[[Any], int]:
    """``observation -> action`` of a module's ``forward_inference`` (one observation; masked
    observations as PettingZoo gives them)."""

    def act(observation: Any) -> int:
        if isinstance(observation, dict):
            obs = {k: torch.as_tensor(np.asarray(v)[None]) for k, v in observation.items()}
        else:
            obs = torch.as_tensor(np.asarray(observation)[None])
        with torch.no_grad():
            out = module.forward_inference({Columns.OBS: obs})
        if Columns.ACTIONS in out:
            return int(out[Columns.ACTIONS][0])
        return int(out[Columns.ACTION_DIST_INPUTS][0].argmax())

    return act


class ShareOneModule:
    """``policy_mapping_fn`` mapping every agent to ``module_id`` (parameter sharing)."""

    def __init__(self, module_id: str) -> None:
        self.module_id = module_id

    def __call__(self, agent_id: Any, episode: Any, **kwargs: Any) -> str:
        return self.module_id


class AlternatingSeats:
    """``policy_mapping_fn`` for two-seat games: in each episode one seat acts with
    ``learner`` and the other with ``opponent``, the learner's seat chosen from the episode id
    (so it plays every seat about equally often)."""

    def __init__(self, seats: Sequence[str], *, learner: str, opponent: str) -> None:
        if len(seats) != 2:
            raise ValueError(f"AlternatingSeats needs two seats, got {list(seats)!r}")
        self.seats = tuple(seats)
        self.learner = learner
        self.opponent = opponent

    def __call__(self, agent_id: Any, episode: Any, **kwargs: Any) -> str:
        if agent_id not in self.seats:
            raise ValueError(f"agent {agent_id!r} is not one of the seats {self.seats}")
        flip = zlib.crc32(str(episode.id_).encode()) % 2
        return self.learner if (self.seats.index(agent_id) + flip) % 2 == 0 else self.opponent


def against_random_opponent(
    config: Any,
    seats: Sequence[str],
    *,
    learner: str = "learner",
    opponent: str = "random",
    learner_spec: Any = None,
) -> Any:
    """``config`` (any RLlib ``AlgorithmConfig``) set up for a ``learner`` module against a
    random legal opponent in a two-seat game: RLlib's ``multi_agent(...)`` with
    :class:`AlternatingSeats` and only the learner trained, and a ``MultiRLModuleSpec`` of
    ``learner_spec`` (default: the algorithm's own module) and
    :class:`~rllib_plugins.action_masking.RandomLegalActionRLModule`."""
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from rllib_plugins.action_masking import RandomLegalActionRLModule

    return config.multi_agent(
        policies={learner, opponent},
        policy_mapping_fn=AlternatingSeats(seats, learner=learner, opponent=opponent),
        policies_to_train=[learner],
    ).rl_module(
        rl_module_spec=MultiRLModuleSpec(
            rl_module_specs={
                learner: learner_spec or RLModuleSpec(),
                opponent: RLModuleSpec(module_class=RandomLegalActionRLModule),
            }
        )
    )
