"""``GorilaCollector``: a Tianshou collector whose envs run in N asynchronous Ray actors.

Each actor (:class:`~tianshou_plugins.actor.GorilaActor`) runs Tianshou's own ``Collector`` over
``envs_per_actor`` envs with a local policy copy and its Ape-X epsilon
(``eps_i = base ** (1 + i / (N - 1) * alpha)``), folds n-step transitions, computes initial
priorities and pushes them to the :class:`~tianshou_plugins.DistributedPrioritizedReplayBuffer`.
Actors never wait for the learner: each keeps ``max_in_flight_per_actor`` rollouts queued, also
while the learner's sample waits on a rate-limited replay (``samples_per_insert``).

:meth:`collect` (what Tianshou's trainer calls each training step) publishes the learner's latest
weights, then returns at once with the :class:`GorilaCollectStats` of every rollout the actors
finished since the previous call, waiting only while fewer than the requested steps (or
episodes) are in, and on the first call until the replay can be sampled. Actors pull weights
every ``weight_sync_every_n_steps`` of their env steps. The fleet, its failures and restarts:
:mod:`tianshou_plugins.actor_collector`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from tianshou.data.stats import SequenceSummaryStats

from rl_dist_ext.exploration import EPSILON_ALPHA, EPSILON_BASE, apex_epsilons
from tianshou_plugins.actor import GorilaActor, MultiAgentGorilaActor
from tianshou_plugins.actor_collector import (
    ActorCollectStats,
    ActorFleet,
    RayActorCollector,
    check_cpus,
    check_env_factory,
    ensure_ray,
    take_fleet,
)
from tianshou_plugins.buffer import DistributedPrioritizedReplayBuffer
from tianshou_plugins.central_inference import CentralInference
from tianshou_plugins.gorila_dqn import GorilaDQN
from tianshou_plugins.multi_agent import (
    MultiAgentDistributedReplayBuffer,
    MultiAgentGorilaDQN,
    check_multi_agent_env_factory,
)


@dataclass(kw_only=True)
class GorilaCollectStats(ActorCollectStats):
    """:class:`~tianshou_plugins.actor_collector.ActorCollectStats` plus the replay's."""

    replay: dict[str, float] = field(default_factory=dict)
    #: multi-agent: each agent's mean episode return. ``returns`` then holds one column per
    #: agent (in the env's agent order), as Tianshou's own collectors give them, for the
    #: trainer's ``multi_agent_return_reduction``; ``returns_stat`` summarises the learning
    #: agents' summed return (a team's return, or the one learner's).
    agent_returns: dict[str, float] = field(default_factory=dict)
    learner_columns: list[int] = field(default_factory=list)

    def refresh_return_stats(self) -> None:
        if self.returns.ndim == 2 and self.returns.size > 0:
            team = self.returns[:, self.learner_columns].sum(axis=1)
            self.returns_stat = SequenceSummaryStats.from_sequence(team)
        else:
            super().refresh_return_stats()


_REPLAY_STATS = (
    "size",
    "shards_alive",
    "samples_per_insert",
    "sample_wait_fraction",
    "insert_rate",
    "sample_rate",
    "stale_updates",
    "items_lost",
    "snapshots_rejected",
    "shard_failures",
    "storage_bytes",
    "bytes_per_transition",
    "compression_ratio",
)


class GorilaCollector(RayActorCollector[GorilaCollectStats]):
    """Collect with a fleet of Ray actors for a GorilaDQN; see the module docstring.

    Args:
        algorithm: the :class:`~tianshou_plugins.GorilaDQN` (or ``MultiAgentGorilaDQN``) being
            trained: its policy acts, its ``gamma`` and n-step horizon fold the rows, and its
            gradient-update count versions the weights the actors get.
        env_factory: builds one environment (picklable; it runs inside the actors).
        buffer: the distributed replay the actors push to (started here if it is not running).
        fleet: the actors (:class:`~tianshou_plugins.actor_collector.ActorFleet`); its fields
            may also be given as keywords (``num_actors=2, envs_per_actor=4``), which replace
            those of ``fleet`` (default ``ActorFleet()``).
        epsilon_base: the Ape-X epsilon ladder's base (actor ``i`` of ``N`` explores with
            ``epsilon_base ** (1 + i / (N - 1) * epsilon_alpha)``).
        epsilon_alpha: the ladder's exponent.
        central_inference: SEED mode (:class:`~tianshou_plugins.CentralInference`): the
            inference server returns greedy actions and Q-values (each actor applies its own
            epsilon and computes its initial priorities from them); the actors hold no weights.
    """

    actor_method = "collect_and_push"
    name = "GorilaCollector"
    server_kind = "q"

    def __init__(
        self,
        algorithm: GorilaDQN | MultiAgentGorilaDQN,
        *,
        env_factory: Callable[[], gym.Env],
        buffer: DistributedPrioritizedReplayBuffer | MultiAgentDistributedReplayBuffer,
        fleet: ActorFleet | None = None,
        epsilon_base: float = EPSILON_BASE,
        epsilon_alpha: float = EPSILON_ALPHA,
        central_inference: CentralInference | None = None,
        **fleet_settings: Any,
    ) -> None:
        fleet = take_fleet(fleet, ActorFleet(), fleet_settings)
        _check_arguments(algorithm, env_factory, buffer, central_inference)
        self._algorithm = algorithm
        self._epsilons = apex_epsilons(fleet.num_actors, epsilon_base, epsilon_alpha)
        super().__init__(
            algorithm,
            fleet=fleet,
            buffer=buffer,
            collect_stats_class=GorilaCollectStats,
            central_inference=central_inference,
        )
        self._published_version = -1
        self._replay_ready = False
        self._rows_pushed = 0
        ensure_ray()
        self._check_resources()
        self._start_fleet(env_factory)

    @property
    def _multi_agent(self) -> bool:
        return isinstance(self._algorithm, MultiAgentGorilaDQN)

    def _check_resources(self) -> None:
        """Refuse a fleet, replay and server that the running cluster has no room for."""
        wanted = self.fleet.num_actors * self.fleet.num_cpus_per_actor + self.server_cpus()
        if not self.buffer.started:
            replays = len(self._algorithm.learning_modules) if self._multi_agent else 1
            replay = self.buffer.config
            wanted += replays * replay.num_shards * replay.num_cpus_per_shard
        check_cpus(
            "GorilaCollector's actors (num_actors x num_cpus_per_actor), replay shards and "
            "inference server",
            wanted,
        )

    def _start_fleet(self, env_factory: Callable[[], gym.Env]) -> None:
        """Start the replay (if it is not running), the weights or inference server and the
        actors; on any failure, stop what this collector started."""
        started_buffer = not self.buffer.started
        try:
            actor_cls, replay = self._start_replay()
            algorithm, fleet = self._algorithm, self.fleet
            self._start(
                actor_cls,
                lambda i: {
                    "policy": algorithm.policy,
                    "env_factory": env_factory,
                    "num_envs": fleet.envs_per_actor,
                    "epsilon": float(self._epsilons[i]),
                    "gamma": algorithm.gamma,
                    "n_step": algorithm.n_step,
                    **replay,
                    "weights_server": self.env.weights_server,
                    "weight_sync_every_n_steps": fleet.weight_sync_every_n_steps,
                    "steps_per_env": fleet.steps_per_env,
                    "actor_index": i,
                    "seed": fleet.seed,
                },
            )
            for buffer in self._replays().values():  # they booted while the actors did
                buffer.client.wait_until_started()
            self._replay_ready = self._replay_holds_min_size()  # e.g. a restored replay
            for buffer in self._replays().values():
                buffer.client.while_waiting(self._keep_actors_acting)
        except BaseException:
            self.close()
            if started_buffer:
                self.buffer.close()
            raise

    def _start_replay(self) -> tuple[type, dict[str, Any]]:
        """The actor class, and the replay arguments its actors take."""
        if not self._multi_agent:
            return GorilaActor, {"replay": self.buffer.start(wait=False)}
        algorithm = self._algorithm
        return MultiAgentGorilaActor, {
            "replays": self.buffer.start(list(algorithm.learning_modules), wait=False),
            "module_of_agent": algorithm.module_of_agent,
            "agents": algorithm.agents,
        }

    def _validate_buffer(self) -> None:
        """BaseCollector's check, for this collector's kind of buffer: the distributed one."""
        if not isinstance(
            self.buffer, DistributedPrioritizedReplayBuffer | MultiAgentDistributedReplayBuffer
        ):
            raise TypeError(
                "buffer must be a DistributedPrioritizedReplayBuffer (or, multi-agent, a "
                f"MultiAgentDistributedReplayBuffer), got {type(self.buffer).__name__}"
            )

    @property
    def epsilons(self) -> np.ndarray:
        """``[num_actors]`` each actor's exploration rate."""
        return self._epsilons.copy()

    def close(self) -> None:
        """Stop the actors and the weights server (the replay buffer keeps running)."""
        for replay in self._replays().values():
            if replay.started:
                replay.client.while_waiting(None)
        super().close()

    def _keep_actors_acting(self) -> None:
        """While the learner's sample waits on the rate limiter (Tianshou's trainer is in its
        update step and calls no ``collect()``): keep the finished rollouts for the next
        ``collect()`` and hand the actors new ones, so that the inserts the learner waits for
        come in (actors paused by :meth:`pause_acting` act again: the sample needs them)."""
        self._actor_pool.resume()
        self._take_finished(timeout_s=0.0)  # close() removes this callback first

    # ---- RayActorCollector's hooks ------------------------------------------------------------
    def _publish_weights(self, *, again: bool = False) -> int:
        """The learner's weights go to the actors (or the inference server) each time the
        trainer turns to acting: the algorithm's learner step publishes them under its
        weights version (gradient updates). ``again``: a restarted inference server lost
        them."""
        if again or self._published_version < 0:  # (re)connect: publishes the weights
            self._published_version = self._algorithm.gorila.connect(weights=self.weights_sink)
        else:
            self._published_version = self._algorithm.gorila.publish()
        return self._published_version

    def _accept(self, result: dict[str, Any]) -> bool:
        """The actor already pushed the rollout to the replay: count its rows."""
        self._rows_pushed += result["env_steps"]
        return True

    def _ready_to_return(self) -> bool:
        """Whether every shard holds its share of ``min_size_to_sample`` (checked until true).

        The first ``collect()`` waits for this, so that the trainer's first update does not
        wait on an empty replay while the actors sit idle with their rollouts delivered.
        """
        if self._replay_ready:
            return True
        if self._rows_pushed < self.buffer.config.min_size_to_sample:
            return False
        self._replay_ready = self._replay_holds_min_size()
        return self._replay_ready

    def _replay_holds_min_size(self) -> bool:
        need = self.buffer.config.rate_limit().min_size_to_sample
        return all(
            s is not None and s.size >= need
            for replay in self._replays().values()
            for s in replay.client.refresh()
        )

    def _replays(self) -> dict[str, DistributedPrioritizedReplayBuffer]:
        """Module -> its replay buffer (single-agent: one, under ``""``)."""
        if isinstance(self.buffer, MultiAgentDistributedReplayBuffer):
            return {m: self.buffer.buffer(m) for m in self.buffer.modules}
        return {"": self.buffer}

    def _summarise(self, results: list[dict[str, Any]]) -> GorilaCollectStats:
        common = self._common_stats(results, self._published_version)
        common["actors"].update(
            {f"epsilon/actor_{i}": float(e) for i, e in enumerate(self._epsilons)}
        )
        replay: dict[str, float] = {}
        for module, buffer in self._replays().items():
            stats = buffer.stats()
            for key in _REPLAY_STATS:
                if key in stats:
                    replay[f"{key}/{module}" if module else key] = stats[key]
        agent_returns = {}
        if isinstance(self._algorithm, MultiAgentGorilaDQN):
            agents = self._algorithm.agents
            returns = common["returns"].reshape(-1, len(agents))
            agent_returns = {
                agent: float(returns[:, i].mean()) if len(returns) else float("nan")
                for i, agent in enumerate(agents)
            }
            common["returns"] = returns
            learning = self._algorithm.module_of_agent
            common["learner_columns"] = [i for i, a in enumerate(agents) if a in learning]
            common["actors"]["dropped_at_truncation"] = float(
                sum(r.get("dropped_at_truncation", 0) for r in results)
            )
        return GorilaCollectStats(**common, replay=replay, agent_returns=agent_returns)


def _check_arguments(
    algorithm: Any, env_factory: Any, buffer: Any, central_inference: CentralInference | None
) -> None:
    """Everything GorilaCollector can check before Ray starts."""
    if not isinstance(algorithm, GorilaDQN | MultiAgentGorilaDQN):
        raise TypeError(
            "GorilaCollector collects for a GorilaDQN or MultiAgentGorilaDQN (its n-step "
            "horizon folds the rows; its gradient updates version the weights), got "
            f"{type(algorithm).__name__}"
        )
    multi_agent = isinstance(algorithm, MultiAgentGorilaDQN)
    wanted_buffer = (
        MultiAgentDistributedReplayBuffer if multi_agent else DistributedPrioritizedReplayBuffer
    )
    if not isinstance(buffer, wanted_buffer):
        raise TypeError(f"buffer must be a {wanted_buffer.__name__}, got {type(buffer).__name__}")
    if multi_agent and central_inference is not None:
        raise ValueError(
            "central_inference is not supported with MultiAgentGorilaDQN; use "
            "central_inference=None (each actor holds the agents' policies)"
        )
    if multi_agent:
        check_multi_agent_env_factory(env_factory, algorithm)
    else:
        check_env_factory(
            env_factory,
            owner="GorilaCollector",
            check_env=lambda env: _check_env(env, algorithm.policy),
        )


def _check_env(env: gym.Env, policy: Any) -> None:
    if not isinstance(env.action_space, gym.spaces.Discrete):
        raise TypeError(
            f"GorilaDQN needs a Discrete action space, the env has {env.action_space!r}"
        )
    if env.action_space.n != policy.action_space.n:
        raise ValueError(
            f"the env has {env.action_space.n} actions, the policy {policy.action_space.n}"
        )
