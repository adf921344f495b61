"""Gorila actor on RLlib's ``SingleAgentEnvRunner``: own epsilon, local n-step, pushes to replay."""

from __future__ import annotations

import numpy as np
import ray
import torch
from ray.rllib.algorithms.dqn.dqn_learner import QF_PREDS
from ray.rllib.core.columns import Columns
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.utils.schedules.scheduler import Scheduler

from rl_dist_ext.exploration import apex_epsilons
from rl_dist_ext.gorila import nstep_batch_with_priorities
from rllib_plugins.central_inference import CentralInferenceRunnerMixin


def episodes_to_rollout(episodes) -> dict[str, np.ndarray]:
    """RLlib episode chunks -> one time-major ``[T, 1]`` rollout for ``fold_nstep``.

    Chunks are laid end to end; a chunk that stops mid-episode is marked truncated at its last
    step, so n-step windows never cross chunks and bootstrap from the chunk's last observation.
    """
    obs, actions, rewards, next_obs, terminated, truncated = [], [], [], [], [], []
    for episode in episodes:
        steps = len(episode)
        if steps == 0:
            continue
        observations = np.asarray(episode.get_observations())
        obs.append(observations[:-1])
        next_obs.append(observations[1:])
        actions.append(np.asarray(episode.get_actions()))
        rewards.append(np.asarray(episode.get_rewards(), dtype=np.float32))
        term = np.zeros(steps, dtype=bool)
        trunc = np.zeros(steps, dtype=bool)
        if episode.is_terminated:
            term[-1] = True
        else:  # truncated by the env, or a chunk boundary: bootstrap from the last obs
            trunc[-1] = True
        terminated.append(term)
        truncated.append(trunc)
    if not obs:
        raise ValueError("no steps in the sampled episodes")

    def column(parts: list[np.ndarray]) -> np.ndarray:
        joined = np.concatenate(parts, axis=0)
        return joined.reshape(joined.shape[0], 1, *joined.shape[1:])

    return {
        "obs": column(obs).astype(np.float32, copy=False),
        "actions": column(actions),
        "rewards": column(rewards),
        "next_obs": column(next_obs).astype(np.float32, copy=False),
        "terminated": column(terminated),
        "truncated": column(truncated),
    }


class GorilaEnvRunner(CentralInferenceRunnerMixin, SingleAgentEnvRunner):
    """Acts with its own Ape-X epsilon and pushes prioritized n-step transitions to the replay.

    ``connect(replay, parameter_server)`` hands it the replay client and the weights server; the
    algorithm calls it at start and again after Ray restarts this runner.
    """

    def __init__(self, *, config, **kwargs) -> None:
        super().__init__(config=config, **kwargs)
        self._replay = None
        self._weights_server = None
        self.weights_version = -1
        self._steps_since_pull = 0

    @property
    def epsilon(self) -> float:
        """This runner's Ape-X epsilon (runner indices start at 1; the local runner gets base)."""
        num = max(1, self.config.num_env_runners)
        ladder = apex_epsilons(num, self.config.epsilon_base, self.config.epsilon_alpha)
        return float(ladder[min(max(self.worker_index - 1, 0), num - 1)])

    def make_module(self) -> None:
        super().make_module()
        if self.module is not None:
            # Weight syncs replace parameters only, so this per-runner schedule stays in place.
            self.module.epsilon_schedule = Scheduler(
                fixed_value_or_schedule=self.epsilon, framework="torch"
            )

    def connect(self, replay, parameter_server, inference_server=None) -> int:
        """Hand over the replay, the weights server and, in SEED mode, the inference server."""
        self._replay = replay
        self._weights_server = parameter_server
        if inference_server is not None:
            self.connect_inference_server(inference_server)
        else:
            self._pull_weights()
        return self.worker_index

    def collect_and_push(self, num_steps: int) -> dict:
        """Step the envs ``num_steps`` times, fold n-step, prioritise and push to the replay."""
        if self._replay is None:
            raise RuntimeError("GorilaEnvRunner.connect() must be called before acting")
        central = self._inference_server is not None
        if not central and self._steps_since_pull >= self.config.weight_sync_every_n_steps:
            self._pull_weights()
        episodes = self.sample(num_timesteps=num_steps, explore=True)
        rollout = episodes_to_rollout(episodes)
        steps = rollout["rewards"].shape[0]
        batch = nstep_batch_with_priorities(
            **rollout,
            gamma=self.config.gamma,
            n_step=self.config.n_step,
            q_values=self._q_values,
        )
        self._replay.add(
            batch.transitions, batch.priorities if self.config.replay_prioritized else None
        )
        self._steps_since_pull += steps
        if central:  # the weights that acted are the server's
            self.weights_version = int(np.mean(self._versions_used)) if self._versions_used else -1
            self._versions_used.clear()
            self.pause_inference()
        return {
            "metrics": self.get_metrics(),
            "env_steps": steps,
            "weights_version": self.weights_version,
            "epsilon": self.epsilon,
            "worker_index": self.worker_index,
        }

    def _q_values(self, obs):
        if self._inference_server is not None:  # SEED mode: the server holds the weights
            return torch.as_tensor(self._infer(obs)["q_values"])
        return self.module.compute_q_values({Columns.OBS: obs.to(self._device)})[QF_PREDS]

    def _to_env_outputs(self, outputs, *, explore: bool) -> dict:
        """SEED mode: greedy actions from the server's Q-values, then this runner's epsilon."""
        actions = outputs["actions"]
        if explore:
            random_actions = np.random.randint(outputs["q_values"].shape[-1], size=actions.shape)
            explore_mask = np.random.random(actions.shape) < self.epsilon
            actions = np.where(explore_mask, random_actions, actions)
        return {Columns.ACTIONS: torch.as_tensor(actions)}

    def _pull_weights(self) -> None:
        latest = ray.get(self._weights_server.pull_if_newer.remote(self.weights_version))
        self._steps_since_pull = 0
        if latest is None:
            return
        self.module.set_state(latest.weights)
        self.weights_version = latest.version
