"""Keep every actor of a fleet busy with one kind of call, and survive actors that die.

Used by collectors that drive many acting processes asynchronously (Gorila actors): each actor
has up to ``max_in_flight`` calls of ``method`` running; :meth:`ActorPool.wait` returns finished
results as they come. A call that fails because its actor died is counted (``failures`` and
``calls_lost``) and the actor gets new calls once Ray has restarted it; until one of them
returns, the actor counts as down (:attr:`ActorPool.num_down`: an actor whose node is gone and
that has nowhere to restart stays down, and the fleet runs degraded on the others). Works on
any Ray actor handles; Ray is imported lazily so the module imports without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from rl_dist_ext.validation import check_int


class PoolResult(NamedTuple):
    actor_index: int
    value: Any


@dataclass
class PoolStats:
    calls_submitted: int = 0
    calls_done: int = 0
    calls_lost: int = 0
    calls_raised: int = 0  # the method raised: the error is re-raised to the caller
    failures_per_actor: list[int] = field(default_factory=list)

    @property
    def failures(self) -> int:
        return sum(self.failures_per_actor)


class ActorPool:
    """Up to ``max_in_flight`` calls of ``method(*args)`` on each actor, results as they finish.

    Args:
        handles: Ray actor handles (started with restarts enabled, e.g. through
            :func:`rl_dist_ext.ray_actors.start_restartable_actor`).
        method: name of the actor method to call.
        args: positional arguments of every call.
        max_in_flight: calls kept running per actor (2 hides the round trip).
        retry_after_s: how long an actor whose call failed is left alone before new calls.
        on_failure: called with ``(actor_index, error)`` for every lost call.
    """

    def __init__(
        self,
        handles: Sequence[Any],
        method: str,
        *,
        args: tuple = (),
        max_in_flight: int = 2,
        retry_after_s: float = 1.0,
        on_failure: Callable[[int, BaseException], None] | None = None,
    ) -> None:
        if not handles:
            raise ValueError("handles must name at least one actor")
        check_int("max_in_flight", max_in_flight, 1)
        self._handles = list(handles)
        self._method = method
        self._args = args
        self._max_in_flight = max_in_flight
        self._retry_after_s = retry_after_s
        self._on_failure = on_failure
        self._in_flight: dict[Any, int] = {}  # ObjectRef -> actor index
        self._paused_until = [0.0] * len(self._handles)
        self._down = [False] * len(self._handles)
        self._held = False  # :meth:`pause` until :meth:`resume`: no new calls
        self.stats = PoolStats(failures_per_actor=[0] * len(self._handles))

    @property
    def handles(self) -> list[Any]:
        return list(self._handles)

    @property
    def num_down(self) -> int:
        """Actors whose last call was lost to their death and that have not answered since."""
        return sum(self._down)

    def num_in_flight(self, actor_index: int | None = None) -> int:
        if actor_index is None:
            return len(self._in_flight)
        return sum(1 for i in self._in_flight.values() if i == actor_index)

    def top_up(self) -> None:
        """Submit calls until every actor that is not paused has ``max_in_flight`` running
        (none while the pool is paused: :meth:`pause`)."""
        if self._held:
            return
        now = time.monotonic()
        for index, handle in enumerate(self._handles):
            if self._paused_until[index] > now:
                continue
            for _ in range(self._max_in_flight - self.num_in_flight(index)):
                ref = getattr(handle, self._method).remote(*self._args)
                self._in_flight[ref] = index
                self.stats.calls_submitted += 1

    def wait(self, *, timeout_s: float) -> list[PoolResult]:
        """Results of the calls that finish within ``timeout_s`` (at least one unless it expires).

        Calls are topped up before waiting and after results arrive; calls lost to a dead actor
        are counted and not returned.
        """
        import ray

        self.top_up()
        if not self._in_flight:
            time.sleep(min(timeout_s, self._retry_after_s))
            return []
        done, _ = ray.wait(list(self._in_flight), num_returns=1, timeout=timeout_s)
        if done:  # take everything else that is ready too
            done, _ = ray.wait(list(self._in_flight), num_returns=len(self._in_flight), timeout=0)
        results = [r for r in map(self._take, done) if r is not None]
        self.top_up()
        return results

    def _take(self, ref: Any) -> PoolResult | None:
        """The finished call's result, or None (counted) if its actor died."""
        import ray

        index = self._in_flight.pop(ref)
        try:
            value = ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as error:
            self._lost(index, error)
            return None
        except ray.exceptions.RayTaskError:
            self.stats.calls_raised += 1
            raise
        self.stats.calls_done += 1
        self._down[index] = False
        return PoolResult(index, value)

    def _lost(self, index: int, error: BaseException) -> None:
        self.stats.calls_lost += 1
        self.stats.failures_per_actor[index] += 1
        self._down[index] = True
        self._paused_until[index] = time.monotonic() + self._retry_after_s
        if self._on_failure is not None:
            self._on_failure(index, error)

    def drain(self, *, timeout_s: float) -> list[PoolResult]:
        """Wait for every call in flight (submitting no new ones); return their results."""
        import ray

        results = []
        deadline = time.monotonic() + timeout_s
        while self._in_flight and time.monotonic() < deadline:
            done, _ = ray.wait(
                list(self._in_flight), num_returns=1, timeout=deadline - time.monotonic()
            )
            results += [r for r in map(self._take, done) if r is not None]
        return results

    def pause(self, *, timeout_s: float) -> list[PoolResult]:
        """Submit no new calls until :meth:`resume`; wait for those in flight and return their
        results (the actors are idle when it returns, unless ``timeout_s`` expired first)."""
        self._held = True
        try:
            return self.drain(timeout_s=timeout_s)
        except BaseException:  # a call raised: the error goes to the caller, calls go on
            self._held = False
            raise

    def resume(self) -> None:
        """Submit calls again (from the next :meth:`top_up` or :meth:`wait` on)."""
        self._held = False

    def close(self) -> None:
        """Kill every actor (no restart) and forget the calls in flight."""
        import ray

        for handle in self._handles:
            ray.kill(handle, no_restart=True)
        self._in_flight.clear()
