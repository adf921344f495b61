"""Shared fixtures: one Ray session (2 CPUs) for every test that needs Ray."""

from __future__ import annotations

import os
import time

import pytest

# the test tiers: fast, ray, subprocess, long (tests/tiers.py); script runs in the background of
# the session (tests/script_pool.py); pytester tests the tiers' guard
pytest_plugins = ["tiers", "script_pool", "pytester"]

# torch computes on one thread in this process and in the scripts and Ray workers it starts
# (they inherit the variable; set before anything imports torch). The learners of algorithms
# built in the driver train in this process, next to their actors on a 2-core machine: with a
# thread per core, torch's idle threads spin waiting for the next parallel region, on CPU the
# actors need (an MLP update at batch 128 took 2.5-3.3x the CPU time on two threads as on one
# while other processes ran, and longer in wall time). Ray gives its workers one thread anyway
# (OMP_NUM_THREADS for actors with fewer than 2 CPUs).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Credentials for the test S3 server (tests/test_object_storage.py), set before Ray starts so
# that replay shard actors see them too; the metadata probe of a missing AWS setup is skipped.
for _name, _value in {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_EC2_METADATA_DISABLED": "true",
}.items():
    os.environ.setdefault(_name, _value)


# Property-based tests (hypothesis): a fixed number of examples, no time limit per example (a
# 2-core machine running Ray beside them is slow at times), no example database in the tree.
try:
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile(
        "rl-dist-ext", max_examples=40, deadline=None, database=None, derandomize=True
    )
    _hypothesis_settings.load_profile("rl-dist-ext")
except ImportError:  # the dev extra brings it; the tests that need it import it themselves
    pass


def start_session_ray() -> None:
    """The tests' one-node Ray session: 2 CPUs, no dashboard."""
    import ray

    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)


@pytest.fixture(scope="session")
def ray_session():
    """``ray.init(num_cpus=2)`` once per test session; shut down at the end."""
    import ray

    start_session_ray()
    yield ray
    ray.shutdown()


#: GCS settings that notice a killed raylet within a few seconds (Ray's defaults take ~30 s).
FAST_NODE_DEATH = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
}


@pytest.fixture(scope="module")
def ray_nodes():
    """A Ray cluster of several raylets on this machine (``ray.cluster_utils.Cluster``): a
    head with 1 CPU that the driver joins; tests add and remove worker nodes. The one-node
    session (if it was running) is stopped meanwhile and started again afterwards."""
    import ray
    from ray.cluster_utils import Cluster

    resume = ray.is_initialized()
    ray.shutdown()
    nodes = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,
            "_system_config": FAST_NODE_DEATH,
        },
    )
    ray.init(address=nodes.address, configure_logging=False)
    try:
        yield nodes
    finally:
        ray.shutdown()
        nodes.shutdown()
        if resume:
            start_session_ray()


def alive_actor_count() -> int:
    """Actors alive in the Ray session (read from the GCS; the dashboard is not running)."""
    from ray._private import state

    return sum(1 for info in state.actors().values() if info["State"] == "ALIVE")


def alive_actor_placement_groups() -> dict[str, tuple[str, str | None]]:
    """Alive actors: id -> (class name, the hex id of the placement group it was scheduled in,
    or None). Read from the GCS actor table (``ray._private.state``; the state API would need
    the dashboard, which the tests do not start)."""
    from ray._private import state
    from ray.core.generated import gcs_pb2

    table = state.state._connect_and_get_accessor().get_actor_table(None, "ALIVE")
    actors = {}
    for raw in table:
        data = gcs_pb2.ActorTableData.FromString(raw)
        group = data.placement_group_id.hex() if data.placement_group_id else None
        actors[data.actor_id.hex()] = (data.class_name, group)
    return actors


def alive_actor_ids() -> set[str]:
    """Ids of the actors alive in the Ray session."""
    from ray._private import state

    return {aid for aid, info in state.actors().items() if info["State"] == "ALIVE"}


def wait_until_not_alive(actor_ids: set[str], timeout_s: float = 60.0) -> set[str]:
    """The ids still alive once none are or ``timeout_s`` passed (ray.kill is asynchronous)."""
    deadline = time.monotonic() + timeout_s
    while (left := actor_ids & alive_actor_ids()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.fixture(scope="module")
def cluster(ray_session):
    """The module's Ray session; on teardown, no actor started in the module may be alive."""
    before = alive_actor_ids()
    yield ray_session
    leaked = wait_until_not_alive(alive_actor_ids() - before)
    assert not leaked, f"actors left alive by this module: {leaked}"


#: Names the RLlib multi-agent tests register their PettingZoo envs under.
TTT = "rl_dist_ext_tictactoe"
SPREAD = "rl_dist_ext_simple_spread"


@pytest.fixture(scope="module")
def envs(cluster):
    """The PettingZoo envs the RLlib multi-agent tests run, registered with Tune."""
    from mpe2 import simple_spread_v3
    from pettingzoo.classic import tictactoe_v3
    from ray.tune.registry import register_env

    from rllib_plugins.pettingzoo import PettingZooCreator

    register_env(TTT, PettingZooCreator(tictactoe_v3.env))
    register_env(
        SPREAD,
        PettingZooCreator(
            simple_spread_v3.parallel_env,
            parallel=True,
            N=2,
            max_cycles=25,
            continuous_actions=False,
        ),
    )
    return cluster
