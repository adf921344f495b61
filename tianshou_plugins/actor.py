"""One Gorila actor: Tianshou's own ``Collector`` over ``M`` envs, pushing to the shared replay.

A plain class (unit-testable without Ray); :class:`~tianshou_plugins.GorilaCollector` starts N of
them as Ray actors. Each call of :meth:`GorilaActor.collect_and_push` is one core actor step
(:class:`rl_dist_ext.gorila.ActorStep`: pull newer weights when ``weight_sync_every_n_steps`` env
steps have passed, act, fold n-step transitions, initial priorities from the local network,
push); this class supplies Tianshou's collection of ``steps_per_env`` steps from every env with
the actor's own epsilon.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tianshou.algorithm.algorithm_base import policy_within_training_step
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.data import Collector, CollectStats, VectorReplayBuffer
from tianshou.env import DummyVectorEnv

from rl_dist_ext.gorila import ActorStep, Rollout


def q_values(model: torch.nn.Module, obs: torch.Tensor) -> torch.Tensor:
    """``[N, A]`` Q-values of a Tianshou Q-network (``model(obs) -> (logits, state)``)."""
    return model(obs, state=None, info={})[0]


def cpu_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached CPU copy of ``module``'s state dict: what the actors load."""
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


class GorilaActor:
    """Acts with a local policy copy and epsilon ``epsilon``; see the module docstring.

    Args:
        policy: the learner's policy (a copy is kept, on the CPU).
        env_factory: builds one environment.
        num_envs: environments stepped by this actor (a ``DummyVectorEnv``).
        epsilon: this actor's exploration rate.
        gamma, n_step: discount and horizon of the n-step transitions.
        replay: a ``DistributedReplay`` client.
        weights_server: the parameter server (``pull_if_newer``; a
            :class:`~rl_dist_ext.ray_actors.ParameterServerClient` across processes).
        weight_sync_every_n_steps: env steps between weight pulls.
        steps_per_env: env steps per env in one :meth:`collect_and_push`.
        actor_index: this actor's number (seeds and metrics).
        seed: base seed.
    """

    def __init__(
        self,
        *,
        policy: DiscreteQLearningPolicy,
        env_factory: Callable[[], gym.Env],
        num_envs: int,
        epsilon: float,
        gamma: float,
        n_step: int,
        replay: Any,
        weights_server: Any,
        weight_sync_every_n_steps: int,
        steps_per_env: int,
        actor_index: int,
        seed: int | None = None,
    ) -> None:
        torch.set_num_threads(1)
        self.actor_index = actor_index
        self.epsilon = float(epsilon)
        self._steps_per_env = steps_per_env
        self._num_envs = num_envs
        self.policy = copy.deepcopy(policy).to("cpu")
        self.policy.set_eps_training(self.epsilon)
        self.envs = DummyVectorEnv([env_factory] * num_envs)
        if seed is not None:
            base = seed + 10_000 * actor_index
            np.random.seed(base)  # Tianshou's epsilon-greedy draws from numpy's global RNG
            torch.manual_seed(base)
            self.envs.seed([base + i for i in range(num_envs)])
        self._buffer = VectorReplayBuffer(num_envs * steps_per_env, num_envs)
        self._collector = Collector(self.policy, self.envs, self._buffer, exploration_noise=True)
        self._collector.reset()
        self._step = ActorStep(
            replay=replay,
            gamma=gamma,
            n_step=n_step,
            weights=weights_server,
            pull_every_n_steps=weight_sync_every_n_steps,
            name=f"actor {actor_index}",
        )
        self._step.pull_weights(self.policy.load_state_dict)

    @property
    def weights_version(self) -> int:
        return self._step.weights_version

    @property
    def env_steps(self) -> int:
        return self._step.env_steps

    def ready(self) -> int:
        """Answers once the constructor finished (envs built, weights pulled)."""
        return self.actor_index

    def reset_envs(self) -> tuple[np.ndarray, np.ndarray]:
        """Start new episodes in every env; return their first observations and infos."""
        return self._collector.reset_env()

    def collect_and_push(self) -> dict[str, Any]:
        """One core actor step of ``num_envs * steps_per_env`` env steps; return stats."""
        collected: list[CollectStats] = []

        def act() -> Rollout:
            self._buffer.reset()
            with policy_within_training_step(self.policy):
                collected.append(
                    self._collector.collect(n_step=self._num_envs * self._steps_per_env)
                )
            return Rollout(self._rollout())

        result = self._step.run(
            act=act,
            q_values=lambda obs: q_values(self.policy.model, obs),
            load_weights=self.policy.load_state_dict,
        )
        stats = collected[0]
        return {
            "actor_index": self.actor_index,
            "env_steps": result.env_steps,
            "episodes": int(stats.n_collected_episodes),
            "returns": np.asarray(stats.returns, dtype=float),
            "lens": np.asarray(stats.lens, dtype=int),
            "weights_version": result.weights_version,
            "epsilon": self.epsilon,
        }

    def _rollout(self) -> dict[str, np.ndarray]:
        """The collected steps as ``[T, M]`` time-major arrays (env ``j`` in column ``j``)."""
        steps = np.arange(self._steps_per_env)
        per_env = [buf[steps] for buf in self._buffer.buffers]

        def stack(name: str, dtype: Any = None) -> np.ndarray:
            return np.stack([np.asarray(b[name], dtype=dtype) for b in per_env], axis=1)

        return {
            "obs": stack("obs", np.float32),
            "actions": stack("act", np.int64),
            "rewards": stack("rew", np.float32),
            "next_obs": stack("obs_next", np.float32),
            "terminated": stack("terminated", bool),
            "truncated": stack("truncated", bool),
        }
