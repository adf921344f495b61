"""How an actor steps its envs (``tianshou_plugins.vector_envs``): threads step the same
episodes as Tianshou's sequential ``DummyVectorEnv``, overlap their steps, keep each env on a
thread of its own and pass an env's error on; a bad ``env_stepping`` is refused by name."""

from __future__ import annotations

import threading

import gymnasium as gym
import numpy as np
import pytest
from tianshou.env import DummyVectorEnv

from tianshou_plugins.actor_collector import ActorFleet
from tianshou_plugins.vector_envs import (
    ThreadedVectorEnv,
    check_env_stepping,
    make_vector_env,
)


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def run(envs, steps: int, seed: int) -> list[tuple]:
    """Seeded episodes under seeded random actions: every step's results."""
    rng = np.random.default_rng(seed)
    envs.seed([seed + i for i in range(envs.env_num)])
    obs, _ = envs.reset()
    record = [(obs.copy(),)]
    for _ in range(steps):
        obs, rew, term, trunc, _ = envs.step(rng.integers(2, size=envs.env_num))
        record.append((obs.copy(), rew.copy(), term.copy(), trunc.copy()))
        done = np.flatnonzero(term | trunc)
        if done.size:
            obs, _ = envs.reset(done)
            record.append((done.copy(), obs.copy()))
    envs.close()
    return record


def test_threads_step_the_same_episodes_as_the_sequential_vector_env():
    threaded = run(ThreadedVectorEnv([cartpole] * 4), 300, seed=7)
    sequential = run(DummyVectorEnv([cartpole] * 4), 300, seed=7)
    assert len(threaded) == len(sequential) > 300  # episodes ended and were reset
    for got, want in zip(threaded, sequential, strict=True):
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)


class Rendezvous(gym.Wrapper):
    """Every step waits at a barrier for the other envs' steps: a vector env that steps them
    one after another never gets there (the barrier breaks after ``timeout_s``)."""

    def __init__(self, env: gym.Env, barrier: threading.Barrier, timeout_s: float) -> None:
        super().__init__(env)
        self.barrier, self.timeout_s = barrier, timeout_s

    def step(self, action):
        self.barrier.wait(timeout=self.timeout_s)
        return self.env.step(action)


def test_threads_step_the_envs_at_once_each_on_a_thread_of_its_own():
    barrier = threading.Barrier(4)
    homes: list[int] = []

    def make() -> gym.Env:
        homes.append(threading.get_ident())
        return Rendezvous(cartpole(), barrier, timeout_s=10)

    envs = ThreadedVectorEnv([make] * 4)
    envs.reset()
    for _ in range(3):
        envs.step(np.zeros(4, dtype=int))  # each step meets the other three at the barrier
    envs.close()
    assert len(set(homes)) == 4 and threading.get_ident() not in homes

    barrier = threading.Barrier(2)
    sequential = DummyVectorEnv([lambda: Rendezvous(cartpole(), barrier, timeout_s=0.2)] * 2)
    sequential.reset()
    with pytest.raises(threading.BrokenBarrierError):
        sequential.step(np.zeros(2, dtype=int))
    sequential.close()


class Failing(gym.Wrapper):
    def step(self, action):
        raise RuntimeError("the simulator crashed")


def test_an_envs_error_reaches_the_actor_and_the_threads_end():
    envs = ThreadedVectorEnv([cartpole, lambda: Failing(cartpole())])
    envs.reset()
    with pytest.raises(RuntimeError, match="the simulator crashed"):
        envs.step(np.zeros(2, dtype=int))
    workers = list(envs.workers)
    envs.close()
    assert all(w._thread._shutdown for w in workers)


@pytest.mark.parametrize("stepping", ["sequential", "threads"])
def test_make_vector_env_builds_what_it_is_asked_for(stepping):
    envs = make_vector_env(cartpole, 3, stepping)
    kind = ThreadedVectorEnv if stepping == "threads" else DummyVectorEnv
    assert isinstance(envs, kind) and envs.env_num == 3
    envs.close()


@pytest.mark.parametrize("bad", ["thread", "", None, 2, ["threads"]])
def test_a_bad_env_stepping_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=r"env_stepping must be one of \['sequential', "):
        check_env_stepping(bad)
    with pytest.raises(ValueError, match="env_stepping"):
        ActorFleet(env_stepping=bad)


class FailingClose(gym.Wrapper):
    def close(self):
        raise RuntimeError("close failed")


def test_closing_closes_every_env_even_where_one_close_raises():
    closed = []

    class Recording(gym.Wrapper):
        def close(self):
            closed.append(threading.get_ident())
            super().close()

    envs = ThreadedVectorEnv([lambda: FailingClose(cartpole()), lambda: Recording(cartpole())])
    assert envs.get_env_attr("spec")[0].id == "CartPole-v1"  # read on the env's own thread
    workers = list(envs.workers)
    with pytest.raises(RuntimeError, match="close failed"):
        envs.close()
    assert len(closed) == 1 and closed[0] != threading.get_ident()
    assert all(w._thread._shutdown for w in workers)


def test_an_env_that_fails_to_build_leaves_no_thread_or_env_behind():
    before = threading.active_count()
    closed = []

    class Recording(gym.Wrapper):
        def close(self):
            closed.append(True)
            super().close()

    def broken() -> gym.Env:
        raise OSError("no simulator licence")

    with pytest.raises(OSError, match="no simulator licence"):
        ThreadedVectorEnv([lambda: Recording(cartpole()), broken])
    assert closed == [True] and threading.active_count() == before
