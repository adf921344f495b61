"""Weight encodings for the parameter server path: exactness of fp32, the documented error bounds
of fp16 and int8 against a naive per-element check, structure and non-float leaves preserved,
the encoded weights through a real parameter server actor, and clear errors for a bad name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_dist_ext.weight_compression import (
    EncodedWeights,
    check_encoding,
    decode_weights,
    encode_weights,
)


def weights_tree(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "encoder": {
            "conv.weight": torch.as_tensor(rng.normal(0, 0.05, (32, 4, 8, 8)), dtype=torch.float32),
            "conv.bias": torch.as_tensor(rng.normal(0, 1.0, 32), dtype=torch.float32),
            "steps": torch.tensor(7, dtype=torch.int64),
        },
        "head": [rng.normal(0, 3.0, (512, 6)).astype(np.float32), np.zeros(6, np.float32)],
        "tiny": np.array([1e-7, -3e-6, 2.0], dtype=np.float32),
        "name": "q",
    }


def leaves(tree) -> list:
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in leaves(v)]
    if isinstance(tree, list):
        return [x for v in tree for x in leaves(v)]
    return [tree]


def as_array(leaf) -> np.ndarray:
    return leaf.numpy() if isinstance(leaf, torch.Tensor) else np.asarray(leaf)


def test_fp32_is_exact_and_unchanged():
    tree = weights_tree()
    assert encode_weights(tree, "fp32") is tree
    assert decode_weights(tree) is tree


@pytest.mark.parametrize("encoding", ["fp16", "int8"])
def test_encoded_weights_keep_structure_types_and_non_float_leaves(encoding):
    tree = weights_tree()
    encoded = encode_weights(tree, encoding)
    assert isinstance(encoded, EncodedWeights)
    back = decode_weights(encoded)
    assert back.keys() == tree.keys() and back["encoder"].keys() == tree["encoder"].keys()
    assert isinstance(back["head"], list)
    assert back["name"] == "q"
    assert back["encoder"]["steps"].dtype == torch.int64 and int(back["encoder"]["steps"]) == 7
    for orig, restored in zip(leaves(tree), leaves(back), strict=True):
        assert type(orig) is type(restored)
        if isinstance(orig, torch.Tensor | np.ndarray) and as_array(orig).dtype.kind == "f":
            assert as_array(restored).dtype == np.float32
            assert as_array(restored).shape == as_array(orig).shape


def test_fp16_error_is_within_half_precision_rounding():
    tree = weights_tree()
    back = decode_weights(encode_weights(tree, "fp16"))
    for orig, restored in zip(leaves(tree), leaves(back), strict=True):
        if not (isinstance(orig, torch.Tensor | np.ndarray) and as_array(orig).dtype.kind == "f"):
            continue
        w, r = as_array(orig).astype(np.float64), as_array(restored).astype(np.float64)
        for x, y in zip(w.ravel(), r.ravel(), strict=True):  # element by element
            if abs(x) >= 2**-14:
                assert abs(y - x) <= abs(x) * 2**-11
            else:
                assert abs(y - x) <= 2**-25


def test_int8_error_is_at_most_half_a_step_per_tensor():
    tree = weights_tree()
    encoded = encode_weights(tree, "int8")
    back = decode_weights(encoded)
    for orig, restored in zip(leaves(tree), leaves(back), strict=True):
        if not (isinstance(orig, torch.Tensor | np.ndarray) and as_array(orig).dtype.kind == "f"):
            continue
        w, r = as_array(orig).astype(np.float64), as_array(restored).astype(np.float64)
        step = np.abs(w).max() / 127.0
        assert np.all(np.abs(r - w) <= step / 2 + 1e-7 * step), np.abs(r - w).max() / step
        if np.abs(w).max() == 0:
            np.testing.assert_array_equal(r, 0.0)
    # 1 byte per float element: the conv weight travels as int8
    conv = encoded.tree["encoder"]["conv.weight"]
    assert conv.values.dtype == np.int8 and conv.values.shape == (32, 4, 8, 8)


def test_bad_encoding_names_the_field_and_the_choices():
    with pytest.raises(ValueError, match=r"weights_encoding must be one of \['fp32', 'fp16'"):
        check_encoding("bf16")
    with pytest.raises(ValueError, match="weights_encoding"):
        encode_weights({}, "int4")


def test_bad_encoding_is_refused_by_both_adapters_before_any_actor_starts():

    from rllib_plugins import GorilaDQNConfig
    from tianshou_plugins.actor_collector import ActorFleet

    config = GorilaDQNConfig().environment("CartPole-v1").training(weights_encoding="bf16")
    with pytest.raises(ValueError, match="weights_encoding"):
        config.validate()
    with pytest.raises(ValueError, match="weights_encoding"):
        ActorFleet(
            num_actors=1,
            envs_per_actor=1,
            steps_per_env=1,
            weight_sync_every_n_steps=1,
            max_in_flight_per_actor=1,
            num_cpus_per_actor=0.1,
            seed=None,
            timeout_s=1.0,
            weights_encoding="bf16",
        )


@pytest.mark.parametrize("encoding", ["fp16", "int8"])
def test_parameter_server_carries_encoded_weights_and_pullers_get_float32(ray_session, encoding):
    import ray

    from rl_dist_ext.ray_actors import start_parameter_server

    server = start_parameter_server(timeout_s=30, weights_encoding=encoding)
    try:
        tree = weights_tree(1)
        server.publish(tree, 3)
        stored = ray.get(server.handle.pull_if_newer.remote(-1))
        assert isinstance(stored.weights, EncodedWeights)  # the server holds the small form

        @ray.remote(num_cpus=0.1)
        def pull(client):
            latest = client.pull_if_newer(-1)
            return latest.version, latest.weights

        version, weights = ray.get(pull.remote(server), timeout=60)
        assert version == 3
        w = tree["head"][0]
        r = weights["head"][0]
        assert r.dtype == np.float32
        bound = np.abs(w).max() / 254 if encoding == "int8" else np.abs(w).max() * 2**-11
        assert np.abs(r - w).max() <= bound * (1 + 1e-6)
        assert server.pull_if_newer(3) is None
    finally:
        server.close()
