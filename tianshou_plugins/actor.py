"""The acting processes: ``M`` envs and a local policy copy (or a SEED server) each.

Plain classes (unit-testable without Ray); the collectors start N of them as Ray actors.
:class:`EnvActor` is what they share (envs, seeds, a ``[T, M]`` rollout). Each call of
:meth:`GorilaActor.collect_and_push` is one Gorila actor step
(:class:`rl_dist_ext.gorila.ActorStep`: pull newer weights when ``weight_sync_every_n_steps`` env
steps have passed, act with the actor's own epsilon, fold n-step transitions, initial priorities
from the local network, push to the shared replay); each call of
:meth:`VTraceActor.collect_trajectory` is one IMPALA actor step
(:class:`rl_dist_ext.impala.TrajectoryActorStep`: pull if due, act, record the behaviour
log-probs, return the trajectory).
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tianshou.algorithm.algorithm_base import Policy, policy_within_training_step
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.modelfree.reinforce import ProbabilisticActorPolicy
from tianshou.data import Collector, VectorReplayBuffer
from tianshou.utils.torch_utils import torch_train_mode

from rl_dist_ext.gorila import ActorStep, ModuleRollouts, Rollout
from rl_dist_ext.gorila.turns import TurnAssembler, transitions_to_rollout
from rl_dist_ext.impala import TrajectoryActorStep
from rl_dist_ext.observations import observation_array
from rl_dist_ext.ray_actors import InferenceCaller
from tianshou_plugins.central_inference import Kind, ServerPolicy
from tianshou_plugins.vector_envs import make_vector_env
from tianshou_plugins.weights import load_cpu_state_dict


def q_values(model: torch.nn.Module, obs: torch.Tensor) -> torch.Tensor:
    """``[N, A]`` Q-values of a Tianshou Q-network (``model(obs) -> (logits, state)``)."""
    return model(obs, state=None, info={})[0]


class EnvActor:
    """Tianshou's own ``Collector`` over ``num_envs`` envs with a local copy of ``policy``, or,
    in SEED mode (``inference_server`` given), a :class:`~tianshou_plugins.central_inference.
    ServerPolicy` that asks the server and holds no weights.

    What every actor kind shares: the envs (one vector env, seeded per actor, stepped as
    ``env_stepping`` says: ``tianshou_plugins.vector_envs``), the acting policy, and
    :meth:`collect_rollout`, which steps every env ``steps_per_env`` times and returns the steps
    as time-major ``[T, M]`` arrays, with what the server replied in SEED mode.
    """

    def __init__(
        self,
        *,
        policy: Policy,
        env_factory: Callable[[], gym.Env],
        num_envs: int,
        steps_per_env: int,
        actor_index: int,
        seed: int | None = None,
        env_stepping: str = "sequential",
        inference_server: Any = None,
        server_kind: Kind = "policy",
        epsilon: float = 0.0,
    ) -> None:
        torch.set_num_threads(1)
        self.actor_index = actor_index
        self._steps_per_env = steps_per_env
        self._num_envs = num_envs
        self.server: InferenceCaller | None = None
        if inference_server is None:
            self.policy: Policy = copy.deepcopy(policy).to("cpu")
        else:
            self.server = InferenceCaller(inference_server, f"actor-{actor_index}")
            self.server.register()
            self.policy = ServerPolicy(
                caller=self.server,
                kind=server_kind,
                action_space=policy.action_space,
                observation_space=policy.observation_space,
                epsilon=epsilon,
            )
        self.envs = make_vector_env(env_factory, num_envs, env_stepping)
        if seed is not None:
            base = seed + 10_000 * actor_index
            np.random.seed(base)  # Tianshou's epsilon-greedy draws from numpy's global RNG
            torch.manual_seed(base)
            self.envs.seed([base + i for i in range(num_envs)])
        self._buffer = VectorReplayBuffer(num_envs * steps_per_env, num_envs)
        self._collector = Collector(self.policy, self.envs, self._buffer, exploration_noise=True)
        self._obs = self._collector.reset()[0]  # each env's current observation
        # Each env's episode so far (episodes span rollouts; Tianshou's own episode lengths
        # count only what the rollout buffer still holds).
        self._episode_return = np.zeros(num_envs)
        self._episode_len = np.zeros(num_envs, dtype=int)

    def ready(self) -> int:
        """Answers once the constructor finished (envs built, weights pulled)."""
        return self.actor_index

    def reset_envs(self) -> tuple[np.ndarray, np.ndarray]:
        """Start new episodes in every env; return their first observations and infos."""
        self._episode_return[:] = 0.0
        self._episode_len[:] = 0
        self._obs, info = self._collector.reset_env()
        return self._obs, info

    def collect_rollout(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Step every env ``steps_per_env`` times (the policy in its training mode): the steps
        as ``[T, M]`` arrays (env ``j`` in column ``j``), and in SEED mode what the server
        replied for each step (``"version"``, and ``"logp"`` for ``kind="policy"``; else
        empty). The server is then told this actor is idle until its next request."""
        per_env = self._collect_per_env()

        def stack(name: str, dtype: Any = None) -> np.ndarray:
            return np.stack([np.asarray(b[name], dtype=dtype) for b in per_env], axis=1)

        columns = {
            "obs": observation_array(stack("obs")),
            "actions": stack("act"),
            "rewards": stack("rew", np.float32),
            "next_obs": observation_array(stack("obs_next")),
            "terminated": stack("terminated", bool),
            "truncated": stack("truncated", bool),
        }
        if self.server is None:
            return columns, {}
        self.server.idle()
        recorded = {"version": np.stack([b.policy.version for b in per_env], axis=1)}
        if "logp" in per_env[0].policy.get_keys():
            recorded["logp"] = np.stack([b.policy.logp for b in per_env], axis=1)
        return columns, recorded

    def _collect_per_env(self) -> list[Any]:
        """Step every env ``steps_per_env`` times; each env's steps as a Tianshou batch."""
        self._buffer.reset()
        with policy_within_training_step(self.policy):
            self._collector.collect(n_step=self._num_envs * self._steps_per_env)
        steps = np.arange(self._steps_per_env)
        return [buf[steps] for buf in self._buffer.buffers]

    def episode_stats(self, columns: dict[str, np.ndarray]) -> dict[str, Any]:
        """The episodes that ended in this rollout, with their whole return and length."""
        returns, lens = [], []
        done = columns["terminated"] | columns["truncated"]
        for t in range(done.shape[0]):
            self._episode_return += columns["rewards"][t]
            self._episode_len += 1
            for j in np.flatnonzero(done[t]):
                returns.append(self._episode_return[j])
                lens.append(self._episode_len[j])
                self._episode_return[j] = 0.0
                self._episode_len[j] = 0
        return {
            "actor_index": self.actor_index,
            "episodes": len(lens),
            "returns": np.asarray(returns, dtype=float),
            "lens": np.asarray(lens, dtype=int),
        }


class GorilaActor(EnvActor):
    """Acts with a local policy copy and epsilon ``epsilon``; see the module docstring.

    Args:
        policy: the learner's policy (a copy is kept, on the CPU).
        env_factory: builds one environment.
        num_envs: environments stepped by this actor (one vector env).
        epsilon: this actor's exploration rate.
        gamma, n_step: discount and horizon of the n-step transitions.
        replay: a ``DistributedReplay`` client.
        weights_server: the parameter server (``pull_if_newer``; a
            :class:`~rl_dist_ext.ray_actors.ParameterServerClient` across processes).
        weight_sync_every_n_steps: env steps between weight pulls.
        steps_per_env: env steps per env in one :meth:`collect_and_push`.
        actor_index: this actor's number (seeds and metrics).
        seed: base seed.
        inference_server: SEED mode: the server's greedy actions (this actor's epsilon on top)
            and its Q-values for the initial priorities; no weights are pulled.
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
        env_stepping: str = "sequential",
        inference_server: Any = None,
    ) -> None:
        super().__init__(
            policy=policy,
            env_factory=env_factory,
            num_envs=num_envs,
            steps_per_env=steps_per_env,
            actor_index=actor_index,
            seed=seed,
            env_stepping=env_stepping,
            inference_server=inference_server,
            server_kind="q",
            epsilon=epsilon,
        )
        self.epsilon = float(epsilon)
        if self.server is None:
            self.policy.set_eps_training(self.epsilon)
        self._step = ActorStep(
            replay=replay,
            gamma=gamma,
            n_step=n_step,
            weights=weights_server if self.server is None else None,
            pull_every_n_steps=weight_sync_every_n_steps,
            name=f"actor {actor_index}",
        )
        self._step.pull_weights(functools.partial(load_cpu_state_dict, self.policy))

    @property
    def weights_version(self) -> int:
        return self._step.weights_version

    @property
    def env_steps(self) -> int:
        return self._step.env_steps

    def collect_and_push(self) -> dict[str, Any]:
        """One core actor step of ``num_envs * steps_per_env`` env steps; return stats."""
        episodes: list[dict[str, Any]] = []

        def act() -> Rollout:
            columns, recorded = self.collect_rollout()
            episodes.append(self.episode_stats(columns))
            columns["actions"] = columns["actions"].astype(np.int64)
            return Rollout(columns, acting_version_of(recorded))

        result = self._step.run(
            act=act,
            q_values=self._q_values,
            load_weights=functools.partial(load_cpu_state_dict, self.policy),
        )
        return {
            **episodes[0],
            "env_steps": result.env_steps,
            "weights_version": result.weights_version,
            "epsilon": self.epsilon,
        }

    def _q_values(self, obs: torch.Tensor) -> torch.Tensor:
        if isinstance(self.policy, ServerPolicy):  # SEED mode: the server holds the weights
            return self.policy.q_values(obs)
        return q_values(self.policy.model, obs)


class MultiAgentGorilaActor(EnvActor):
    """A Gorila actor over PettingZoo envs (``tianshou.env.PettingZooEnv``): Tianshou's
    collector runs the multi-agent policy (every learning agent's policy with this actor's
    epsilon, masks honoured), each env's turns become each agent's own transitions
    (:class:`rl_dist_ext.gorila.turns.TurnAssembler`, pending ones carried to the next
    rollout), and each learning module's transitions are folded, prioritised and pushed to its
    replay (:meth:`rl_dist_ext.gorila.ActorStep.push_modules`; the rate limiters count env
    steps). See :class:`GorilaActor` for the shared arguments.

    Args:
        replays: module -> its replay client.
        module_of_agent: learning agent -> its module (agents not in it push nothing).
        agents: every agent id, in the env's reward order.
    """

    def __init__(
        self,
        *,
        policy: Policy,
        env_factory: Callable[[], Any],
        num_envs: int,
        epsilon: float,
        gamma: float,
        n_step: int,
        replays: dict[str, Any],
        module_of_agent: dict[str, str],
        agents: list[str],
        weights_server: Any,
        weight_sync_every_n_steps: int,
        steps_per_env: int,
        actor_index: int,
        seed: int | None = None,
        env_stepping: str = "sequential",
    ) -> None:
        super().__init__(
            policy=policy,
            env_factory=env_factory,
            num_envs=num_envs,
            steps_per_env=steps_per_env,
            actor_index=actor_index,
            seed=seed,
            env_stepping=env_stepping,
        )
        # Tianshou's collector summarises each rollout's per-agent returns (unused here) with
        # a warning per call about their 2-d shape.
        logging.getLogger("tianshou.data.stats").setLevel(logging.ERROR)
        self.epsilon = float(epsilon)
        self._module_of_agent = dict(module_of_agent)
        self._agents = list(agents)
        for agent in self._module_of_agent:
            self.policy.policies[agent].set_eps_training(self.epsilon)
        self._turns = [TurnAssembler(self._agents) for _ in range(num_envs)]
        self._dropped_reported = 0  # of the assemblers' drops, what earlier rollouts reported
        self._agent_returns = np.zeros((num_envs, len(self._agents)))
        self._episode_len = np.zeros(num_envs, dtype=int)
        self._step = ActorStep(
            replays=replays,
            gamma=gamma,
            n_step=n_step,
            weights=weights_server,
            pull_every_n_steps=weight_sync_every_n_steps,
            name=f"actor {actor_index}",
        )
        self._step.pull_weights(functools.partial(load_cpu_state_dict, self.policy))

    @property
    def weights_version(self) -> int:
        return self._step.weights_version

    def reset_envs(self) -> tuple[np.ndarray, np.ndarray]:
        for turns in self._turns:
            turns.reset()
        self._agent_returns[:] = 0.0
        return super().reset_envs()

    def collect_and_push(self) -> dict[str, Any]:
        """One core actor step of ``num_envs * steps_per_env`` env steps (agent turns)."""
        stats: dict[str, Any] = {}

        def act() -> ModuleRollouts:
            per_env = self._collect_per_env()
            transitions: dict[str, list] = {}
            returns, lens = [], []
            for env, steps in enumerate(per_env):
                for t in range(len(steps)):
                    step = steps[t]
                    rewards = np.asarray(step.rew, dtype=np.float64).reshape(-1)
                    self._agent_returns[env] += rewards
                    self._episode_len[env] += 1
                    done = bool(step.terminated) or bool(step.truncated)
                    for transition in self._turns[env].step(
                        agent=step.obs.agent_id,
                        obs=step.obs.obs,
                        action=int(step.act),
                        rewards=rewards,
                        terminated=bool(step.terminated),
                        truncated=bool(step.truncated) and not bool(step.terminated),
                        next_agent=step.obs_next.agent_id,
                        next_obs=step.obs_next.obs,
                        next_action_mask=step.obs_next.mask,
                    ):
                        module = self._module_of_agent.get(transition.agent)
                        if module is not None:
                            transitions.setdefault(module, []).append(transition)
                    if done:
                        returns.append(self._agent_returns[env].copy())
                        lens.append(self._episode_len[env])
                        self._agent_returns[env] = 0.0
                        self._episode_len[env] = 0
            stats.update(
                episodes=len(lens),
                returns=np.asarray(returns, dtype=float).reshape(len(lens), len(self._agents)),
                lens=np.asarray(lens, dtype=int),
            )
            return ModuleRollouts(
                {m: Rollout(transitions_to_rollout(ts)) for m, ts in transitions.items()},
                env_steps=self._num_envs * self._steps_per_env,
            )

        result = self._step.run_modules(
            act=act,
            q_values={
                module: functools.partial(q_values, self._module_policy(module).model)
                for module in set(self._module_of_agent.values())
            },
            load_weights=functools.partial(load_cpu_state_dict, self.policy),
        )
        dropped = sum(turns.dropped for turns in self._turns)
        dropped_now, self._dropped_reported = dropped - self._dropped_reported, dropped
        return {
            "actor_index": self.actor_index,
            **stats,
            "env_steps": result.env_steps,
            "agent_steps": result.agent_steps,
            "weights_version": result.weights_version,
            "epsilon": self.epsilon,
            "dropped_at_truncation": dropped_now,  # in this rollout
        }

    def _module_policy(self, module: str) -> Policy:
        agent = next(a for a, m in self._module_of_agent.items() if m == module)
        return self.policy.policies[agent]


def acting_version_of(recorded: dict[str, np.ndarray]) -> float | None:
    """The mean weights version of a SEED rollout's replies (``None`` outside SEED mode)."""
    return float(np.mean(recorded["version"])) if "version" in recorded else None


def action_distribution(policy: ProbabilisticActorPolicy, obs: np.ndarray) -> Any:
    """``policy``'s action distribution at a batch of observations, as its ``forward`` builds
    it (no gradients)."""
    with torch.no_grad():
        return policy.dist_fn(policy.actor(torch.as_tensor(obs), state=None, info={})[0])


def behaviour_log_probs(
    policy: ProbabilisticActorPolicy, obs: np.ndarray, actions: np.ndarray
) -> np.ndarray:
    """``[T, B]`` log mu(a_t|x_t) of ``[T, B, ...]`` steps under ``policy``'s current weights."""
    num_steps, num_envs = actions.shape[:2]
    dist = action_distribution(policy, obs.reshape(num_steps * num_envs, *obs.shape[2:]))
    flat_actions = torch.as_tensor(actions.reshape(num_steps * num_envs, *actions.shape[2:]))
    return dist.log_prob(flat_actions).reshape(num_steps, num_envs).cpu().numpy()


class VTraceActor(EnvActor):
    """An IMPALA actor: fixed-length trajectories with the behaviour log-probs.

    Each :meth:`collect_trajectory` is one core actor step
    (:class:`rl_dist_ext.impala.TrajectoryActorStep`): pull newer weights when
    ``weight_sync_every_n_steps`` env steps have passed, step every env ``steps_per_env`` times
    with the local policy (sampling its distribution), record log mu(a|x). The local policy
    acts in :meth:`sample_rollout`, one forward pass per vector step that also gives the
    log-probs of the sampled actions, without Tianshou's ``Collector``: its batches per step
    cost more than the step of a fast env and the forward pass together (``benchmarks/results/
    tianshou_actor_bench.md``: 2.5x faster with envs stepped one after another, 1.7-2x on
    threads), and the trajectory is the same (tested against
    the ``Collector``'s on the same seeds). In SEED mode (``inference_server`` given) the
    server samples the actions through the ``Collector`` and its replies carry log mu(a|x) and
    the version that acted.

    Args:
        policy: the learner's ``ProbabilisticActorPolicy`` (a copy is kept, on the CPU).
        env_factory, num_envs, steps_per_env, actor_index, seed: as :class:`EnvActor`.
        weights_server: the parameter server (``pull_if_newer``).
        weight_sync_every_n_steps: env steps between weight pulls.
        inference_server: SEED mode (see above); no weights are pulled.
    """

    def __init__(
        self,
        *,
        policy: ProbabilisticActorPolicy,
        env_factory: Callable[[], gym.Env],
        num_envs: int,
        weights_server: Any,
        weight_sync_every_n_steps: int,
        steps_per_env: int,
        actor_index: int,
        seed: int | None = None,
        env_stepping: str = "sequential",
        inference_server: Any = None,
    ) -> None:
        super().__init__(
            policy=policy,
            env_factory=env_factory,
            num_envs=num_envs,
            steps_per_env=steps_per_env,
            actor_index=actor_index,
            seed=seed,
            env_stepping=env_stepping,
            inference_server=inference_server,
            server_kind="policy",
        )
        self._step = TrajectoryActorStep(
            weights=weights_server if self.server is None else None,
            pull_every_n_steps=weight_sync_every_n_steps,
            name=f"actor {actor_index}",
        )
        self._step.pull_weights(functools.partial(load_cpu_state_dict, self.policy))

    @property
    def weights_version(self) -> int:
        return self._step.weights_version

    def collect_rollout(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """:meth:`sample_rollout` with the local policy; the ``Collector``'s in SEED mode."""
        if self.server is not None:
            return super().collect_rollout()
        return self.sample_rollout()

    def sample_rollout(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Step every env ``steps_per_env`` times, sampling the local policy's distribution:
        the steps as ``[T, M]`` arrays, as :meth:`EnvActor.collect_rollout` returns them, and
        ``{"logp": [T, M]}``, the log-probs of the sampled actions. An env whose episode ends
        is reset, and its next step starts the new episode. The networks run in eval mode, as
        in Tianshou's ``Collector``, for the actions and their log-probs alike."""
        steps: dict[str, list[np.ndarray]] = {
            name: []
            for name in ("obs", "actions", "rewards", "next_obs", "terminated", "truncated")
        }
        logps = []
        obs = self._obs
        with torch.no_grad(), torch_train_mode(self.policy, enabled=False):
            for _ in range(self._steps_per_env):
                dist = action_distribution(self.policy, obs)
                actions = dist.sample()
                logps.append(dist.log_prob(actions).numpy())
                actions = actions.numpy()
                next_obs, rewards, terminated, truncated, _ = self.envs.step(
                    self.policy.map_action(actions)
                )
                for name, value in zip(
                    steps, (obs, actions, rewards, next_obs, terminated, truncated), strict=True
                ):
                    steps[name].append(value)
                obs = next_obs
                ended = np.flatnonzero(np.logical_or(terminated, truncated))
                if ended.size:
                    obs = next_obs.copy()
                    obs[ended] = self.envs.reset(env_id=ended)[0]
        self._obs = obs
        columns = {
            "obs": observation_array(np.stack(steps["obs"])),
            "actions": np.stack(steps["actions"]),
            "rewards": np.stack(steps["rewards"]).astype(np.float32),
            "next_obs": observation_array(np.stack(steps["next_obs"])),
            "terminated": np.stack(steps["terminated"]).astype(bool),
            "truncated": np.stack(steps["truncated"]).astype(bool),
        }
        return columns, {"logp": np.stack(logps)}

    def collect_trajectory(self) -> dict[str, Any]:
        """One core actor step of ``num_envs * steps_per_env`` env steps: the trajectory and
        the stats of the episodes that ended in it."""
        episodes: list[dict[str, Any]] = []

        recorded: dict[str, np.ndarray] = {}

        def act() -> dict[str, np.ndarray]:
            columns, replies = self.collect_rollout()
            recorded.update(replies)
            episodes.append(self.episode_stats(columns))
            # log mu(a|x) of the sampled actions: the local policy's or the server's
            columns["behaviour_logp"] = recorded["logp"].astype(np.float32)
            return columns

        trajectory = self._step.run(
            act=act,
            load_weights=functools.partial(load_cpu_state_dict, self.policy),
            acting_version=None if self.server is None else lambda: acting_version_of(recorded),
        )
        steps = trajectory.columns["rewards"].size
        return {
            **episodes[0],
            "env_steps": steps,
            "weights_version": trajectory.acting_version,
            "trajectory": trajectory,
        }
