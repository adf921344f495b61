"""What the Tianshou races share: a clock in the trainer's callbacks, greedy tests, one run.

A run is Tianshou's own ``algorithm.run_training`` (off- or on-policy trainer params), timed
in training seconds (from the call, the trainer's greedy tests not counted) until a test
averages >= the target or until the cap (the ``training_fn`` stops the run at its next
training step).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
from race import TARGET
from slow_env import slow_cartpole, slower_cartpole
from tianshou.algorithm.algorithm_base import Policy
from tianshou.data import Collector
from tianshou.env import DummyVectorEnv
from tianshou.trainer import OffPolicyTrainerParams, OnPolicyTrainerParams

TEST_EPISODES = 10
#: the CartPole races' envs: CartPole-v1, and the same with 2 ms of latency per step
ENVS = ("CartPole-v1", "SlowCartPole-v1")
ACTOR_TIMEOUT_S = 300.0  # actor start-up (not timed) is slow on a busy 2-core machine


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


ENV_FACTORIES: dict[str, Callable[[], gym.Env]] = {
    "CartPole-v1": cartpole,
    "SlowCartPole-v1": slow_cartpole,
    "SlowerCartPole-v1": slower_cartpole,
}


class _TimeCapReached(Exception):
    """Raised by :meth:`RunClock.training_fn` once a run has used its ``--max-seconds``."""


class RunClock:
    """The trainer's callbacks that time one run in training seconds (the greedy tests'
    time, reported by :class:`RecordingCollector`, not counted): a cap, the env steps, the
    moment of the target."""

    def __init__(self, max_seconds: float, target: float = TARGET) -> None:
        self.max_seconds = max_seconds
        self.target = target
        self.env_steps = 0
        self.curve: list[list[float]] = []  # [seconds, env steps, test return] of every test
        self.seconds_to_target: float | None = None
        self.best_test_return: float | None = None
        self.test_seconds = 0.0
        #: called before each test, inside the clock: a Ray-actor collector's pause_acting, so
        #: that its actors take no env steps while the clock is stopped for the test
        self.before_test: Callable[[], None] | None = None
        self._start = time.perf_counter()

    def start(self) -> None:
        self._start = time.perf_counter()
        self.test_seconds = 0.0

    def elapsed(self) -> float:
        """Training seconds since :meth:`start`: the wall time less the tests'."""
        return time.perf_counter() - self._start - self.test_seconds

    def training_fn(self, epoch: int, env_step: int) -> None:
        self.env_steps = env_step
        if self.elapsed() > self.max_seconds:
            raise _TimeCapReached

    def test_fn(self, epoch: int, env_step: int | None) -> None:
        self.env_steps = env_step or 0
        if self.before_test is not None:
            self.before_test()

    def stop_fn(self, best_test_return: float) -> bool:
        self.best_test_return = best_test_return  # the trainer passes its best test return
        if best_test_return >= self.target and self.seconds_to_target is None:
            self.seconds_to_target = self.elapsed()
        return best_test_return >= self.target

    def record_test(self, mean_return: float) -> None:
        self.curve.append([round(self.elapsed(), 2), self.env_steps, mean_return])


class RecordingCollector(Collector):
    """Tianshou's ``Collector`` for the trainer's tests: adds each test's mean return to the
    clock's curve and its time to the clock's test seconds (not training time)."""

    def __init__(self, policy: Policy, envs: Any, clock: RunClock) -> None:
        super().__init__(policy, envs)
        self.clock = clock

    def collect(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            stats = super().collect(*args, **kwargs)
        finally:
            self.clock.test_seconds += time.perf_counter() - started
        if stats.returns_stat is not None:
            self.clock.record_test(float(stats.returns_stat.mean))
        return stats


def test_collector(policy: Policy, seed: int, clock: RunClock | None = None) -> Collector:
    """Greedy tests on plain CartPole-v1 (SlowCartPole has the same dynamics); with ``clock``,
    each test is recorded on its curve and not counted as training time."""
    envs = DummyVectorEnv([lambda: gym.make("CartPole-v1")] * TEST_EPISODES)
    envs.seed([50_000 + 100 * seed + i for i in range(TEST_EPISODES)])
    if clock is None:
        return Collector(policy, envs)
    return RecordingCollector(policy, envs, clock)


def train_until_target(
    algorithm: Any,
    training_collector: Any,
    test: Collector,
    clock: RunClock,
    args: Any,
    *,
    on_policy: bool = False,
    **step_params: Any,
) -> dict:
    """``algorithm.run_training`` until the target or the cap; the run's timing and steps."""
    params_class = OnPolicyTrainerParams if on_policy else OffPolicyTrainerParams
    params = params_class(
        training_collector=training_collector,
        test_collector=test,
        max_epochs=1_000_000,  # the target or the time cap ends the run
        epoch_num_steps=args.epoch_steps,
        test_step_num_episodes=TEST_EPISODES,
        training_fn=clock.training_fn,
        test_fn=clock.test_fn,
        stop_fn=clock.stop_fn,
        show_progress=False,
        verbose=False,
        **step_params,
    )
    # Actors that kept stepping while a test runs would take env steps off the clock: they
    # stop for each test (the rollouts in flight finish on the clock, before it stops).
    clock.before_test = getattr(training_collector, "pause_acting", None)
    clock.start()
    with contextlib.suppress(_TimeCapReached):  # the cap ends a run that missed the target
        algorithm.run_training(params)
    return {
        "seconds_to_target": clock.seconds_to_target,
        "trained_seconds": round(clock.elapsed(), 2),  # as the curve rounds it
        "env_steps": clock.env_steps,
        "best_test_return": clock.best_test_return,
        "curve": clock.curve,
    }


def collection_rate(
    collector, *, chunk: int, seconds: float, warmup_s: float, empty_buffer: bool
) -> dict:
    """Env steps per second a Ray-actor collector delivers with no learner: ``collect(n_step=
    chunk)`` over and over for ``warmup_s`` (not counted), then for ``seconds``. A collect
    returns every rollout finished since the last one (at least ``chunk`` steps); the actors
    keep stepping between calls. ``empty_buffer``: empty the collector's buffer after each
    collect, as an on-policy trainer does after its update (a V-trace collector's buffer holds
    one collect's trajectories); the fewest steps one collect returned are reported."""

    def collect() -> int:
        steps = collector.collect(n_step=chunk).n_collected_steps
        if empty_buffer:
            collector.reset_buffer(keep_statistics=True)
        return steps

    warm_up_end = time.perf_counter() + warmup_s
    while time.perf_counter() < warm_up_end:
        collect()
    counts, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        counts.append(collect())
    measured = time.perf_counter() - start
    return {
        "env_steps": sum(counts),
        "seconds": measured,
        "env_steps_per_s": sum(counts) / measured,
        "collects": len(counts),
        "fewest_steps_per_collect": min(counts, default=0),
    }
