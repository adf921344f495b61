"""Hostile input to the replay API, property-based: whatever a caller passes to ``add``,
``sample`` or ``update_priorities`` (wrong shapes, dtypes or lengths, NaN/inf/negative
priorities, stale and out-of-range keys, empty and huge batches), the call either works or
raises ``ValueError``/``TypeError``, and a refused call changes nothing: rows, keys,
priorities, counters and the sampler's random state are as before."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rl_dist_ext.replay.prioritized import PrioritizedReplay
from rl_dist_ext.replay.shard import ReplayShardServer, ShardSpec

DTYPES = st.sampled_from(["int64", "int32", "uint8", "float32", "float64", "bool", "complex64"])
PRIORITY_VALUES = st.floats(allow_nan=True, allow_infinity=True, width=64)


def replay() -> PrioritizedReplay:
    out = PrioritizedReplay(16, seed=0)
    out.add({"obs": np.arange(30, dtype=np.float32).reshape(10, 3), "a": np.arange(10)})
    out.update_priorities(out.sample(4).keys, np.array([0.5, 1.0, 2.0, 3.0]))
    return out


def state_of(target: PrioritizedReplay) -> tuple:
    state, columns = target.snapshot()
    return repr(state), {name: column.copy() for name, column in columns.items()}


def assert_unchanged(before: tuple, after: tuple) -> None:
    assert before[0] == after[0]
    assert before[1].keys() == after[1].keys()
    for name, column in before[1].items():
        np.testing.assert_array_equal(column, after[1][name], err_msg=name)


def arrays(rows: st.SearchStrategy[int]):
    return st.tuples(DTYPES, rows, hnp.array_shapes(min_dims=0, max_dims=2, max_side=4)).flatmap(
        lambda spec: hnp.arrays(np.dtype(spec[0]), (spec[1], *spec[2]))
    )


ROWS = st.integers(0, 6)
BATCHES = st.one_of(
    st.dictionaries(st.sampled_from(["obs", "a", "other"]), arrays(ROWS), max_size=3),
    st.dictionaries(st.sampled_from(["obs", "a"]), st.one_of(st.none(), st.integers(), st.text())),
    st.one_of(st.none(), st.lists(st.integers(), max_size=3), st.text()),
)
PRIORITIES = st.one_of(
    st.none(),
    st.lists(PRIORITY_VALUES, max_size=7).map(np.array),
    hnp.arrays(np.float64, hnp.array_shapes(max_dims=2, max_side=4), elements=PRIORITY_VALUES),
)
KEYS = st.one_of(
    st.lists(st.integers(-(2**40), 2**40), max_size=6).map(lambda k: np.array(k, dtype=np.int64)),
    st.lists(st.integers(0, 30), max_size=6).map(lambda k: np.array(k, dtype=np.int64)),
    hnp.arrays(st.sampled_from(["float64", "int64", "uint8"]), hnp.array_shapes(max_dims=2)),
)
BATCH_SIZES = st.one_of(
    st.integers(-3, 2**40), st.floats(allow_nan=True), st.none(), st.sampled_from([1.0, True])
)


def refused_or_done(call) -> bool:
    try:
        call()
    except (ValueError, TypeError):
        return False
    return True


@given(batch=BATCHES, priorities=PRIORITIES)
def test_add_refuses_what_does_not_fit_and_changes_nothing(batch, priorities):
    target = replay()
    before = state_of(target)
    if not refused_or_done(lambda: target.add(batch, priorities)):
        assert_unchanged(before, state_of(target))


@given(keys=KEYS, priorities=PRIORITIES)
def test_update_priorities_refuses_bad_keys_or_priorities_and_changes_nothing(keys, priorities):
    target = replay()
    before = state_of(target)
    if refused_or_done(lambda: target.update_priorities(keys, priorities)):
        assert np.isfinite(target.total_priority)
    else:
        assert_unchanged(before, state_of(target))


@given(batch_size=BATCH_SIZES, beta=st.one_of(st.floats(allow_nan=True), st.just(0.4)))
def test_sample_refuses_bad_sizes_and_betas_and_changes_nothing(batch_size, beta):
    target = replay()
    before = state_of(target)
    if refused_or_done(lambda: target.sample(batch_size, beta=beta)):
        assert 1 <= batch_size <= 2**20
    else:
        assert_unchanged(before, state_of(target))


def test_a_huge_sample_is_refused_before_anything_is_allocated():
    with pytest.raises(ValueError, match="batch_size=1000000000 is more rows"):
        replay().sample(10**9)


@given(batch=BATCHES, priorities=PRIORITIES, keys=KEYS, batch_size=BATCH_SIZES)
def test_a_shard_serving_hostile_calls_keeps_serving_good_ones(batch, priorities, keys, batch_size):
    shard = ReplayShardServer(ShardSpec(shard_index=0, capacity=16, timeout_s=0.01))

    async def main():
        await shard.add({"obs": np.zeros((4, 3), np.float32), "a": np.arange(4)})
        for call in (
            lambda: shard.add(batch, priorities, max_wait_s=0.01),
            lambda: shard.update_priorities(keys, priorities if priorities is not None else keys),
            lambda: shard.sample(batch_size, max_wait_s=0.01),
        ):
            with contextlib.suppress(ValueError, TypeError):
                await call()
        sample = await shard.sample(8)
        status = await shard.update_priorities(sample.keys, np.ones(8))
        assert status.size >= 4 and np.isfinite(status.total_priority)

    asyncio.run(main())
