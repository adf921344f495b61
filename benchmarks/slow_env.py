"""SlowCartPole: CartPole-v1 with a fixed latency in every step, a stand-in for a slow simulator.

Shared by the benchmarks, which import it as ``slow_env``: running ``python benchmarks/<x>.py``
puts this folder on ``sys.path``, and Ray adds the driver script's folder to its workers' path,
so env factories that use it can be sent to Ray actors.
"""

from __future__ import annotations

import time

import gymnasium as gym


class SlowStep(gym.Wrapper):
    """Adds a fixed latency to every ``step`` (a slow simulator)."""

    def __init__(self, env: gym.Env, latency_s: float = 0.002) -> None:
        super().__init__(env)
        self.latency_s = latency_s

    def step(self, action):
        time.sleep(self.latency_s)
        return self.env.step(action)


def slow_cartpole() -> gym.Env:
    """CartPole-v1 with 2 ms per step (same dynamics, so evaluate on plain CartPole-v1)."""
    return SlowStep(gym.make("CartPole-v1"))


#: SlowerCartPole's latency per step: what makes Tianshou's PPO over 16 subprocess envs take
#: about a minute to a greedy 450 here (its first run: 14,000 env steps at 231 a second)
SLOWER_LATENCY_S = 0.05


def slower_cartpole() -> gym.Env:
    """CartPole-v1 with 50 ms per step, a simulator whose latency sets the pace of a run."""
    return SlowStep(gym.make("CartPole-v1"), latency_s=SLOWER_LATENCY_S)
