"""Tianshou's buffer kernels come from numba's on-disk cache in every process but the first
(tianshou_plugins/kernel_cache.py): an actor process no longer compiles them on start."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# What an actor process does first: import the package, build Tianshou's VectorReplayBuffer
# (its Collector's), and report how numba got each kernel.
BUILD_A_VECTOR_BUFFER = """
import json
import tianshou_plugins
from tianshou.data import VectorReplayBuffer
from tianshou.data.buffer import manager

VectorReplayBuffer(8, 2)
print(json.dumps({
    kernel.__name__: {"hits": sum(kernel.stats.cache_hits.values()),
                      "misses": sum(kernel.stats.cache_misses.values())}
    for kernel in (manager._prev_index, manager._next_index)
}))
"""


def kernel_stats() -> dict[str, dict[str, int]]:
    done = subprocess.run(
        [sys.executable, "-c", BUILD_A_VECTOR_BUFFER],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.subprocess
def test_a_second_process_loads_tianshous_buffer_kernels_from_the_cache():
    kernel_stats()  # compiles and writes the cache, unless an earlier process did
    second = kernel_stats()
    assert second == {
        "_prev_index": {"hits": 1, "misses": 0},
        "_next_index": {"hits": 1, "misses": 0},
    }, f"the kernels were compiled again: {second}"


def test_caching_the_kernels_twice_is_harmless():
    from tianshou_plugins.kernel_cache import cache_tianshou_buffer_kernels

    assert cache_tianshou_buffer_kernels() and cache_tianshou_buffer_kernels()
