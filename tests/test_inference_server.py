"""InferenceServer (SEED central inference) without Ray: batching, ordering, versions, errors."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from rl_dist_ext.inference import InferenceServer, InferenceServerConfig


class _LinearPolicy:
    """actions = argmax(obs @ W); records every batch it ran."""

    is_recurrent = False

    def __init__(self, device: str) -> None:
        self.device = device
        self.weights = np.eye(3)
        self.batches: list[int] = []

    def __call__(self, obs: np.ndarray) -> dict[str, np.ndarray]:
        self.batches.append(obs.shape[0])
        q = obs @ self.weights
        return {"actions": q.argmax(axis=1), "q_values": q, "row_sum": obs.sum(axis=1)}

    def set_weights(self, weights) -> None:
        self.weights = np.asarray(weights)


def _server(**kwargs) -> InferenceServer:
    return InferenceServer(_LinearPolicy, InferenceServerConfig(**kwargs))


def test_concurrent_callers_are_batched_and_each_gets_its_own_rows_once():
    server = _server(max_batch_size=64, max_wait_ms=20.0)
    rng = np.random.default_rng(0)
    requests = [rng.normal(size=(int(rng.integers(1, 5)), 3)) for _ in range(40)]

    async def main():
        return await asyncio.gather(
            *(server.infer(f"actor-{i}", obs) for i, obs in enumerate(requests))
        )

    replies = asyncio.run(main())
    assert len(replies) == len(requests)
    for obs, reply in zip(requests, replies, strict=True):
        np.testing.assert_allclose(reply.outputs["row_sum"], obs.sum(axis=1))
        np.testing.assert_array_equal(reply.outputs["actions"], obs.argmax(axis=1))
        assert reply.version == -1
    # Requests that waited for a batch to form (or for the one before to run) report it.
    queued = [reply.queue_ms for reply in replies]
    assert min(queued) >= 0.0 and max(queued) > 0.0
    policy = server._policies[""]
    assert sum(policy.batches) == sum(len(o) for o in requests)  # every row exactly once
    assert max(policy.batches) <= 64
    assert len(policy.batches) < len(requests)  # requests really were batched
    stats = asyncio.run(server.stats())
    assert stats["num_requests"] == len(requests)
    assert stats["mean_batch_requests"] > 1.0
    assert 0.0 < stats["batch_fill"] <= 1.0


def test_a_full_batch_runs_without_waiting_for_the_timeout():
    server = _server(max_batch_size=4, max_wait_ms=10_000.0)

    async def main():
        return await asyncio.wait_for(
            asyncio.gather(*(server.infer("a", np.ones((1, 3))) for _ in range(8))), timeout=5.0
        )

    replies = asyncio.run(main())
    assert len(replies) == 8
    assert server._policies[""].batches == [4, 4]


def test_a_lone_caller_is_answered_at_once_not_after_max_wait():
    server = _server(max_batch_size=1_000, max_wait_ms=10_000.0)
    reply = asyncio.run(asyncio.wait_for(server.infer("a", np.ones((2, 3))), timeout=5.0))
    assert reply.outputs["actions"].shape == (2,)
    assert server._policies[""].batches == [2]
    assert asyncio.run(server.stats())["early_batches"] == 1


async def _a_request_waiting_for_registered_b(server: InferenceServer, *, settle_s: float):
    """Register a and b, send a's request; after ``settle_s`` it is still queued, waiting for
    b (active since it registered), not answered alone."""
    await server.register("a")
    await server.register("b")
    first = asyncio.ensure_future(server.infer("a", np.ones((1, 3))))
    await asyncio.sleep(settle_s)
    assert not first.done()
    return first


def test_a_batch_runs_once_every_active_caller_has_a_request_queued():
    """b is active (registered), so a's request waits for it; then both go in one batch."""
    server = _server(max_batch_size=1_000, max_wait_ms=10_000.0, active_caller_window_s=30.0)

    async def main():
        first = await _a_request_waiting_for_registered_b(server, settle_s=0.2)
        second = await asyncio.wait_for(server.infer("b", np.ones((2, 3))), timeout=5.0)
        return await first, second

    first, second = asyncio.run(main())
    assert server._policies[""].batches == [3]
    assert first.queue_ms >= 150.0 and second.queue_ms < 150.0


def test_a_caller_that_says_it_is_idle_is_not_waited_for():
    server = _server(max_batch_size=1_000, max_wait_ms=10_000.0, active_caller_window_s=30.0)

    async def main():
        first = await _a_request_waiting_for_registered_b(server, settle_s=0.1)
        await server.idle("b")  # b went off to do something else: a's batch runs now
        reply = await asyncio.wait_for(first, timeout=5.0)
        again = await asyncio.wait_for(server.infer("a", np.ones((1, 3))), timeout=5.0)
        return reply, again

    reply, again = asyncio.run(main())
    assert reply.queue_ms < 5_000.0 and again.queue_ms < 1_000.0
    assert server._policies[""].batches == [1, 1]


def test_a_caller_that_went_quiet_delays_others_only_until_its_window_ends():
    server = _server(max_batch_size=1_000, max_wait_ms=10_000.0, active_caller_window_s=0.3)

    async def main():
        await asyncio.gather(server.infer("a", np.ones((1, 3))), server.infer("b", np.ones((1, 3))))
        # b goes quiet: a's next request waits until b's 0.3 s window ends, not 10 s
        waited = await asyncio.wait_for(server.infer("a", np.ones((1, 3))), timeout=5.0)
        at_once = await asyncio.wait_for(server.infer("a", np.ones((1, 3))), timeout=5.0)
        return waited, at_once

    waited, at_once = asyncio.run(main())
    assert 100.0 <= waited.queue_ms <= 3_000.0
    assert at_once.queue_ms < 100.0


def test_an_oversized_request_runs_as_its_own_batch():
    server = _server(max_batch_size=4, max_wait_ms=1.0)
    reply = asyncio.run(server.infer("a", np.ones((10, 3))))
    assert reply.outputs["q_values"].shape == (10, 3)


def test_weights_and_versions_reach_later_batches():
    server = _server(max_wait_ms=0.0)

    async def main():
        first = await server.infer("a", np.array([[1.0, 0.0, 0.0]]))
        await server.set_weights(np.roll(np.eye(3), 1, axis=1), version=3)
        second = await server.infer("a", np.array([[1.0, 0.0, 0.0]]))
        assert await server.set_weights(np.eye(3), version=2) == 3  # older: ignored
        third = await server.infer("a", np.array([[1.0, 0.0, 0.0]]))
        with pytest.raises(ValueError, match="version"):
            await server.set_weights(np.eye(3), version=-2)
        assert (await server.stats())["stale_weights_ignored"] == 1
        return first, second, third

    first, second, third = asyncio.run(main())
    assert (third.version, int(third.outputs["actions"][0])) == (3, 1)
    assert (first.version, int(first.outputs["actions"][0])) == (-1, 0)
    assert (second.version, int(second.outputs["actions"][0])) == (3, 1)


def test_a_restarted_caller_is_recognised():
    server = _server()

    async def main():
        assert await server.register("runner-1") == 0
        assert await server.register("runner-2") == 0
        assert await server.register("runner-1") == 1
        return await server.stats()

    stats = asyncio.run(main())
    assert stats["num_callers"] == 2
    assert stats["caller_restarts"] == 1


def test_callers_that_never_registered_are_known_from_their_requests():
    """After a server restart the runners keep sending without registering again."""
    server = _server(max_wait_ms=0.0)

    async def main():
        await server.register("runner-1")
        for caller in ("runner-1", "runner-2", "runner-2"):
            await server.infer(caller, np.ones((1, 3)))
        return await server.stats()

    stats = asyncio.run(main())
    assert stats["num_callers"] == 2
    assert stats["caller_restarts"] == 0


def test_a_request_the_policy_cannot_take_fails_only_its_own_caller():
    """It used to fail every request batched with it."""

    class Flaky(_LinearPolicy):
        def __call__(self, obs):
            if np.isnan(obs).any():
                raise RuntimeError("bad observation")
            return super().__call__(obs)

    server = InferenceServer(Flaky, InferenceServerConfig(max_batch_size=8, max_wait_ms=20.0))

    async def main():
        bad = np.full((1, 3), np.nan)
        results = await asyncio.gather(
            server.infer("a", np.ones((1, 3))),
            server.infer("b", bad),
            server.infer("c", np.ones((2, 3))),
            return_exceptions=True,
        )
        after = await server.infer("b", np.ones((1, 3)))
        return results, after

    (good, bad, other), after = asyncio.run(main())
    assert isinstance(bad, RuntimeError)
    assert good.outputs["actions"].shape == (1,) and other.outputs["actions"].shape == (2,)
    assert after.outputs["actions"].shape == (1,)


@pytest.mark.parametrize(
    "obs, match",
    [
        (np.ones((2, 4)), r"shape \(4,\) and dtype float64 do not fit the policy"),
        (np.full((2, 3), "x"), r"dtype <U1 do not fit"),
        (np.ones((1, 3, 1)), r"shape \(3, 1\)"),
    ],
)
def test_a_request_of_the_wrong_shape_or_dtype_is_refused_to_its_caller_alone(obs, match):
    server = _server(max_batch_size=8, max_wait_ms=20.0)

    async def main():
        first = await asyncio.gather(  # nothing learned yet: the batch fails, each runs alone
            server.infer("a", np.ones((1, 3))), server.infer("b", obs), return_exceptions=True
        )
        later = await asyncio.gather(  # refused on arrival
            server.infer("a", np.ones((1, 3))), server.infer("b", obs), return_exceptions=True
        )
        return first, later

    (good, bad), (good_later, bad_later) = asyncio.run(main())
    assert good.outputs["actions"].shape == good_later.outputs["actions"].shape == (1,)
    assert isinstance(bad, Exception)
    assert isinstance(bad_later, ValueError) and bad_later.args[0]
    with pytest.raises(ValueError, match=match):
        raise bad_later


def test_outputs_with_the_wrong_batch_size_are_an_error():
    class Wrong(_LinearPolicy):
        def __call__(self, obs):
            return {"actions": np.zeros(obs.shape[0] + 1)}

    server = InferenceServer(Wrong, InferenceServerConfig(max_wait_ms=0.0))
    with pytest.raises(ValueError, match="one row per observation"):
        asyncio.run(server.infer("a", np.ones((2, 3))))


def test_config_errors_and_recurrent_policies_are_rejected():
    with pytest.raises(ValueError, match="max_batch_size"):
        InferenceServerConfig(max_batch_size=0)
    with pytest.raises(ValueError, match="max_wait_ms"):
        InferenceServerConfig(max_wait_ms=-1.0)
    with pytest.raises(ValueError, match="device"):
        InferenceServerConfig(device="")
    with pytest.raises(ValueError, match="active_caller_window_s"):
        InferenceServerConfig(active_caller_window_s=-1.0)

    class Recurrent(_LinearPolicy):
        is_recurrent = True

    with pytest.raises(ValueError, match="recurrent"):
        InferenceServer(Recurrent)
    with pytest.raises(ValueError, match="obs"):
        asyncio.run(_server().infer("a", np.ones((0, 3))))


def test_a_server_of_several_modules_batches_each_module_apart_and_takes_weights_per_module():
    policies = {}

    def factory(device):
        policies.update(a=_LinearPolicy(device), b=_LinearPolicy(device))
        return dict(policies)

    server = InferenceServer(factory, InferenceServerConfig(max_batch_size=64, max_wait_ms=20.0))
    rng = np.random.default_rng(3)
    requests = [(f"r{i}", "ab"[i % 2], rng.normal(size=(2, 3))) for i in range(10)]

    async def main():
        await server.set_weights({"b": -np.eye(3)}, 1)  # only b's weights change
        return await asyncio.gather(*(server.infer(c, obs, m) for c, m, obs in requests))

    replies = asyncio.run(main())
    for (_, module, obs), reply in zip(requests, replies, strict=True):
        sign = 1.0 if module == "a" else -1.0
        np.testing.assert_allclose(reply.outputs["q_values"], sign * obs)
        assert reply.version == 1
    assert sum(policies["a"].batches) == sum(policies["b"].batches) == 10  # rows of its module
    assert len(policies["a"].batches) < 5  # batched within the module

    with pytest.raises(ValueError, match=r"no policy for module 'c'; it serves \['a', 'b'\]"):
        asyncio.run(server.infer("r0", np.zeros((1, 3)), "c"))
    with pytest.raises(ValueError, match=r"weights for modules \['c'\]"):
        asyncio.run(server.set_weights({"c": np.eye(3)}, 2))


def test_central_inference_is_one_settings_object_for_both_adapters():
    """SEED mode's settings are defined once (rl_dist_ext.inference.CentralInference): the
    server's batching defaults are InferenceServerConfig's, Tianshou's collectors take the same
    class, and RLlib's ``.central_inference(...)`` builds one (checked when built, so that Tune
    search spaces pass through the setter)."""
    from rl_dist_ext.inference import CentralInference, InferenceServerConfig
    from rllib_plugins import VTraceConfig
    from tianshou_plugins import CentralInference as TianshouCentralInference

    assert TianshouCentralInference is CentralInference
    default = CentralInference()
    server = InferenceServerConfig()
    assert (default.max_batch_size, default.max_wait_ms) == (
        server.max_batch_size,
        server.max_wait_ms,
    )
    assert default.gpus(cluster_gpus=0.0) == 0.0 and default.gpus(cluster_gpus=2.0) == 0.5
    assert CentralInference(num_gpus=1).bundle(cluster_gpus=0.0) == {"CPU": 0.5, "GPU": 1.0}
    for bad, match in (
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_wait_ms": -1.0}, "max_wait_ms"),
        ({"num_cpus": -0.5}, "num_cpus"),
        ({"num_gpus": "all"}, "num_gpus"),
    ):
        with pytest.raises(ValueError, match=match):
            CentralInference(**bad)

    config = VTraceConfig().central_inference(enabled=True, max_batch_size=8, num_cpus=0.2)
    assert config.central_inference_config() == CentralInference(max_batch_size=8, num_cpus=0.2)
    with pytest.raises(TypeError, match="central_inference\\(\\) has no setting 'max_batch'"):
        config.central_inference(max_batch=8)
    config.central_inference(max_wait_ms=-3.0)  # a value is checked when the algorithm is built
    with pytest.raises(ValueError, match=r"central_inference\(...\): max_wait_ms"):
        config.validate_central_inference()
