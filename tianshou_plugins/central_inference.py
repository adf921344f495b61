"""SEED-style central inference for Tianshou collectors (``central_inference=...``).

Espeholt et al. 2020, "SEED RL" (arXiv:1910.06591): actors only step environments; one
:class:`~rl_dist_ext.inference.InferenceServer` (on the accelerator when there is one) batches
every actor's observations and returns actions. Weights go to the server, never to the actors.

- :class:`TianshouInferencePolicy`: what the server runs: a copy of the learner's Tianshou
  policy on the server's device. ``kind="policy"`` (a ``ProbabilisticActorPolicy``, for
  :class:`~tianshou_plugins.VTrace`) samples actions and returns their log-probs, the behaviour
  log-probs V-trace needs; ``kind="q"`` (a ``DiscreteQLearningPolicy``, for
  :class:`~tianshou_plugins.GorilaDQN`) returns Q-values and greedy actions.
- :class:`ServerPolicy`: the actor's side: a Tianshou ``Policy`` whose ``forward`` asks the
  server, so the actor's own Tianshou ``Collector`` runs unchanged. The reply's log-probs and
  weights version ride in the ``policy`` field Tianshou stores with each step; with
  ``kind="q"`` the actor's own epsilon is applied locally (``add_exploration_noise``).
- :class:`~rl_dist_ext.inference.CentralInference` (re-exported here): the settings a collector
  takes to run in SEED mode, the same object RLlib's ``.central_inference(...)`` builds.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from tianshou.algorithm.algorithm_base import Policy
from tianshou.data import Batch

from rl_dist_ext.inference import CentralInference
from rl_dist_ext.observations import observation_array
from tianshou_plugins.weights import load_cpu_state_dict

Kind = Literal["policy", "q"]

__all__ = ["CentralInference", "Kind", "ServerPolicy", "TianshouInferencePolicy"]


class TianshouInferencePolicy:
    """A Tianshou policy on the inference server (see the module docstring for ``kind``)."""

    is_recurrent = False

    def __init__(self, policy: Policy, device: str, kind: Kind) -> None:
        self.device = torch.device(device)
        self.kind = kind
        self.policy = copy.deepcopy(policy).to(self.device)
        self.policy.eval()

    def __call__(self, obs: np.ndarray) -> dict[str, np.ndarray]:
        obs_t = torch.as_tensor(obs, dtype=torch.float32, device=self.device)
        with torch.no_grad():
            if self.kind == "q":
                q = self.policy.model(obs_t, state=None, info={})[0]
                return {"q_values": q.cpu().numpy(), "actions": q.argmax(-1).cpu().numpy()}
            dist = self.policy.dist_fn(self.policy.actor(obs_t, state=None, info={})[0])
            actions = dist.sample()
            return {
                "actions": actions.cpu().numpy(),
                "logp": dist.log_prob(actions).cpu().numpy(),
            }

    def set_weights(self, weights: Any) -> None:
        load_cpu_state_dict(self.policy, weights)


class TianshouPolicyFactory:
    """Picklable ``device -> TianshouInferencePolicy`` for the server actor."""

    def __init__(self, policy: Policy, kind: Kind) -> None:
        self.policy = copy.deepcopy(policy).to("cpu")
        self.kind = kind

    def __call__(self, device: str) -> TianshouInferencePolicy:
        return TianshouInferencePolicy(self.policy, device, self.kind)


class ServerPolicy(Policy):
    """An actor's policy in SEED mode: ``forward`` asks the inference server.

    Args:
        caller: an :class:`~rl_dist_ext.ray_actors.InferenceCaller` (this actor's requests).
        kind: ``"policy"`` (sampled actions with their log-probs) or ``"q"`` (greedy actions;
            ``epsilon`` makes them epsilon-greedy on the actor).
        action_space, observation_space: the env's spaces.
        epsilon: the actor's exploration rate (``kind="q"`` only).
    """

    def __init__(
        self,
        *,
        caller: Any,
        kind: Kind,
        action_space: gym.Space,
        observation_space: gym.Space | None = None,
        epsilon: float = 0.0,
    ) -> None:
        super().__init__(
            action_space=action_space,
            observation_space=observation_space,
            action_scaling=False,
            action_bound_method=None,
        )
        self.caller = caller
        self.kind = kind
        self.epsilon = float(epsilon)

    def forward(self, batch: Batch, state: Any = None) -> Batch:
        reply = self.caller.infer(observation_array(batch.obs))
        rows = len(reply.outputs["actions"])
        recorded = Batch(version=np.full(rows, reply.version, dtype=np.float64))
        if self.kind == "policy":
            recorded.logp = reply.outputs["logp"]
        return Batch(act=reply.outputs["actions"], policy=recorded)

    def q_values(self, obs: torch.Tensor) -> torch.Tensor:
        """``[N, A]`` Q-values from the server (initial priorities of ``kind="q"`` actors)."""
        reply = self.caller.infer(obs.cpu().numpy())
        return torch.as_tensor(reply.outputs["q_values"])

    def add_exploration_noise(self, act: Any, batch: Batch) -> Any:
        """The actor's epsilon over the server's greedy actions (``kind="q"``)."""
        if self.kind != "q" or self.epsilon <= 0.0:
            return act
        act = np.array(act, copy=True)
        explore = np.random.rand(len(act)) < self.epsilon
        act[explore] = np.random.randint(int(self.action_space.n), size=int(explore.sum()))
        return act
