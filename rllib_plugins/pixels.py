"""Pixel observations in RLlib: Atari and MinAtar env creators, uint8 at the module's first layer,
and the Nature CNN as the default encoder for 84x84 frames.

- :func:`pixel_env`: ``config.environment(pixel_env("ALE/Pong-v5"))`` registers (with Tune's
  registry, which every runner process reads) and names a :class:`PixelEnvCreator`:
  :func:`rl_dist_ext.pixel_envs.make_atari` (or, for ``"minatar:breakout"``,
  :func:`~rl_dist_ext.pixel_envs.make_minatar`) channels-last, as RLlib's CNN encoders take
  them; ``env_config={"train": False}`` (e.g. in ``evaluation_config``) plays whole games with
  raw scores.
- :func:`pixel_model_config`: RLlib's catalog picks ``[[16, 8, 4], [32, 4, 2], [256, 11, 1]]``
  for 84x84 inputs; GorilaDQN's module uses the Nature DQN sizes instead (32 8x8/4, 64 4x4/2,
  64 3x3/1; Mnih et al. 2015) unless ``model_config`` sets ``conv_filters``.
- :func:`to_network_input` (with ``rl_dist_ext.observations.pixel_scale``): uint8 observations
  travel and are stored as uint8 and become floats in ``[0, 1]`` only inside the module (on the
  learner, the runner or the inference server).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rl_dist_ext.observations import pixel_scale
from rl_dist_ext.pixel_envs import make_atari, make_minatar

#: Nature DQN convolutions as RLlib ``conv_filters``: [filters, kernel, stride, padding]
NATURE_CNN_FILTERS = [[32, 8, 4, "valid"], [64, 4, 2, "valid"], [64, 3, 1, "valid"]]


class PixelEnvCreator:
    """``env_config -> env``: an Atari id (``"ALE/Pong-v5"``) or ``"minatar:<game>"``; keyword
    arguments go to the env maker, ``env_config`` entries override them."""

    def __init__(self, env: str, **kwargs: Any) -> None:
        if not isinstance(env, str) or not (env.startswith("ALE/") or env.startswith("minatar:")):
            raise ValueError(
                f"env must be an ALE id ('ALE/Pong-v5') or 'minatar:<game>', got {env!r}"
            )
        self.env = env
        self.kwargs = kwargs

    def __call__(self, env_config: dict | None = None) -> gym.Env:
        settings = {**self.kwargs, **dict(env_config or {})}
        if self.env.startswith("minatar:"):
            settings.pop("train", None)  # MinAtar has no lives and no reward clipping
            return make_minatar(self.env.split(":", 1)[1], channels_last=True, **settings)
        return make_atari(self.env, channels_last=True, **settings)


def pixel_env(env: str, **kwargs: Any) -> str:
    """Register a :class:`PixelEnvCreator` for ``env`` with Tune and return its name
    (``"rl_dist_ext/<env>"``), for ``config.environment(...)``."""
    from ray.tune.registry import register_env

    creator = PixelEnvCreator(env, **kwargs)
    name = f"rl_dist_ext/{env}"
    register_env(name, creator)
    return name


def is_pixel_space(space: gym.Space) -> bool:
    """A uint8 image ``Box`` (``[H, W]`` or ``[H, W, C]``)."""
    return (
        isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) in (2, 3)
    )


def to_network_input(obs: Any, scale: float | None) -> Any:
    """A uint8 observation tensor as float32 times ``scale``; anything else unchanged."""
    if scale is not None and isinstance(obs, torch.Tensor) and obs.dtype == torch.uint8:
        return obs.float().mul_(scale)
    return obs


def pixel_model_config(space: gym.Space, model_config: Any) -> Any:
    """``model_config`` with the Nature CNN filters for 84x84 pixel observations when it sets no
    ``conv_filters`` (a dict or RLlib's ``DefaultModelConfig``; returned as given otherwise)."""
    if not (is_pixel_space(space) and tuple(space.shape[:2]) == (84, 84)):
        return model_config
    if dataclasses.is_dataclass(model_config):
        if model_config.conv_filters is None:
            return dataclasses.replace(model_config, conv_filters=NATURE_CNN_FILTERS)
        return model_config
    settings = dict(model_config or {})
    if settings.get("conv_filters") is None:
        settings["conv_filters"] = NATURE_CNN_FILTERS
    return settings


def _ppo_module_class():
    from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import (
        DefaultPPOTorchRLModule,
    )
    from ray.rllib.core.columns import Columns

    class PixelPPOTorchRLModule(DefaultPPOTorchRLModule):
        """RLlib's PPO/IMPALA actor-critic module (VTrace's default): uint8 observations become
        floats in [0, 1] at its encoder, 84x84 frames get the Nature CNN; other observations
        pass exactly as in RLlib's module."""

        def __init__(self, *args: Any, observation_space: gym.Space | None = None, **kwargs):
            self._pixel_scale = pixel_scale(observation_space)
            if "model_config" in kwargs:
                kwargs["model_config"] = pixel_model_config(
                    observation_space, kwargs["model_config"]
                )
            super().__init__(*args, observation_space=observation_space, **kwargs)

        def _scaled(self, batch: dict) -> dict:
            obs = batch.get(Columns.OBS)
            converted = to_network_input(obs, self._pixel_scale)
            return batch if converted is obs else {**batch, Columns.OBS: converted}

        def _forward(self, batch: dict, **kwargs: Any) -> dict:
            return super()._forward(self._scaled(batch), **kwargs)

        def _forward_train(self, batch: dict, **kwargs: Any) -> dict:
            return super()._forward_train(self._scaled(batch), **kwargs)

        def compute_values(self, batch: dict, embeddings: Any = None) -> Any:
            return super().compute_values(self._scaled(batch), embeddings)

    return PixelPPOTorchRLModule


#: VTrace's default module (a class made on first import of this module, so that RLlib's PPO
#: module is imported only with RLlib)
PixelPPOTorchRLModule = _ppo_module_class()
