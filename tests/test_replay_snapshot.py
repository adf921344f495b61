"""Replay snapshots as data: round trips of every column kind, damage of every kind raising
ReplaySnapshotCorrupt (never running code, never another error), fallback to the previous
generation, refusal of old pickles and of columns that would need pickle."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import pickle
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rl_dist_ext.replay import snapshot
from rl_dist_ext.replay.compression import ObsCompression
from rl_dist_ext.replay.convert_pickle_snapshot import main as convert_main
from rl_dist_ext.replay.prioritized import PrioritizedReplay
from rl_dist_ext.replay.shard import ReplayShardServer, ShardSpec

NUMERIC = st.sampled_from(
    [
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    ]
)


def column(rows: int):
    """A numeric column of ``rows`` rows, any per-row shape (empty shapes and zero sizes too),
    or a column of bytes objects (with None)."""
    numeric = st.tuples(NUMERIC, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3))
    numeric = numeric.flatmap(
        lambda spec: hnp.arrays(np.dtype(spec[0]), (rows, *spec[1]), elements=None)
    )
    blobs = st.lists(st.one_of(st.none(), st.binary(max_size=40)), min_size=rows, max_size=rows)
    blobs = blobs.map(lambda values: _objects(values))
    return st.one_of(numeric, blobs)


def _objects(values: list) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


TABLES = st.integers(0, 30).flatmap(
    lambda rows: st.dictionaries(
        st.text(min_size=1, max_size=8), column(rows), min_size=1, max_size=4
    )
)
STATES = st.dictionaries(
    st.text(max_size=5),
    st.one_of(st.integers(-(2**130), 2**130), st.floats(allow_nan=False), st.text(), st.none()),
    max_size=4,
)


def assert_columns_equal(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for name, values in want.items():
        assert got[name].dtype == values.dtype.newbyteorder("="), name
        assert got[name].shape == values.shape, name
        if values.dtype.hasobject:
            assert list(got[name]) == list(values), name
        else:
            np.testing.assert_array_equal(got[name], values, err_msg=name)


@given(columns=TABLES, state=STATES)
def test_every_column_kind_round_trips_exactly(columns, state):
    with tempfile.TemporaryDirectory() as tmp:
        location = os.path.join(tmp, "snap")
        snapshot.write_snapshot(location, state, columns)
        loaded = snapshot.read_snapshot(location)
    assert loaded.state == state
    assert_columns_equal(loaded.columns, columns)


def test_a_large_column_is_written_in_bounded_record_batches(tmp_path):
    import pyarrow as pa

    columns = {
        "obs": np.arange(40_000, dtype=np.float32).reshape(10_000, 4),
        "blob": _objects([bytes([i % 251]) * (i % 50) for i in range(10_000)]),
    }
    snapshot.write_snapshot(str(tmp_path / "s"), {}, columns, chunk_bytes=10_000)
    (data,) = (tmp_path / "s").glob("*.arrow")
    with pa.ipc.open_file(pa.memory_map(str(data))) as reader:
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
    assert len(batches) > 10
    per_row = [16 + len(b) for b in columns["blob"]]
    sizes = np.cumsum([0] + [b.num_rows for b in batches])
    # every batch but a single-row one stays within the budget
    assert all(sum(per_row[s:e]) <= 10_000 for s, e in itertools.pairwise(sizes))
    assert_columns_equal(snapshot.read_snapshot(str(tmp_path / "s")).columns, columns)


# ---- a replay's snapshot ------------------------------------------------------------------------


def filled_replay(compression: ObsCompression | None = None) -> PrioritizedReplay:
    replay = PrioritizedReplay(64, alpha=0.7, eps=1e-3, seed=3, compression=compression)
    rng = np.random.default_rng(0)
    for start in range(0, 100, 20):  # wraps around: slots no longer in insertion order
        replay.add(
            {
                "obs": rng.integers(0, 255, (20, 6, 6), dtype=np.uint8),
                "action": np.arange(start, start + 20),
                "done": rng.random(20) < 0.1,
            },
            rng.uniform(0.1, 3.0, 20),
        )
    replay.update_priorities(replay.sample(16).keys, np.full(16, 5.0))
    return replay


@pytest.mark.parametrize("compression", [None, ObsCompression(columns=("obs",))])
def test_a_replay_restored_from_its_snapshot_samples_exactly_as_the_original(tmp_path, compression):
    original = filled_replay(compression)
    state, columns = original.snapshot()
    snapshot.write_snapshot(str(tmp_path / "s"), {"replay": state}, columns)
    loaded = snapshot.read_snapshot(str(tmp_path / "s"))
    restored = PrioritizedReplay(64, alpha=0.7, eps=1e-3, seed=99, compression=compression)
    restored.load_snapshot(loaded.state["replay"], loaded.columns)
    assert (restored.num_inserted, len(restored)) == (100, 64)
    assert restored.total_priority == original.total_priority
    for _ in range(3):  # the sampler's generator state came along
        a, b = original.sample(32), restored.sample(32)
        np.testing.assert_array_equal(a.keys, b.keys)
        for name in a.batch:
            np.testing.assert_array_equal(a.batch[name], b.batch[name])


def test_save_refuses_a_column_that_would_need_pickle_and_names_it(tmp_path):
    replay = PrioritizedReplay(8)
    info = _objects([{"lives": 3}, {"lives": 2}])
    replay.add({"obs": np.zeros((2, 3)), "info": info})
    state, columns = replay.snapshot()
    with pytest.raises(snapshot.SnapshotUnsupported, match=r"'row\.info' holds dict"):
        snapshot.write_snapshot(str(tmp_path / "s"), {"replay": state}, columns)
    with pytest.raises(snapshot.SnapshotUnsupported, match="dtype <U3"):
        snapshot.write_snapshot(str(tmp_path / "s"), {}, {"name": np.array(["abc"])})
    assert not list(tmp_path.rglob("*.json"))  # nothing was written


# ---- damage --------------------------------------------------------------------------------------


def one_generation(tmp_path: Path) -> tuple[str, Path, Path, dict]:
    location = str(tmp_path / "s")
    state, columns = filled_replay(ObsCompression(columns=("obs",))).snapshot()
    snapshot.write_snapshot(location, {"replay": state}, columns)
    (data,) = (tmp_path / "s").glob("*.arrow")
    (header,) = (tmp_path / "s").glob("*.json")
    return location, data, header, columns


@given(cut=st.floats(0.0, 0.999))
def test_a_truncated_data_file_is_reported_as_truncated(cut):
    with tempfile.TemporaryDirectory() as tmp:
        location, data, _, _ = one_generation(Path(tmp))
        raw = data.read_bytes()
        data.write_bytes(raw[: int(cut * len(raw))])
        with pytest.raises(snapshot.ReplaySnapshotCorrupt) as error:
            snapshot.read_snapshot(location)
    assert error.value.reason == "truncated"
    assert error.value.uri == str(data)


@given(position=st.floats(0.0, 0.999), flip=st.integers(1, 255))
def test_a_damaged_byte_anywhere_in_the_data_is_caught_or_harmless(position, flip):
    """A byte changed anywhere: the read raises ReplaySnapshotCorrupt (checksum, format,
    truncated or schema; never another error, never a crash: a flipped byte in Arrow's offsets
    crashed the reader before it validated them), or, where the byte was padding Arrow never
    reads, returns the exact columns."""
    with tempfile.TemporaryDirectory() as tmp:
        location, data, _, columns = one_generation(Path(tmp))
        raw = bytearray(data.read_bytes())
        raw[int(position * len(raw))] ^= flip
        data.write_bytes(bytes(raw))
        try:
            loaded = snapshot.read_snapshot(location)
        except snapshot.ReplaySnapshotCorrupt as error:
            assert error.reason in {"checksum", "truncated", "schema", "format"}
        else:
            assert_columns_equal(loaded.columns, columns)


@given(position=st.floats(0.0, 0.999), flip=st.integers(1, 255))
def test_a_damaged_byte_anywhere_in_the_header_is_caught(position, flip):
    with tempfile.TemporaryDirectory() as tmp:
        location, _, header, _ = one_generation(Path(tmp))
        raw = bytearray(header.read_bytes())
        at = int(position * len(raw))
        raw[at] ^= flip
        header.write_bytes(bytes(raw))
        try:
            snapshot.read_snapshot(location)
        except snapshot.ReplaySnapshotCorrupt as error:
            assert error.reason in {"checksum", "truncated", "header", "version", "schema"}
        else:  # only JSON whitespace can change without changing what it says
            assert chr(raw[at]).isspace() and chr(raw[at] ^ flip).isspace()


def rewrite_header(header: Path, **changes) -> None:
    """Change header fields and give it a matching checksum (as a deliberate writer could)."""
    content = json.loads(header.read_text())
    content.update(changes)
    content["header_crc32"] = snapshot._header_crc(content)
    header.write_text(json.dumps(content))


def test_a_newer_format_version_is_refused_by_name(tmp_path):
    location, _, header, _ = one_generation(tmp_path)
    rewrite_header(header, version=snapshot.VERSION + 1)
    with pytest.raises(snapshot.ReplaySnapshotCorrupt, match="upgrade rl-dist-ext") as error:
        snapshot.read_snapshot(location)
    assert error.value.reason == "version"


def test_a_header_whose_schema_does_not_match_the_data_is_refused(tmp_path):
    location, _, header, _ = one_generation(tmp_path)
    columns = json.loads(header.read_text())["columns"]
    columns[0]["dtype"] = "<f8"
    rewrite_header(header, columns=columns)
    with pytest.raises(snapshot.ReplaySnapshotCorrupt) as error:
        snapshot.read_snapshot(location)
    assert error.value.reason == "schema"


def test_a_consistent_snapshot_of_impossible_rows_is_refused_by_the_replay(tmp_path):
    """Valid checksums around content no replay could hold (keys that name other slots):
    the shard refuses it as corrupt and keeps its own rows."""
    location = str(tmp_path / "s")
    state, columns = filled_replay().snapshot()
    columns = dict(columns, **{"key.insert_ids": columns["key.insert_ids"][::-1].copy()})
    snapshot.write_snapshot(location, {"replay": state}, columns)
    shard = ReplayShardServer(ShardSpec(shard_index=0, capacity=64, alpha=0.7, eps=1e-3))
    asyncio.run(
        shard.add(
            {
                "obs": np.zeros((3, 6, 6), np.uint8),
                "action": np.arange(3),
                "done": np.zeros(3, bool),
            }
        )
    )
    with pytest.raises(snapshot.ReplaySnapshotCorrupt, match="insert_ids") as error:
        asyncio.run(shard.restore(location))
    assert error.value.reason == "schema"
    assert shard.status().size == 3


class _Marker:
    """A pickle that, when loaded, writes a file: what a crafted snapshot could do."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path(self.path).write_text, ("the pickle ran",))


def test_a_crafted_pickle_in_place_of_a_snapshot_is_refused_without_running(tmp_path):
    marker = tmp_path / "ran"
    crafted = pickle.dumps(_Marker(str(marker)))
    (tmp_path / "shard_0.pkl").write_bytes(crafted)  # where rl-dist-ext 0.x kept it
    with pytest.raises(snapshot.LegacyPickleSnapshot, match="convert_pickle_snapshot"):
        snapshot.read_snapshot(str(tmp_path / "shard_0"))
    (tmp_path / "in_place").write_bytes(crafted)  # the location itself a pickle file
    with pytest.raises(snapshot.LegacyPickleSnapshot):
        snapshot.read_snapshot(str(tmp_path / "in_place"))
    shard = ReplayShardServer(ShardSpec(shard_index=0, capacity=8))
    with pytest.raises(snapshot.LegacyPickleSnapshot):
        asyncio.run(shard.restore(str(tmp_path / "shard_0")))
    assert not marker.exists()


def test_an_old_pickle_snapshot_converts_and_then_restores(tmp_path, capsys):
    original = filled_replay()
    (tmp_path / "shard_0.pkl").write_bytes(
        pickle.dumps({"replay": original.state_dict(), "num_sampled": 0}, protocol=5)
    )
    assert convert_main([str(tmp_path)]) == 0
    assert f"converted -> {tmp_path / 'shard_0'}" in capsys.readouterr().out
    shard = ReplayShardServer(ShardSpec(shard_index=0, capacity=64, alpha=0.7, eps=1e-3))
    status = asyncio.run(shard.restore(str(tmp_path / "shard_0")))
    assert (status.size, status.num_inserted) == (64, 100)
    assert status.total_priority == pytest.approx(original.total_priority)


def test_an_old_pickle_named_without_pkl_converts_to_the_location_given(tmp_path, capsys):
    (tmp_path / "replay").write_bytes(
        pickle.dumps({"replay": filled_replay().state_dict(), "num_sampled": 0}, protocol=5)
    )
    with pytest.raises(SystemExit):  # the location would be the file itself
        convert_main([str(tmp_path / "replay")])
    assert "--to" in capsys.readouterr().err
    assert convert_main([str(tmp_path / "replay"), "--to", str(tmp_path / "new")]) == 0
    assert snapshot.read_snapshot(str(tmp_path / "new")).state["replay"]["num_inserted"] == 100


# ---- generations and fallback --------------------------------------------------------------------


def shard_spec(tmp_path: Path) -> ShardSpec:
    return ShardSpec(shard_index=0, capacity=100, snapshot_uri=str(tmp_path / "snap"))


def rows(start: int, n: int) -> dict[str, np.ndarray]:
    return {"obs": np.arange(start, start + n, dtype=np.float32)[:, None], "action": np.arange(n)}


def shard_with_snapshots(spec: ShardSpec, count: int, start: int = 0) -> ReplayShardServer:
    """A fresh shard (not a restart) that added 10 rows, then snapshotted, ``count`` times."""

    async def main() -> ReplayShardServer:
        shard = ReplayShardServer(spec)
        for i in range(count):
            await shard.add(rows(start + 10 * i, 10))
            await shard.snapshot_now()
        return shard

    return asyncio.run(main())


def test_the_previous_generation_is_kept_until_the_next_is_complete(tmp_path):
    spec = shard_spec(tmp_path)
    shard_with_snapshots(spec, 4)
    names = sorted(p.name for p in (tmp_path / "snap").iterdir())
    generations = [f"{g:012d}.{s}" for g in (3, 4) for s in ("arrow", "json")]
    assert names == [*generations, "rows.counts"]  # and the shard's row counters
    # a write that died before its header: the location still reads the newest complete one
    (tmp_path / "snap" / f"{5:012d}.arrow").write_bytes(b"half a file")
    assert snapshot.read_snapshot(spec.snapshot_uri).state["replay"]["num_inserted"] == 40


def test_a_restarting_shard_falls_back_past_damaged_snapshots_and_counts_them(tmp_path):
    spec = shard_spec(tmp_path)
    shard_with_snapshots(spec, 2)
    newest = sorted((tmp_path / "snap").glob("*.arrow"))[-1]
    newest.write_bytes(newest.read_bytes()[:100])
    restarted = ReplayShardServer(spec, restore_snapshot=True)
    status = restarted.status()
    assert (status.size, status.restored_num_inserted, status.snapshots_rejected) == (10, 10, 1)
    # the damaged one is renamed aside: the restored generation stays the previous one after
    # the next save (before, that save deleted it and kept the damaged one)
    assert sorted(p.name for p in (tmp_path / "snap").glob("*.rejected")) == [
        f"{2:012d}.arrow.rejected",
        f"{2:012d}.json.rejected",
    ]
    asyncio.run(restarted.snapshot_now())
    assert [g.number for g in snapshot.generations(spec.snapshot_uri)] == [3, 1]

    for data in (tmp_path / "snap").glob("*.arrow"):
        data.write_bytes(b"")
    empty = ReplayShardServer(spec, restore_snapshot=True).status()
    assert (empty.size, empty.restored_num_inserted, empty.snapshots_rejected) == (0, 0, 2)


def test_headers_that_are_not_ours_or_unreadable_never_stop_a_restarting_shard(tmp_path):
    """A checksum-valid header without its data file's name raised KeyError out of the
    shard's constructor (a shard Ray could never restart); so did digits beyond Python's
    integer limit and deep nesting."""
    spec = shard_spec(tmp_path)
    for damage in (
        lambda h: rewrite_header(h, data_file=None),
        lambda h: h.write_text(
            '{"format": "' + snapshot.FORMAT + '", "version": ' + "9" * 5000 + "}"
        ),
        lambda h: h.write_text("[" * 100_000 + "]" * 100_000),
    ):
        for leftover in (tmp_path / "snap").glob("*"):
            leftover.unlink()
        shard_with_snapshots(spec, 1)
        (header,) = (tmp_path / "snap").glob("*.json")
        damage(header)
        status = ReplayShardServer(spec, restore_snapshot=True).status()
        assert (status.size, status.snapshots_rejected) == (0, 1)


def test_a_header_claiming_more_rows_than_its_file_holds_is_refused_before_allocating(tmp_path):
    location, _, header, _ = one_generation(tmp_path)
    rewrite_header(header, rows=10**10)
    with pytest.raises(snapshot.ReplaySnapshotCorrupt, match="at least") as error:
        snapshot.read_snapshot(location)
    assert error.value.reason == "schema"
    with pytest.raises(snapshot.ReplaySnapshotCorrupt, match="more than the 10 it may hold"):
        snapshot.generations(location)[0].read(max_rows=10)


def test_compressed_arrow_data_is_refused(tmp_path):
    """Arrow decompresses IPC buffers on read: a few KB could claim hundreds of MB."""
    import pyarrow as pa

    location, data, header, _ = one_generation(tmp_path)
    with pa.ipc.open_file(pa.BufferReader(data.read_bytes())) as reader:
        table = reader.read_all()  # from memory: the file is rewritten below
    with (
        pa.OSFile(str(data), "wb") as sink,
        pa.ipc.new_file(
            sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")
        ) as writer,
    ):
        writer.write_table(table)
    rewrite_header(header, data_bytes=data.stat().st_size)
    with pytest.raises(snapshot.ReplaySnapshotCorrupt) as error:
        snapshot.read_snapshot(location)
    assert error.value.reason in {"format", "schema"}


def test_a_snapshot_whose_compressed_layout_cannot_be_sampled_is_refused(tmp_path):
    """A checksum-valid layout of shape [-1, 4] restored, then every sample raised."""
    location = str(tmp_path / "s")
    compression = ObsCompression(columns=("obs",))
    state, columns = filled_replay(compression).snapshot()
    state = dict(state, layout=[["obs", [-1, 4], "|u1"]])
    snapshot.write_snapshot(location, {"replay": state}, columns)
    shard = ReplayShardServer(
        ShardSpec(shard_index=0, capacity=64, alpha=0.7, eps=1e-3, compression=compression)
    )
    with pytest.raises(snapshot.ReplaySnapshotCorrupt, match="layout"):
        asyncio.run(shard.restore(location))


def test_a_periodic_snapshot_that_fails_leaves_the_add_stored_and_counts_it(tmp_path):
    """A column the format cannot hold made every add raise after storing its rows."""
    spec = ShardSpec(
        shard_index=0, capacity=100, snapshot_uri=str(tmp_path / "snap"), snapshot_every_inserts=1
    )

    async def main():
        shard = ReplayShardServer(spec)
        for i in range(3):
            status = await shard.add({"name": np.array(["ab", "cd"]), "x": np.arange(2)})
            assert (status.size, status.snapshot_failures) == (2 * (i + 1), i + 1)
        with pytest.raises(snapshot.SnapshotUnsupported, match=r"'row\.name'"):
            await shard.snapshot_now()  # asked for: raised

    asyncio.run(main())


def test_a_fresh_shards_first_snapshot_replaces_an_earlier_runs(tmp_path):
    spec = shard_spec(tmp_path)
    shard_with_snapshots(spec, 1)
    shard_with_snapshots(spec, 1, start=100)  # a fresh run, not a restart
    (only,) = snapshot.generations(spec.snapshot_uri)
    assert only.read().columns["row.obs"][0, 0] == 100  # the earlier run's rows are gone


def test_an_aborted_restore_drops_what_it_prepared(tmp_path):
    spec = shard_spec(tmp_path)
    shard = shard_with_snapshots(spec, 1)

    async def main():
        await shard.prepare_restore(spec.snapshot_uri)
        await shard.abort_restore()
        with pytest.raises(RuntimeError, match="no prepared restore"):
            await shard.commit_restore()

    asyncio.run(main())


def test_an_explicit_restore_of_a_damaged_snapshot_raises_and_keeps_the_rows(tmp_path):
    spec = shard_spec(tmp_path)
    shard = shard_with_snapshots(spec, 2)

    async def main():
        newest = sorted((tmp_path / "snap").glob("*.arrow"))[-1]
        newest.write_bytes(newest.read_bytes()[:-10])
        with pytest.raises(snapshot.ReplaySnapshotCorrupt, match=newest.name) as error:
            await shard.restore(spec.snapshot_uri)
        assert error.value.reason == "truncated"
        assert shard.status().size == 20

    asyncio.run(main())
