"""Pixel observations in Tianshou: Q-networks that take uint8 frames and scale them at the first
layer.

:func:`pixel_q_network` picks Tianshou's own Atari network (``DQNet``, the Nature DQN CNN) for
84x84 frames and :class:`MinAtarQNet` (the MinAtar paper's network: one 3x3 convolution of 16
filters and a 128-unit layer; Young & Tian 2019) for MinAtar's 10x10 grids, both behind
Tianshou's ``ScaledObsInputActionReprNet``, which divides by the observation space's ``high``.
Envs: :func:`rl_dist_ext.pixel_envs.make_atari` and :func:`~rl_dist_ext.pixel_envs.make_minatar`
(channels-first, uint8), e.g. ``GorilaCollector(..., env_factory=partial(make_atari,
"ALE/Pong-v5"))``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tianshou.env.atari.atari_network import DQNet, ScaledObsInputActionReprNet
from tianshou.utils.net.common import ActionReprNetWithVectorOutput
from torch import nn

from rl_dist_ext.observations import pixel_scale


class MinAtarQNet(ActionReprNetWithVectorOutput[Any]):
    """``[B, C, H, W]`` -> ``[B, A]`` Q-values: conv 16 3x3/1, ReLU, linear 128, ReLU, linear."""

    def __init__(self, c: int, h: int, w: int, action_shape: Sequence[int] | int) -> None:
        num_actions = int(np.prod(action_shape))
        super().__init__(num_actions)
        self.net = nn.Sequential(
            nn.Conv2d(c, 16, kernel_size=3, stride=1),
            nn.ReLU(inplace=True),
            nn.Flatten(),
            nn.Linear(16 * (h - 2) * (w - 2), 128),
            nn.ReLU(inplace=True),
            nn.Linear(128, num_actions),
        )

    def forward(self, obs: Any, state: Any = None, info: Any = None) -> tuple[torch.Tensor, Any]:
        device = next(self.parameters()).device
        return self.net(torch.as_tensor(obs, device=device, dtype=torch.float32)), state


def pixel_q_network(
    observation_space: gym.Space, action_space: gym.Space
) -> ScaledObsInputActionReprNet:
    """The Q-network for a uint8 ``[C, H, W]`` observation space: ``DQNet`` for images of at
    least 36x36 (the Nature CNN's smallest input), :class:`MinAtarQNet` below that."""
    if not (
        isinstance(observation_space, gym.spaces.Box)
        and observation_space.dtype == np.uint8
        and len(observation_space.shape) == 3
    ):
        raise ValueError(
            "pixel_q_network needs a uint8 Box observation space of shape [C, H, W] "
            f"(rl_dist_ext.pixel_envs makes them), got {observation_space!r}"
        )
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"pixel_q_network needs a Discrete action space, got {action_space!r}")
    c, h, w = observation_space.shape
    actions = int(action_space.n)
    net = DQNet(c, h, w, actions) if min(h, w) >= 36 else MinAtarQNet(c, h, w, actions)
    return ScaledObsInputActionReprNet(net, denom=1.0 / pixel_scale(observation_space))
