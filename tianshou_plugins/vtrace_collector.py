"""``VTraceCollector``: IMPALA's asynchronous actors behind Tianshou's collector interface.

N Ray actors (:class:`~tianshou_plugins.actor.VTraceActor`) each step ``envs_per_actor`` envs
with a local copy of the policy (one forward pass per vector step; in SEED mode Tianshou's own
``Collector`` asks the inference server), and return fixed-length
trajectories (``steps_per_env`` steps of every env; episode ends and truncations marked, the
rollout's end a cut) with the behaviour log-probs and the weights version that acted. Each keeps
``max_in_flight_per_actor`` trajectories queued, so acting goes on while the learner trains and
runs at most that far ahead. Actors pull the newest weights every ``weight_sync_every_n_steps``
of their env steps.

:meth:`collect` (what Tianshou's ``OnPolicyTrainer`` calls each training step) publishes the
learner's weights if they are newer, then writes the trajectories finished meanwhile into its
buffer (one sub-buffer per env row; the ``policy`` field holds each step's behaviour log-prob,
row, time index and acting version) and returns, waiting only while fewer than the asked env
steps are in. The trainer hands that buffer to :meth:`VTrace.update
<tianshou_plugins.VTrace>`, which rebuilds the trajectories, and empties it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from tianshou.data import VectorReplayBuffer

from rl_dist_ext.validation import check_int
from tianshou_plugins.actor import VTraceActor
from tianshou_plugins.actor_collector import (
    VTRACE_FLEET,
    ActorCollectStats,
    ActorFleet,
    RayActorCollector,
    check_cpus,
    check_env_factory,
    ensure_ray,
    take_fleet,
)
from tianshou_plugins.central_inference import CentralInference
from tianshou_plugins.vtrace import VTrace, steps_from_trajectory


@dataclass(kw_only=True)
class VTraceCollectStats(ActorCollectStats):
    """:class:`~tianshou_plugins.actor_collector.ActorCollectStats` plus the trajectory queue."""

    num_trajectories: int = 0
    #: Trajectories that had finished and were waiting when ``collect()`` began, over what the
    #: actors may hold (``num_actors x max_in_flight_per_actor``): near 1, acting is ahead of
    #: learning; near 0, the learner waits for actors.
    queue_fill: float = 0.0


class VTraceCollector(RayActorCollector[VTraceCollectStats]):
    """Collect fixed-length trajectories with ``num_actors`` Ray actors; see the module doc.

    Args:
        algorithm: the :class:`~tianshou_plugins.VTrace` being trained (its policy acts; its
            gradient-update count versions the weights).
        env_factory: builds one environment (picklable; it runs inside the actors).
        fleet: the actors (:class:`~tianshou_plugins.actor_collector.ActorFleet`;
            ``steps_per_env`` is the trajectory length ``T``); its fields may also be given as
            keywords (``num_actors=2``), which replace those of ``fleet`` (default
            :data:`~tianshou_plugins.actor_collector.VTRACE_FLEET`).
        max_trajectories_per_collect: the most trajectories one ``collect()`` returns (the
            buffer's size); more finished ones wait for the next call.
        central_inference: SEED mode (:class:`~tianshou_plugins.CentralInference`): the
            inference server samples every actor's actions and returns their log-probs; the
            actors hold no weights. ``None``: each actor acts with its own copy.
    """

    actor_method = "collect_trajectory"
    name = "VTraceCollector"
    server_kind = "policy"

    def __init__(
        self,
        algorithm: VTrace,
        *,
        env_factory: Callable[[], gym.Env],
        fleet: ActorFleet | None = None,
        max_trajectories_per_collect: int = 16,
        central_inference: CentralInference | None = None,
        **fleet_settings: Any,
    ) -> None:
        fleet = take_fleet(fleet, VTRACE_FLEET, fleet_settings)
        if not isinstance(algorithm, VTrace):
            raise TypeError(
                "VTraceCollector collects for a tianshou_plugins.VTrace algorithm (its weights "
                f"version labels the trajectories), got {type(algorithm).__name__}"
            )
        check_trajectories_per_collect(max_trajectories_per_collect, fleet)
        check_env_factory(
            env_factory,
            owner="VTraceCollector",
            check_env=lambda env: _check_env(env, algorithm.policy),
        )
        rows = max_trajectories_per_collect * fleet.envs_per_actor
        super().__init__(
            algorithm,
            fleet=fleet,
            buffer=VectorReplayBuffer(rows * fleet.steps_per_env, rows),
            collect_stats_class=VTraceCollectStats,
            central_inference=central_inference,
        )
        self._algorithm = algorithm
        self._published_version = -1
        ensure_ray()
        check_cpus(
            "VTraceCollector's actors (num_actors x num_cpus_per_actor) and inference server",
            fleet.num_actors * fleet.num_cpus_per_actor + self.server_cpus(),
        )
        self._start_fleet(env_factory)

    def _start_fleet(self, env_factory: Callable[[], gym.Env]) -> None:
        """Start the weights or inference server and the actors; on any failure, stop them."""
        fleet = self.fleet
        try:
            self._start(
                VTraceActor,
                lambda i: {
                    "policy": self._algorithm.policy,
                    "env_factory": env_factory,
                    "num_envs": fleet.envs_per_actor,
                    "weights_server": self.env.weights_server,
                    "weight_sync_every_n_steps": fleet.weight_sync_every_n_steps,
                    "steps_per_env": fleet.steps_per_env,
                    "actor_index": i,
                    "seed": fleet.seed,
                },
            )
        except BaseException:
            self.close()
            raise

    def _validate_buffer(self) -> None:
        """BaseCollector's check for the buffer this collector builds itself."""
        if not isinstance(self.buffer, VectorReplayBuffer):
            raise TypeError(f"buffer must be a VectorReplayBuffer, got {type(self.buffer)}")

    @property
    def max_steps_per_collect(self) -> int:
        """The most env steps one ``collect()`` can return (the buffer's size)."""
        return self.buffer.maxsize

    # ---- RayActorCollector's hooks ------------------------------------------------------------
    def _collect(self, n_step: int | None = None, n_episode: int | None = None, **kwargs: Any):  # type: ignore[override]
        if n_step is not None and n_step > self.max_steps_per_collect:
            raise ValueError(
                f"collect(n_step={n_step}) asks for more env steps than one collect() can hold "
                f"({self.max_steps_per_collect} = max_trajectories_per_collect x envs_per_actor "
                "x steps_per_env); lower the trainer's collection_step_num_env_steps or raise "
                "max_trajectories_per_collect"
            )
        return super()._collect(n_step=n_step, n_episode=n_episode, **kwargs)

    def _publish_weights(self, *, again: bool = False) -> int:
        """The learner's weights, when it made new ones since the last publish (or again)."""
        if again or self._algorithm.weights_version > self._published_version:
            latest = self._algorithm.versioned_weights()
            self.weights_sink.publish(latest.weights, latest.version)
            self._published_version = latest.version
        return self._published_version

    def _accept(self, result: dict[str, Any]) -> bool:
        """Write the trajectory into the next free rows of the buffer, if they fit."""
        trajectory = result["trajectory"]
        num_rows = trajectory.columns["rewards"].shape[1]
        first = sum(len(b) > 0 for b in self.buffer.buffers)  # rows fill in order
        if first + num_rows > self.buffer.buffer_num:
            return False
        rows = np.arange(first, first + num_rows)
        for step in steps_from_trajectory(trajectory, first_row=first):
            self.buffer.add(step, buffer_ids=rows)
        return True

    def _summarise(self, results: list[dict[str, Any]]) -> VTraceCollectStats:
        capacity = self.fleet.num_actors * self.fleet.max_in_flight_per_actor
        return VTraceCollectStats(
            **self._common_stats(results, self._algorithm.weights_version),
            num_trajectories=len(results),
            queue_fill=min(self._ready_at_start / capacity, 1.0),
        )


def check_trajectories_per_collect(value: Any, fleet: ActorFleet) -> int:
    """``max_trajectories_per_collect`` must let every actor deliver one trajectory."""
    return check_int("max_trajectories_per_collect", value, fleet.num_actors)


def _check_env(env: gym.Env, policy: Any) -> None:
    space = policy.action_space
    if type(env.action_space) is not type(space) or (
        getattr(env.action_space, "shape", None) != getattr(space, "shape", None)
        or getattr(env.action_space, "n", None) != getattr(space, "n", None)
    ):
        raise ValueError(
            f"the env's action space {env.action_space!r} differs from the policy's {space!r}"
        )
