"""ActorPool on real Ray actors (the shared 2-CPU session): in-flight bookkeeping, deaths, close."""

from __future__ import annotations

import os
import time

import pytest

from rl_dist_ext.actor_pool import ActorPool

ray = pytest.importorskip("ray")


def counter_class() -> type:
    """A test actor class, defined locally so Ray ships it by value (workers cannot import
    this test module).
    """

    class Counter:
        """``work()`` sleeps, then returns ``(pid, calls so far)``; call ``raise_on_call``
        raises an application error (``ValueError``) instead.
        """

        def __init__(self, delay_s: float, raise_on_call: int | None = None) -> None:
            self.delay_s = delay_s
            self.raise_on_call = raise_on_call
            self.calls = 0

        def work(self) -> tuple[int, int]:
            self.calls += 1
            time.sleep(self.delay_s)
            if self.calls == self.raise_on_call:
                raise ValueError(f"boom on call {self.calls}")
            return os.getpid(), self.calls

    return Counter


def alive_actors() -> int:
    from conftest import alive_actor_count

    return alive_actor_count()


def actor_states(handles) -> list[str]:
    from ray._private import state

    return [state.actors(actor_id=h._actor_id.hex())["State"] for h in handles]


def wait_until_dead(handles, timeout_s: float = 30.0) -> list[str]:
    """The GCS learns about killed actors asynchronously: poll until every one is DEAD."""
    deadline = time.monotonic() + timeout_s
    while set(states := actor_states(handles)) != {"DEAD"} and time.monotonic() < deadline:
        time.sleep(0.2)
    return states


@pytest.fixture
def start_pool(ray_session):
    from rl_dist_ext.ray_actors import start_restartable_actor

    pools: list[ActorPool] = []
    before = alive_actors()

    def start(num_actors: int, *, delay_s: float = 0.1, raise_on_call=None, **options):
        handles = [
            start_restartable_actor(counter_class(), delay_s, raise_on_call, num_cpus=0.05)
            for _ in range(num_actors)
        ]
        pool = ActorPool(handles, "work", **options)
        pools.append(pool)
        return pool

    yield start
    for pool in pools:
        pool.close()
        assert set(wait_until_dead(pool.handles)) == {"DEAD"}
    # Actors of earlier tests may still be winding down, never ones of ours.
    assert alive_actors() <= before


def results_until(pool: ActorPool, done, *, timeout_s: float = 60.0) -> list:
    """Call ``pool.wait`` until ``done(results so far)``; return every result."""
    results = []
    deadline = time.monotonic() + timeout_s
    while not done(results):
        assert time.monotonic() < deadline, f"gave up after {timeout_s}s with {results}"
        results += pool.wait(timeout_s=5.0)
    return results


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="handles"):
        ActorPool([], "work")
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="max_in_flight"):
            ActorPool([object()], "work", max_in_flight=bad)


def test_top_up_wait_drain_and_close(start_pool):
    pool = start_pool(2, delay_s=0.05, max_in_flight=3)
    pool.top_up()
    assert pool.num_in_flight(0) == pool.num_in_flight(1) == 3
    assert pool.num_in_flight() == 6 and pool.stats.calls_submitted == 6
    pool.top_up()  # already full: nothing more is submitted
    assert pool.stats.calls_submitted == 6

    results = results_until(pool, lambda rs: {r.actor_index for r in rs} == {0, 1} and len(rs) > 8)
    # After every wait the pool is topped up again.
    assert pool.num_in_flight(0) == pool.num_in_flight(1) == 3
    # Results carry their actor's index: one process per index, calls counted in order.
    for index in (0, 1):
        mine = [r.value for r in results if r.actor_index == index]
        assert len({pid for pid, _ in mine}) == 1
        counts = [count for _, count in mine]
        assert counts == list(range(1, len(counts) + 1))
    pids = {r.actor_index: r.value[0] for r in results}
    assert pids[0] != pids[1]
    assert pool.stats.calls_done == len(results)

    in_flight = pool.num_in_flight()
    drained = pool.drain(timeout_s=30.0)
    assert len(drained) == in_flight == 6
    assert pool.num_in_flight() == 0
    assert pool.stats.calls_done == pool.stats.calls_submitted
    assert pool.stats.calls_lost == pool.stats.failures == 0
    assert pool.drain(timeout_s=1.0) == []  # nothing left, and drain submits nothing new
    assert pool.stats.calls_submitted == pool.stats.calls_done

    before = alive_actors()
    assert set(actor_states(pool.handles)) == {"ALIVE"}
    pool.close()
    assert pool.num_in_flight() == 0
    assert set(wait_until_dead(pool.handles)) == {"DEAD"}  # killed for good, not restarted
    assert alive_actors() <= before - 2


def test_pause_waits_for_the_calls_in_flight_and_submits_none_until_resume(start_pool):
    pool = start_pool(2, delay_s=0.2, max_in_flight=2)
    pool.top_up()
    paused = pool.pause(timeout_s=30.0)
    assert len(paused) == 4 and pool.num_in_flight() == 0  # the 4 calls finished, returned
    pool.top_up()
    assert pool.wait(timeout_s=0.5) == [] and pool.num_in_flight() == 0  # none submitted
    assert pool.stats.calls_submitted == 4
    pool.resume()
    assert len(results_until(pool, lambda rs: len(rs) >= 2)) >= 2
    assert pool.num_in_flight() == 4 and pool.stats.calls_submitted >= 6


def test_killed_actor_is_counted_restarted_and_the_other_keeps_going(start_pool):
    lost = []
    pool = start_pool(
        2,
        delay_s=0.3,  # long enough that both calls queued on actor 0 are unfinished at the kill
        max_in_flight=2,
        retry_after_s=0.5,
        on_failure=lambda index, error: lost.append((index, error)),
    )
    first = results_until(pool, lambda rs: {r.actor_index for r in rs} == {0, 1})
    old_pid = {r.actor_index: r.value[0] for r in first}
    assert pool.num_in_flight(0) == 2

    ray.kill(pool.handles[0], no_restart=False)
    after_kill = results_until(
        pool, lambda rs: any(r.actor_index == 0 and r.value[0] != old_pid[0] for r in rs)
    )
    results = first + after_kill

    # The calls in flight on actor 0 when it died are counted as lost, for actor 0 only.
    stats = pool.stats
    assert stats.failures_per_actor[0] >= 1 and stats.failures_per_actor[1] == 0
    assert stats.calls_lost == stats.failures == len(lost)
    assert {index for index, _ in lost} == {0}
    assert all(
        isinstance(e, ray.exceptions.RayActorError | ray.exceptions.ActorUnavailableError)
        for _, e in lost
    )
    # Actor 0 came back as a new process with fresh state (Ray re-ran the constructor).
    restarted = [r.value for r in after_kill if r.actor_index == 0 and r.value[0] != old_pid[0]]
    assert restarted[0][1] == 1
    # Actor 1 never stopped: same process, every call answered, in order.
    ones = [r.value for r in results if r.actor_index == 1]
    assert {pid for pid, _ in ones} == {old_pid[1]}
    assert [count for _, count in ones] == list(range(1, len(ones) + 1))
    assert any(r.actor_index == 1 for r in after_kill)
    # Every submitted call is accounted for.
    assert stats.calls_submitted == stats.calls_done + stats.calls_lost + pool.num_in_flight()
    assert stats.calls_done == len(results)

    # Actor 0 keeps working after its restart.
    more = results_until(pool, lambda rs: sum(r.actor_index == 0 for r in rs) >= 3)
    assert {r.value[0] for r in more if r.actor_index == 0} == {restarted[0][0]}
    assert pool.stats.failures_per_actor == [stats.failures_per_actor[0], 0]


def test_application_errors_propagate_out_of_wait(start_pool):
    pool = start_pool(1, delay_s=0.01, max_in_flight=1, raise_on_call=2)
    assert [r.value[1] for r in pool.wait(timeout_s=30.0)] == [1]
    with pytest.raises(ValueError, match="boom on call 2"):
        results_until(pool, lambda rs: False, timeout_s=30.0)
    # An exception from the actor's own code is not an actor death.
    assert pool.stats.calls_lost == pool.stats.failures == 0
    assert pool.stats.calls_done == 1


# ---- restarts of actors whose constructor arguments live in the object store -------------------

#: larger than Ray's inline limit (100 KiB): a Nature-CNN policy pickles to ~6.7 MB
LARGE_ARGUMENT_BYTES = 4_000_000


def wait_for_restart(call, restarted, timeout_s: float = 60.0):
    """``ray.get(call())`` once the killed actor answers from its new process
    (``restarted(answer)``; ``ray.kill`` lands asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            answer = ray.get(call(), timeout=30)
            if restarted(answer):
                return answer
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
        assert time.monotonic() < deadline, "the actor did not come back"
        time.sleep(0.2)


def test_a_restartable_actor_with_large_constructor_arguments_comes_back_after_a_crash(
    ray_session,
):
    """Ray frees an actor's constructor arguments once the actor is created (ray#53727), so a
    restart of an actor started with a large argument (a pixel policy) failed in its creation
    task and the actor stayed dead. The starter keeps the arguments alive with the handle."""
    import gc

    import numpy as np

    from rl_dist_ext.ray_actors import start_restartable_actor

    class Holder:
        def __init__(self, payload: np.ndarray, *, scale: np.ndarray) -> None:
            self.total = int(payload.sum() + scale.sum())
            self.pid = os.getpid()

        def answer(self) -> tuple[int, int]:
            return self.pid, self.total

    payload = np.ones(LARGE_ARGUMENT_BYTES, dtype=np.uint8)
    handle = start_restartable_actor(
        Holder, payload, scale=np.full(LARGE_ARGUMENT_BYTES, 2, np.uint8), num_cpus=0.05
    )
    try:
        first_pid, total = ray.get(handle.answer.remote(), timeout=120)
        assert total == 3 * LARGE_ARGUMENT_BYTES
        del payload
        gc.collect()
        time.sleep(2.0)  # Ray releases creation arguments shortly after the actor is up
        ray.kill(handle, no_restart=False)
        _, total = wait_for_restart(handle.answer.remote, lambda answer: answer[0] != first_pid)
        assert total == 3 * LARGE_ARGUMENT_BYTES
    finally:
        ray.kill(handle, no_restart=True)


def test_an_inference_server_with_a_large_policy_factory_comes_back_after_a_crash(ray_session):
    """... and a caller's request of the wrong shape fails that caller alone, with the
    server's own ValueError (not Ray's wrapper), while the server goes on."""
    import gc

    import numpy as np

    from rl_dist_ext.inference import InferenceServerConfig
    from rl_dist_ext.ray_actors import InferenceCaller, start_inference_server

    class TablePolicy:
        is_recurrent = False

        def __init__(self, table: np.ndarray) -> None:
            self.table = table

        def __call__(self, obs: np.ndarray) -> dict[str, np.ndarray]:
            return {"actions": np.full(len(obs), int(self.table[:10].sum()), dtype=np.int64)}

        def set_weights(self, weights) -> None:
            pass

    class TableFactory:  # a factory that carries the policy's initial weights
        def __init__(self, table: np.ndarray) -> None:
            self.table = table

        def __call__(self, device: str) -> TablePolicy:
            return TablePolicy(self.table)

    server = start_inference_server(
        TableFactory(np.ones(LARGE_ARGUMENT_BYTES, dtype=np.uint8)),
        InferenceServerConfig(max_batch_size=8, max_wait_ms=1.0),
        num_cpus=0.05,
    )
    try:
        reply = ray.get(server.infer.remote("caller-0", np.zeros((2, 3))), timeout=120)
        assert reply.outputs["actions"].tolist() == [10, 10]
        caller = InferenceCaller(server, "caller-1", retry_s=10.0)
        with pytest.raises(ValueError, match=r"shape \(5,\).*do not fit") as refused:
            caller.infer(np.zeros((1, 5)))
        assert not isinstance(refused.value, ray.exceptions.RayError)
        assert caller.infer(np.zeros((1, 3))).outputs["actions"].tolist() == [10]
        gc.collect()
        time.sleep(2.0)  # Ray releases creation arguments shortly after the actor is up
        ray.kill(server, no_restart=False)
        wait_for_restart(server.stats.remote, lambda stats: stats["num_requests"] == 0)
        reply = ray.get(server.infer.remote("caller-0", np.zeros((1, 3))), timeout=30)
        assert reply.outputs["actions"].tolist() == [10]
    finally:
        ray.kill(server, no_restart=True)
