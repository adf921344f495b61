"""GorilaDQN's checks of the env's spaces and the policy mapping, on one env built in the
driver before any actor starts (RLlib's own checks come only once the runners are up)."""

from __future__ import annotations

import logging
from typing import Any

import gymnasium as gym
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

from rllib_plugins.action_masking import is_masked_space

log = logging.getLogger(__name__)


def check_env_spaces(config: Any) -> None:
    """Discrete actions and Box (or PettingZoo masked) observations, and, multi-agent, a
    mapping onto the configured modules under which agents sharing a module share their spaces:
    checked on one env before any actor starts."""
    if config.is_multi_agent:
        _check_multi_agent_spaces(config)
        return
    observation_space, action_space = config.observation_space, config.action_space
    if observation_space is None or action_space is None:
        env = _make_env(config)
        try:
            observation_space = observation_space or env.observation_space
            action_space = action_space or env.action_space
        finally:
            env.close()
    _check_module_spaces(f"env {config.env!r}", observation_space, action_space)


def _make_env(config: Any):
    _, creator = Algorithm._get_env_id_and_creator(config.env, config)
    return creator(config.env_config)


def _check_module_spaces(what: str, observation_space, action_space) -> None:
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"GorilaDQN needs a Discrete action space; {what} has {action_space}")
    if not (isinstance(observation_space, gym.spaces.Box) or is_masked_space(observation_space)):
        raise ValueError(
            f"GorilaDQN needs a Box observation space (or PettingZoo's Dict of 'observation' "
            f"and 'action_mask'); {what} has {observation_space} (wrap it, e.g. with "
            "gymnasium.wrappers.FlattenObservation)"
        )


#: Episodes the policy mapping is probed with (mappings that alternate seats by episode).
MAPPING_PROBES = 16


def _check_multi_agent_spaces(config: Any) -> None:
    env = _make_env(config)
    try:
        agents = sorted(getattr(env, "possible_agents", None) or env.agents)
        spaces = {
            agent: (env.get_observation_space(agent), env.get_action_space(agent))
            for agent in agents
        }
    finally:
        env.close()
    agents_of: dict[str, set[str]] = {}
    for _ in range(MAPPING_PROBES):
        episode = MultiAgentEpisode()
        for agent in agents:
            try:
                module = config.policy_mapping_fn(agent, episode)
            except Exception as error:
                raise ValueError(
                    f"multi_agent(policy_mapping_fn=...) failed for agent {agent!r}: "
                    f"{type(error).__name__}: {error}"
                ) from error
            if module not in config.policies:
                raise ValueError(
                    f"multi_agent(policy_mapping_fn=...) maps agent {agent!r} to {module!r}, "
                    f"which is not among the policies {sorted(config.policies)}"
                )
            agents_of.setdefault(module, set()).add(agent)
    for module in config.trained_module_ids():
        mapped = sorted(agents_of.get(module, ()))
        if not mapped:
            log.warning("trained module %r gets no agent from policy_mapping_fn", module)
            continue
        first = mapped[0]
        for agent in mapped:
            _check_module_spaces(f"agent {agent!r} (module {module!r})", *spaces[agent])
            if spaces[agent] != spaces[first]:
                raise ValueError(
                    f"agents {first!r} and {agent!r} share module {module!r} but have different "
                    f"spaces: {spaces[first]} vs {spaces[agent]}; map them to different modules"
                )
