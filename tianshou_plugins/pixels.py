"""Pixel observations in Tianshou: networks that take uint8 frames and scale them at the first
layer.

:func:`pixel_q_network` (GorilaDQN) and :func:`pixel_actor_critic` (VTrace) pick Tianshou's own
Atari network (``DQNet``, the Nature DQN CNN) for 84x84 frames and :class:`MinAtarNet` (the
MinAtar paper's network: one 3x3 convolution of 16 filters and a 128-unit layer; Young & Tian
2019) for MinAtar's 10x10 grids, both behind Tianshou's ``ScaledObsInputActionReprNet``, which
divides by the observation space's ``high``. The actor and the critic share one such trunk, as
in Tianshou's Atari PPO example (and IMPALA's network).
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
from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic
from torch import nn

from rl_dist_ext.observations import pixel_scale

#: the MinAtar network's hidden layer; the Nature CNN's (DQN and IMPALA) is 512
MINATAR_HIDDEN = 128
NATURE_HIDDEN = 512
#: the smallest frame the Nature CNN's three convolutions take
NATURE_MIN_SIZE = 36


class MinAtarNet(ActionReprNetWithVectorOutput[Any]):
    """``[B, C, H, W]`` -> ``[B, A]`` Q-values: conv 16 3x3/1, ReLU, linear 128, ReLU, linear;
    with ``features_only`` the 128 features (for an actor's and a critic's heads)."""

    def __init__(
        self,
        c: int,
        h: int,
        w: int,
        action_shape: Sequence[int] | int = 0,
        features_only: bool = False,
    ) -> None:
        layers = [
            nn.Conv2d(c, 16, kernel_size=3, stride=1),
            nn.ReLU(inplace=True),
            nn.Flatten(),
            nn.Linear(16 * (h - 2) * (w - 2), MINATAR_HIDDEN),
            nn.ReLU(inplace=True),
        ]
        output_dim = MINATAR_HIDDEN
        if not features_only:
            output_dim = int(np.prod(action_shape))
            layers.append(nn.Linear(MINATAR_HIDDEN, output_dim))
        super().__init__(output_dim)
        self.net = nn.Sequential(*layers)

    def forward(self, obs: Any, state: Any = None, info: Any = None) -> tuple[torch.Tensor, Any]:
        device = next(self.parameters()).device
        return self.net(torch.as_tensor(obs, device=device, dtype=torch.float32)), state


def pixel_q_network(
    observation_space: gym.Space, action_space: gym.Space
) -> ScaledObsInputActionReprNet:
    """The Q-network for a uint8 ``[C, H, W]`` observation space: ``DQNet`` for images of at
    least 36x36 (the Nature CNN's smallest input), :class:`MinAtarNet` below that."""
    c, h, w, actions = _pixel_shapes("pixel_q_network", observation_space, action_space)
    small = min(h, w) < NATURE_MIN_SIZE
    net = MinAtarNet(c, h, w, actions) if small else DQNet(c, h, w, actions)
    return ScaledObsInputActionReprNet(net, denom=1.0 / pixel_scale(observation_space))


def pixel_actor_critic(
    observation_space: gym.Space, action_space: gym.Space
) -> tuple[DiscreteActor, DiscreteCritic]:
    """A discrete actor (logits: pair it with ``categorical_from_logits``) and a critic on one
    shared trunk for a uint8 ``[C, H, W]`` observation space: the Nature CNN and a 512-unit
    layer for images of at least 36x36, :class:`MinAtarNet`'s 128 features below that. Give
    ``VTrace`` one optimizer over both (it takes them so): the shared trunk gets both losses."""
    c, h, w, actions = _pixel_shapes("pixel_actor_critic", observation_space, action_space)
    if min(h, w) < NATURE_MIN_SIZE:
        trunk = MinAtarNet(c, h, w, features_only=True)
    else:
        trunk = DQNet(c, h, w, actions, features_only=True, output_dim_added_layer=NATURE_HIDDEN)
    shared = ScaledObsInputActionReprNet(trunk, denom=1.0 / pixel_scale(observation_space))
    actor = DiscreteActor(preprocess_net=shared, action_shape=actions, softmax_output=False)
    return actor, DiscreteCritic(preprocess_net=shared)


def _pixel_shapes(
    name: str, observation_space: gym.Space, action_space: gym.Space
) -> tuple[int, int, int, int]:
    """``(C, H, W, number of actions)``, after checking both spaces (``name``: the caller)."""
    if not (
        isinstance(observation_space, gym.spaces.Box)
        and observation_space.dtype == np.uint8
        and len(observation_space.shape) == 3
    ):
        raise ValueError(
            f"{name} needs a uint8 Box observation space of shape [C, H, W] "
            f"(rl_dist_ext.pixel_envs makes them), got {observation_space!r}"
        )
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"{name} needs a Discrete action space, got {action_space!r}")
    c, h, w = observation_space.shape
    return c, h, w, int(action_space.n)
