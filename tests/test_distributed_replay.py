"""DistributedReplay on real Ray actors (one shared 2-CPU session)."""

from __future__ import annotations

import pickle
import threading
import time

import numpy as np
import pytest
from scipy import stats as scipy_stats

from rl_dist_ext.ops.priorities import td_priorities
from rl_dist_ext.replay.distributed import (
    DistributedReplay,
    DistributedReplayConfig,
    RateLimitTimeout,
)


def rows(start: int, n: int) -> dict[str, np.ndarray]:
    """Rows whose ``id`` column is their global row number."""
    ids = np.arange(start, start + n)
    return {
        "id": ids.astype(np.int64),
        "obs": np.repeat(ids[:, None], 3, axis=1).astype(np.float32),
    }


def config(**overrides) -> DistributedReplayConfig:
    settings = {
        "num_shards": 2,
        "capacity": 1_000,
        "min_size_to_sample": 1,
        "seed": 0,
        "timeout_s": 20.0,
        # one batch per sample request and priorities sent at once: what most of these tests
        # check; the tests of batches_per_request > 1 (the default, 4) set it
        "batches_per_request": 1,
    }
    settings.update(overrides)
    return DistributedReplayConfig(**settings)


@pytest.fixture
def make_replay(ray_session):
    started: list[DistributedReplay] = []

    def make(**overrides) -> DistributedReplay:
        replay = DistributedReplay(config(**overrides))
        started.append(replay)
        return replay

    yield make
    for replay in started:
        replay.close()


@pytest.mark.parametrize("num_shards", [1, 3])
def test_round_trip(make_replay, num_shards):
    replay = make_replay(num_shards=num_shards, capacity=900)
    for start in range(0, 270, 30):  # 9 batches: round-robin spreads them evenly
        replay.add(rows(start, 30))
    replay.flush()
    assert replay.stats(wait=True)["size"] == 270
    assert replay.stats(wait=True)["size_per_shard"] == [270 // num_shards] * num_shards
    key_of: dict[int, int] = {}
    shards_seen = set()
    for _ in range(40):
        sample = replay.sample(32)
        assert sample.batch["obs"].shape == (32, 3)
        np.testing.assert_array_equal(sample.batch["obs"][:, 0], sample.batch["id"])
        assert sample.weights.dtype == np.float32
        assert np.all((sample.weights > 0) & (sample.weights <= 1))
        shard = sample.keys % num_shards
        assert (shard == shard[0]).all()  # a batch comes whole from one shard
        shards_seen.add(int(shard[0]))
        for row_id, key in zip(sample.batch["id"].tolist(), sample.keys.tolist(), strict=True):
            assert key_of.setdefault(row_id, key) == key  # a row keeps its key
    assert set(key_of) <= set(range(270)) and len(key_of) > 230
    assert len(set(key_of.values())) == len(key_of)  # no two rows share a key
    assert shards_seen == set(range(num_shards))


def test_cross_shard_sampling_is_proportional_to_priority(make_replay):
    """Shard 0 gets priority-1 rows, shard 1 priority-3 rows: P(shard 1) = 3/4 per item mass."""
    replay = make_replay(num_shards=2, capacity=400, alpha=1.0, eps=1e-9, prefetch=1)
    replay.add(rows(0, 100), priorities=np.full(100, 1.0))  # round-robin: shard a
    replay.add(rows(100, 100), priorities=np.full(100, 3.0))  # shard b
    replay.flush()
    replay.refresh()
    # Each batch comes whole from one shard, so batches (not items) are the independent draws.
    batches = {"low": 0, "high": 0}
    for _ in range(400):
        sample = replay.sample(16, beta=1.0)
        low = sample.batch["id"] < 100
        assert low.all() or not low.any()
        batches["low" if low.all() else "high"] += 1
        # importance weights normalised across shards: (p_i / p_min) ** -beta
        expected = np.where(low, 1.0, 1.0 / 3.0)
        np.testing.assert_allclose(sample.weights, expected, rtol=1e-5)
    chi = scipy_stats.chisquare([batches["low"], batches["high"]], [100, 300])
    assert chi.pvalue > 1e-3, batches


def collect_keys(replay: DistributedReplay, expected_rows: int) -> dict[int, int]:
    """Sample until every row has been seen once; return row id -> global key."""
    keys_by_id: dict[int, int] = {}
    for _ in range(200):
        sample = replay.sample(16)
        keys_by_id.update(zip(sample.batch["id"].tolist(), sample.keys.tolist(), strict=True))
        if len(keys_by_id) == expected_rows:
            break
    assert len(keys_by_id) == expected_rows
    return keys_by_id


def test_priority_updates_reach_the_right_items_and_stale_ones_are_dropped(make_replay):
    replay = make_replay(num_shards=2, capacity=40, alpha=1.0, eps=1e-9)
    replay.add(rows(0, 20))
    replay.add(rows(20, 20))
    replay.flush()
    keys_by_id = collect_keys(replay, 40)
    ids = np.array(sorted(keys_by_id))
    keys = np.array([keys_by_id[i] for i in ids])
    replay.update_priorities(keys, ids + 1.0)  # row i gets priority i + 1
    replay.flush()
    for _ in range(replay.config.prefetch):  # requests already in flight predate the update
        replay.sample(16)
    replay.refresh()
    for _ in range(20):
        # beta = 1: w_i = p_min / p_i = 1 / (id + 1) exactly when each update hit its own row
        sample = replay.sample(16, beta=1.0)
        np.testing.assert_allclose(sample.weights, 1.0 / (sample.batch["id"] + 1.0), rtol=1e-5)

    # Overwrite every slot, then the old keys are stale: dropped and counted, never applied.
    replay.add(rows(100, 20))
    replay.add(rows(120, 20))
    replay.flush()
    before = replay.stats(wait=True)["stale_updates"]
    replay.update_priorities(keys, np.full(len(keys), 1e6))
    replay.flush()
    assert replay.stats(wait=True)["stale_updates"] - before == len(keys)
    statuses = replay.refresh()
    assert sum(s.total_priority for s in statuses) < 1e6


def test_updates_change_sampling_frequencies(make_replay):
    replay = make_replay(num_shards=2, capacity=100, alpha=1.0, eps=1e-9, prefetch=1)
    replay.add(rows(0, 10), priorities=np.ones(10))
    replay.add(rows(10, 10), priorities=np.ones(10))
    replay.flush()
    keys_by_id = {}
    for _ in range(30):
        sample = replay.sample(16)
        keys_by_id.update(zip(sample.batch["id"].tolist(), sample.keys.tolist(), strict=True))
    assert len(keys_by_id) == 20
    ids = np.array(sorted(keys_by_id))
    priorities = np.where(ids == 3, 50.0, 1.0)
    replay.update_priorities(np.array([keys_by_id[i] for i in ids]), priorities)
    replay.flush()
    replay.sample(32)  # the one prefetched request predates the update
    replay.refresh()
    draws = np.concatenate([replay.sample(32).batch["id"] for _ in range(100)])
    share = np.mean(draws == 3)
    expected = td_priorities(np.array(50.0), alpha=1.0, eps=1e-9) / (50.0 + 19.0)
    assert abs(share - expected) < 0.08, share


def test_one_request_serves_batches_per_request_strided_batches(make_replay):
    """K = 4: one 64-row stratified draw over 64 equal-priority rows hits every row once; the
    four batches split it by stride, so each spans the whole shard and they partition it."""
    replay = make_replay(num_shards=1, capacity=64, prefetch=1, batches_per_request=4)
    replay.add(rows(0, 64), priorities=np.ones(64))
    replay.flush()
    samples = [replay.sample(16, beta=1.0) for _ in range(4)]
    # one 64-row request for these four (+ the prefetched one, if the shard served it yet)
    assert replay.refresh()[0].num_sampled in (64, 128)
    ids = [s.batch["id"] for s in samples]
    for j, batch_ids in enumerate(ids):
        np.testing.assert_array_equal(batch_ids, np.arange(j, 64, 4))
        np.testing.assert_array_equal(samples[j].keys, batch_ids)  # 1 shard: key = insert id
        np.testing.assert_allclose(samples[j].weights, 1.0)
    # a different batch size drops the split-off batches of the old size
    assert replay.sample(8).batch["id"].shape == (8,)


def test_priority_updates_are_sent_every_batches_per_request_calls(make_replay):
    replay = make_replay(num_shards=1, capacity=64, alpha=1.0, eps=1e-9, batches_per_request=3)
    replay.add(rows(0, 64), priorities=np.ones(64))
    replay.flush()
    total = replay.refresh()[0].total_priority
    for i in range(2):  # gathered, not sent
        replay.update_priorities(np.array([i]), np.array([11.0]))
    replay._priorities._reap(block=False)
    assert replay.refresh()[0].total_priority == pytest.approx(total)
    replay.update_priorities(np.array([2]), np.array([11.0]))  # third call: all three go
    replay._priorities._reap(block=True)
    assert replay.refresh()[0].total_priority == pytest.approx(total + 30.0)
    replay.update_priorities(np.array([3]), np.array([11.0]))
    replay.flush()  # flush sends a partial gathering too
    assert replay.refresh()[0].total_priority == pytest.approx(total + 40.0)


def test_rate_limiter_blocks_sampling_until_inserts_arrive(make_replay):
    replay = make_replay(
        num_shards=1,
        capacity=10_000,
        min_size_to_sample=10,
        samples_per_insert=1.0,
        error_buffer=40.0,
        prefetch=1,
        timeout_s=20.0,
    )
    replay.add(rows(0, 10))
    replay.flush()
    replay.sample(32)  # allowed at diff 10 >= 10 - 40; afterwards diff = -22
    replay.sample(32)  # the prefetched request, allowed at -22 >= -30; afterwards diff = -54
    result = {}

    def learner():
        started = time.monotonic()
        replay.sample(32)  # the next request waits in the shard: -54 < -30
        result["waited"] = time.monotonic() - started

    thread = threading.Thread(target=learner)
    thread.start()
    time.sleep(1.5)
    assert thread.is_alive(), "sampling should wait for inserts"
    producer = pickle.loads(pickle.dumps(replay))  # a second client, as an actor would hold
    producer.add(rows(10, 100))
    producer.flush()
    thread.join(timeout=20)
    assert not thread.is_alive()
    assert result["waited"] > 1.0


def test_a_rate_limited_sample_calls_back_while_it_waits_and_the_callback_can_feed_it(make_replay):
    """``while_waiting``: the learner's own process hands out the actors' work (Tianshou's
    trainer); here the callback inserts rows itself, so the sample that the limiter holds back
    goes through on this thread, and without it the same sample times out."""
    replay = make_replay(
        num_shards=1,
        capacity=10_000,
        min_size_to_sample=10,
        samples_per_insert=1.0,
        error_buffer=10.0,
        prefetch=1,
        timeout_s=3.0,
    )
    replay.add(rows(0, 10))
    replay.flush()
    replay.sample(16)  # allowed at diff 10 >= 0; at -6 the prefetched request waits
    calls = []

    def feed():
        calls.append(time.monotonic())
        if len(calls) == 3:
            replay.add(rows(10, 50))
            replay.flush()

    with pytest.raises(TypeError, match="callable"):
        replay.while_waiting(42)
    replay.while_waiting(feed)
    replay.sample(16)
    assert len(calls) >= 3
    replay.while_waiting(None)
    with pytest.raises(RateLimitTimeout):
        for _ in range(10):
            replay.sample(16)
    assert len(calls) < 10  # removed: not called any more


def test_rate_limiter_times_out_with_a_clear_error(make_replay):
    replay = make_replay(
        num_shards=1,
        capacity=1_000,
        min_size_to_sample=10,
        samples_per_insert=1.0,
        error_buffer=10.0,
        prefetch=1,
        timeout_s=1.0,
    )
    replay.add(rows(0, 10))
    replay.flush()
    with pytest.raises(RateLimitTimeout, match="rate limiter"):
        for _ in range(5):
            replay.sample(16)


def test_rate_limited_learner_and_actor_keep_going_when_shard_masses_differ(make_replay):
    """Two shards, one with 20x the priority mass: the learner samples it far more often, so
    per shard the learner runs ahead on one and the actors on the other. Each side must then
    use the shard that lets it through (no dead-lock of a learner waiting on one shard while
    the actor waits on the other), and the whole replay keeps samples per insert near 4."""
    import ray

    replay = make_replay(
        num_shards=2,
        capacity=100_000,
        alpha=1.0,
        min_size_to_sample=200,
        samples_per_insert=4.0,
        error_buffer=800.0,
        timeout_s=5.0,
        status_refresh_s=0.2,
    )

    @ray.remote(num_cpus=0.1)
    def insert_for(client, seconds: float) -> int:
        import time as time_

        import numpy as np_

        rows, start = 0, time_.monotonic()
        while time_.monotonic() - start < seconds:
            ids = np_.arange(rows, rows + 50)
            priority = 20.0 if (rows // 50) % 2 else 1.0  # round-robin: one shard gets the 20s
            client.add(
                {"id": ids, "obs": np_.repeat(ids[:, None], 3, axis=1).astype(np_.float32)},
                priorities=np_.full(50, priority),
            )
            rows += 50
        client.flush()
        return rows

    inserted_ref = insert_for.remote(replay, 8.0)
    deadline = time.monotonic() + 60  # the task starts slowly on a busy machine
    while min(status.size for status in replay.refresh()) < 100:  # the learner may start
        assert time.monotonic() < deadline
        time.sleep(0.1)
    sampled, started = 0, time.monotonic()
    while not ray.wait([inserted_ref], timeout=0)[0]:  # learn for as long as the actor acts
        assert time.monotonic() - started < 120
        sample = replay.sample(32, beta=0.4)
        replay.update_priorities(sample.keys, np.where(sample.batch["id"] // 50 % 2, 20.0, 1.0))
        sampled += 32
    inserted = ray.get(inserted_ref)
    replay.flush()
    stats = replay.stats(wait=True)
    assert inserted >= 1_000 and sampled >= 4_000, (inserted, sampled)
    assert 2.0 <= stats["samples_per_insert"] <= 6.0, stats
    assert stats["num_inserted"] == inserted


def test_inserts_wait_when_actors_are_too_far_ahead(make_replay):
    replay = make_replay(
        num_shards=1,
        capacity=10_000,
        min_size_to_sample=10,
        samples_per_insert=1.0,
        error_buffer=20.0,
        prefetch=1,
        max_in_flight_adds=1,
        timeout_s=20.0,
    )
    replay.add(rows(0, 40))  # diff 40 > 10 + 20: the next insert must wait
    replay.flush()
    done = threading.Event()

    def actor():
        replay.add(rows(40, 10))
        replay.flush()
        done.set()

    learner = pickle.loads(pickle.dumps(replay))
    thread = threading.Thread(target=actor)
    thread.start()
    assert not done.wait(1.5), "insert should wait for the learner"
    for _ in range(3):
        learner.sample(16)
    assert done.wait(20)
    thread.join()


def test_save_and_restore_round_trip(make_replay, tmp_path):
    replay = make_replay(num_shards=2, capacity=200, alpha=1.0)
    for start in range(0, 120, 20):
        replay.add(rows(start, 20), priorities=np.arange(start, start + 20) + 1.0)
    replay.flush()
    replay.save(str(tmp_path / "ckpt"))
    assert (tmp_path / "ckpt" / "manifest.json").exists()
    before = replay.stats(wait=True)
    # A later save into the same path that died before its manifest (every shard wrote a
    # newer generation): a restore reads the generations the manifest names, never a mix.
    import ray

    from rl_dist_ext.replay.distributed.checkpoints import shard_file

    replay.add(rows(120, 20))
    replay.flush()
    ray.get(
        [h.save.remote(shard_file(str(tmp_path / "ckpt"), i)) for i, h in enumerate(replay.handles)]
    )

    fresh = make_replay(num_shards=2, capacity=200, alpha=1.0)
    fresh.restore(str(tmp_path / "ckpt"))
    after = fresh.stats(wait=True)
    assert after["size_per_shard"] == before["size_per_shard"]
    assert after["num_inserted"] == before["num_inserted"]
    draws = np.concatenate([fresh.sample(32).batch["id"] for _ in range(20)])
    assert set(draws.tolist()) <= set(range(120))
    # Rows keep their priorities: high ids are drawn far more often than low ones.
    assert np.mean(draws >= 60) > 0.6

    other = make_replay(num_shards=3, capacity=200, alpha=1.0)
    with pytest.raises(ValueError, match="num_shards"):
        other.restore(str(tmp_path / "ckpt"))
    with pytest.raises(FileNotFoundError):
        other.restore(str(tmp_path / "missing"))


def test_killed_shard_restarts_from_snapshot_and_losses_are_counted(make_replay, tmp_path):
    import ray

    replay = make_replay(
        num_shards=2,
        capacity=4_000,
        snapshot_dir=str(tmp_path / "snap"),
        snapshot_every_inserts=100,
        retry_down_shard_after_s=0.5,
    )
    rng = np.random.default_rng(0)
    next_id = 0
    for _ in range(20):
        replay.add(rows(next_id, 25))
        next_id += 25
    replay.flush()
    assert replay.stats(wait=True)["size"] == 500
    ray.kill(replay.handles[0], no_restart=False)
    # A training-style loop keeps going while the shard is down and comes back.
    deadline = time.monotonic() + 30
    cycles = 0
    while time.monotonic() < deadline:
        sample = replay.sample(32)
        replay.update_priorities(sample.keys, rng.random(32))
        replay.add(rows(next_id, 25))
        next_id += 25
        cycles += 1
        if (
            cycles > 50
            and replay.stats(wait=True)["shards_alive"] == 2
            and replay.stats(wait=True)["shard_failures"]
        ):
            break
    replay.flush()
    stats = replay.stats(wait=True)
    assert cycles > 50
    assert stats["shard_failures"] >= 1
    assert stats["shards_alive"] == 2
    # Shard 0 held 250 rows and snapshotted every 100 inserts: at most the last 50 are lost.
    assert 0 <= stats["items_lost"] <= 100
    # Nothing silently vanished: every inserted row is stored, or counted as lost. (An add the
    # shard applied just before dying unanswered is re-sent elsewhere; if its snapshot also
    # held it, that one batch of 25 counts twice.)
    assert next_id <= stats["num_inserted"] + stats["items_lost"] <= next_id + 25
    # The shards' own row counts: every row they acknowledged is stored, evicted or lost.
    assert stats["rows_acknowledged"] == stats["size"] + stats["rows_evicted"] + stats["items_lost"]
    assert next_id <= stats["rows_acknowledged"] <= next_id + 25


def test_rows_another_process_added_after_the_snapshot_count_as_lost_exactly(make_replay, tmp_path):
    """The driver's client never saw the rows an actor added after the shard's last snapshot
    (an actor's replies reach only the actor). The shard dies: its restarted incarnation
    counts them itself, from the row counters it keeps beside its snapshots, so the driver's
    ``items_lost`` is exact, not the driver's stale view (it used to read 0 here)."""
    import ray

    replay = make_replay(
        num_shards=1,
        capacity=4_000,
        snapshot_dir=str(tmp_path / "snap"),
        snapshot_every_inserts=100,
        retry_down_shard_after_s=0.2,
    )
    assert replay.stats(wait=True)["num_inserted"] == 0  # the driver's view, from now on stale

    @ray.remote(num_cpus=0.1)
    def insert(client, batches: int) -> None:  # an actor's copy of the client
        for start in range(0, 25 * batches, 25):
            ids = np.arange(start, start + 25)
            client.add({"id": ids, "obs": np.repeat(ids[:, None], 3, 1).astype(np.float32)})
        client.flush()

    ray.get(insert.remote(replay, 10), timeout=60)  # 250 rows; snapshots at 100 and 200
    ray.kill(replay.handles[0], no_restart=False)
    deadline = time.monotonic() + 30
    while (stats := replay.stats(wait=True))["shard_failures"] == 0 or stats["shards_alive"] < 1:
        assert time.monotonic() < deadline, "the shard never came back"
        time.sleep(0.1)
    assert stats["size"] == 200
    assert stats["items_lost"] == 50
    assert stats["rows_acknowledged"] == 250 == stats["size"] + stats["items_lost"]


def damage_shard_snapshots(directory, shard: int) -> int:
    """Cut every file of ``shard``'s snapshots under ``directory`` to a third; how many."""
    files = [
        path
        for path in directory.rglob("*")
        if path.is_file()
        and path.relative_to(directory).parts[0] in (f"shard_{shard}", f"shard_{shard}.pkl")
    ]
    for path in files:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    return len(files)


def test_a_shard_whose_snapshots_are_damaged_restarts_empty_counts_its_rows_and_saves_again(
    make_replay, tmp_path
):
    """It used to die in its creation task (UnpicklingError), never come back, count no rows
    lost, and make the next save raise ReplayUnavailable."""
    import ray

    replay = make_replay(
        num_shards=2,
        capacity=4_000,
        snapshot_dir=str(tmp_path / "snap"),
        snapshot_every_inserts=100,
        retry_down_shard_after_s=0.5,
        timeout_s=10.0,
    )
    for start in range(0, 500, 25):
        replay.add(rows(start, 25))
    replay.flush()
    held = replay.stats(wait=True)["size_per_shard"][0]
    assert held >= 200
    assert damage_shard_snapshots(tmp_path / "snap", 0) > 0
    ray.kill(replay.handles[0], no_restart=False)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stats = replay.stats(wait=True)
        if stats["shards_alive"] == 2 and stats["shard_failures"]:
            break
        replay.add(rows(0, 1))  # calls notice the restart sooner than status polls
        time.sleep(0.2)
    replay.flush()
    stats = replay.stats(wait=True)
    assert stats["shards_alive"] == 2
    assert stats["snapshots_rejected"] == 2  # the newest generation and the one kept before it
    assert stats["items_lost"] == held  # every row it held: it started empty
    replay.save(str(tmp_path / "ckpt"))  # every shard answers again


class CraftedPickle:
    """Unpickled, it writes a file: what a stranger's "snapshot" could do instead."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        import pathlib

        return (pathlib.Path(self.path).write_text, ("the pickle ran",))


def test_restoring_a_checkpoint_with_a_crafted_pickle_runs_nothing_and_changes_nothing(
    make_replay, tmp_path
):
    """It used to run the pickle's code in the shard, then fail with a raw RayTaskError."""
    import shutil

    replay = make_replay(num_shards=2, capacity=200)
    replay.add(rows(0, 40))
    replay.flush()
    checkpoint = tmp_path / "ckpt"
    replay.save(str(checkpoint))
    for stale in checkpoint.glob("shard_1*"):
        shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    marker = tmp_path / "ran"
    (checkpoint / "shard_1.pkl").write_bytes(pickle.dumps(CraftedPickle(str(marker))))
    replay.add(rows(40, 40))
    replay.flush()
    before = replay.stats(wait=True)["size_per_shard"]
    with pytest.raises(Exception, match=r"shard_1\.pkl.*convert_pickle_snapshot") as refused:
        replay.restore(str(checkpoint))
    assert type(refused.value).__name__ == "LegacyPickleSnapshot"  # the project's, not Ray's
    assert not marker.exists()
    # shard 0's file was good, but no shard swapped its rows in: the replay is as it was
    assert replay.stats(wait=True)["size_per_shard"] == before == [40, 40]


def test_priorities_for_rows_of_a_shard_that_restarted_meanwhile_are_dropped_as_stale(
    make_replay, tmp_path
):
    """Keys sampled before a shard restarted name rows of its old incarnation: the restarted
    shard (restored from an older snapshot) hands out the same insert ids to other rows, or none
    yet. Their priority updates are dropped and counted as stale, never applied to the new
    rows and never an error (the learner died on one: key 130 must be in [0, 130))."""
    import ray

    replay = make_replay(
        num_shards=1,
        capacity=1_000,
        snapshot_dir=str(tmp_path / "snap"),
        snapshot_every_inserts=100,
        retry_down_shard_after_s=0.2,
    )
    replay.add(rows(0, 100))  # snapshot at 100 inserts
    replay.add(rows(100, 30))  # ids 100-129 only in the old incarnation
    replay.flush()
    old = replay.sample(64)
    incarnation = replay.refresh()[0].incarnation
    ray.kill(replay.handles[0], no_restart=False)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = replay.refresh()[0]
        if status is not None and status.incarnation != incarnation:
            break
        time.sleep(0.2)
    assert status is not None and status.incarnation != incarnation and status.size == 100
    replay.add(rows(1_000, 30))  # the new incarnation's ids 100-129: other rows
    replay.flush()
    before = replay.stats(wait=True)["stale_updates"]
    replay.update_priorities(old.keys, np.full(len(old.keys), 1e6))
    replay.flush()
    assert replay.stats(wait=True)["stale_updates"] - before == len(old.keys)
    assert replay.refresh()[0].total_priority < 1e6  # none reached a row of the new incarnation
    new = replay.sample(16)  # keys sampled from the new incarnation still update
    replay.update_priorities(new.keys, np.full(len(new.keys), 1e3))
    replay.flush()
    assert replay.refresh()[0].total_priority >= 1e3


def test_restore_while_a_shard_restarts_waits_for_it(make_replay, tmp_path):
    import ray

    replay = make_replay(num_shards=2, capacity=400, alpha=1.0)
    for start in range(0, 120, 20):
        replay.add(rows(start, 20), priorities=np.ones(20))
    replay.flush()
    replay.save(str(tmp_path / "ckpt"))
    replay.add(rows(500, 20))
    ray.kill(replay.handles[1], no_restart=False)  # Ray restarts it; restore must wait

    replay.restore(str(tmp_path / "ckpt"))

    assert replay.stats(wait=True)["size_per_shard"] == [60, 60]


def test_calls_to_a_shard_that_never_comes_back_raise_the_projects_error(make_replay, tmp_path):
    import ray

    from rl_dist_ext.replay.distributed import ReplayUnavailable

    replay = make_replay(num_shards=2, capacity=400, timeout_s=1.5)  # each call waits it out
    replay.add(rows(0, 20))
    replay.flush()
    replay.save(str(tmp_path / "ckpt"))
    ray.kill(replay.handles[0], no_restart=True)
    started = time.monotonic()
    for call in (
        lambda: replay.restore(str(tmp_path / "ckpt")),
        lambda: replay.save(str(tmp_path / "again")),
        replay.clear,
    ):
        with pytest.raises(ReplayUnavailable, match=r"replay shard 0 .*dead"):
            call()
    assert time.monotonic() - started < 60  # bounded waits, not a hang


def test_adds_give_up_when_no_shard_is_alive(make_replay):
    """Batches whose shards died are re-sent elsewhere; when no shard ever answers again, the
    client raises the project's error after timeout_s instead of re-sending forever."""
    import ray

    from rl_dist_ext.replay.distributed import ReplayUnavailable

    replay = make_replay(num_shards=2, capacity=400, timeout_s=2.0, max_in_flight_adds=1)
    replay.add(rows(0, 10))
    replay.flush()
    for handle in replay.handles:
        ray.kill(handle, no_restart=True)
    with pytest.raises(ReplayUnavailable, match="no replay shard took a batch"):
        for start in range(10, 1_000, 10):
            replay.add(rows(start, 10))
        replay.flush()
    assert replay.stats(wait=True)["adds_rerouted"] >= 1


def test_client_pickles_into_a_remote_producer(make_replay):
    import ray

    replay = make_replay(num_shards=2, capacity=1_000)

    @ray.remote(num_cpus=0.1)
    def produce(client, start):
        # Self-contained: test-module helpers are not importable on Ray workers.
        for offset in range(0, 100, 20):
            ids = np.arange(start + offset, start + offset + 20)
            client.add({"id": ids, "obs": np.repeat(ids[:, None], 3, axis=1).astype(np.float32)})
        client.flush()
        return client.stats(wait=True)["num_inserted"]

    ray.get([produce.remote(replay, 0), produce.remote(replay, 1000)], timeout=60)
    assert replay.stats(wait=True)["size"] == 200


def test_a_client_in_another_actor_samples_every_shard_by_its_mass(make_replay):
    """The learner layout (``num_learners=1``): the client is unpickled inside its own actor and
    rows come from a third process. The client must learn of every shard's priority mass by
    itself, including shards that were empty when it first looked."""
    import ray

    replay = make_replay(
        num_shards=4, capacity=8_000, alpha=1.0, eps=1e-9, prefetch=2, status_refresh_s=0.2
    )

    @ray.remote(num_cpus=0.1)
    class Sampler:  # self-contained: test-module helpers are not importable on Ray workers
        def __init__(self, client):
            self.client = client

        def shards(self, draws: int) -> list[int]:
            out = []
            for _ in range(draws):
                keys = self.client.sample(8).keys % self.client.num_shards
                assert (keys == keys[0]).all()  # a batch comes whole from one shard
                out.append(int(keys[0]))
            return out

    @ray.remote(num_cpus=0.1)
    def insert(client, start: int, priorities: list[float]) -> None:
        for j, priority in enumerate(priorities):  # round-robin: one batch per shard
            ids = np.arange(start + 500 * j, start + 500 * (j + 1))
            client.add(
                {"id": ids, "obs": np.repeat(ids[:, None], 3, axis=1).astype(np.float32)},
                priorities=np.full(500, priority),
            )
        client.flush()

    # Phase 1: only shards 0 and 1 hold rows when the sampler starts.
    for shard in (0, 1):
        ray.get(replay.handles[shard].add.remote(rows(10_000 * shard, 200), np.ones(200)))
    sampler = Sampler.remote(replay)
    first = ray.get(sampler.shards.remote(60), timeout=60)
    assert set(first) == {0, 1}
    # Phase 2: a third process inserts into every shard, with masses far apart.
    ray.get(insert.remote(replay, 100_000, [1.0, 2.0, 4.0, 8.0]), timeout=60)
    masses = np.array([status.total_priority for status in replay.refresh()])
    assert masses.min() > 0 and masses.max() / masses.min() > 4
    ray.get(sampler.shards.remote(20), timeout=60)  # replies to stale picks drain
    draws = np.bincount(ray.get(sampler.shards.remote(800), timeout=120), minlength=4)
    assert (draws > 0).all(), draws
    chi = scipy_stats.chisquare(draws, masses / masses.sum() * draws.sum())
    assert chi.pvalue > 1e-3, (draws.tolist(), masses.tolist())
    ray.kill(sampler)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"num_shards": 0}, "num_shards"),
        ({"capacity": 1}, "capacity"),
        ({"alpha": -1.0}, "alpha"),
        ({"min_size_to_sample": 5_000}, "min_size_to_sample"),
        ({"samples_per_insert": 0.0}, "samples_per_insert"),
        ({"error_buffer": 5.0}, "error_buffer"),
        ({"prefetch": 0}, "prefetch"),
        ({"batches_per_request": 0}, "batches_per_request"),
        ({"max_in_flight_adds": 0}, "max_in_flight_adds"),
        ({"num_cpus_per_shard": -1}, "num_cpus_per_shard"),
        ({"bundle_indices": (0, 1)}, "placement_group"),
        ({"snapshot_every_inserts": 10}, "snapshot_dir"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"status_refresh_s": 0}, "status_refresh_s"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_config_raises_before_any_actor_starts(overrides, match):
    with pytest.raises(ValueError, match=match):
        config(**overrides)


def test_impossible_cpu_request_raises_before_actors_start(ray_session):
    from conftest import alive_actor_count

    before = alive_actor_count()
    with pytest.raises(ValueError, match="num_cpus_per_shard"):
        DistributedReplay(config(num_shards=8, num_cpus_per_shard=1.0))
    assert alive_actor_count() == before


def test_bad_calls_raise(make_replay):
    replay = make_replay(num_shards=1)
    with pytest.raises(TypeError, match="batch"):
        replay.add([1, 2, 3])
    with pytest.raises(ValueError, match="priorities"):
        replay.add(rows(0, 4), priorities=np.ones(3))
    with pytest.raises(ValueError, match="batch_size"):
        replay.sample(0)
    with pytest.raises(ValueError, match="beta"):
        replay.sample(4, beta=2.0)
    with pytest.raises(ValueError, match="keys"):
        replay.update_priorities(np.array([0.5]), np.array([1.0]))
    with pytest.raises(TypeError, match="DistributedReplayConfig"):
        DistributedReplay({"num_shards": 1})


def test_shards_run_inside_a_placement_group(ray_session):
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group([{"CPU": 0.1}, {"CPU": 0.1}])
    ray_session.get(group.ready(), timeout=60)
    replay = DistributedReplay(config(num_shards=2, placement_group=group, bundle_indices=(1, 0)))
    try:
        replay.add(rows(0, 10))
        replay.add(rows(10, 10))
        replay.flush()
        assert replay.stats(wait=True)["size"] == 20
        assert len(replay.sample(8).keys) == 8
    finally:
        replay.close()
        remove_placement_group(group)


def test_stats_never_wait_on_a_shard_and_stay_current_from_status_polls(make_replay, monkeypatch):
    """A training loop reads stats every iteration: they come from statuses the client already
    has (no blocking ray.get); its background status requests keep them current."""
    import ray

    replay = make_replay(num_shards=2, capacity=400, status_refresh_s=0.2)
    writer = pickle.loads(pickle.dumps(replay))  # another process's client, as an actor has
    writer.add(rows(0, 50))
    writer.add(rows(50, 50))  # round-robin: one batch per shard
    writer.flush()

    real_get = ray.get

    def no_blocking_get(refs, *args, **kwargs):
        listed = refs if isinstance(refs, list) else [refs]
        if len(ray.wait(listed, num_returns=len(listed), timeout=0)[0]) < len(listed):
            raise AssertionError("stats() waited on a shard")
        return real_get(refs, *args, **kwargs)  # a reply that is already here

    monkeypatch.setattr(ray, "get", no_blocking_get)
    deadline = time.monotonic() + 10
    while replay.stats()["size"] < 100:  # the inserts show up through the status polls
        assert time.monotonic() < deadline, replay.stats()
        time.sleep(0.05)
    with pytest.raises(AssertionError, match="waited"):
        replay.stats(wait=True)
    monkeypatch.setattr(ray, "get", real_get)
    assert replay.stats(wait=True)["size_per_shard"] == [50, 50]


def test_stats_report_a_dead_shard_without_waiting_for_it(make_replay):
    import ray

    replay = make_replay(num_shards=2, capacity=400, status_refresh_s=0.2)
    replay.add(rows(0, 100))
    replay.flush()
    ray.kill(replay.handles[1], no_restart=True)
    deadline = time.monotonic() + 10
    while (stats := replay.stats())["shards_alive"] != 1:
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)
    assert stats["shard_failures"] == 1 and stats["size_per_shard"][1] is None


def test_an_insert_counts_for_the_rate_limiter_what_its_count_says(make_replay):
    """Multi-agent actors credit each module's replay with env steps, not rows: the count
    travels through the client to the shard's limiter (and into the stats)."""
    replay = make_replay(
        num_shards=1,
        capacity=1_000,
        min_size_to_sample=1,
        samples_per_insert=1.0,
        error_buffer=8.0,
        timeout_s=2.0,
        status_refresh_s=0.2,
    )
    replay.add({"x": np.zeros((4, 1), np.float32)}, count=40)
    replay.flush()
    stats = replay.stats(wait=True)
    assert (stats["num_inserted"], stats["counted_inserts"]) == (4, 40)
    # 40 sampled rows on 4 inserted ones: counted as rows, the limiter would have held the
    # learner after 11 (and raised RateLimitTimeout after timeout_s)
    for _ in range(10):
        replay.sample(4, beta=0.0)
    assert 1.0 <= replay.stats(wait=True)["rate_limiter_ratio"] <= 1.2  # prefetch: 1-2 more
    with pytest.raises(ValueError, match="count must be an int >= 0"):
        replay.add({"x": np.zeros((1, 1), np.float32)}, count=-1)
