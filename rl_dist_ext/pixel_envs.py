"""Pixel environments with uint8 observations: Atari through ``ale-py`` and MinAtar.

Atari follows the standard preprocessing of the DQN/Ape-X papers (Mnih et al. 2015, Horgan et al.
2018): 84x84 grey frames, frame skip 4 (max over the last two), up to 30 no-ops at reset, a
4-frame stack, and for training episodic life (a lost life ends the episode) and rewards clipped
to their sign. MinAtar (Young & Tian 2019) observations are 10x10 boolean channels, given here as
uint8 0/1. Observations stay uint8: networks convert them at their first layer, dividing by the
observation space's ``high`` (255 for Atari, 1 for MinAtar); see
:mod:`rl_dist_ext.observations`.

Frames are channels-first ``[C, H, W]`` (Tianshou's Atari network, torch) unless
``channels_last=True`` (``[H, W, C]``, what RLlib's CNN encoders take).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rl_dist_ext.validation import check_choice


class ClipRewardToSign(gym.RewardWrapper):
    """Rewards become -1, 0 or +1 (training only; evaluation reports the game's score)."""

    def reward(self, reward: float) -> float:
        return float(np.sign(reward))


class FireOnReset(gym.Wrapper):
    """Press FIRE after each reset, for games that wait for it (Breakout)."""

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


class MoveChannels(gym.ObservationWrapper):
    """``[C, H, W]`` <-> ``[H, W, C]``; ``to_last`` says which way."""

    def __init__(self, env: gym.Env, *, to_last: bool) -> None:
        super().__init__(env)
        self._source, self._dest = (0, -1) if to_last else (-1, 0)
        space = env.observation_space
        self.observation_space = gym.spaces.Box(
            np.moveaxis(space.low, self._source, self._dest),
            np.moveaxis(space.high, self._source, self._dest),
            dtype=space.dtype,
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.moveaxis(observation, self._source, self._dest))


class BoolToUint8(gym.ObservationWrapper):
    """Boolean image channels as uint8 0/1 (Box high 1)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        shape = env.observation_space.shape
        self.observation_space = gym.spaces.Box(0, 1, shape=shape, dtype=np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.asarray(observation, dtype=np.uint8)


def make_atari(
    env_id: str = "ALE/Pong-v5",
    *,
    train: bool = True,
    frame_stack: int = 4,
    screen_size: int = 84,
    channels_last: bool = False,
    max_episode_steps: int | None = None,
    **make_kwargs: Any,
) -> gym.Env:
    """An Atari env with the standard preprocessing; observations ``[frame_stack, 84, 84]``
    uint8 (``[84, 84, frame_stack]`` with ``channels_last``).

    Args:
        env_id: an ALE id (``"ALE/Pong-v5"``, ``"ALE/Breakout-v5"``, ...).
        train: episodic life and sign-clipped rewards (the training env); ``False`` for the
            evaluation env, which plays whole games and reports their score.
        max_episode_steps: cut episodes after this many agent steps (``None``: the env's own
            limit).
        make_kwargs: passed to ``gymnasium.make`` (e.g. ``repeat_action_probability``).
    """
    try:
        import ale_py
    except ImportError as error:
        raise ImportError(
            "Atari envs need ale-py (its wheel ships the ROMs): pip install 'rl-dist-ext[pixels]'"
        ) from error
    gym.register_envs(ale_py)
    if not isinstance(env_id, str) or not env_id.startswith("ALE/"):
        raise ValueError(f"env_id must be an ALE id such as 'ALE/Pong-v5', got {env_id!r}")
    env = gym.make(env_id, frameskip=1, **make_kwargs)
    env = gym.wrappers.AtariPreprocessing(
        env, noop_max=30, frame_skip=4, screen_size=screen_size, terminal_on_life_loss=train
    )
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireOnReset(env)
    if train:
        env = ClipRewardToSign(env)
    env = gym.wrappers.FrameStackObservation(env, frame_stack)
    env = _as_box(env)
    if max_episode_steps is not None:
        env = gym.wrappers.TimeLimit(env, max_episode_steps)
    return MoveChannels(env, to_last=True) if channels_last else env


def make_minatar(
    game: str = "breakout",
    *,
    channels_last: bool = False,
    max_episode_steps: int | None = 10_000,
) -> gym.Env:
    """A MinAtar game (``"breakout"``, ``"asterix"``, ``"freeway"``, ``"seaquest"``,
    ``"space_invaders"``); observations ``[C, 10, 10]`` uint8 0/1 (``[10, 10, C]`` with
    ``channels_last``)."""
    try:
        import minatar.gym
    except ImportError as error:
        raise ImportError("MinAtar envs need minatar: pip install 'rl-dist-ext[pixels]'") from error
    names = {
        "asterix": "Asterix",
        "breakout": "Breakout",
        "freeway": "Freeway",
        "seaquest": "Seaquest",
        "space_invaders": "SpaceInvaders",
    }
    check_choice("game", game, sorted(names))
    env_id = f"MinAtar/{names[game]}-v1"
    if env_id not in gym.registry:
        minatar.gym.register_envs()
    env = BoolToUint8(gym.make(env_id, max_episode_steps=max_episode_steps))
    return env if channels_last else MoveChannels(env, to_last=False)


def _as_box(env: gym.Env) -> gym.Env:
    """FrameStackObservation's space is already a uint8 Box; check so a gymnasium change that
    alters it fails here, not in a network."""
    space = env.observation_space
    if not (isinstance(space, gym.spaces.Box) and space.dtype == np.uint8):
        raise TypeError(f"expected a uint8 Box observation space, got {space!r}")
    return env
