"""Tests for rl_dist_ext.replay.shard.ReplayShardServer under plain asyncio (no Ray)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from rl_dist_ext.ops.priorities import td_priorities
from rl_dist_ext.replay import snapshot
from rl_dist_ext.replay.rate_limiter import RateLimit
from rl_dist_ext.replay.shard import (
    RateLimitTimeout,
    ReplayShardServer,
    ShardSample,
    ShardSpec,
    ShardStatus,
)

ALPHA = 0.6
EPS = 1e-6


def make_batch(start: int, n: int) -> dict[str, np.ndarray]:
    """``n`` rows whose contents encode their row number ``start .. start + n - 1``."""
    ids = np.arange(start, start + n)
    return {
        "obs": (ids[:, None] * 10 + np.arange(3)[None, :]).astype(np.float32),
        "row": ids.astype(np.int64),
    }


def stored(raw) -> np.ndarray:
    return td_priorities(np.asarray(raw, dtype=np.float64), alpha=ALPHA, eps=EPS)


def make_spec(**overrides) -> ShardSpec:
    kwargs = {"shard_index": 3, "capacity": 1000, "alpha": ALPHA, "eps": EPS, "seed": 7}
    kwargs.update(overrides)
    return ShardSpec(**kwargs)


def blocking_spec(**overrides) -> ShardSpec:
    limit = RateLimit(min_size_to_sample=10, samples_per_insert=1.0, error_buffer=20)
    kwargs = {"rate_limit": limit, "timeout_s": 5.0}
    kwargs.update(overrides)
    return make_spec(**kwargs)


def assert_rows_match_keys(keys: np.ndarray, batch: dict[str, np.ndarray]) -> None:
    """Rows of a server's first incarnation (or restored from it) have key == row number."""
    rows = np.asarray(keys, dtype=np.int64)
    np.testing.assert_array_equal(batch["row"], rows)
    np.testing.assert_array_equal(
        batch["obs"], (rows[:, None] * 10 + np.arange(3)[None, :]).astype(np.float32)
    )


# ---- add / sample / update_priorities -------------------------------------------------------


def test_add_then_sample_round_trip():
    async def main():
        server = ReplayShardServer(make_spec())
        empty = await server.get_status()
        assert isinstance(empty, ShardStatus)
        assert empty.size == 0
        assert empty.total_priority == 0.0
        assert empty.min_priority == float("inf")
        assert (empty.num_inserted, empty.num_sampled, empty.stale_updates) == (0, 0, 0)

        raw = np.linspace(0.5, 3.0, 20)
        status = await server.add(make_batch(0, 20), raw)
        assert isinstance(status, ShardStatus)
        assert status.shard_index == 3
        assert status.size == 20
        assert status.total_priority == pytest.approx(stored(raw).sum(), rel=1e-9)
        assert status.min_priority == pytest.approx(stored(raw).min(), rel=1e-12)
        assert status.num_inserted == 20
        assert status.num_sampled == 0
        assert status.stale_updates == 0
        assert isinstance(status.incarnation, str) and status.incarnation
        assert status.restored_num_inserted == 0

        status = await server.add(make_batch(20, 5))  # no priorities: the largest seen (3.0)
        assert status.size == 25
        assert status.num_inserted == 25
        assert status.total_priority == pytest.approx(
            stored(raw).sum() + 5 * stored([3.0])[0], rel=1e-9
        )

        sample = await server.sample(16)
        assert isinstance(sample, ShardSample)
        assert sample.keys.shape == (16,) and sample.keys.dtype == np.int64
        assert sample.priorities.shape == (16,) and sample.priorities.dtype == np.float64
        assert set(sample.batch) == {"obs", "row"}
        assert sample.batch["obs"].shape == (16, 3)
        assert sample.batch["row"].shape == (16,)
        assert ((sample.keys >= 0) & (sample.keys < 25)).all()
        assert_rows_match_keys(sample.keys, sample.batch)
        all_stored = np.concatenate([stored(raw), np.full(5, stored([3.0])[0])])
        np.testing.assert_allclose(sample.priorities, all_stored[sample.keys], rtol=1e-12)
        assert sample.status.num_sampled == 16
        assert sample.status.size == 25
        assert sample.status.incarnation == status.incarnation

        again = await server.sample(4)
        assert again.status.num_sampled == 20
        assert (await server.get_status()).num_sampled == 20

    asyncio.run(main())


def test_update_priorities_reaches_the_right_items():
    async def main():
        server = ReplayShardServer(make_spec(capacity=16))
        await server.add(make_batch(0, 16), np.ones(16))
        sample = await server.sample(64)
        keys = np.unique(sample.keys)
        assert keys.size >= 4
        target = keys[:3]
        status = await server.update_priorities(target, np.zeros(3))
        assert status.stale_updates == 0
        expected = 13 * stored([1.0])[0] + 3 * stored([0.0])[0]
        assert status.total_priority == pytest.approx(expected, rel=1e-9)
        assert status.min_priority == pytest.approx(stored([0.0])[0], rel=1e-12)

        # only the row we raised can be drawn (the others hold ~1e-6 ** 0.6 of the mass each)
        await server.update_priorities(np.arange(16), np.zeros(16))
        await server.update_priorities(np.array([11]), np.array([5.0]))
        drawn = await server.sample(256)
        assert set(drawn.keys.tolist()) == {11}
        np.testing.assert_array_equal(drawn.batch["row"], np.full(256, 11))
        assert drawn.status.total_priority == pytest.approx(
            15 * stored([0.0])[0] + stored([5.0])[0], rel=1e-9
        )

    asyncio.run(main())


def test_stale_keys_are_dropped_and_counted():
    async def main():
        server = ReplayShardServer(make_spec(capacity=8))
        await server.add(make_batch(0, 8), np.ones(8))
        old = await server.sample(32)
        old_keys = np.unique(old.keys)
        assert old_keys.size > 1
        # overwrite every row: the old keys now point at rows that are gone
        status = await server.add(make_batch(8, 8), np.ones(8))
        total = status.total_priority
        status = await server.update_priorities(old_keys, np.full(old_keys.size, 100.0))
        assert status.stale_updates == old_keys.size
        assert status.total_priority == pytest.approx(total, rel=1e-12)
        # a mix: live keys are applied, stale ones counted
        status = await server.update_priorities(np.array([2, 10, 15]), np.array([9.0, 0.0, 0.0]))
        assert status.stale_updates == old_keys.size + 1
        expected = 6 * stored([1.0])[0] + 2 * stored([0.0])[0]
        assert status.total_priority == pytest.approx(expected, rel=1e-9)
        assert (await server.get_status()).stale_updates == old_keys.size + 1

    asyncio.run(main())


# ---- rate limiting --------------------------------------------------------------------------


def test_blocked_sample_is_released_by_an_insert():
    # window on diff = inserts - samples: [10 - 20, 10 + 20] = [-10, 30]
    async def main():
        server = ReplayShardServer(blocking_spec())
        await server.add(make_batch(0, 10))
        # diff 10 -> 5 -> 0 -> -5 -> -10 -> -15: five samples are admitted, the sixth waits
        done = 0
        while True:
            try:
                await asyncio.wait_for(server.sample(5), 0.2)
            except asyncio.TimeoutError:
                break
            done += 1
            assert done <= 5
        assert done == 5
        assert (await server.get_status()).num_sampled == 25

        pending = asyncio.create_task(server.sample(5))
        await asyncio.sleep(0.05)
        assert not pending.done()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(pending), 0.2)
        assert not pending.done()

        # 4 rows bring diff to -11: still too far behind
        await asyncio.create_task(server.add(make_batch(10, 4)))
        await asyncio.sleep(0.05)
        assert not pending.done()
        # one more row: diff -10 == low, the waiting sample proceeds
        adder = asyncio.create_task(server.add(make_batch(14, 1)))
        sample = await asyncio.wait_for(pending, 2.0)
        await adder
        assert sample.keys.shape == (5,)
        assert_rows_match_keys(sample.keys, sample.batch)
        status = await server.get_status()
        assert status.num_sampled == 30
        assert status.size == 15

    asyncio.run(main())


def test_blocked_insert_is_released_by_a_sample():
    async def main():
        server = ReplayShardServer(blocking_spec())
        # diff 10 -> 20 -> 30 -> 40: the fourth batch is admitted at diff 30 == high
        for i in range(4):
            await asyncio.wait_for(server.add(make_batch(10 * i, 10)), 0.2)
        pending = asyncio.create_task(server.add(make_batch(40, 10)))
        await asyncio.sleep(0.05)
        assert not pending.done()
        assert (await server.get_status()).size == 40

        await server.sample(5)  # diff 35: still ahead
        await asyncio.sleep(0.05)
        assert not pending.done()
        sampler = asyncio.create_task(server.sample(5))  # diff 30: the insert proceeds
        status = await asyncio.wait_for(pending, 2.0)
        await sampler
        assert status.size == 50
        assert status.num_inserted == 50
        assert status.num_sampled == 10

    asyncio.run(main())


def test_stop_rate_limiting_releases_a_blocked_insert_and_later_ones():
    async def main():
        server = ReplayShardServer(blocking_spec())
        for i in range(4):  # diff 40: the next insert waits for a sampler
            await asyncio.wait_for(server.add(make_batch(10 * i, 10)), 0.2)
        pending = asyncio.create_task(server.add(make_batch(40, 10)))
        await asyncio.sleep(0.05)
        assert not pending.done()
        await server.stop_rate_limiting()
        status = await asyncio.wait_for(pending, 1.0)
        assert status.size == 50
        later = await asyncio.wait_for(server.add(make_batch(50, 10)), 0.2)
        assert later.size == 60

    asyncio.run(main())


def test_many_waiting_samplers_are_released_one_batch_at_a_time():
    async def main():
        server = ReplayShardServer(blocking_spec())
        await server.add(make_batch(0, 10))
        for _ in range(5):
            await server.sample(5)  # diff -15 now
        waiters = [asyncio.create_task(server.sample(5)) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert not any(w.done() for w in waiters)
        await server.add(make_batch(10, 5))  # diff -10: exactly one sampler may go
        await asyncio.sleep(0.05)
        assert sum(w.done() for w in waiters) == 1
        await server.add(make_batch(15, 10))  # diff -5 -> admits at -5 and -10
        await asyncio.wait_for(asyncio.gather(*waiters), 2.0)
        assert (await server.get_status()).num_sampled == 40

    asyncio.run(main())


def test_blocked_sample_times_out():
    async def main():
        server = ReplayShardServer(blocking_spec(timeout_s=0.3))
        start = time.monotonic()
        with pytest.raises(RateLimitTimeout) as info:
            await server.sample(4)  # empty shard, below min_size_to_sample
        assert 0.25 <= time.monotonic() - start < 2.0
        message = str(info.value)
        assert isinstance(info.value, TimeoutError)
        assert "rate limiter" in message
        assert "sample" in message
        assert "size=0" in message
        assert "min_size_to_sample=10" in message
        assert "samples_per_insert=1.0" in message
        assert "[-10.0, 30.0]" in message

        # the shard still works after a timeout: enough rows, then sampling goes through
        await server.add(make_batch(0, 10))
        sample = await asyncio.wait_for(server.sample(4), 1.0)
        assert sample.status.num_sampled == 4

        # now run the learner too far ahead: diff 6 -> 2 -> -2 -> -6 -> -10 -> -14, then blocked
        for _ in range(5):
            await asyncio.wait_for(server.sample(4), 1.0)
        with pytest.raises(RateLimitTimeout, match="rate limiter") as info:
            await server.sample(4)
        assert "diff=-14.0" in str(info.value)
        assert "actors are not inserting fast enough" in str(info.value)
        assert (await server.get_status()).num_sampled == 24

    asyncio.run(main())


def test_blocked_insert_times_out():
    async def main():
        server = ReplayShardServer(blocking_spec(timeout_s=0.3))
        for i in range(4):
            await server.add(make_batch(10 * i, 10))  # diff 40 > high 30
        with pytest.raises(RateLimitTimeout) as info:
            await server.add(make_batch(40, 10))
        message = str(info.value)
        assert "rate limiter" in message
        assert "insert" in message
        assert "inserts=40" in message
        assert "diff=40.0" in message
        assert "[-10.0, 30.0]" in message
        status = await server.get_status()
        assert status.size == 40
        assert status.num_inserted == 40

    asyncio.run(main())


def test_server_can_block_under_a_second_event_loop():
    server = ReplayShardServer(blocking_spec(timeout_s=0.2))
    with pytest.raises(RateLimitTimeout):
        asyncio.run(server.sample(1))
    with pytest.raises(RateLimitTimeout):
        asyncio.run(server.sample(1))


# ---- snapshots ------------------------------------------------------------------------------


def snapshotted_inserts(uri: str) -> int:
    """num_inserted of the newest snapshot at ``uri``."""
    return snapshot.read_snapshot(uri).state["replay"]["num_inserted"]


def test_snapshot_every_inserts_and_restart_restores_it(tmp_path):
    uri = str(tmp_path / "snapshots" / "shard3")
    spec = make_spec(capacity=200, snapshot_uri=uri, snapshot_every_inserts=50)

    async def first_life():
        server = ReplayShardServer(spec)
        for i in range(12):
            await server.add(make_batch(10 * i, 10), np.ones(10))
        sample = await server.sample(1024)  # uniform priorities: covers every row
        return server, sample

    old, handed_out = asyncio.run(first_life())
    old_status = old.status()
    assert old_status.num_inserted == 120
    keys = np.unique(handed_out.keys)
    before, after = keys[keys < 100], keys[keys >= 100]
    assert before.size > 50 and after.size > 10

    assert snapshotted_inserts(uri) == 100  # snapshots at 50 and 100
    assert not list((tmp_path / "snapshots").rglob("*.tmp"))

    async def second_life():
        server = ReplayShardServer(spec, restore_snapshot=True)
        status = await server.get_status()
        assert status.size == 100
        assert status.num_inserted == 100
        assert status.restored_num_inserted == 100
        assert status.num_sampled == 0
        assert status.incarnation != old_status.incarnation
        assert status.incarnation
        assert status.total_priority == pytest.approx(100 * stored([1.0])[0], rel=1e-9)
        stale_before = status.stale_updates

        # keys of rows added after the snapshot are stale here
        status = await server.update_priorities(after, np.full(after.size, 50.0))
        assert status.stale_updates == stale_before + after.size
        assert status.total_priority == pytest.approx(100 * stored([1.0])[0], rel=1e-9)
        assert status.size == 100

        # keys of restored rows still reach their rows
        status = await server.update_priorities(before, np.full(before.size, 4.0))
        assert status.stale_updates == stale_before + after.size
        expected = (100 - before.size) * stored([1.0])[0] + before.size * stored([4.0])[0]
        assert status.total_priority == pytest.approx(expected, rel=1e-9)

        # restored rows keep their contents, and only restored rows are drawn
        sample = await server.sample(256)
        assert (sample.keys < 100).all()
        assert_rows_match_keys(sample.keys, sample.batch)

        # new rows get fresh keys; the dead incarnation's keys stay stale even after that
        await server.add(make_batch(1000, 30), np.ones(30))
        fresh = await server.sample(512)
        is_new = fresh.batch["row"] >= 1000
        new_keys = fresh.keys[is_new]
        assert new_keys.size > 0
        assert not np.isin(new_keys, keys).any()
        # row 1000 + j got key base + j, with base moved on by a whole number of capacities
        bases = np.unique(new_keys - (fresh.batch["row"][is_new] - 1000))
        assert bases.size == 1
        assert bases[0] > 120 and (bases[0] - 100) % 200 == 0
        assert_rows_match_keys(
            fresh.keys[~is_new], {name: col[~is_new] for name, col in fresh.batch.items()}
        )
        total = (await server.get_status()).total_priority
        status = await server.update_priorities(after, np.full(after.size, 50.0))
        assert status.stale_updates == stale_before + 2 * after.size
        assert status.total_priority == pytest.approx(total, rel=1e-12)
        assert status.num_inserted == 130
        assert status.restored_num_inserted == 100

    asyncio.run(second_life())


@pytest.mark.parametrize("seed", range(6))
def test_row_counts_across_restarts_match_a_reference_that_follows_every_row(tmp_path, seed):
    """A shard that evicts, snapshots and dies (its object dropped, as a killed process leaves
    it: no close) several times, sometimes with its snapshots damaged. A reference that follows
    every row by its number says which rows were held at each death and not restored (lost);
    the shard's own counts must agree, and acknowledged == size + evicted + lost."""
    rng = np.random.default_rng(seed)
    uri = str(tmp_path / "shard")
    spec = make_spec(capacity=40, snapshot_uri=uri, snapshot_every_inserts=int(rng.integers(5, 30)))
    next_row, acknowledged, lost = 0, 0, 0

    async def life(server: ReplayShardServer, adds: int) -> None:
        nonlocal next_row, acknowledged
        for _ in range(adds):
            n = int(rng.integers(1, 12))
            await server.add(make_batch(next_row, n))
            next_row += n
            acknowledged += n

    def rows_held(server: ReplayShardServer) -> set[int]:
        if len(server._replay) == 0:
            return set()
        sample = asyncio.run(server.sample(4096))  # uniform priorities: every row is drawn
        return set(sample.batch["row"].tolist())

    server = ReplayShardServer(spec)
    for death in range(4):
        asyncio.run(life(server, int(rng.integers(3, 15))))
        held = rows_held(server)
        assert len(held) == len(server._replay)
        if death == 2:  # damaged snapshots: the restart falls back to none, starting empty
            for path in (tmp_path / "shard").glob("*.arrow"):
                path.write_bytes(path.read_bytes()[:10])
        server = ReplayShardServer(spec, restore_snapshot=True)
        lost += len(held - rows_held(server))
        status = server.status()
        assert status.rows_lost == lost
        assert status.rows_acknowledged == acknowledged
        assert acknowledged == status.size + status.rows_evicted + status.rows_lost
        assert status.rows_evicted >= 0
    asyncio.run(life(server, 5))
    status = server.status()
    assert (status.rows_acknowledged, status.rows_lost) == (acknowledged, lost)
    assert acknowledged == status.size + status.rows_evicted + status.rows_lost


def test_a_fresh_shard_restarts_its_row_counts_and_a_restore_keeps_the_losses(tmp_path):
    spec = make_spec(snapshot_uri=str(tmp_path / "shard"), snapshot_every_inserts=10)

    async def main():
        first = ReplayShardServer(spec)
        await first.add(make_batch(0, 25))  # snapshot at 25 (one add of 25)
        await first.add(make_batch(25, 5))
        restarted = ReplayShardServer(spec, restore_snapshot=True)
        assert (restarted.status().rows_acknowledged, restarted.status().rows_lost) == (30, 5)
        await restarted.save(str(tmp_path / "ckpt"))
        await restarted.add(make_batch(30, 10))
        await restarted.restore(str(tmp_path / "ckpt"))  # 25 rows, the losses stay counted
        status = restarted.status()
        assert (status.rows_acknowledged, status.rows_evicted, status.rows_lost) == (30, 0, 5)
        await restarted.clear()
        status = restarted.status()
        assert (status.rows_acknowledged, status.size, status.rows_lost) == (5, 0, 5)
        fresh = ReplayShardServer(spec)  # another run at the same location: counts from 0
        status = fresh.status()
        assert (status.rows_acknowledged, status.rows_evicted, status.rows_lost) == (0, 0, 0)
        unsnapshotted = ReplayShardServer(make_spec())
        assert unsnapshotted.status().rows_acknowledged == -1  # no location: not counted

    asyncio.run(main())


def test_restart_without_restore_starts_empty(tmp_path):
    uri = str(tmp_path / "shard")
    spec = make_spec(snapshot_uri=uri, snapshot_every_inserts=10)

    async def main():
        first = ReplayShardServer(spec)
        await first.add(make_batch(0, 20))
        assert snapshot.read_snapshot(uri) is not None
        fresh = ReplayShardServer(spec, restore_snapshot=False)
        status = await fresh.get_status()
        assert status.size == 0
        assert status.num_inserted == 0
        assert status.restored_num_inserted == 0
        # the default is not to restore either
        assert (await ReplayShardServer(spec).get_status()).size == 0

    asyncio.run(main())


def test_restore_snapshot_without_a_file_starts_empty(tmp_path):
    spec = make_spec(snapshot_uri=str(tmp_path / "missing"), snapshot_every_inserts=10)
    server = ReplayShardServer(spec, restore_snapshot=True)
    status = server.status()
    assert (status.size, status.num_inserted, status.restored_num_inserted) == (0, 0, 0)


def test_restore_puts_the_rate_limiter_in_balance(tmp_path):
    uri = str(tmp_path / "shard")
    spec = blocking_spec(snapshot_uri=uri, snapshot_every_inserts=10, timeout_s=0.3)

    async def main():
        first = ReplayShardServer(spec)
        for i in range(3):
            await first.add(make_batch(10 * i, 10))  # diff 30 == high
        restored = ReplayShardServer(spec, restore_snapshot=True)
        assert restored.status().size == 30
        # balanced: diff = m r = 10, so both sampling and inserting go through without waiting
        await asyncio.wait_for(restored.sample(5), 0.1)
        await asyncio.wait_for(restored.add(make_batch(30, 10)), 0.1)

    asyncio.run(main())


def test_snapshot_every_s(tmp_path):
    uri = str(tmp_path / "timed")
    spec = make_spec(snapshot_uri=uri, snapshot_every_s=0.25)

    async def main():
        server = ReplayShardServer(spec)
        await server.add(make_batch(0, 10))
        await asyncio.sleep(0.3)
        await server.add(make_batch(10, 10))
        assert snapshotted_inserts(uri) == 20
        # no time has passed since: the next add does not snapshot
        await server.add(make_batch(20, 10))
        assert snapshotted_inserts(uri) == 20

    asyncio.run(main())


def test_snapshot_now(tmp_path):
    async def main():
        server = ReplayShardServer(make_spec())
        await server.add(make_batch(0, 5))
        with pytest.raises(ValueError, match="snapshot_uri"):
            await server.snapshot_now()

        uri = str(tmp_path / "now")
        with_uri = ReplayShardServer(make_spec(snapshot_uri=uri))
        await with_uri.add(make_batch(0, 7))
        assert snapshot.read_snapshot(uri) is None  # no periodic snapshot configured
        status = await with_uri.snapshot_now()
        assert status.size == 7
        assert snapshotted_inserts(uri) == 7

    asyncio.run(main())


# ---- save / restore -------------------------------------------------------------------------


def test_save_restore_round_trip(tmp_path):
    uri = str(tmp_path / "saved" / "shard")
    spec = make_spec(capacity=64)

    async def main():
        rng = np.random.default_rng(0)
        source = ReplayShardServer(spec)
        await source.add(make_batch(0, 50), rng.uniform(0.1, 2.0, 50))
        await source.add(make_batch(50, 30), rng.uniform(0.1, 2.0, 30))  # wraps the ring
        drawn = await source.sample(16)
        await source.update_priorities(drawn.keys, rng.uniform(0.1, 2.0, 16))
        saved = await source.save(uri)
        assert saved.size == 64

        target = ReplayShardServer(spec)
        restored = await target.restore(uri)
        assert restored.size == saved.size
        assert restored.total_priority == pytest.approx(saved.total_priority, rel=1e-12)
        assert restored.min_priority == saved.min_priority
        assert restored.num_inserted == saved.num_inserted == 80
        assert restored.restored_num_inserted == 80
        assert restored.incarnation != saved.incarnation

        # same rows, priorities and sampler state: both draw the same batches
        for _ in range(3):
            a, b = await source.sample(32), await target.sample(32)
            np.testing.assert_array_equal(a.keys, b.keys)
            np.testing.assert_array_equal(a.priorities, b.priorities)
            for name in ("obs", "row"):
                np.testing.assert_array_equal(a.batch[name], b.batch[name])
            assert_rows_match_keys(b.keys, b.batch)
            assert (b.batch["row"] >= 16).all()  # the 16 oldest rows were overwritten

        # keys handed out by the source for its rows still update the restored copy
        status = await target.update_priorities(a.keys, np.zeros(32))
        assert status.stale_updates == restored.stale_updates
        assert status.total_priority < restored.total_priority

    asyncio.run(main())


def test_restore_missing_file_raises(tmp_path):
    async def main():
        server = ReplayShardServer(make_spec())
        await server.add(make_batch(0, 3))
        with pytest.raises(FileNotFoundError, match="no replay snapshot"):
            await server.restore(str(tmp_path / "nope"))
        assert (await server.get_status()).size == 3

    asyncio.run(main())


def test_global_keys_name_the_shard_incarnation_their_rows_came_from():
    """A client numbers each shard's incarnations as it meets them; a key decodes to its shard,
    its local key and that incarnation, and keys it did not hand out to no incarnation."""
    from rl_dist_ext.replay.distributed import DistributedReplayConfig
    from rl_dist_ext.replay.distributed.shards import ShardSet

    shards = ShardSet(
        DistributedReplayConfig(num_shards=2, capacity=8, min_size_to_sample=1), [None, None]
    )
    local = np.array([0, 5, 7], dtype=np.int64)
    first = shards.global_keys(1, local, "a")
    second = shards.global_keys(1, local, "b")  # shard 1 restarted
    again = shards.global_keys(1, local, "a")  # a late reply of the first incarnation
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first, local * 2 + 1)  # the first incarnation: plain keys
    keys = np.concatenate([first, second, shards.global_keys(0, local, "c")])
    parts = shards.split_keys(keys)
    assert set(parts) == {(1, "a"), (1, "b"), (0, "c")}
    for mask in parts.values():
        np.testing.assert_array_equal(shards.local_keys(keys[mask]), local)
    np.testing.assert_array_equal(parts[(1, "b")], [False] * 3 + [True] * 3 + [False] * 3)
    # keys of incarnations this client never met (another client's numbering): unchecked, whole
    foreign = ((np.array([2, 3], dtype=np.int64) << 40) | 4) * 2 + 1
    assert {k: m.tolist() for k, m in shards.split_keys(foreign).items()} == {
        (1, None): [True, True]
    }


def test_client_ledgers_add_up_and_the_account_needs_the_shards_counts(tmp_path):
    from rl_dist_ext.replay.distributed import account_rows
    from rl_dist_ext.replay.distributed.ledger import ClientLedger, read_ledgers

    assert read_ledgers(str(tmp_path)) == {"sent": 0, "acknowledged": 0, "resent": 0, "clients": 0}
    first, second, sampler = (ClientLedger(str(tmp_path)) for _ in range(3))
    first.sent(10)
    first.acknowledged(10)
    second.sent(7)  # its actor died before the answer
    second.resent(7)
    del sampler  # a client that never adds leaves no file
    assert read_ledgers(str(tmp_path)) == {
        "sent": 17,
        "acknowledged": 10,
        "resent": 7,
        "clients": 2,
    }
    stats = {"rows_acknowledged": 17, "size": 12, "rows_evicted": 3, "items_lost": 2}
    account = account_rows(str(tmp_path), stats)
    assert (account.dropped_in_transit, account.shards_balance) == (7, True)
    assert account.clients_within_shards
    assert not account_rows(str(tmp_path), {**stats, "rows_acknowledged": 9}).clients_within_shards
    with pytest.raises(ValueError, match="keep no row counts"):
        account_rows(str(tmp_path), {**stats, "rows_acknowledged": -1})
    (tmp_path / "client-broken.rows").write_bytes(b"\0" * 5)
    with pytest.raises(ValueError, match=r"client-broken\.rows is not a row ledger"):
        read_ledgers(str(tmp_path))


def test_row_ledger_dir_must_be_a_local_directory(tmp_path, monkeypatch):
    from rl_dist_ext.replay.distributed import DistributedReplayConfig

    monkeypatch.chdir(tmp_path)
    assert DistributedReplayConfig(row_ledger_dir="ledger").row_ledger_dir == str(
        tmp_path / "ledger"
    )  # made absolute: clients in other processes name the same place
    for bad in ("s3://bucket/ledger", 3):
        with pytest.raises(ValueError, match="row_ledger_dir must be a local directory"):
            DistributedReplayConfig(row_ledger_dir=bad)


def test_a_shard_that_dies_again_while_restarting_keeps_the_counts_of_the_one_before(tmp_path):
    from rl_dist_ext.replay.row_counts import ShardRowCounts

    path = str(tmp_path / "rows.counts")
    first = ShardRowCounts(path, restarted=False)
    first.added(30, num_inserted=30, size=30)
    ShardRowCounts(path, restarted=True)  # dies reading its snapshot, before taking over
    again = ShardRowCounts(path, restarted=True)
    assert again.exact
    assert again.restarted_with(num_inserted=20, size=20) == 10  # rows 20..29 are gone
    assert (again.acknowledged, again.lost, again.evicted(20, 20)) == (30, 10, 0)
    assert not ShardRowCounts(str(tmp_path / "none.counts"), restarted=True).exact
