"""How an actor steps its envs: one after another, on threads, or in processes.

An actor's envs form one Tianshou vector env, which sends every env its action and then
receives every result. ``"sequential"`` (Tianshou's ``DummyVectorEnv``) steps them one after
another in the actor's thread: right for fast envs, whose step costs less than a handoff.
``"threads"`` (:class:`ThreadedVectorEnv`) gives each env a thread of its own, so the steps
overlap wherever a step releases the GIL: a simulator written in C, I/O, a remote service, a
wait (the benchmarks' 2 ms CartPole). ``"processes"`` (Tianshou's ``SubprocVectorEnv``, spawned:
forking a Ray worker's threads is unsafe) gives each env a process of its own, for slow envs
written in Python, at the cost of a process per env and a pickle per step.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import gymnasium as gym
from tianshou.env import BaseVectorEnv, DummyVectorEnv, SubprocVectorEnv
from tianshou.env.worker import DummyEnvWorker, EnvWorker

from rl_dist_ext.validation import check_choice

#: the ways an actor steps its envs (``ActorFleet.env_stepping``)
ENV_STEPPINGS = ("sequential", "threads", "processes")


class ThreadEnvWorker(DummyEnvWorker):
    """A Tianshou env worker whose env lives on a thread of its own: it is built, stepped,
    reset and closed there. ``send`` starts a step or reset and returns; ``recv`` waits for it
    (and raises what the env raised)."""

    def __init__(self, env_fn: Callable[[], gym.Env]) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="env")
        self._pending: Future | None = None
        try:
            self.env = self._on_thread(env_fn)
            EnvWorker.__init__(self, env_fn)
        except BaseException:
            self._thread.shutdown(wait=True)
            raise

    def _on_thread(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        return self._thread.submit(fn, *args, **kwargs).result()

    def get_env_attr(self, key: str) -> Any:
        return self._on_thread(super().get_env_attr, key)

    def set_env_attr(self, key: str, value: Any) -> None:
        self._on_thread(super().set_env_attr, key, value)

    def send(self, action: Any, **kwargs: Any) -> None:
        self._pending = self._thread.submit(super().send, action, **kwargs)

    def recv(self) -> Any:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()
        return self.result

    def reset(self, **kwargs: Any) -> Any:
        return self._on_thread(super().reset, **kwargs)

    def seed(self, seed: int | None = None) -> list[int] | None:
        return self._on_thread(super().seed, seed)

    def render(self, **kwargs: Any) -> Any:
        return self._on_thread(super().render, **kwargs)

    def close_env(self) -> None:
        try:
            self._on_thread(self.env.close)
        finally:
            self._thread.shutdown(wait=True)


class ThreadedVectorEnv(BaseVectorEnv):
    """Tianshou's vector env over :class:`ThreadEnvWorker` s: every env steps on its own
    thread, all of them at once (synchronously: Tianshou's ``wait_num`` and ``timeout`` are
    not offered). Closing closes every env, even where one's ``close`` raises; an env that
    fails to build closes those built before it."""

    def __init__(self, env_fns: list[Callable[[], gym.Env]]) -> None:
        built: list[ThreadEnvWorker] = []

        def worker(env_fn: Callable[[], gym.Env]) -> ThreadEnvWorker:
            built.append(ThreadEnvWorker(env_fn))
            return built[-1]

        try:
            super().__init__(env_fns, worker)
        except BaseException:
            for made in built:
                made.close()
            raise

    def close(self) -> None:
        errors = []
        for worker in self.workers:
            try:
                worker.close()
            except Exception as error:  # close the others first, then raise the first
                errors.append(error)
        self.is_closed = True
        if errors:
            raise errors[0]


def check_env_stepping(value: object) -> str:
    """``value`` if it names one of :data:`ENV_STEPPINGS`, else a ``ValueError`` naming
    ``env_stepping``."""
    return check_choice("env_stepping", value, ENV_STEPPINGS)


def make_vector_env(env_factory: Callable[[], gym.Env], num_envs: int, stepping: str):
    """``num_envs`` envs from ``env_factory`` as one Tianshou vector env stepped as
    ``stepping`` says (see the module docstring)."""
    env_fns = [env_factory] * num_envs
    stepping = check_env_stepping(stepping)
    if stepping == "threads":
        return ThreadedVectorEnv(env_fns)
    if stepping == "processes":
        return SubprocVectorEnv(env_fns, context="spawn")
    return DummyVectorEnv(env_fns)
