"""What every rl-dist-ext collector shares: a Tianshou collector whose envs run in Ray actors.

N actors (:mod:`tianshou_plugins.actor`), each stepping its own envs with a local policy copy,
are kept busy by an :class:`~rl_dist_ext.actor_pool.ActorPool` (``max_in_flight_per_actor``
rollouts queued each: the bound on how far acting runs ahead of learning). Each ``collect()``
(what Tianshou's trainers call) publishes the learner's newest weights, then returns the
rollouts that finished since the previous call, waiting only while fewer than the requested
steps (or episodes) are in. An actor whose process dies is restarted by Ray with the same
arguments (new envs, latest weights) and resumes; its lost rollout is counted in the stats.

Subclasses say which actor class runs, how weights are published and what happens to each
finished rollout (:class:`~tianshou_plugins.GorilaCollector`: already pushed to the replay;
:class:`~tianshou_plugins.VTraceCollector`: its trajectory goes into the trainer's buffer).

SEED mode (``central_inference=CentralInference(...)``): one
:class:`~rl_dist_ext.inference.InferenceServer` actor runs the policy for every actor
(:mod:`tianshou_plugins.central_inference`); the learner's weights go to it instead of to a
parameter server, and the actors hold none. A server that Ray restarts gets the weights again at
the next ``collect()``; actors wait out the restart.
"""

from __future__ import annotations

import logging
import time
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import gymnasium as gym
import numpy as np
import torch
from tianshou.algorithm.algorithm_base import Algorithm, Policy
from tianshou.data import ReplayBuffer
from tianshou.data.collector import BaseCollector, CollectStats

from rl_dist_ext.actor_pool import ActorPool
from rl_dist_ext.params import PolicyLag, policy_lag
from rl_dist_ext.validation import check_int, check_real, start_timeout_s, with_settings
from rl_dist_ext.weight_compression import check_encoding
from rl_dist_ext.weight_deltas import DEFAULT_TOLERANCE
from tianshou_plugins.central_inference import CentralInference, Kind, TianshouPolicyFactory
from tianshou_plugins.vector_envs import check_env_stepping

if TYPE_CHECKING:
    from rl_dist_ext.ray_actors import InferenceServerHandle, ParameterServerClient

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class ActorCollectStats(CollectStats):
    """Tianshou's collect stats plus what a distributed run needs watched.

    ``collect_time`` is the time the trainer spent inside ``collect()``; ``collect_speed`` is the
    actors' throughput (env steps per second of wall time since the previous ``collect()``).
    Versions and the policy lag count the learner's gradient updates.
    """

    env_steps_per_s: float = 0.0
    weights_version: int = 0
    policy_lag_mean: float = 0.0
    policy_lag_max: float = 0.0
    actors: dict[str, float] = field(default_factory=dict)
    #: SEED mode: the inference server's requests/s, batch rows and fill, queueing p50/p99 (ms),
    #: weights version and caller restarts (empty otherwise).
    inference: dict[str, float] = field(default_factory=dict)

    def set_collect_time(self, collect_time: float, update_collect_speed: bool = True) -> None:
        if collect_time < 0:
            raise ValueError(f"collect_time must be >= 0, got {collect_time!r}")
        self.collect_time = collect_time
        if update_collect_speed:
            self.collect_speed = self.env_steps_per_s


TStats = TypeVar("TStats", bound=ActorCollectStats)


@dataclass(frozen=True, kw_only=True)
class ActorFleet:
    """The actors of a collector: how many, their envs and resources (validated when built).

    The one definition of these settings: ``GorilaCollector`` and ``VTraceCollector`` take a
    fleet (``fleet=ActorFleet(...)``) or its fields as keywords, and so do the high-level
    ``GorilaParams`` and ``VTraceActorParams``. These defaults are GorilaDQN's;
    :data:`VTRACE_FLEET` says where V-trace's differ, and why.

    Attributes:
        num_actors: actor processes.
        envs_per_actor: envs each actor steps (one Tianshou vector env).
        env_stepping: how an actor steps its envs: ``"sequential"`` (one after another, as
            Tianshou's ``DummyVectorEnv``: fast envs), ``"threads"`` (each on a thread of its
            own, all at once: envs whose step releases the GIL, as a simulator in C, I/O or a
            wait) or ``"processes"`` (each in a spawned process of its own: slow envs written
            in Python); ``tianshou_plugins.vector_envs``.
        steps_per_env: env steps per env in one rollout (a V-trace trajectory's length ``T``).
        weight_sync_every_n_steps: an actor's env steps between weight pulls.
        max_in_flight_per_actor: rollouts queued per actor (how far acting runs ahead).
        num_cpus_per_actor: Ray CPUs per actor (fractional: they step small envs and wait).
        seed: seeds the actors' envs and exploration; ``None``: random.
        timeout_s: the longest ``collect()`` waits for actors (and actors to start), in
            seconds.
        weights_encoding: how weights travel to the actors: ``"fp32"`` (exact), ``"fp16"``,
            ``"int8"`` (``rl_dist_ext.weight_compression``) or ``"delta"`` (each actor gets the
            change since the weights it holds, every weight within ``weights_delta_tolerance``
            of the learner's; ``rl_dist_ext.weight_deltas``).
        weights_delta_tolerance: the bound of ``"delta"`` pulls, as a fraction of each weight
            tensor's RMS (> 0) in the first weights the server sends.
    """

    num_actors: int = 4
    envs_per_actor: int = 4
    env_stepping: str = "sequential"
    steps_per_env: int = 16
    weight_sync_every_n_steps: int = 400
    max_in_flight_per_actor: int = 2
    num_cpus_per_actor: float = 0.25
    seed: int | None = None
    timeout_s: float = 120.0
    weights_encoding: str = "fp32"
    weights_delta_tolerance: float = DEFAULT_TOLERANCE

    def __post_init__(self) -> None:
        check_int("num_actors", self.num_actors, 1)
        check_int("envs_per_actor", self.envs_per_actor, 1)
        check_env_stepping(self.env_stepping)
        check_int("steps_per_env", self.steps_per_env, 1)
        check_int("weight_sync_every_n_steps", self.weight_sync_every_n_steps, 1)
        check_int("max_in_flight_per_actor", self.max_in_flight_per_actor, 1)
        check_real("num_cpus_per_actor", self.num_cpus_per_actor, low=0.0)
        if self.seed is not None:
            check_int("seed", self.seed, 0)
        check_real("timeout_s", self.timeout_s, low=0.0, strict=True)
        check_encoding(self.weights_encoding)
        check_real("weights_delta_tolerance", self.weights_delta_tolerance, low=0.0, strict=True)

    @property
    def num_envs(self) -> int:
        return self.num_actors * self.envs_per_actor


#: V-trace's fleet where it differs from :class:`ActorFleet`'s defaults: trajectories of
#: ``T = 32`` steps (a V-trace unroll; IMPALA used 20-100) from 8 envs per actor, so that one
#: trajectory is a ``[32, 8]`` time-major batch and each actor pulls weights once per
#: trajectory (256 = 8 x 32 env steps); 2 such actors fill CartPole's 2-core laptop.
VTRACE_FLEET = ActorFleet(
    num_actors=2, envs_per_actor=8, steps_per_env=32, weight_sync_every_n_steps=256
)


def take_fleet(fleet: ActorFleet | None, default: ActorFleet, settings: dict[str, Any]):
    """The fleet a collector runs: ``fleet`` (or ``default``) with ``settings`` replaced."""
    if fleet is not None and not isinstance(fleet, ActorFleet):
        raise TypeError(f"fleet must be an ActorFleet, got {type(fleet).__name__}")
    return with_settings(fleet or default, settings)


class RayActorCollector(BaseCollector[TStats], Generic[TStats]):
    """A collector over a fleet of Ray actors; see the module docstring.

    Subclasses call :meth:`_start` at the end of their constructor and implement
    :meth:`_publish_weights`, :meth:`_accept` and :meth:`_summarise`.
    """

    #: The actor method the pool keeps calling (returns a dict with "env_steps", "episodes",
    #: "returns", "lens" and "weights_version").
    actor_method: str
    #: Names the collector in errors.
    name: str
    #: What the inference server returns in SEED mode (``central_inference``).
    server_kind: Kind

    #: The inference server's metrics reported in the collect stats.
    INFERENCE_STATS = (
        "version",
        "requests_per_s",
        "mean_batch_rows",
        "batch_fill",
        "queue_ms_p50",
        "queue_ms_p99",
        "caller_restarts",
    )

    def __init__(
        self,
        policy: Policy | Algorithm,
        *,
        fleet: ActorFleet,
        buffer: ReplayBuffer | None,
        collect_stats_class: type[TStats],
        central_inference: CentralInference | None = None,
    ) -> None:
        acting = policy.policy if isinstance(policy, Algorithm) else policy
        if central_inference is not None:
            if not isinstance(central_inference, CentralInference):
                raise TypeError(
                    "central_inference must be a CentralInference (or None), got "
                    f"{type(central_inference).__name__}"
                )
            if any(isinstance(m, torch.nn.RNNBase) for m in acting.modules()):
                raise ValueError(
                    "central inference does not support recurrent policies (the server keeps "
                    "no per-actor state); use central_inference=None for this policy"
                )
        super().__init__(
            policy,
            ActorEnvs(fleet.num_envs, acting.action_space),
            buffer,
            exploration_noise=True,
            collect_stats_class=collect_stats_class,
            raise_on_nan_in_buffer=False,  # the core actor steps reject non-finite rollouts
        )
        self.fleet = fleet
        self.central_inference = central_inference
        self._timeout_s = float(fleet.timeout_s)
        self._last_return_time: float | None = None  # set by the first collect()
        self._ready_at_start = 0  # finished rollouts waiting when the last collect() began
        self._actors_down = 0  # as of the last collect(): warn when it changes

    def _start(self, actor_cls: type, actor_kwargs: Callable[[int], dict[str, Any]]) -> None:
        """Start the weights server (or, in SEED mode, the inference server) and the actors
        (``actor_kwargs(i)`` for actor ``i``)."""
        import ray

        from rl_dist_ext.ray_actors import (
            InferenceServerHandle,
            cluster_gpus,
            start_inference_server,
            start_parameter_server,
            start_restartable_actor,
        )

        seed_mode: dict[str, Any] = {}
        if self.central_inference is None:
            self.env.weights_server = start_parameter_server(
                timeout_s=self._timeout_s,
                weights_encoding=self.fleet.weights_encoding,
                delta_tolerance=self.fleet.weights_delta_tolerance,
            )
        else:
            settings = self.central_inference
            handle = start_inference_server(
                TianshouPolicyFactory(self.policy, self.server_kind),
                settings.server_config(),
                num_cpus=settings.num_cpus,
                num_gpus=settings.gpus(cluster_gpus()),
            )
            self.env.inference = InferenceServerHandle(handle)
            seed_mode["inference_server"] = handle
        self._publish_weights()
        handles = [
            start_restartable_actor(
                actor_cls,
                num_cpus=self.fleet.num_cpus_per_actor,
                env_stepping=self.fleet.env_stepping,
                **actor_kwargs(i),
                **seed_mode,
            )
            for i in range(self.fleet.num_actors)
        ]
        self.env.pool = ActorPool(
            handles, self.actor_method, max_in_flight=self.fleet.max_in_flight_per_actor
        )
        if self.env.inference is not None:  # booted while the actors did; constructor errors
            ray.get(self.env.inference.handle.get_version.remote(), timeout=self._timeout_s)
        wait_ready(handles, self._timeout_s, self.name)

    @property
    def weights_sink(self) -> Any:
        """Where the learner's weights go: the inference server (SEED) or the parameter
        server (both have ``publish(weights, version)``)."""
        return self.env.inference if self.env.inference is not None else self.env.weights_server

    def server_cpus(self) -> float:
        """The CPUs the inference server asks for (0 outside SEED mode)."""
        return 0.0 if self.central_inference is None else self.central_inference.num_cpus

    # ---- what subclasses say ------------------------------------------------------------------
    @abstractmethod
    def _publish_weights(self, *, again: bool = False) -> int:
        """Publish the learner's weights if they are newer (or ``again``: the inference
        server was restarted and lost them); return the version published."""

    @abstractmethod
    def _accept(self, result: dict[str, Any]) -> bool:
        """Take one finished rollout (``False``: no room now; it is offered again next time)."""

    def _ready_to_return(self) -> bool:
        """Whether ``collect()`` may return once it has the asked steps (e.g. replay filled)."""
        return True

    @abstractmethod
    def _summarise(self, results: list[dict[str, Any]]) -> TStats:
        """The stats of one ``collect()``; :meth:`_common_stats` gives the shared fields."""

    # ---- BaseCollector's interface ------------------------------------------------------------
    def reset_env(
        self, gym_reset_kwargs: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Start new episodes in every actor's envs (after the rollouts already queued)."""
        import ray

        if gym_reset_kwargs:
            raise ValueError(f"{self.name} does not support gym_reset_kwargs")
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
    ) -> TStats:
        if random:
            raise ValueError(
                f"{self.name} does not support random=True: its actors always act with their "
                "own exploration"
            )
        if render or gym_reset_kwargs:
            raise ValueError(f"{self.name} does not support render or gym_reset_kwargs")
        started = time.monotonic()
        self._actor_pool.resume()  # acting paused by pause_acting() goes on
        if self._last_return_time is None:  # the actors get their first rollouts only now
            self._last_return_time = started
        inference = self.env.inference
        self._publish_weights(again=inference is not None and inference.needs_weights())
        results = self._gather(n_step=n_step, n_episode=n_episode)
        stats = self._summarise(results)
        self._last_return_time = time.monotonic()
        self.collect_step += stats.n_collected_steps
        self.collect_episode += stats.n_collected_episodes
        self.collect_time += time.monotonic() - started
        return stats

    def pause_acting(self) -> None:
        """Stop acting until the next ``collect()``: the rollouts in flight finish (the next
        ``collect()`` returns them first) and no new ones start. Between two ``collect()`` calls
        the actors otherwise keep stepping their envs (``max_in_flight_per_actor`` rollouts
        each); pause them where steps taken meanwhile would go unseen, e.g. while a clock that
        leaves out the policy's evaluation is stopped for it. The next ``collect()`` finds the
        drained rollouts waiting (its ``queue_fill`` counts them). A GorilaDQN learner whose
        sample waits on the rate limiter resumes acting: it waits for the actors' inserts."""
        results = self._actor_pool.pause(timeout_s=self._timeout_s)
        self.env.waiting.extend(result.value for result in results)
        if self._actor_pool.num_in_flight():
            log.warning(
                "%s.pause_acting: %d rollouts still in flight after %ss; they finish meanwhile "
                "and wait for the next collect()",
                self.name,
                self._actor_pool.num_in_flight(),
                self._timeout_s,
            )

    def close(self) -> None:
        """Stop the actors and the weights server."""
        super().close()  # closes ``self.env``: the actors and the weights server

    # ---- internals ----------------------------------------------------------------------------
    @property
    def _actor_pool(self) -> ActorPool:
        if self.env.pool is None:
            raise RuntimeError(f"this {self.name} is closed")
        return self.env.pool

    def _gather(self, *, n_step: int | None, n_episode: int | None) -> list[dict[str, Any]]:
        """Finished rollouts (those waiting first), until they hold ``n_step`` steps or
        ``n_episode`` episodes; rollouts :meth:`_accept` has no room for wait for the next
        call."""
        results: list[dict[str, Any]] = []
        steps = episodes = 0
        deadline = time.monotonic() + self._timeout_s
        waiting = self.env.waiting
        self._take_finished(timeout_s=0.0)
        self._ready_at_start = len(waiting)  # what finished while the learner trained
        while True:
            while waiting and self._accept(waiting[0]):
                result = waiting.pop(0)
                results.append(result)
                steps += result["env_steps"]
                episodes += result["episodes"]
            enough = (n_step and steps >= n_step) or (n_episode and episodes >= n_episode)
            if (enough or waiting) and self._ready_to_return():
                return results
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.name}: the actors delivered {steps} steps / {episodes} episodes "
                    f"in {self._timeout_s}s, fewer than asked (n_step={n_step}, "
                    f"n_episode={n_episode}); actor failures so far: "
                    f"{self._actor_pool.stats.failures}"
                )
            self._take_finished(timeout_s=1.0)

    def _take_finished(self, *, timeout_s: float) -> None:
        """Move the rollouts that finish within ``timeout_s`` to ``env.waiting`` (where the
        next :meth:`_gather` takes them) and give their actors new ones."""
        self.env.waiting.extend(r.value for r in self._actor_pool.wait(timeout_s=timeout_s))

    def _common_stats(self, results: list[dict[str, Any]], learner_version: int) -> dict[str, Any]:
        """The :class:`ActorCollectStats` fields of ``results``."""
        steps = sum(r["env_steps"] for r in results)
        lag: PolicyLag = policy_lag(learner_version, [r["weights_version"] for r in results])
        pool = self._actor_pool.stats
        elapsed = time.monotonic() - (self._last_return_time or time.monotonic())
        returns = [r["returns"] for r in results]
        lens = [r["lens"] for r in results]
        return {
            "n_collected_steps": steps,
            "n_collected_episodes": sum(r["episodes"] for r in results),
            "returns": np.concatenate(returns).astype(float) if returns else np.zeros(0),
            "lens": np.concatenate(lens).astype(int) if lens else np.zeros(0, int),
            "env_steps_per_s": steps / max(elapsed, 1e-9),
            "weights_version": learner_version,
            "policy_lag_mean": lag.mean,
            "policy_lag_max": lag.max,
            "actors": {
                "num_actors": self.fleet.num_actors,
                "failures": pool.failures,
                "rollouts_lost": pool.calls_lost,
                **self._health(),
            },
            "inference": self._inference_stats(),
        }

    def _health(self) -> dict[str, int]:
        """Actors down (lost, not answering since) and ``degraded`` (1 while any is), with a
        warning when that changes (e.g. a lost node whose actors have nowhere to restart)."""
        down = self._actor_pool.num_down
        if down != self._actors_down:
            if down:
                log.warning(
                    "%s runs degraded: %d of %d actors are down (restarting, or waiting for "
                    "resources to restart on); collecting goes on with the others",
                    self.name,
                    down,
                    self.fleet.num_actors,
                )
            else:
                log.warning("%s: all %d actors are up again", self.name, self.fleet.num_actors)
            self._actors_down = down
        return {"down": down, "degraded": int(down > 0)}

    def _inference_stats(self) -> dict[str, float]:
        if self.env.inference is None:
            return {}
        stats = self.env.inference.stats()
        return {k: float(v) for k, v in stats.items() if k in self.INFERENCE_STATS}


class ActorEnvs:
    """A collector's envs as ``BaseCollector`` sees its env (a length, an action space,
    ``close``): they live in the actors of ``pool``, whose weights come from
    ``weights_server`` (or, in SEED mode, from the ``inference`` server); closing stops them.
    ``waiting`` holds finished rollouts the collector had no room for yet."""

    def __init__(self, num_envs: int, action_space: gym.Space) -> None:
        self._num_envs = num_envs
        self.action_space = action_space
        self.pool: ActorPool | None = None
        self.weights_server: ParameterServerClient | None = None
        self.inference: InferenceServerHandle | None = None
        self.waiting: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return self._num_envs

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.weights_server is not None:
            self.weights_server.close()
            self.weights_server = None
        if self.inference is not None:
            self.inference.close()
            self.inference = None
        self.waiting.clear()


def check_env_factory(
    env_factory: Any,
    *,
    owner: str,
    check_env: Callable[[Any], None],
    env_type: type = gym.Env,
    env_kind: str = "a gymnasium.Env",
) -> None:
    """Build one env here, before any actor starts, check that it is an ``env_type`` (with a
    Box observation space, for gymnasium envs) and then with ``check_env`` (raises), and check
    that ``env_factory`` pickles (it is sent to the actors)."""
    import cloudpickle

    if not callable(env_factory):
        raise TypeError(f"env_factory must be a callable returning {env_kind}, got {env_factory!r}")
    try:
        env = env_factory()
    except Exception as error:
        raise ValueError(f"env_factory failed to build an environment: {error!r}") from error
    try:
        if not isinstance(env, env_type):
            raise TypeError(f"env_factory must return {env_kind}, got {type(env).__name__}")
        if isinstance(env, gym.Env) and not isinstance(env.observation_space, gym.spaces.Box):
            raise TypeError(
                f"{owner} needs a Box observation space (stored as float32, or uint8 for "
                f"pixels), the env has {env.observation_space!r}"
            )
        check_env(env)
    finally:
        env.close()
    try:
        cloudpickle.dumps(env_factory)
    except Exception as error:
        raise TypeError(
            f"env_factory must be picklable (it is sent to the actors): {error!r}"
        ) from error


def ensure_ray() -> None:
    """Start a one-node Ray if none is running (what a collector does on a laptop)."""
    import ray

    if not ray.is_initialized():
        ray.init()


def check_cpus(owner: str, wanted: float) -> None:
    """Refuse, before anything starts, CPU asks that the running cluster has no room for."""
    from rl_dist_ext.ray_actors import check_resources_fit

    check_resources_fit(
        owner,
        {"CPU": wanted},
        how_to_lower="lower num_cpus_per_actor (actors mostly step envs and wait) or num_actors",
        free=True,
    )


def wait_ready(handles: list, timeout_s: float, owner: str) -> None:
    """Wait until every actor answers, up to ``timeout_s`` each (or the longer floor the
    environment sets: :func:`rl_dist_ext.validation.start_timeout_s`)."""
    import ray

    timeout_s = start_timeout_s(timeout_s)
    refs = [h.ready.remote() for h in handles]
    for index, ref in enumerate(refs):
        try:
            ray.get(ref, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(
                f"{owner}: actor {index} did not start within {timeout_s}s"
            ) from None
        except ray.exceptions.RayError as error:
            raise RuntimeError(f"{owner}: actor {index} failed to start: {error}") from error
