"""Compressed observation columns: exact round trips through pack/unpack, the prioritized replay
(episode ends, ring-buffer wrap, checkpoints), a shard's snapshot restart, and the distributed
replay (actors compress, a killed shard restores its compressed rows); memory accounting."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from rl_dist_ext.replay.compression import (
    BLOB_COLUMN,
    ObsCompression,
    PackedRows,
    pack,
    unpack,
)
from rl_dist_ext.replay.prioritized import PrioritizedReplay
from rl_dist_ext.replay.shard import ReplayShardServer, ShardSpec

CODECS = ["lz4", "zstd"]


def pong_like_frames(num: int, seed: int = 0) -> np.ndarray:
    """``[num, 84, 84]`` uint8 frames like Pong's: a flat background, two paddles, a ball, noise
    in a score band; consecutive frames differ a little."""
    rng = np.random.default_rng(seed)
    frames = np.full((num, 84, 84), 87, dtype=np.uint8)
    for t in range(num):
        left, right = (t * 3) % 70, (t * 5 + 20) % 70
        frames[t, left : left + 12, 4:6] = 148
        frames[t, right : right + 12, 78:80] = 148
        bx, by = (t * 7) % 80, (t * 11) % 80
        frames[t, by : by + 2, bx : bx + 2] = 236
        frames[t, :8, 20:60] = rng.integers(0, 255, size=(8, 40), dtype=np.uint8) // 128 * 200
    return frames


def stacked_transitions(frames: np.ndarray, start: int, num: int, episode_len: int) -> dict:
    """1-step transitions over 4-frame stacks, ``[B, 4, 84, 84]`` uint8; every ``episode_len``
    steps an episode ends (its next_obs is the last stack, then the stack restarts)."""
    obs, next_obs, ids, done = [], [], [], []
    for t in range(start, start + num):
        step = t % episode_len
        first = t - step
        stack = [frames[max(first, t - 3 + k)] for k in range(4)]
        nxt = [frames[max(first, t - 2 + k)] for k in range(4)]
        obs.append(np.stack(stack))
        next_obs.append(np.stack(nxt))
        ids.append(t)
        done.append(step == episode_len - 1)
    return {
        "obs": np.stack(obs),
        "next_obs": np.stack(next_obs),
        "id": np.asarray(ids, dtype=np.int64),
        "terminated": np.asarray(done),
        "rewards": np.linspace(-1, 1, num).astype(np.float32),
    }


@pytest.mark.parametrize("codec", CODECS)
def test_pack_unpack_is_exact_for_every_dtype_and_shape(codec):
    rng = np.random.default_rng(0)
    batch = {
        "obs": rng.integers(0, 256, size=(9, 4, 84, 84), dtype=np.uint8),
        "next_obs": rng.standard_normal((9, 3, 5)).astype(np.float32),
        "mask": rng.random((9, 6)) > 0.5,
        "actions": np.arange(9),
    }
    packed = pack(batch, ObsCompression(columns=("obs", "next_obs", "mask"), codec=codec))
    assert isinstance(packed, PackedRows) and len(packed) == 9
    assert set(packed.columns) == {"actions"}
    assert all(isinstance(b, bytes) for b in packed.blobs)
    out = unpack(packed.blobs, packed.layout, codec)
    for name in ("obs", "next_obs", "mask"):
        assert out[name].dtype == batch[name].dtype
        np.testing.assert_array_equal(out[name], batch[name])


@pytest.mark.parametrize("codec", CODECS)
def test_replay_rows_come_back_exactly_across_episode_ends_and_ring_wrap(codec):
    frames = pong_like_frames(400)
    replay = PrioritizedReplay(64, alpha=0.0, seed=0, compression=ObsCompression(codec=codec))
    inserted: dict[int, dict] = {}
    start = 0
    for size in (7, 30, 1, 50, 90, 13):  # 191 rows into 64 slots: the ring wraps twice
        batch = stacked_transitions(frames, start, size, episode_len=23)
        keys = replay.add(batch)
        for i, key in enumerate(keys):
            inserted[int(key)] = {k: v[i] for k, v in batch.items()}
        start += size
    assert len(replay) == 64
    # No column holds the pixels uncompressed: the storage keeps the blobs only.
    stored = replay._storage.gather(np.arange(1))
    assert set(stored) == {"id", "terminated", "rewards", BLOB_COLUMN}
    seen = set()
    for _ in range(20):
        sample = replay.sample(32)
        assert sample.batch["obs"].dtype == np.uint8
        assert sample.batch["obs"].shape == (32, 4, 84, 84)
        for i, key in enumerate(sample.keys):
            want = inserted[int(key)]
            for name in ("obs", "next_obs", "id", "terminated", "rewards"):
                np.testing.assert_array_equal(sample.batch[name][i], want[name])
            seen.add(int(want["id"]))
    # Only the newest 64 rows are stored; every one of them can be drawn back.
    assert seen == set(range(start - 64, start))


def test_memory_accounting_follows_overwrites_and_is_a_fraction_of_raw():
    frames = pong_like_frames(300)
    replay = PrioritizedReplay(50, seed=0, compression=ObsCompression())
    plain = PrioritizedReplay(50, seed=0)
    start = 0
    for size in (20, 40, 70):
        batch = stacked_transitions(frames, start, size, episode_len=40)
        replay.add(batch)
        plain.add(batch)
        start += size
    blobs = replay._storage.gather(np.arange(50))[BLOB_COLUMN]
    other_bytes = 8 + 1 + 4  # id int64, terminated bool, rewards float32
    naive = sum(len(b) for b in blobs) + 50 * (other_bytes + 8 + 33)
    assert replay.nbytes == naive
    raw_row = 2 * 4 * 84 * 84 + other_bytes
    assert replay.uncompressed_row_bytes == raw_row
    assert plain.nbytes == 50 * raw_row
    assert plain.uncompressed_row_bytes == raw_row
    assert replay.nbytes * 20 < plain.nbytes, (replay.nbytes, plain.nbytes)


def test_checkpoint_round_trip_keeps_compressed_rows_and_refuses_a_mismatch():
    frames = pong_like_frames(200)
    replay = PrioritizedReplay(40, seed=0, compression=ObsCompression(codec="zstd"))
    replay.add(stacked_transitions(frames, 0, 70, episode_len=30))
    state = replay.state_dict()
    restored = PrioritizedReplay(40, seed=0, compression=ObsCompression(codec="zstd"))
    restored.load_state_dict(state)
    assert restored.nbytes == replay.nbytes
    a, b = replay.sample(16), restored.sample(16)
    np.testing.assert_array_equal(a.keys, b.keys)
    for name in ("obs", "next_obs", "id"):
        np.testing.assert_array_equal(a.batch[name], b.batch[name])
    restored.add(stacked_transitions(frames, 70, 5, episode_len=30))  # and goes on adding
    for other in (
        PrioritizedReplay(40, seed=0),
        PrioritizedReplay(40, compression=ObsCompression()),
    ):
        with pytest.raises(ValueError, match="compression"):
            other.load_state_dict(state)


def test_bad_settings_and_batches_raise_clear_errors():
    with pytest.raises(ValueError, match="codec"):
        ObsCompression(codec="snappy")
    with pytest.raises(ValueError, match="columns"):
        ObsCompression(columns=())
    with pytest.raises(ValueError, match="columns"):
        ObsCompression(columns=["obs"])
    with pytest.raises(ValueError, match="columns"):
        ObsCompression(columns=("obs", "obs"))
    with pytest.raises(TypeError, match="level"):
        ObsCompression(level=1.5)
    with pytest.raises(TypeError, match="compression"):
        PrioritizedReplay(10, compression="lz4")
    replay = PrioritizedReplay(10, compression=ObsCompression())
    with pytest.raises(ValueError, match="missing \\['next_obs'\\]"):
        replay.add({"obs": np.zeros((2, 3), np.uint8)})
    replay.add({"obs": np.zeros((2, 3), np.uint8), "next_obs": np.zeros((2, 3), np.uint8)})
    with pytest.raises(ValueError, match="schema"):
        replay.add({"obs": np.zeros((2, 4), np.uint8), "next_obs": np.zeros((2, 3), np.uint8)})
    packed = pack(
        {"obs": np.zeros((2, 3), np.uint8), "next_obs": np.zeros((2, 3), np.uint8)},
        ObsCompression(codec="zstd"),
    )
    with pytest.raises(ValueError, match="codec"):
        replay.add(packed)
    with pytest.raises(ValueError, match="no compression"):
        PrioritizedReplay(10).add(packed)
    with pytest.raises(ValueError, match="reserved"):
        PrioritizedReplay(10).add({BLOB_COLUMN: np.zeros(2)})


def test_a_restarted_shard_restores_its_compressed_rows_from_the_snapshot(tmp_path):
    frames = pong_like_frames(120)
    spec = ShardSpec(
        shard_index=0,
        capacity=100,
        compression=ObsCompression(),
        snapshot_uri=str(tmp_path / "shard"),
        snapshot_every_inserts=10,
    )

    async def run():
        shard = ReplayShardServer(spec)
        batch = stacked_transitions(frames, 0, 60, episode_len=25)
        status = await shard.add(pack(batch, spec.compression))  # as a client sends it
        assert status.storage_bytes * 20 < status.size * status.uncompressed_row_bytes
        restarted = ReplayShardServer(spec, restore_snapshot=True)
        assert restarted.status().size == 60
        sample = await restarted.sample(40)
        for name in ("obs", "next_obs"):
            np.testing.assert_array_equal(sample.batch[name], batch[name][sample.batch["id"]])

    asyncio.run(run())


def test_distributed_replay_compresses_on_the_actor_and_survives_a_killed_shard(
    ray_session, tmp_path
):
    import ray

    from rl_dist_ext.replay.distributed import DistributedReplay, DistributedReplayConfig

    frames = pong_like_frames(600)
    config = DistributedReplayConfig(
        num_shards=2,
        capacity=1_000,
        min_size_to_sample=1,
        num_cpus_per_shard=0.1,
        seed=0,
        timeout_s=20.0,
        retry_down_shard_after_s=0.5,
        snapshot_dir=str(tmp_path / "snap"),
        snapshot_every_inserts=50,
        compression=ObsCompression(),
    )
    replay = DistributedReplay(config)
    try:

        @ray.remote(num_cpus=0.1)
        def produce(client, batches):
            for batch in batches:
                client.add(batch)
            client.flush()

        batches = [stacked_transitions(frames, s, 25, episode_len=60) for s in range(0, 300, 25)]
        ray.get(produce.remote(replay, batches), timeout=60)
        stats = replay.stats(wait=True)
        assert stats["size"] == 300
        assert stats["compression_ratio"] > 20, stats
        assert 0 < stats["bytes_per_transition"] < 2 * 4 * 84 * 84 / 20
        by_id = {
            int(i): (o, n)
            for b in batches
            for i, o, n in zip(b["id"], b["obs"], b["next_obs"], strict=True)
        }

        def check(sample):
            for i, row_id in enumerate(sample.batch["id"]):
                obs, next_obs = by_id[int(row_id)]
                np.testing.assert_array_equal(sample.batch["obs"][i], obs)
                np.testing.assert_array_equal(sample.batch["next_obs"][i], next_obs)

        check(replay.sample(32))
        ray.kill(replay.handles[0], no_restart=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            check(replay.sample(32))
            stats = replay.stats(wait=True)
            if stats["shard_failures"] and stats["shards_alive"] == 2:
                break
        assert stats["shard_failures"] >= 1 and stats["shards_alive"] == 2
        # the restored shard serves its snapshot's rows, exactly
        for _ in range(5):
            check(replay.sample(32))
        assert stats["size"] + stats["items_lost"] >= 300
    finally:
        replay.close()
