"""``GorilaCollector``: a Tianshou collector whose envs run in N asynchronous Ray actors.

Each actor (:class:`~tianshou_plugins.actor.GorilaActor`) runs Tianshou's own ``Collector`` over
``envs_per_actor`` envs with a local policy copy and its Ape-X epsilon
(``eps_i = base ** (1 + i / (N - 1) * alpha)``), folds n-step transitions, computes initial
priorities and pushes them to the :class:`~tianshou_plugins.DistributedPrioritizedReplayBuffer`.
Actors never wait for the learner: each keeps ``max_in_flight_per_actor`` rollouts queued.

:meth:`collect` (what Tianshou's trainer calls each training step) publishes the learner's latest
weights, then returns at once with the :class:`GorilaCollectStats` of every rollout the actors
finished since the previous call, waiting only while fewer than the requested steps (or
episodes) are in. Actors pull weights every ``weight_sync_every_n_steps`` of their env steps.
An actor whose process dies is restarted by Ray with the same arguments (new envs, latest
weights) and resumes; its lost rollout is counted in the stats.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.data.collector import BaseCollector, CollectStats

from rl_dist_ext.actor_pool import ActorPool
from rl_dist_ext.exploration import apex_epsilons
from rl_dist_ext.params import policy_lag
from rl_dist_ext.validation import check_int, check_real
from tianshou_plugins.actor import GorilaActor, cpu_state_dict
from tianshou_plugins.buffer import DistributedPrioritizedReplayBuffer
from tianshou_plugins.gorila_dqn import GorilaDQN

if TYPE_CHECKING:
    from rl_dist_ext.ray_actors import ParameterServerClient


@dataclass(kw_only=True)
class GorilaCollectStats(CollectStats):
    """Tianshou's collect stats plus what a distributed run needs watched.

    ``collect_time`` is the time the trainer spent inside ``collect()``; ``collect_speed`` is the
    actors' throughput (env steps per second of wall time since the previous ``collect()``).
    """

    env_steps_per_s: float = 0.0
    weights_version: int = 0
    policy_lag_mean: float = 0.0
    policy_lag_max: float = 0.0
    replay: dict[str, float] = field(default_factory=dict)
    actors: dict[str, float] = field(default_factory=dict)

    def set_collect_time(self, collect_time: float, update_collect_speed: bool = True) -> None:
        if collect_time < 0:
            raise ValueError(f"collect_time must be >= 0, got {collect_time!r}")
        self.collect_time = collect_time
        if update_collect_speed:
            self.collect_speed = self.env_steps_per_s


_REPLAY_STATS = (
    "size",
    "shards_alive",
    "samples_per_insert",
    "sample_wait_fraction",
    "insert_rate",
    "sample_rate",
    "stale_updates",
    "items_lost",
    "shard_failures",
)


class GorilaCollector(BaseCollector[GorilaCollectStats]):
    """Collect with ``num_actors`` Ray actors of ``envs_per_actor`` envs each; see the module doc.

    Args:
        policy: the :class:`~tianshou_plugins.GorilaDQN` being trained (its policy acts; its
            ``gamma`` and n-step horizon fold the rows; its gradient-update count versions the
            weights), or a ``DiscreteQLearningPolicy`` together with ``gamma`` and ``n_step``.
        env_factory: builds one environment (picklable; it runs inside the actors).
        buffer: the distributed replay the actors push to (started here if it is not running).
        num_actors: actor processes.
        envs_per_actor: environments per actor (stepped as one ``DummyVectorEnv``).
        weight_sync_every_n_steps: an actor's env steps between weight pulls.
        steps_per_env: env steps per env in one actor rollout (a rollout is
            ``envs_per_actor * steps_per_env`` transitions).
        gamma, n_step: only with a bare policy.
        epsilon_base, epsilon_alpha: the Ape-X epsilon ladder.
        max_in_flight_per_actor: rollouts queued per actor (bounds how far actors run ahead).
        num_cpus_per_actor: CPUs reserved per actor in Ray.
        seed: seeds the actors' envs and exploration.
        timeout_s: the longest ``collect()`` waits for actors (and actors to start).
    """

    def __init__(
        self,
        policy: GorilaDQN | DiscreteQLearningPolicy,
        *,
        env_factory: Callable[[], gym.Env],
        buffer: DistributedPrioritizedReplayBuffer,
        num_actors: int = 4,
        envs_per_actor: int = 4,
        weight_sync_every_n_steps: int = 400,
        steps_per_env: int = 16,
        gamma: float | None = None,
        n_step: int | None = None,
        epsilon_base: float = 0.4,
        epsilon_alpha: float = 7.0,
        max_in_flight_per_actor: int = 2,
        num_cpus_per_actor: float = 0.25,
        seed: int | None = None,
        timeout_s: float = 120.0,
    ) -> None:
        self._algorithm, policy, gamma, n_step = _resolve_policy(policy, gamma, n_step)
        if not isinstance(buffer, DistributedPrioritizedReplayBuffer):  # before Ray starts
            raise TypeError(
                f"buffer must be a DistributedPrioritizedReplayBuffer, got {type(buffer).__name__}"
            )
        check_int("num_actors", num_actors, 1)
        check_int("envs_per_actor", envs_per_actor, 1)
        check_int("weight_sync_every_n_steps", weight_sync_every_n_steps, 1)
        check_int("steps_per_env", steps_per_env, 1)
        check_int("max_in_flight_per_actor", max_in_flight_per_actor, 1)
        if seed is not None:
            check_int("seed", seed, 0)
        check_real("num_cpus_per_actor", num_cpus_per_actor, low=0.0)
        check_real("timeout_s", timeout_s, low=0.0, strict=True)
        self._epsilons = apex_epsilons(num_actors, epsilon_base, epsilon_alpha)
        _check_env_factory(env_factory, policy)

        import ray

        from rl_dist_ext.ray_actors import start_parameter_server, start_restartable_actor

        super().__init__(
            policy,
            ActorEnvs(num_actors * envs_per_actor, policy.action_space),
            buffer,
            exploration_noise=True,
            collect_stats_class=GorilaCollectStats,
            raise_on_nan_in_buffer=False,  # the actor step rejects non-finite rows
        )
        self._timeout_s = float(timeout_s)
        self._published_version = -1
        self._last_return_time: float | None = None  # set by the first collect()
        self._replay_ready = False
        self._rows_pushed = 0

        if not ray.is_initialized():
            ray.init()
        _check_cpus(num_actors * num_cpus_per_actor, buffer)
        started_buffer = not buffer.started
        try:
            replay = buffer.start()
            self.env.weights_server = start_parameter_server(timeout_s=self._timeout_s)
            self._publish_weights()
            handles = [
                start_restartable_actor(
                    GorilaActor,
                    num_cpus=num_cpus_per_actor,
                    policy=policy,
                    env_factory=env_factory,
                    num_envs=envs_per_actor,
                    epsilon=float(self._epsilons[i]),
                    gamma=gamma,
                    n_step=n_step,
                    replay=replay,
                    weights_server=self.env.weights_server,
                    weight_sync_every_n_steps=weight_sync_every_n_steps,
                    steps_per_env=steps_per_env,
                    actor_index=i,
                    seed=seed,
                )
                for i in range(num_actors)
            ]
            self.env.pool = ActorPool(
                handles, "collect_and_push", max_in_flight=max_in_flight_per_actor
            )
            _wait_ready(handles, self._timeout_s)
            self._replay_ready = self._replay_holds_min_size()  # e.g. a restored replay
        except BaseException:
            self.close()
            if started_buffer:
                buffer.close()
            raise

    def _validate_buffer(self) -> None:
        """BaseCollector's check, for this collector's kind of buffer: the distributed one."""
        if not isinstance(self.buffer, DistributedPrioritizedReplayBuffer):
            raise TypeError(
                "buffer must be a DistributedPrioritizedReplayBuffer, got "
                f"{type(self.buffer).__name__}"
            )

    # ---- BaseCollector's interface ------------------------------------------------------------
    @property
    def epsilons(self) -> np.ndarray:
        """``[num_actors]`` each actor's exploration rate."""
        return self._epsilons.copy()

    def reset_env(
        self, gym_reset_kwargs: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Start new episodes in every actor's envs (after the rollouts already queued)."""
        import ray

        if gym_reset_kwargs:
            raise ValueError("GorilaCollector does not support gym_reset_kwargs")
        replies = ray.get(
            [h.reset_envs.remote() for h in self._actor_pool.handles], timeout=self._timeout_s
        )
        return (
            np.concatenate([obs for obs, _ in replies]),
            np.concatenate([info for _, info in replies]),
        )

    def _collect(
        self,
        n_step: int | None = None,
        n_episode: int | None = None,
        random: bool = False,
        render: float | None = None,
        gym_reset_kwargs: dict[str, Any] | None = None,
    ) -> GorilaCollectStats:
        if random:
            raise ValueError(
                "GorilaCollector does not support random=True: its actors always explore with "
                "their own epsilon (set epsilon_base=1.0 for uniformly random actors)"
            )
        if render or gym_reset_kwargs:
            raise ValueError("GorilaCollector does not support render or gym_reset_kwargs")
        started = time.monotonic()
        if self._last_return_time is None:  # the actors get their first rollouts only now
            self._last_return_time = started
        self._publish_weights()
        results = self._gather(n_step=n_step, n_episode=n_episode)
        stats = self._summarise(results)
        self.collect_step += stats.n_collected_steps
        self.collect_episode += stats.n_collected_episodes
        self.collect_time += time.monotonic() - started
        return stats

    def close(self) -> None:
        """Stop the actors and the weights server (the replay buffer keeps running)."""
        super().close()  # closes ``self.env``: the actors and the weights server

    # ---- internals ----------------------------------------------------------------------------
    @property
    def _actor_pool(self) -> ActorPool:
        if self.env.pool is None:
            raise RuntimeError("this GorilaCollector is closed")
        return self.env.pool

    def _publish_weights(self) -> None:
        """The learner's weights go to the actors each time the trainer turns to acting: the
        algorithm's learner step publishes them (a bare policy: a new version each call)."""
        if self._algorithm is not None:
            if self._published_version < 0:  # first call: the learner gets the weights server
                self._published_version = self._algorithm.gorila.connect(
                    weights=self.env.weights_server
                )
            else:
                self._published_version = self._algorithm.gorila.publish()
            return
        self._published_version += 1
        self.env.weights_server.publish(cpu_state_dict(self.policy), self._published_version)

    def _gather(self, *, n_step: int | None, n_episode: int | None) -> list[dict[str, Any]]:
        """Every finished rollout, waiting until they hold ``n_step`` steps or ``n_episode``."""
        results: list[dict[str, Any]] = []
        steps = episodes = 0
        deadline = time.monotonic() + self._timeout_s
        wait_s = 0.0  # first take whatever finished while the learner trained
        while True:
            for result in self._actor_pool.wait(timeout_s=wait_s):
                results.append(result.value)
                steps += result.value["env_steps"]
                episodes += result.value["episodes"]
                self._rows_pushed += result.value["env_steps"]
            enough = (n_step and steps >= n_step) or (n_episode and episodes >= n_episode)
            if enough and self._replay_can_sample():
                return results
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"GorilaCollector: the actors delivered {steps} steps / {episodes} episodes "
                    f"in {self._timeout_s}s, fewer than asked (n_step={n_step}, "
                    f"n_episode={n_episode}); actor failures so far: "
                    f"{self._actor_pool.stats.failures}"
                )
            wait_s = 1.0

    def _replay_can_sample(self) -> bool:
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
        statuses = self.buffer.client.refresh()
        return all(s is not None and s.size >= need for s in statuses)

    def _summarise(self, results: list[dict[str, Any]]) -> GorilaCollectStats:
        now = time.monotonic()
        steps = sum(r["env_steps"] for r in results)
        lag = policy_lag(self._published_version, [r["weights_version"] for r in results])
        pool = self._actor_pool.stats
        stats = GorilaCollectStats(
            n_collected_steps=steps,
            n_collected_episodes=sum(r["episodes"] for r in results),
            returns=np.concatenate([r["returns"] for r in results]).astype(float),
            lens=np.concatenate([r["lens"] for r in results]).astype(int),
            env_steps_per_s=steps / max(now - self._last_return_time, 1e-9),
            weights_version=self._published_version,
            policy_lag_mean=lag.mean,
            policy_lag_max=lag.max,
            replay={k: v for k, v in self.buffer.stats().items() if k in _REPLAY_STATS},
            actors={
                "num_actors": len(self._epsilons),
                "failures": pool.failures,
                "rollouts_lost": pool.calls_lost,
                **{f"epsilon/actor_{i}": float(e) for i, e in enumerate(self._epsilons)},
            },
        )
        self._last_return_time = now
        return stats


class ActorEnvs:
    """A :class:`GorilaCollector`'s envs as ``BaseCollector`` sees its env (a length, an action
    space, ``close``): they live in the actors of ``pool``, whose weights come from
    ``weights_server``; closing stops both."""

    def __init__(self, num_envs: int, action_space: gym.Space) -> None:
        self._num_envs = num_envs
        self.action_space = action_space
        self.pool: ActorPool | None = None
        self.weights_server: ParameterServerClient | None = None

    def __len__(self) -> int:
        return self._num_envs

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.weights_server is not None:
            self.weights_server.close()
            self.weights_server = None


def _resolve_policy(
    policy: Any, gamma: float | None, n_step: int | None
) -> tuple[GorilaDQN | None, DiscreteQLearningPolicy, float, int]:
    if isinstance(policy, GorilaDQN):
        for name, given, own in (
            ("gamma", gamma, policy.gamma),
            ("n_step", n_step, policy.n_step),
        ):
            if given is not None and given != own:
                raise ValueError(
                    f"{name}={given!r} differs from the algorithm's {name}={own!r}; "
                    f"leave {name} unset when passing a GorilaDQN"
                )
        return policy, policy.policy, policy.gamma, policy.n_step
    if isinstance(policy, DiscreteQLearningPolicy):
        if gamma is None or n_step is None:
            raise ValueError("with a bare DiscreteQLearningPolicy, pass gamma and n_step too")
        check_real("gamma", gamma, low=0.0, high=1.0)
        check_int("n_step", n_step, 1)
        return None, policy, float(gamma), n_step
    raise TypeError(
        f"policy must be a GorilaDQN or a DiscreteQLearningPolicy, got {type(policy).__name__}"
    )


def _check_env_factory(env_factory: Any, policy: DiscreteQLearningPolicy) -> None:
    """Build one env here, before any actor starts, and check what the actors will get."""
    import cloudpickle

    if not callable(env_factory):
        raise TypeError(f"env_factory must be a callable returning a gym.Env, got {env_factory!r}")
    try:
        env = env_factory()
    except Exception as error:
        raise ValueError(f"env_factory failed to build an environment: {error!r}") from error
    try:
        if not isinstance(env, gym.Env):
            raise TypeError(f"env_factory must return a gymnasium.Env, got {type(env).__name__}")
        if not isinstance(env.action_space, gym.spaces.Discrete):
            raise TypeError(
                f"GorilaDQN needs a Discrete action space, the env has {env.action_space!r}"
            )
        if env.action_space.n != policy.action_space.n:
            raise ValueError(
                f"the env has {env.action_space.n} actions, the policy {policy.action_space.n}"
            )
        if not isinstance(env.observation_space, gym.spaces.Box):
            raise TypeError(
                "GorilaCollector needs a Box observation space (stored as float32), the env has "
                f"{env.observation_space!r}"
            )
    finally:
        env.close()
    try:
        cloudpickle.dumps(env_factory)
    except Exception as error:
        raise TypeError(
            f"env_factory must be picklable (it is sent to the actors): {error!r}"
        ) from error


def _check_cpus(actor_cpus: float, buffer: DistributedPrioritizedReplayBuffer) -> None:
    from rl_dist_ext.ray_actors import check_resources_fit

    wanted = actor_cpus
    if not buffer.started:
        wanted += buffer.config.num_shards * buffer.config.num_cpus_per_shard
    check_resources_fit(
        "GorilaCollector's actors (num_actors x num_cpus_per_actor) and replay shards",
        {"CPU": wanted},
        how_to_lower="lower num_cpus_per_actor (actors mostly step envs and wait) or num_actors",
        free=True,
    )


def _wait_ready(handles: list, timeout_s: float) -> None:
    import ray

    refs = [h.ready.remote() for h in handles]
    for index, ref in enumerate(refs):
        try:
            ray.get(ref, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"Gorila actor {index} did not start within {timeout_s}s") from None
        except ray.exceptions.RayError as error:
            raise RuntimeError(f"Gorila actor {index} failed to start: {error}") from error
