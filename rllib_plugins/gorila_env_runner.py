"""Gorila actors on RLlib's env runners: own epsilon, local n-step, pushes to replay.

:class:`GorilaEnvRunner` (a ``SingleAgentEnvRunner``) and :class:`GorilaMultiAgentEnvRunner` (a
``MultiAgentEnvRunner``: PettingZoo envs through RLlib's wrappers, RLlib's own
``multi_agent(policies=..., policy_mapping_fn=..., policies_to_train=...)``) run the core actor
step (:class:`rl_dist_ext.gorila.ActorStep`). The multi-agent runner folds each agent's steps
with the agent's own terminations and truncations (RLlib's per-agent episodes), groups them by
the module the agent maps to, and pushes each trained module's transitions to that module's
replay; untrained modules (a fixed or random opponent) act but push nothing.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import torch
from ray.rllib.algorithms.dqn.dqn_learner import QF_PREDS
from ray.rllib.core.columns import Columns
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.utils.schedules.scheduler import Scheduler

from rl_dist_ext.exploration import apex_epsilons
from rl_dist_ext.gorila import NEXT_ACTION_MASK, ActorStep, ModuleRollouts, Rollout
from rl_dist_ext.observations import observation_array
from rl_dist_ext.ops.dqn import epsilon_greedy_masked
from rllib_plugins.action_masking import split_masked
from rllib_plugins.central_inference import CentralInferenceRunnerMixin


def episodes_to_rollout(episodes) -> dict[str, np.ndarray]:
    """RLlib (single-agent) episode chunks -> one time-major ``[T, 1]`` rollout for
    ``fold_nstep``.

    Chunks are laid end to end; a chunk that stops mid-episode is marked truncated at its last
    step, so n-step windows never cross chunks and bootstrap from the chunk's last observation.
    Masked observations (``{"observation", "action_mask"}``) become the flattened observation
    and a ``next_action_mask`` column (the legal actions at each next observation).
    """
    obs, actions, rewards, next_obs, terminated, truncated, masks = [], [], [], [], [], [], []
    for episode in episodes:
        steps = len(episode)
        if steps == 0:
            continue
        observations, mask = split_masked(episode.get_observations())
        observations = np.asarray(observations)
        obs.append(observations[:-1])
        next_obs.append(observations[1:])
        if mask is not None:
            masks.append(mask[1:])
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

    rollout = {
        "obs": observation_array(column(obs)),
        "actions": column(actions),
        "rewards": column(rewards),
        "next_obs": observation_array(column(next_obs)),
        "terminated": column(terminated),
        "truncated": column(truncated),
    }
    if masks:
        rollout[NEXT_ACTION_MASK] = column(masks)
    return rollout


def multi_agent_episodes_to_rollouts(
    episodes, modules: set[str]
) -> dict[str, dict[str, np.ndarray]]:
    """RLlib multi-agent episode chunks -> module id -> its agents' ``[T, 1]`` rollout.

    Each agent's piece of a chunk is its own episode (its observations, its actions, the
    rewards RLlib credited to it, its own termination or truncation), laid end to end with the
    other pieces of agents that map to the same module, as :func:`episodes_to_rollout` does. An
    agent's action whose next observation has not come yet stays in RLlib's episode and is
    folded with the next chunk. Only agents mapped to ``modules`` are kept.
    """
    pieces: dict[str, list] = defaultdict(list)
    for episode in episodes:
        for agent_id, agent_episode in episode.agent_episodes.items():
            module = episode.module_for(agent_id)
            if module in modules and len(agent_episode) > 0:
                pieces[module].append(agent_episode)
    return {module: episodes_to_rollout(parts) for module, parts in pieces.items()}


class GorilaRunnerMixin:
    """What both Gorila runners share: the Ape-X epsilon, ``connect``, weight pulls and
    ``collect_and_push``; each runner class says how it acts and what its modules are."""

    _actor: ActorStep | None = None

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

    def _set_epsilon(self, module) -> None:
        # Weight syncs replace parameters only, so this per-runner schedule stays in place.
        module.unwrapped().epsilon_schedule = Scheduler(
            fixed_value_or_schedule=self.epsilon, framework="torch"
        )

    def connect(self, replay, parameter_server, inference_server=None) -> int:
        """Hand over the replay (multi-agent: module id -> replay), the weights server and, in
        SEED mode, the inference server."""
        config = self.config
        central = inference_server is not None
        self._actor = ActorStep(
            **self._replay_arguments(replay),
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
        result = self._run_actor_step(self._connected_actor(), num_steps)
        self.pause_inference()  # SEED mode: no requests from this runner until the next call
        return {
            "metrics": self.get_metrics(),
            "env_steps": result.env_steps,
            "agent_steps": result.agent_steps,
            "weights_version": result.weights_version,
            "epsilon": self.epsilon,
            "worker_index": self.worker_index,
        }

    def _connected_actor(self) -> ActorStep:
        if self._actor is None:
            raise RuntimeError(f"{type(self).__name__}.connect() must be called before acting")
        return self._actor

    def _sample_with_versions(self, num_steps: int) -> tuple[list, float | None]:
        """RLlib's sampling; in SEED mode also the mean version of the server's replies."""
        caller = self.inference_caller
        if caller is None:
            return self.sample(num_timesteps=num_steps, explore=True), None
        caller.take_versions_used()  # forget replies from before this sample
        episodes = self.sample(num_timesteps=num_steps, explore=True)
        used = caller.take_versions_used()  # the server's replies while acting
        return episodes, float(np.mean(used)) if used else -1.0

    def _q_values_of(self, module_id: str, module):
        """``[N, obs] -> [N, A]``: the module's, or in SEED mode the server's Q-values."""
        caller = self.inference_caller
        if caller is None:
            return q_values_of(module)
        return lambda obs: torch.as_tensor(caller.infer(obs, module_id).outputs["q_values"])

    def _to_env_outputs(self, outputs, *, explore: bool, action_mask=None) -> dict:
        """SEED mode: greedy (legal) actions from the server's Q-values, then this runner's
        epsilon (the server sees the flattened observation only; masks apply here)."""
        q = torch.as_tensor(outputs["q_values"])
        mask = None if action_mask is None else torch.as_tensor(action_mask)
        actions = epsilon_greedy_masked(q, mask, self.epsilon if explore else 0.0)
        return {Columns.ACTIONS: actions}


def q_values_of(module):
    """``[N, obs] -> [N, A]`` Q-values of an RLlib DQN module (on the module's device)."""

    def q_values(obs: torch.Tensor) -> torch.Tensor:
        device = next(module.parameters()).device
        return module.compute_q_values({Columns.OBS: obs.to(device)})[QF_PREDS]

    return q_values


class GorilaEnvRunner(GorilaRunnerMixin, CentralInferenceRunnerMixin, SingleAgentEnvRunner):
    """Acts with its own Ape-X epsilon and pushes prioritized n-step transitions to the replay.

    The actor step is the core's (:class:`rl_dist_ext.gorila.ActorStep`); this runner supplies
    RLlib's sampling, its module's Q-values and weight loading. ``connect(replay,
    parameter_server)`` hands it the replay client and the weights server; the algorithm calls it
    at start and again after Ray restarts this runner.
    """

    def make_module(self) -> None:
        super().make_module()
        if self.module is not None:
            self._set_epsilon(self.module)

    def _replay_arguments(self, replay) -> dict[str, Any]:
        return {"replay": replay}

    def _run_actor_step(self, actor: ActorStep, num_steps: int):
        return actor.run(
            act=lambda: self._act(num_steps),
            q_values=self._q_values,
            load_weights=self.module.set_state,
        )

    def _act(self, num_steps: int) -> Rollout:
        episodes, version = self._sample_with_versions(num_steps)
        return Rollout(episodes_to_rollout(episodes), version)

    def _q_values(self, obs: torch.Tensor) -> torch.Tensor:
        return self._q_values_of("", self.module)(obs)


class GorilaMultiAgentEnvRunner(
    GorilaRunnerMixin, CentralInferenceRunnerMixin, MultiAgentEnvRunner
):
    """The multi-agent Gorila actor (see the module docstring): every trained module explores
    with this runner's Ape-X epsilon, and each one's folded, prioritized transitions go to its
    own replay. ``connect(replays, parameter_server)`` takes module id -> replay. In SEED mode
    the server holds every trained module and the untrained ones act here."""

    def _server_module_ids(self) -> list[str]:
        return self.config.trained_module_ids()

    def make_module(self) -> None:
        super().make_module()
        if self.module is not None:
            for module_id in self.config.trained_module_ids():
                self._set_epsilon(self.module[module_id])

    def _replay_arguments(self, replays) -> dict[str, Any]:
        return {"replays": replays, "count_steps_by": self.config.count_steps_by}

    def _run_actor_step(self, actor: ActorStep, num_steps: int):
        trained = self.config.trained_module_ids()
        return actor.run_modules(
            act=lambda: self._act(num_steps, trained),
            q_values={m: self._q_values_of(m, self.module[m]) for m in trained},
            load_weights=self.module.set_state,
        )

    def _act(self, num_steps: int, trained: set[str]) -> ModuleRollouts:
        episodes, version = self._sample_with_versions(num_steps)
        rollouts = multi_agent_episodes_to_rollouts(episodes, trained)
        return ModuleRollouts(
            {m: Rollout(columns) for m, columns in rollouts.items()},
            env_steps=sum(len(e) for e in episodes),
            acting_version=version,
        )
