"""Tianshou's numba kernels come from numba's on-disk cache in every process but the first
(tianshou_plugins/kernel_cache.py): an actor process no longer compiles them on start."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# What an actor process does first: import the package, build a policy (a SEED actor's
# ServerPolicy; any trainer's) and Tianshou's VectorReplayBuffer (its Collector's), and report
# how numba got each kernel those constructors compile.
BUILD_A_POLICY_AND_A_VECTOR_BUFFER = """
import json

import gymnasium as gym
import tianshou_plugins
from tianshou.algorithm import algorithm_base
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.data import VectorReplayBuffer
from tianshou.data.buffer import manager
from tianshou.utils.net.common import Net

net = Net(state_shape=(4,), action_shape=2)
DiscreteQLearningPolicy(model=net, action_space=gym.spaces.Discrete(2))
VectorReplayBuffer(8, 2)
kernels = (
    algorithm_base._gae, algorithm_base._nstep_return, manager._prev_index, manager._next_index
)
print(json.dumps({
    kernel.__name__: {"hits": sum(kernel.stats.cache_hits.values()),
                      "misses": sum(kernel.stats.cache_misses.values())}
    for kernel in kernels
}))
"""


def kernel_stats() -> dict[str, dict[str, int]]:
    done = subprocess.run(
        [sys.executable, "-c", BUILD_A_POLICY_AND_A_VECTOR_BUFFER],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.subprocess
def test_a_second_process_loads_tianshous_kernels_from_the_cache():
    kernel_stats()  # compiles and writes the cache, unless an earlier process did
    second = kernel_stats()
    assert second == {
        "_gae": {"hits": 2, "misses": 0},  # two signatures: float64 and float32 values
        "_nstep_return": {"hits": 1, "misses": 0},
        "_prev_index": {"hits": 1, "misses": 0},
        "_next_index": {"hits": 1, "misses": 0},
    }, f"some kernels were compiled again: {second}"


def test_caching_the_kernels_twice_is_harmless():
    from tianshou_plugins.kernel_cache import cache_tianshou_kernels

    assert cache_tianshou_kernels() and cache_tianshou_kernels()


def test_a_tianshou_without_one_of_the_kernels_is_left_as_it_is_and_the_log_says_so(
    monkeypatch, caplog
):
    import logging

    from tianshou.data.buffer import manager

    from tianshou_plugins.kernel_cache import cache_tianshou_kernels

    monkeypatch.delattr(manager, "_prev_index")
    with caplog.at_level(logging.INFO, logger="tianshou_plugins.kernel_cache"):
        assert cache_tianshou_kernels() is False
    assert "no numba kernel manager._prev_index" in caplog.text
