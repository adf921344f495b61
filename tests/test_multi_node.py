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


def hold_head_cpus(num_cpus: float = 1.0):
    """An actor holding ``num_cpus`` of the head's CPU (the head has 1), so that what starts
    next goes to worker nodes; ``ray.kill`` it afterwards. Its class is made here, so it is
    pickled by value (worker processes do not import the tests)."""
    import ray

    @ray.remote(num_cpus=num_cpus)
    class HoldsTheHeadCPU:
        def ping(self) -> bool:
            return True

    holder = HoldsTheHeadCPU.remote()
    ray.get(holder.ping.remote(), timeout=30)
    return holder


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
        # exact, although the shard's process died with its node: its row counters live
        # beside its snapshots, which the restarted shard reads on the surviving node
        assert (
            stats["rows_acknowledged"]
            == stats["size"] + stats["rows_evicted"] + stats["items_lost"]
        )
        assert cycles >= 1  # the loop ran while the shard was down or restarting
    finally:
        replay.close()


def test_a_shard_and_a_server_whose_node_is_gone_and_cannot_restart_raise_the_projects_errors(
    ray_nodes, tmp_path
):
    """A replay shard and a SEED inference server run on the one worker node (the head's CPU is
    held); the node dies and no node has room to restart them. Replay calls wait ``timeout_s``
    and a caller's request waits its bounded ``retry_s``; each raises the project's error (never
    a raw Ray one, never a hang), and the learner's side of the server neither hangs nor
    raises. A node joins: the shard comes back there with its snapshot, and the server restarts
    there with its initial weights (version -1), the learner sees that it needs weights, and
    requests are answered with the next push."""
    import ray

    from rl_dist_ext.inference import InferenceServerConfig, InferenceServerUnavailable
    from rl_dist_ext.ray_actors import (
        InferenceCaller,
        InferenceServerHandle,
        start_inference_server,
    )

    class LinearPolicy:  # defined here: pickled by value, as worker nodes lack the tests
        is_recurrent = False

        def __init__(self, device: str) -> None:
            self.weights = np.eye(3)

        def __call__(self, obs: np.ndarray) -> dict[str, np.ndarray]:
            return {"actions": (obs @ self.weights).argmax(axis=1)}

        def set_weights(self, weights) -> None:
            self.weights = np.asarray(weights)

    holder = hold_head_cpus()
    worker = ray_nodes.add_node(num_cpus=1)
    ray_nodes.wait_for_nodes()
    replay = DistributedReplay(replay_config(tmp_path, num_shards=1, timeout_s=1.0))
    server = InferenceServerHandle(
        start_inference_server(
            LinearPolicy, InferenceServerConfig(max_batch_size=8, max_wait_ms=1.0), num_cpus=0.5
        )
    )
    caller = InferenceCaller(server.handle, "actor-0", retry_s=1.5)
    obs = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0]])
    try:
        assert node_of(replay.handles[0]) == worker.node_id
        assert node_of(server.handle) == worker.node_id
        replay.add(rows(0, 100))
        replay.flush()
        assert replay.stats(wait=True)["size"] == 100  # snapshotted at 100 inserts
        server.push(np.eye(3)[:, ::-1], 5)  # reversed: actions flip
        reply = caller.infer(obs)
        assert reply.version == 5 and list(reply.outputs["actions"]) == [1, 0]
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
        started = time.monotonic()
        with pytest.raises(InferenceServerUnavailable, match=r"actor-0.*1\.5 s"):
            caller.infer(obs)
        with pytest.raises(InferenceServerUnavailable, match="actor-0"):
            caller.register()
        assert time.monotonic() - started < 30  # bounded waits, not a hang
        assert server.stats() == {}  # the learner's side warns and goes on
        server.push(np.eye(3), 6)  # fire and forget, lost with the server

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

        deadline = time.monotonic() + 60
        while True:
            try:
                reply = caller.infer(obs)
                break
            except InferenceServerUnavailable:
                assert time.monotonic() < deadline, "the server never came back"
        assert node_of(server.handle) == replacement.node_id
        assert reply.version == -1  # restarted: its initial weights
        server.stats()
        assert server.needs_weights()
        server.push(np.eye(3)[:, ::-1], 7)
        deadline = time.monotonic() + 10
        while (reply := caller.infer(obs)).version != 7:
            assert time.monotonic() < deadline
        assert list(reply.outputs["actions"]) == [1, 0]
    finally:
        server.close()
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


# make test-long for CI time (30-46 s): make test restarts actors after a lost node with
# test_rllib_gorila_loses_a_node_runs_degraded_and_recovers_when_a_node_joins, a shard and an
# inference server on a replacement node, and each framework's killed actors and servers
@pytest.mark.long
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

    holder = hold_head_cpus(0.6)
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


# make test-long for CI time (30-46 s): make test restarts actors after a lost node with
# test_rllib_gorila_loses_a_node_runs_degraded_and_recovers_when_a_node_joins, a shard and an
# inference server on a replacement node, and each framework's killed actors and servers
@pytest.mark.long
def test_rllib_vtrace_server_on_a_lost_node_restarts_on_a_surviving_node(ray_nodes):
    """VTrace in SEED mode with the head's CPU held, so the inference server and the env
    runner start on the one worker node. That node dies: no runner and no server is up, and the
    results say the run is degraded (IMPALA alone would sample on the driver's env runner, which
    has no env, and fail). A node joins: Ray restarts the server and RLlib the runner there, the
    runner is reconnected, the learner pushes its weights to the new server and training goes
    on. (The node joins after the loss: joined before, the runner could restart on it between
    two iterations, unseen by the results.)"""
    import ray
    from test_rllib_vtrace import server_restarts, small_config

    holder = hold_head_cpus()
    first = ray_nodes.add_node(num_cpus=1)
    ray_nodes.wait_for_nodes()
    algorithm = (
        small_config(central=True)
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.4)
        .resources(num_cpus_for_main_process=0)
        .learners(num_learners=0, num_cpus_per_learner=0)
        .central_inference(num_cpus=0.5)
        .fault_tolerance(restart_failed_env_runners=True)
        .build_algo()
    )
    try:
        for _ in range(30):
            result = algorithm.train()
            metrics = result.get("central_inference", {})
            if metrics.get("version", -1) > 0:
                break
        assert metrics["version"] > 0, metrics
        assert result["vtrace"]["degraded"] == 0
        assert node_of(algorithm._inference.handle) == first.node_id
        assert runner_nodes(algorithm) == {1: first.node_id}
        pushed_before = algorithm._inference.version
        remove_node(ray_nodes, first)
        deadline = time.monotonic() + 60
        while not (degraded := algorithm.train()["vtrace"]["degraded"]):
            assert time.monotonic() < deadline, "the run never reported the lost runner"
        assert degraded == 1  # the runner is down, and the results say so

        survivor = ray_nodes.add_node(num_cpus=1)
        ray_nodes.wait_for_nodes()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            result = algorithm.train()
            metrics = result.get("central_inference", {})
            # A fresh server instance counts from zero: these requests came after the restart.
            if metrics.get("num_requests", 0) > 100 and metrics.get("version", -1) > pushed_before:
                break
        assert metrics.get("version", -1) > pushed_before, metrics
        assert metrics["num_requests"] > 100, metrics
        assert node_of(algorithm._inference.handle) == survivor.node_id
        assert runner_nodes(algorithm) == {1: survivor.node_id}
        assert server_restarts(algorithm._inference.handle) >= 1
        assert result["vtrace"]["degraded"] == 0
    finally:
        algorithm.stop()
        ray.kill(holder)


def test_a_vtrace_update_whose_episodes_all_died_with_their_node_is_skipped_and_counted(
    ray_nodes,
):
    """IMPALA's env runners put their episodes in the object store and hand the learner the
    references. A runner lost with its node takes those episodes along; RLlib's
    ``TrainingData.solve_refs`` drops the dead references, so an update can reach the learner
    with no episodes at all (a clean-clone CI run lost the test above to it: IMPALA's learner
    connector raised ``IndexError`` on ``episodes[0]`` and ended the run). The learner skips
    that update and counts it; the next one, with episodes, trains."""
    import gymnasium as gym
    import ray
    from ray.rllib.core.learner.training_data import TrainingData
    from test_rllib_vtrace import small_config

    config = small_config(central=False)
    config.validate()
    runner = config.env_runner_cls(config=config)  # in the driver, on the head
    episodes = runner.sample(num_timesteps=200)
    runner.stop()

    @ray.remote(num_cpus=1)
    class Owner:
        def put(self, items: list) -> list:  # as an env runner's sample_get_state_and_metrics
            return [ray.put(item) for item in items]

    holder = hold_head_cpus()
    learner = None
    try:
        node = ray_nodes.add_node(num_cpus=1)
        ray_nodes.wait_for_nodes()
        owner = Owner.remote()  # on the worker node: the head's CPU is held
        dead = ray.get(owner.put.remote([episodes[:2], episodes[2:]]), timeout=60)
        learner = config.build_learner(env=gym.make("CartPole-v1"))
        remove_node(ray_nodes, node)
        with pytest.raises(ray.exceptions.OwnerDiedError):
            ray.get(dead[0], timeout=30)
        version = learner.weights_clock.version

        learner.update(training_data=TrainingData(episodes_refs=dead), timesteps={})

        assert (learner.weights_clock.version, learner.updates_skipped) == (version, 1)
        learner.update(training_data=TrainingData(episodes_refs=[ray.put(episodes)]), timesteps={})
        deadline = time.monotonic() + 60  # IMPALA's learner thread takes the step
        while learner.weights_clock.version == version and time.monotonic() < deadline:
            time.sleep(0.05)
        assert learner.weights_clock.version == version + 1
        assert learner.updates_skipped == 1
    finally:
        if learner is not None:
            learner.shutdown()
        ray.kill(holder)
