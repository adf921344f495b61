"""Gorila actor on RLlib's ``SingleAgentEnvRunner``: own epsilon, local n-step, pushes to replay."""

from __future__ import annotations

import numpy as np
import torch
from ray.rllib.algorithms.dqn.dqn_learner import QF_PREDS
from ray.rllib.core.columns import Columns
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.utils.schedules.scheduler import Scheduler

from rl_dist_ext.exploration import apex_epsilons
from rl_dist_ext.gorila import ActorStep, Rollout
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

    The actor step is the core's (:class:`rl_dist_ext.gorila.ActorStep`); this runner supplies
    RLlib's sampling, its module's Q-values and weight loading. ``connect(replay,
    parameter_server)`` hands it the replay client and the weights server; the algorithm calls it
    at start and again after Ray restarts this runner.
    """

    def __init__(self, *, config, **kwargs) -> None:
        super().__init__(config=config, **kwargs)
        self._actor: ActorStep | None = None

    @property
    def epsilon(self) -> float:
        """This runner's Ape-X epsilon (runner indices start at 1; the local runner gets base)."""
        num = max(1, self.config.num_env_runners)
        ladder = apex_epsilons(num, self.config.epsilon_base, self.config.epsilon_alpha)
        return float(ladder[min(max(self.worker_index - 1, 0), num - 1)])

    @property
    def connected(self) -> bool:
        """Whether :meth:`connect` gave this runner its replay (and weights or server)."""
        return self._actor is not None

    @property
    def weights_version(self) -> int:
        """The version of the weights this runner pulled (-1: none yet, or SEED mode)."""
        return -1 if self._actor is None else self._actor.weights_version

    def make_module(self) -> None:
        super().make_module()
        if self.module is not None:
            # Weight syncs replace parameters only, so this per-runner schedule stays in place.
            self.module.unwrapped().epsilon_schedule = Scheduler(
                fixed_value_or_schedule=self.epsilon, framework="torch"
            )

    def connect(self, replay, parameter_server, inference_server=None) -> int:
        """Hand over the replay, the weights server and, in SEED mode, the inference server."""
        config = self.config
        central = inference_server is not None
        self._actor = ActorStep(
            replay=replay,
            gamma=config.gamma,
            n_step=config.n_step,
            prioritized=config.replay_prioritized,
            weights=None if central else parameter_server,
            pull_every_n_steps=config.weight_sync_every_n_steps,
            name=f"env runner {self.worker_index}",
        )
        if central:
            self.connect_inference_server(inference_server)
        else:
            self.pull_weights()
        return self.worker_index

    def pull_weights(self) -> bool:
        """Pull newer weights from the parameter server now; ``True`` if there were any."""
        return self._connected_actor().pull_weights(self.module.set_state)

    def collect_and_push(self, num_steps: int) -> dict:
        """One core actor step of ``num_steps`` env steps; returns RLlib metrics and counts."""
        result = self._connected_actor().run(
            act=lambda: self._act(num_steps),
            q_values=self._q_values,
            load_weights=self.module.set_state,
        )
        self.pause_inference()  # SEED mode: no requests from this runner until the next call
        return {
            "metrics": self.get_metrics(),
            "env_steps": result.env_steps,
            "weights_version": result.weights_version,
            "epsilon": self.epsilon,
            "worker_index": self.worker_index,
        }

    def _connected_actor(self) -> ActorStep:
        if self._actor is None:
            raise RuntimeError("GorilaEnvRunner.connect() must be called before acting")
        return self._actor

    def _act(self, num_steps: int) -> Rollout:
        server = self.server_module
        if server is None:
            return Rollout(episodes_to_rollout(self.sample(num_timesteps=num_steps, explore=True)))
        server.caller.take_versions_used()  # forget replies from before this sample
        episodes = self.sample(num_timesteps=num_steps, explore=True)
        used = server.caller.take_versions_used()  # the server's replies while acting
        return Rollout(episodes_to_rollout(episodes), float(np.mean(used)) if used else -1.0)

    def _q_values(self, obs: torch.Tensor) -> torch.Tensor:
        server = self.server_module
        if server is not None:  # SEED mode: the server holds the weights
            return torch.as_tensor(server.infer(obs)["q_values"])
        module = self.module
        device = next(module.parameters()).device
        return module.compute_q_values({Columns.OBS: obs.to(device)})[QF_PREDS]

    def _to_env_outputs(self, outputs, *, explore: bool) -> dict:
        """SEED mode: greedy actions from the server's Q-values, then this runner's epsilon."""
        actions = outputs["actions"]
        if explore:
            random_actions = np.random.randint(outputs["q_values"].shape[-1], size=actions.shape)
            explore_mask = np.random.random(actions.shape) < self.epsilon
            actions = np.where(explore_mask, random_actions, actions)
        return {Columns.ACTIONS: torch.as_tensor(actions)}
