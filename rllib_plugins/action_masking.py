"""Action masks in RLlib: PettingZoo's ``{"observation": ..., "action_mask": ...}`` observations.

PettingZoo's classic games (tic-tac-toe, connect four, ...) give each agent a ``Dict``
observation whose ``"action_mask"`` marks the legal moves. RLlib's default DQN module cannot read
a ``Dict`` observation, and its epsilon-greedy exploration draws from every action.

- :class:`ActionMaskingDQNTorchRLModule`, GorilaDQN's default module: RLlib's DQN module over the
  flattened ``"observation"`` (an MLP encoder), whose Q-values put illegal actions at the lowest
  float, whose greedy and epsilon-greedy actions are legal ones
  (:func:`rl_dist_ext.ops.dqn.epsilon_greedy_masked`), and which behaves exactly like RLlib's on
  ``Box`` observations, except that uint8 pixels become floats in [0, 1] only at its first layer and
  84x84 frames get the Nature CNN (:mod:`rllib_plugins.pixels`). Given the masked observation
  (acting; RLlib's own DQN learner, which samples whole observations), the online and target
  Q-values are masked; given the flattened observation alone (GorilaDQN's learner, which gets the
  mask of the bootstrap observation as a replay column), they are not and the loss masks the action
  selection (``double_dqn_loss(next_action_mask=...)``). Its training forward takes gradients
  through the Q-values of the sampled observations only: the online Q-values of the next
  observations (which only select the bootstrap action) and the target Q-values are computed
  without a graph, so the backward pass runs over B rows instead of RLlib's 2B.
- :class:`RandomLegalActionRLModule`: an opponent that plays uniformly random legal moves (for
  "against a random opponent"; RLlib's example ``RandomRLModule`` ignores masks and, in
  PettingZoo's classic envs, loses every game by an illegal move).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.algorithms.dqn.default_dqn_rl_module import (
    QF_NEXT_PREDS,
    QF_PREDS,
    QF_TARGET_NEXT_PREDS,
)
from ray.rllib.algorithms.dqn.torch.default_dqn_torch_rl_module import DefaultDQNTorchRLModule
from ray.rllib.core.columns import Columns
from ray.rllib.core.models.base import ENCODER_OUT
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule

from rl_dist_ext.observations import pixel_scale
from rl_dist_ext.ops.dqn import epsilon_greedy_masked, mask_q_values, masked_argmax
from rllib_plugins.pixels import pixel_model_config, to_network_input

OBSERVATION = "observation"
ACTION_MASK = "action_mask"


def is_masked_space(space: gym.Space) -> bool:
    """Whether ``space`` is PettingZoo's masked layout: a ``Dict`` of exactly ``"observation"``
    (a ``Box``) and ``"action_mask"``."""
    return (
        isinstance(space, gym.spaces.Dict)
        and set(space.spaces) == {OBSERVATION, ACTION_MASK}
        and isinstance(space[OBSERVATION], gym.spaces.Box)
    )


def flat_observation_space(space: gym.Space) -> gym.Space:
    """The space a module's encoder sees: the flattened ``"observation"`` of a masked space
    (float32), else ``space`` itself."""
    if not is_masked_space(space):
        return space
    size = int(np.prod(space[OBSERVATION].shape))
    return gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)


def split_masked(obs: Any) -> tuple[Any, Any]:
    """``(flat observation [N, D] float32, action mask [N, A] bool)`` of a batch of masked
    observations (numpy or torch); ``(obs, None)`` for anything else."""
    if not (isinstance(obs, dict) and ACTION_MASK in obs and OBSERVATION in obs):
        return obs, None
    observation, mask = obs[OBSERVATION], obs[ACTION_MASK]
    if isinstance(observation, torch.Tensor):
        flat = observation.reshape(observation.shape[0], -1).float()
        return flat, torch.as_tensor(mask, device=flat.device).bool()
    observation = np.asarray(observation)
    flat = observation.reshape(observation.shape[0], -1).astype(np.float32, copy=False)
    return flat, np.asarray(mask).astype(bool, copy=False)


class ActionMaskingDQNTorchRLModule(DefaultDQNTorchRLModule):
    """RLlib's DQN module that honours PettingZoo action masks; see the module docstring."""

    def __init__(self, *args: Any, observation_space: gym.Space | None = None, **kwargs: Any):
        self.observation_space_with_mask = observation_space
        flat = flat_observation_space(observation_space)
        # Pixels: uint8 up to here, floats in [0, 1] from the encoder on; Nature CNN for 84x84.
        self._pixel_scale = pixel_scale(flat)
        if "model_config" in kwargs:
            kwargs["model_config"] = pixel_model_config(flat, kwargs["model_config"])
        super().__init__(*args, observation_space=flat, **kwargs)

    def _qf_forward_helper(self, batch: dict, encoder: Any, head: Any) -> dict:
        obs, mask = split_masked(batch[Columns.OBS])
        batch = {**batch, Columns.OBS: to_network_input(obs, self._pixel_scale)}
        if self.uses_dueling and self.num_atoms == 1 and Columns.STATE_IN not in batch:
            # RLlib's dueling combination; its advantage mean skips -inf entries (nanmean of
            # nan_to_num), which an unmasked head never holds (masks apply below), so a plain
            # mean gives the same Q-values in two kernels fewer per forward.
            features = encoder(batch)[ENCODER_OUT]
            advantages = head["af"](features)
            q = advantages - advantages.mean(dim=-1, keepdim=True) + head["vf"](features)
            out = {QF_PREDS: q}
        else:
            out = super()._qf_forward_helper(batch, encoder, head)
        out[QF_PREDS] = mask_q_values(out[QF_PREDS], mask)
        return out

    def train(self, mode: bool = True) -> ActionMaskingDQNTorchRLModule:
        """Set training mode only where some submodule is in the other mode: RLlib's
        ``forward_train`` calls ``train()`` before every training forward, which otherwise walks
        and re-sets every submodule of the online and target networks each gradient step."""
        if any(module.training != mode for module in self.modules()):
            super().train(mode)
        return self

    def _forward_train(self, batch: dict, **kwargs: Any) -> dict:
        """RLlib's DQN training outputs (``QF_PREDS``, ``QF_NEXT_PREDS`` with double Q,
        ``QF_TARGET_NEXT_PREDS``) with gradients through ``QF_PREDS`` only.

        RLlib's module runs the online network once over the observations and the next
        observations stacked, with gradients, so its backward pass covers 2B rows; the next
        observations' online Q-values only pick the bootstrap action (an argmax, which passes
        no gradient), so they are computed here without a graph, as are the target's.
        Distributional and stateful modules take RLlib's forward (as does an inference-only
        module, which it refuses)."""
        if self.inference_only or self.num_atoms > 1 or Columns.STATE_IN in batch:
            return super()._forward_train(batch, **kwargs)
        out = {QF_PREDS: self.compute_q_values({Columns.OBS: batch[Columns.OBS]})[QF_PREDS]}
        next_obs = {Columns.OBS: batch[Columns.NEXT_OBS]}
        with torch.no_grad():
            if self.uses_double_q:
                out[QF_NEXT_PREDS] = self.compute_q_values(next_obs)[QF_PREDS]
            out[QF_TARGET_NEXT_PREDS] = self.forward_target(next_obs)[QF_PREDS]
        return out

    def _forward_inference(self, batch: dict, **kwargs: Any) -> dict:
        _, mask = split_masked(batch[Columns.OBS])
        q = self.compute_q_values(batch)[QF_PREDS]
        return {Columns.ACTIONS: masked_argmax(q, mask)}

    def _forward_exploration(self, batch: dict, t: int, **kwargs: Any) -> dict:
        _, mask = split_masked(batch[Columns.OBS])
        q = self.compute_q_values(batch)[QF_PREDS]
        self.epsilon_schedule.update(t)
        epsilon = float(self.epsilon_schedule.get_current_value())
        return {Columns.ACTIONS: epsilon_greedy_masked(q, mask, epsilon)}


class RandomLegalActionRLModule(TorchRLModule):
    """Uniformly random legal actions (all actions without a mask); never trained: list it
    outside ``multi_agent(policies_to_train=...)``."""

    def __init__(self, *args: Any, observation_space: gym.Space | None = None, **kwargs: Any):
        super().__init__(*args, observation_space=observation_space, **kwargs)
        if not isinstance(self.action_space, gym.spaces.Discrete):
            raise ValueError(
                f"RandomLegalActionRLModule needs a Discrete action space, got {self.action_space}"
            )

    def setup(self) -> None:
        """No networks; one frozen placeholder parameter, because RLlib's torch learners build
        an optimizer for every torch module and torch refuses an empty parameter list (so this
        opponent also works with RLlib's own algorithms, e.g. DQN)."""
        self._placeholder = torch.nn.Parameter(torch.zeros(1), requires_grad=False)

    def _forward(self, batch: dict, **kwargs: Any) -> dict:
        obs, mask = split_masked(batch[Columns.OBS])
        rows = len(obs[next(iter(obs))]) if isinstance(obs, dict) else len(obs)
        q = torch.zeros(rows, int(self.action_space.n))
        return {Columns.ACTIONS: epsilon_greedy_masked(q, mask, 1.0)}

    def _forward_train(self, *args: Any, **kwargs: Any) -> dict:
        raise NotImplementedError(
            "RandomLegalActionRLModule is not trainable: leave it out of "
            "multi_agent(policies_to_train=...)"
        )
