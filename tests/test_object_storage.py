"""Replay snapshots and checkpoints on object storage, through the S3 API.

A cluster of several machines keeps replay snapshots where every node reaches them: a
``pyarrow.fs`` URI such as ``s3://bucket/prefix``. Here an S3 server (moto's, on this machine)
stands in for the object store; the URI carries its address and credentials in the query, as
it would for MinIO or Ceph (``?endpoint_override=host:port&scheme=http``); the credentials come
from the environment (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, set in ``conftest.py``
before Ray starts, as on every node of a real cluster).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from test_distributed_replay import rows

from rl_dist_ext.replay import snapshot

BUCKET = "rl-dist-ext"


@pytest.fixture(scope="module")
def s3():
    """``prefix -> s3:// URI`` on a moto S3 server with the bucket created."""
    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    query = f"endpoint_override={host}:{port}&scheme=http&region=us-east-1"
    bucket_maker = pafs.FileSystem.from_uri(f"s3://{BUCKET}?{query}&allow_bucket_creation=true")
    bucket_maker[0].create_dir(BUCKET)
    yield lambda prefix: f"s3://{BUCKET}/{prefix}?{query}"
    server.stop()


def test_join_keeps_a_uri_query_after_the_path():
    assert snapshot.join("s3://b/run?endpoint_override=h:1", "x.pkl") == (
        "s3://b/run/x.pkl?endpoint_override=h:1"
    )
    assert snapshot.join("s3://b/run/", "x.pkl") == "s3://b/run/x.pkl"
    assert snapshot.join("/tmp/run/", "x.pkl") == "/tmp/run/x.pkl"


def test_snapshots_and_text_files_round_trip_on_s3(s3):
    base = s3("files")
    location = snapshot.join(base, "shard_0")
    columns = {
        "rows": np.arange(10, dtype=np.uint8),
        "blob": np.array([b"x", None], object)[[0] * 10],
    }
    for n in range(3):
        snapshot.write_snapshot(location, {"n": n}, columns)
    snapshot.write_text(snapshot.join(base, "manifest.json"), '{"a": 1}')
    loaded = snapshot.read_snapshot(location)
    np.testing.assert_array_equal(loaded.columns["rows"], columns["rows"])
    assert list(loaded.columns["blob"]) == [b"x"] * 10
    assert loaded.state == {"n": 2}
    # the two newest generations are kept, older ones deleted
    assert [g.number for g in snapshot.generations(location)] == [3, 2]
    assert snapshot.read_text(snapshot.join(base, "manifest.json")) == '{"a": 1}'
    assert snapshot.read_snapshot(snapshot.join(base, "missing")) is None
    assert snapshot.read_text(snapshot.join(base, "missing.json")) is None


def test_a_damaged_s3_snapshot_is_named_by_its_uri(s3):
    import pyarrow.fs as pafs

    location = s3("damaged")
    snapshot.write_snapshot(location, {}, {"rows": np.arange(100)})
    fs, path = pafs.FileSystem.from_uri(location)
    data = f"{path}/{1:012d}.arrow"
    with fs.open_input_stream(data) as stream:
        raw = stream.read()
    with fs.open_output_stream(data) as stream:
        stream.write(raw[:-20])
    with pytest.raises(
        snapshot.ReplaySnapshotCorrupt, match=r"s3://rl-dist-ext/damaged/0+1\.arrow"
    ):
        snapshot.read_snapshot(location)


def test_a_killed_shard_restores_its_s3_snapshot_and_checkpoints_round_trip(ray_session, s3):
    import ray

    from rl_dist_ext.replay.distributed import DistributedReplay, DistributedReplayConfig

    def config(prefix: str) -> DistributedReplayConfig:
        return DistributedReplayConfig(
            num_shards=2,
            capacity=2_000,
            min_size_to_sample=1,
            num_cpus_per_shard=0.1,
            seed=0,
            timeout_s=20.0,
            snapshot_dir=s3(prefix),
            snapshot_every_inserts=100,
            retry_down_shard_after_s=0.5,
        )

    replay = DistributedReplay(config("snapshots"))
    other = None
    try:
        for start in range(0, 400, 25):
            replay.add(rows(start, 25))
        replay.flush()
        assert replay.stats(wait=True)["size_per_shard"] == [200, 200]
        replay.save(s3("checkpoint"))

        ray.kill(replay.handles[0], no_restart=False)
        deadline = time.monotonic() + 30
        while replay.stats(wait=True)["shard_failures"] == 0 or (
            replay.stats(wait=True)["shards_alive"] < 2
        ):
            replay.sample(8)  # finds the shard down, then back
            assert time.monotonic() < deadline, replay.stats(wait=True)
            time.sleep(0.2)
        # The restarted shard read its snapshot (every 100 inserts: all 200 rows) from S3.
        stats = replay.stats(wait=True)
        assert stats["size_per_shard"] == [200, 200] and stats["items_lost"] == 0

        other = DistributedReplay(config("other-snapshots"))
        other.restore(s3("checkpoint"))
        assert other.stats(wait=True)["size_per_shard"] == [200, 200]
        ids = np.concatenate([other.sample(64).batch["id"] for _ in range(20)])
        assert set(ids.tolist()) <= set(range(400)) and len(set(ids.tolist())) > 150
    finally:
        replay.close()
        if other is not None:
            other.close()
