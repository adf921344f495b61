"""The distributed replay on several Ray nodes: placement, and a node lost mid-run.

Real raylets on this machine (``ray.cluster_utils.Cluster``); removing a node kills its raylet
and every actor on it, as a machine failure would. Snapshots go to a local directory, which
every node reaches only because all of them run here (on real clusters: a pyarrow.fs URI).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from rl_dist_ext.replay.distributed import (
    DistributedReplay,
    DistributedReplayConfig,
    ReplayTimeout,
    ReplayUnavailable,
)

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(autouse=True)
def only_the_head_afterwards(ray_nodes):
    """Each test adds the worker nodes it needs; they are removed after it."""
    yield
    for node in list(ray_nodes.worker_nodes):
        ray_nodes.remove_node(node)


def rows(start: int, n: int) -> dict[str, np.ndarray]:
    ids = np.arange(start, start + n)
    return {"id": ids.astype(np.int64), "obs": np.repeat(ids[:, None], 3, 1).astype(np.float32)}


def node_of(handle) -> str:
    import ray

    return ray.get(
        handle.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()),
        timeout=30,
    )


def alive_node_ids() -> set[str]:
    import ray

    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


def remove_node(nodes, node) -> None:
    """Kill ``node``'s raylet (no draining) and wait until the cluster has noticed."""
    nodes.remove_node(node, allow_graceful=False)
    deadline = time.monotonic() + 60
    while node.node_id in alive_node_ids():
        assert time.monotonic() < deadline, "the cluster did not notice the node's death"
        time.sleep(0.2)


def replay_config(tmp_path, **overrides) -> DistributedReplayConfig:
    settings = {
        "num_shards": 3,
        "capacity": 3_000,
        "min_size_to_sample": 1,
        "num_cpus_per_shard": 0.5,
        "shard_placement": "SPREAD",
        "snapshot_dir": str(tmp_path / "snapshots"),
        "snapshot_every_inserts": 100,
        "timeout_s": 5.0,
        "retry_down_shard_after_s": 0.5,
        "seed": 0,
    }
    settings.update(overrides)
    return DistributedReplayConfig(**settings)


def test_spread_shards_come_back_on_a_surviving_node_from_their_snapshots(ray_nodes, tmp_path):
    """Three shards SPREAD over three nodes; a worker node dies while a learner-style loop
    samples, updates priorities and inserts. The loop never stops; the lost shard restarts on a
    surviving node with its latest snapshot, and the rows inserted after it are counted."""
    workers = [ray_nodes.add_node(num_cpus=1) for _ in range(2)]
    ray_nodes.wait_for_nodes()
    replay = DistributedReplay(replay_config(tmp_path))
    try:
        where = [node_of(handle) for handle in replay.handles]
        assert len(set(where)) == 3, f"SPREAD put the shards on nodes {where}"
        next_id = 0
        for _ in range(24):
            replay.add(rows(next_id, 25))
            next_id += 25
        replay.flush()
        assert replay.stats(wait=True)["size"] == 600

        victim = workers[0]
        lost = where.index(victim.node_id)
        remove_node(ray_nodes, victim)
        rng = np.random.default_rng(0)
        deadline = time.monotonic() + 90
        cycles = 0
        while time.monotonic() < deadline:
            sample = replay.sample(32)
            replay.update_priorities(sample.keys, rng.random(32))
            replay.add(rows(next_id, 25))
            next_id += 25
            cycles += 1
            stats = replay.stats(wait=True)
            if stats["shard_failures"] and stats["shards_alive"] == 3:
                break
        replay.flush()
        stats = replay.stats(wait=True)
        assert stats["shards_alive"] == 3, f"the lost shard did not come back: {stats}"
        assert node_of(replay.handles[lost]) in alive_node_ids() - {victim.node_id}
        # It held ~200 rows, snapshotted every 100 inserts: at most the last 100 are lost.
        assert 0 <= stats["items_lost"] <= 100
        assert next_id <= stats["num_inserted"] + stats["items_lost"] <= next_id + 25
        assert cycles >= 1  # the loop ran while the shard was down or restarting
    finally:
        replay.close()


def test_a_shard_whose_node_is_gone_and_cannot_restart_raises_the_projects_errors(
    ray_nodes, tmp_path
):
    """The only node with room for the shard dies: calls wait ``timeout_s`` and raise the
    project's errors (never a raw Ray one, never a hang). A node that joins later takes the
    shard, which comes back with its snapshot."""
    import ray

    @ray.remote(num_cpus=1)
    class HoldsTheHeadCPU:
        def ping(self) -> bool:
            return True

    holder = HoldsTheHeadCPU.remote()
    ray.get(holder.ping.remote(), timeout=30)
    worker = ray_nodes.add_node(num_cpus=1)
    ray_nodes.wait_for_nodes()
    replay = DistributedReplay(replay_config(tmp_path, num_shards=1, timeout_s=2.0))
    try:
        assert node_of(replay.handles[0]) == worker.node_id
        replay.add(rows(0, 100))
        replay.flush()
        assert replay.stats(wait=True)["size"] == 100  # snapshotted at 100 inserts
        remove_node(ray_nodes, worker)

        started = time.monotonic()
        with pytest.raises((ReplayUnavailable, ReplayTimeout)):
            replay.sample(8)
        with pytest.raises((ReplayUnavailable, ReplayTimeout)):
            replay.save(str(tmp_path / "checkpoint"))
        with pytest.raises((ReplayUnavailable, ReplayTimeout)):
            for start in range(100, 2_000, 25):
                replay.add(rows(start, 25))
            replay.flush()
        assert time.monotonic() - started < 60  # bounded waits, not a hang

        replacement = ray_nodes.add_node(num_cpus=1)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if replay.stats(wait=True)["shards_alive"] == 1:
                    break
            except (ReplayUnavailable, ReplayTimeout):
                pass
            time.sleep(0.5)
        assert node_of(replay.handles[0]) == replacement.node_id
        assert replay.stats(wait=True)["size"] == 100  # its snapshot
        assert len(replay.sample(8).keys) == 8
    finally:
        replay.close()
        ray.kill(holder)


def test_a_relative_snapshot_dir_is_refused_on_several_nodes(ray_nodes):
    ray_nodes.add_node(num_cpus=1)
    ray_nodes.wait_for_nodes()
    with pytest.raises(ValueError, match=r"relative local path.*pyarrow\.fs URI"):
        DistributedReplay(DistributedReplayConfig(num_shards=1, snapshot_dir="snapshots"))


def runner_nodes(algorithm) -> dict[int, str]:
    """Env runner index -> the node it runs on (healthy runners only)."""
    import ray

    return dict(
        algorithm.env_runner_group.foreach_env_runner(
            lambda r: (r.worker_index, ray.get_runtime_context().get_node_id()),
            local_env_runner=False,
        )
    )


def test_rllib_gorila_loses_a_node_runs_degraded_and_recovers_when_a_node_joins(
    ray_nodes, tmp_path
):
    """GorilaDQN with one env runner on each of two worker nodes (a custom ``runner_slot``
    resource that only workers have) and two replay shards SPREAD over the cluster. One worker
    node dies: training goes on with the other runner, the results say the run is degraded
    (nowhere to restart the lost runner), a shard that was on the node comes back from its
    snapshot. A node joins: the runner restarts there and rejoins the replay."""
    from rllib_plugins import GorilaDQNConfig

    workers = [ray_nodes.add_node(num_cpus=1, resources={"runner_slot": 1}) for _ in range(2)]
    ray_nodes.wait_for_nodes()
    config = (
        GorilaDQNConfig()
        .environment("CartPole-v1")
        .env_runners(
            num_env_runners=2,
            num_cpus_per_env_runner=0.5,
            custom_resources_per_env_runner={"runner_slot": 1},
            num_envs_per_env_runner=2,
        )
        .learners(num_learners=0)
        .resources(num_cpus_for_main_process=0)
        .training(env_steps_per_request=64, updates_per_iteration=8, lr=1e-3)
        .replay(
            num_shards=2,
            capacity=10_000,
            min_size_to_sample=200,
            num_cpus_per_shard=0.2,
            shard_placement="SPREAD",
            snapshot_dir=str(tmp_path / "snapshots"),
            snapshot_every_inserts=200,
            samples_per_insert=None,
        )
        .fault_tolerance(restart_failed_env_runners=True)
        .reporting(min_sample_timesteps_per_iteration=200)
        .debugging(seed=0)
    )
    algorithm = config.build_algo()
    try:
        algorithm.train()
        placed = runner_nodes(algorithm)
        assert sorted(placed.values()) == sorted(w.node_id for w in workers)
        victim_index = 1
        victim = next(w for w in workers if w.node_id == placed[victim_index])
        remove_node(ray_nodes, victim)

        steps_before = algorithm.replay().stats(wait=True)["num_inserted"]
        degraded = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            result = algorithm.train()
            if result["gorila"]["degraded"]:
                degraded = result["gorila"]
                if algorithm.replay().stats(wait=True)["num_inserted"] > steps_before + 500:
                    break
        assert degraded is not None, "the run never reported the lost runner"
        assert degraded["num_healthy_env_runners"] == 1
        assert degraded["num_env_runners_down"] == 1
        assert algorithm.replay().stats(wait=True)["num_inserted"] > steps_before + 500

        ray_nodes.add_node(num_cpus=1, resources={"runner_slot": 1})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            result = algorithm.train()
            if not result["gorila"]["degraded"]:
                break
        assert result["gorila"]["num_healthy_env_runners"] == 2
        assert result["gorila"]["replay_shards_alive"] == 2
        connected = dict(
            algorithm.env_runner_group.foreach_env_runner(
                lambda r: (r.worker_index, r.connected), local_env_runner=False
            )
        )
        assert connected == {1: True, 2: True}
    finally:
        algorithm.stop()


def test_tianshou_gorila_loses_a_node_runs_degraded_and_recovers_when_a_node_joins(
    ray_nodes, tmp_path
):
    """Tianshou's GorilaCollector with one actor on each of two worker nodes (0.6 CPU each;
    the head's CPU is mostly held) and two replay shards SPREAD. A worker node dies while
    collect() and gradient steps alternate: collecting goes on from the other actor, the stats
    say the fleet is degraded, a shard that was on the node comes back from its snapshot. A
    node joins: the actor restarts there and delivers rollouts again."""
    import ray
    from test_tianshou_gorila import gradient_steps, make_algo, make_buffer, make_collector

    @ray.remote(num_cpus=0.6)
    class HoldsTheHeadCPU:
        def ping(self) -> bool:
            return True

    holder = HoldsTheHeadCPU.remote()
    ray.get(holder.ping.remote(), timeout=30)
    workers = [ray_nodes.add_node(num_cpus=1) for _ in range(2)]
    ray_nodes.wait_for_nodes()
    algo = make_algo()
    buffer = make_buffer(
        capacity=10_000,
        num_cpus_per_shard=0.1,
        shard_placement="SPREAD",
        snapshot_dir=str(tmp_path / "snapshots"),
        snapshot_every_inserts=200,
        timeout_s=10.0,
    )
    collector = None
    try:
        collector = make_collector(algo, buffer, num_cpus_per_actor=0.6)
        collector.collect(n_step=128)
        actors = collector._actor_pool.handles
        placed = [node_of(handle) for handle in actors]
        assert sorted(placed) == sorted(w.node_id for w in workers)
        victim = workers[0]
        remove_node(ray_nodes, victim)

        degraded = None
        for _ in range(200):
            stats = collector.collect(n_step=64)
            gradient_steps(algo, buffer, 2)
            if stats.actors["degraded"]:
                degraded = stats
                if stats.n_collected_steps > 0 and algo.num_gradient_updates > 10:
                    break
        assert degraded is not None, "the lost actor was never reported"
        assert degraded.actors["down"] == 1
        updates_while_degraded = algo.num_gradient_updates

        replacement = ray_nodes.add_node(num_cpus=1)
        lost = placed.index(victim.node_id)
        for _ in range(300):
            stats = collector.collect(n_step=64)
            gradient_steps(algo, buffer, 2)
            if not stats.actors["degraded"]:
                break
        assert stats.actors["down"] == 0
        assert node_of(actors[lost]) == replacement.node_id
        assert algo.num_gradient_updates > updates_while_degraded
        assert buffer.stats(wait=True)["shards_alive"] == 2
    finally:
        if collector is not None:
            collector.close()
        buffer.close()
        ray.kill(holder)
