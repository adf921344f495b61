"""``clear()`` on one prioritized replay (no Ray) and on the distributed replay (Ray).

After a clear the replay is empty, its priorities are reset, keys handed out before are stale
(dropped and counted by ``update_priorities``, never applied to the rows inserted afterwards),
sampling waits for ``min_size_to_sample`` again, and inserting and sampling work as before.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from scipy import stats as scipy_stats

from rl_dist_ext.ops.priorities import td_priorities
from rl_dist_ext.replay import PrioritizedReplay

ALPHA, EPS = 1.0, 1e-9
HUGE = 1e9


def rows(start: int, n: int) -> dict[str, np.ndarray]:
    """Rows whose ``id`` column is their row number."""
    ids = np.arange(start, start + n)
    return {"id": ids.astype(np.int64), "obs": np.repeat(ids[:, None], 3, 1).astype(np.float32)}


def uniform_p_value(ids: np.ndarray, expected_ids: set[int]) -> float:
    """Chi-square p-value of ``ids`` against the uniform distribution over ``expected_ids``."""
    assert set(ids.tolist()) <= expected_ids
    observed = np.array([np.sum(ids == i) for i in sorted(expected_ids)], dtype=np.float64)
    return float(scipy_stats.chisquare(observed).pvalue)


# ---- one shard, no Ray ----------------------------------------------------------------------


def test_prioritized_replay_clear():
    capacity = 8
    replay = PrioritizedReplay(capacity, alpha=ALPHA, eps=EPS, seed=0)
    replay.add(rows(0, 5), priorities=np.full(5, 3.0))
    replay.add(rows(5, 7), priorities=np.arange(7.0) + 10.0)  # wraps: every slot is used
    old_keys = replay.state_dict()["storage"]["insert_ids"].copy()  # one key per slot
    old_keys = np.concatenate([old_keys, replay.sample_items(32).keys, [0, 1]])  # + overwritten
    assert replay.max_priority == 16.0
    stale_before = replay.stale_updates
    assert stale_before == 0

    replay.clear()
    assert len(replay) == 0
    assert replay.num_inserted == 0
    assert replay.total_priority == 0.0
    assert math.isinf(replay.min_priority)
    assert replay.max_priority == 1.0
    with pytest.raises(ValueError, match="empty"):
        replay.sample(4)
    # Keys handed out before the clear are stale: dropped and counted, the tree is untouched.
    assert replay.update_priorities(old_keys, np.full(len(old_keys), HUGE)) == len(old_keys)
    assert replay.stale_updates == len(old_keys)
    assert replay.total_priority == 0.0 and replay.max_priority == 1.0

    # New rows fill every slot again (so every old key's slot holds a new row).
    new_keys = replay.add(rows(100, capacity), priorities=np.ones(capacity))
    assert len(replay) == capacity and replay.num_inserted == capacity
    assert not set(new_keys.tolist()) & set(old_keys.tolist())
    assert new_keys.min() > old_keys.max()
    np.testing.assert_array_equal(np.sort(new_keys % capacity), np.arange(capacity))
    p1 = float(td_priorities(np.array(1.0), alpha=ALPHA, eps=EPS))
    assert replay.total_priority == pytest.approx(capacity * p1, rel=1e-12)

    assert replay.update_priorities(old_keys, np.full(len(old_keys), HUGE)) == len(old_keys)
    assert replay.stale_updates == 2 * len(old_keys)
    assert replay.total_priority == pytest.approx(capacity * p1, rel=1e-12)
    assert replay.max_priority == 1.0  # a stale update's priority is not "seen"
    stored = replay.state_dict()["priorities"]
    np.testing.assert_allclose(stored, p1, rtol=1e-12)
    sample = replay.sample(4000, beta=1.0)
    assert set(sample.keys.tolist()) <= set(new_keys.tolist())
    np.testing.assert_array_equal(sample.batch["id"], sample.keys - new_keys[0] + 100)
    np.testing.assert_allclose(sample.weights, 1.0)  # equal priorities: no correction
    assert uniform_p_value(sample.batch["id"], set(range(100, 100 + capacity))) > 1e-3

    # Live keys of the new rows still update; the old ones stay stale after a round trip.
    assert replay.update_priorities(new_keys[:2], np.array([5.0, 5.0])) == 0
    restored = PrioritizedReplay(capacity, alpha=ALPHA, eps=EPS)
    restored.load_state_dict(replay.state_dict())
    assert restored.update_priorities(old_keys, np.ones(len(old_keys))) == len(old_keys)
    assert restored.total_priority == pytest.approx(replay.total_priority)


def test_prioritized_replay_clear_twice_and_when_empty():
    replay = PrioritizedReplay(4, alpha=ALPHA, eps=EPS, seed=1)
    replay.clear()  # clearing an empty replay is fine
    first = replay.add(rows(0, 3))
    replay.clear()
    replay.clear()
    second = replay.add(rows(3, 6))  # wraps after the clears
    assert second.min() > first.max()
    assert replay.update_priorities(first, np.ones(3)) == 3
    assert replay.update_priorities(second[-4:], np.ones(4)) == 0
    assert len(replay) == 4 and replay.num_inserted == 6


# ---- distributed replay on Ray --------------------------------------------------------------


@pytest.fixture
def replay(ray_session):
    from rl_dist_ext.replay.distributed import DistributedReplay, DistributedReplayConfig

    config = DistributedReplayConfig(
        num_shards=2,
        capacity=40,  # 20 per shard
        alpha=ALPHA,
        eps=EPS,
        min_size_to_sample=10,  # 5 per shard
        num_cpus_per_shard=0.05,
        seed=0,
        timeout_s=2.0,
    )
    client = DistributedReplay(config)
    yield client
    client.close()


def test_distributed_replay_clear(replay):
    from rl_dist_ext.replay.distributed import RateLimitTimeout, ReplayTimeout

    replay.add(rows(0, 20), priorities=np.full(20, 3.0))
    replay.add(rows(20, 20), priorities=np.full(20, 7.0))
    replay.flush()
    old_keys = np.unique(np.concatenate([replay.sample(16).keys for _ in range(20)]))
    assert len(replay) == 40
    stale_before = replay.stats(wait=True)["stale_updates"]

    replay.clear()
    assert len(replay) == 0
    stats = replay.stats(wait=True)
    assert stats["size"] == 0 and stats["size_per_shard"] == [0, 0]
    assert stats["num_inserted"] == 0
    for status in replay.refresh():
        assert status.total_priority == 0.0 and math.isinf(status.min_priority)
    replay.update_priorities(old_keys, np.full(len(old_keys), HUGE))
    replay.flush()
    assert replay.stats(wait=True)["stale_updates"] - stale_before == len(old_keys)

    # Fewer rows than min_size_to_sample: sampling waits again, then times out.
    replay.add(rows(100, 4), priorities=np.ones(4))
    replay.flush()
    started = time.monotonic()
    with pytest.raises((RateLimitTimeout, ReplayTimeout)):
        replay.sample(8)
    assert time.monotonic() - started >= 0.9 * replay.config.timeout_s
    # Let the other prefetched request time out too: its stale timeout must not surface later.
    time.sleep(1.0)

    # Inserting works again; fill every slot of both shards with priority-1 rows.
    replay.add(rows(104, 16), priorities=np.ones(16))
    replay.add(rows(120, 16), priorities=np.ones(16))
    replay.add(rows(136, 4), priorities=np.ones(4))
    replay.flush()
    assert replay.stats(wait=True)["size_per_shard"] == [20, 20]
    assert len(replay.sample(8).keys) == 8  # sampling works again at once
    # Old keys are stale again and their huge priorities never reach the new rows.
    before = replay.stats(wait=True)["stale_updates"]
    replay.update_priorities(old_keys, np.full(len(old_keys), HUGE))
    replay.flush()
    assert replay.stats(wait=True)["stale_updates"] - before == len(old_keys)
    p1 = float(td_priorities(np.array(1.0), alpha=ALPHA, eps=EPS))
    for status in replay.refresh():
        assert status.total_priority == pytest.approx(20 * p1, rel=1e-9)
        assert status.min_priority == pytest.approx(p1, rel=1e-12)

    new_keys: set[int] = set()
    ids_by_shard: dict[int, list[np.ndarray]] = {0: [], 1: []}
    for _ in range(150):
        sample = replay.sample(16, beta=1.0)
        np.testing.assert_allclose(sample.weights, 1.0, rtol=1e-6)  # equal priorities
        new_keys.update(sample.keys.tolist())
        shard = int(sample.keys[0] % 2)
        assert np.all(sample.keys % 2 == shard)  # a batch comes whole from one shard
        ids_by_shard[shard].append(sample.batch["id"])
    assert not new_keys & set(old_keys.tolist())
    # Batches are the independent draws across shards (equal mass: 1/2 each), rows within one.
    batches = [len(ids_by_shard[0]), len(ids_by_shard[1])]
    assert scipy_stats.binomtest(batches[0], 150, 0.5).pvalue > 1e-4, batches
    seen = set()
    for shard_ids in ids_by_shard.values():
        shard_ids = np.concatenate(shard_ids)
        rows_of_shard = set(shard_ids.tolist())
        assert len(rows_of_shard) == 20
        assert uniform_p_value(shard_ids, rows_of_shard) > 1e-4
        seen |= rows_of_shard
    assert seen == set(range(100, 140))
