"""Shared fixtures: one Ray session (2 CPUs) for every test that needs Ray."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def ray_session():
    """``ray.init(num_cpus=2)`` once per test session; shut down at the end."""
    import ray

    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield ray
    ray.shutdown()


def alive_actor_count() -> int:
    """Actors alive in the Ray session (read from the GCS; the dashboard is not running)."""
    from ray._private import state

    return sum(1 for info in state.actors().values() if info["State"] == "ALIVE")
