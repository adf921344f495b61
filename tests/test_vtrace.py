"""Tests for rl_dist_ext.ops.vtrace against a naive implementation of IMPALA eq. (1)."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from rl_dist_ext.ops import vtrace as vtrace_mod
from rl_dist_ext.ops.vtrace import (
    VTraceReturns,
    vtrace_from_importance_weights,
    vtrace_from_log_probs,
)

# --------------------------------------------------------------------------------------------
# Naive reference: the explicit double sum of Espeholt et al. 2018, eq. (1), in float64 numpy.
# --------------------------------------------------------------------------------------------


def naive_vtrace(
    log_rhos: np.ndarray,
    discounts: np.ndarray,
    rewards: np.ndarray,
    values: np.ndarray,
    bootstrap_value: np.ndarray,
    clip_rho_threshold: float | None,
    clip_pg_rho_threshold: float | None,
    lambda_: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t V.

    delta_t V = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t)), rho_t = min(rho_bar, pi/mu),
    c_i = lambda * min(1, pi/mu), V(x_T) = bootstrap. Trailing dims are flattened into B.
    """
    log_rhos = np.asarray(log_rhos, dtype=np.float64)
    shape = log_rhos.shape
    T = shape[0]
    flat = lambda a: np.asarray(a, dtype=np.float64).reshape(T, -1)  # noqa: E731
    lr, gam, r, V = flat(log_rhos), flat(discounts), flat(rewards), flat(values)
    boot = np.asarray(bootstrap_value, dtype=np.float64).reshape(-1)
    n = lr.shape[1]

    vs = np.zeros((T, n))
    pg = np.zeros((T, n))
    for b in range(n):
        ratio = [math.exp(lr[t, b]) for t in range(T)]
        rho = [
            ratio[t] if clip_rho_threshold is None else min(clip_rho_threshold, ratio[t])
            for t in range(T)
        ]
        c = [lambda_ * min(1.0, ratio[t]) for t in range(T)]

        def V_at(t: int, b: int = b) -> float:
            return boot[b] if t == T else V[t, b]

        delta = [rho[t] * (r[t, b] + gam[t, b] * V_at(t + 1) - V_at(t)) for t in range(T)]
        for s in range(T):
            total = V_at(s)
            for t in range(s, T):
                coef = 1.0
                for i in range(s, t):
                    coef *= gam[i, b] * c[i]
                total += coef * delta[t]
            vs[s, b] = total
        for s in range(T):
            v_next = boot[b] if s == T - 1 else vs[s + 1, b]
            rho_pg = (
                ratio[s] if clip_pg_rho_threshold is None else min(clip_pg_rho_threshold, ratio[s])
            )
            pg[s, b] = rho_pg * (r[s, b] + gam[s, b] * v_next - V_at(s))
    return vs.reshape(shape), pg.reshape(shape)


def make_inputs(T: int, batch_shape: tuple[int, ...], seed: int, terminal_at: int | None = None):
    rng = np.random.default_rng(seed)
    shape = (T, *batch_shape)
    log_rhos = rng.uniform(-2.0, 2.0, size=shape)
    discounts = np.full(shape, 0.95)
    if terminal_at is not None:
        discounts[terminal_at] = 0.0
    rewards = rng.normal(size=shape)
    values = rng.normal(size=shape)
    bootstrap_value = rng.normal(size=batch_shape)
    return dict(
        log_rhos=log_rhos,
        discounts=discounts,
        rewards=rewards,
        values=values,
        bootstrap_value=bootstrap_value,
    )


def to_torch(inputs: dict[str, np.ndarray], dtype=torch.float64) -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(v, dtype=dtype) for k, v in inputs.items()}


# --------------------------------------------------------------------------------------------
# Agreement with the reference
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_shape", [(1,), (5,), (5, 3)])
@pytest.mark.parametrize(
    ("clip_rho", "clip_pg_rho", "lambda_"),
    [(1.0, 0.8, 1.0), (None, None, 1.0), (1.0, 0.8, 0.9), (2.0, None, 0.9)],
)
def test_matches_naive_reference(batch_shape, clip_rho, clip_pg_rho, lambda_):
    T = 7
    inputs = make_inputs(T, batch_shape, seed=123, terminal_at=3)
    # rho must fall below and above both thresholds for the test to mean anything.
    rhos = np.exp(inputs["log_rhos"])
    assert (rhos < 0.8).any() and (rhos > 1.0).any()

    out = vtrace_from_importance_weights(
        **to_torch(inputs),
        clip_rho_threshold=clip_rho,
        clip_pg_rho_threshold=clip_pg_rho,
        lambda_=lambda_,
    )
    ref_vs, ref_pg = naive_vtrace(
        **inputs,
        clip_rho_threshold=clip_rho,
        clip_pg_rho_threshold=clip_pg_rho,
        lambda_=lambda_,
    )
    assert isinstance(out, VTraceReturns)
    assert out.vs.shape == (T, *batch_shape)
    assert out.pg_advantages.shape == (T, *batch_shape)
    torch.testing.assert_close(out.vs, torch.from_numpy(ref_vs), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out.pg_advantages, torch.from_numpy(ref_pg), rtol=1e-10, atol=1e-10)


def test_float32_matches_reference_and_keeps_dtype():
    inputs = make_inputs(6, (4,), seed=7, terminal_at=2)
    out = vtrace_from_importance_weights(
        **to_torch(inputs, torch.float32), clip_rho_threshold=1.0, clip_pg_rho_threshold=0.8
    )
    assert out.vs.dtype == torch.float32
    assert out.pg_advantages.dtype == torch.float32
    ref_vs, ref_pg = naive_vtrace(**inputs, clip_rho_threshold=1.0, clip_pg_rho_threshold=0.8)
    np.testing.assert_allclose(out.vs.numpy(), ref_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages.numpy(), ref_pg, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_device_preserved():
    inputs = make_inputs(5, (3,), seed=11)
    cpu = vtrace_from_importance_weights(**to_torch(inputs))
    cuda_inputs = {k: v.cuda() for k, v in to_torch(inputs).items()}
    out = vtrace_from_importance_weights(**cuda_inputs)
    assert out.vs.device.type == "cuda"
    assert out.pg_advantages.device.type == "cuda"
    torch.testing.assert_close(out.vs.cpu(), cpu.vs)
    torch.testing.assert_close(out.pg_advantages.cpu(), cpu.pg_advantages)


# --------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------


def test_on_policy_gives_n_step_bootstrapped_return():
    T, B = 6, 4
    inputs = make_inputs(T, (B,), seed=3, terminal_at=2)
    inputs["log_rhos"] = np.zeros((T, B))
    rng = np.random.default_rng(4)
    inputs["discounts"] = rng.uniform(0.5, 1.0, size=(T, B))
    inputs["discounts"][2, 1] = 0.0
    out = vtrace_from_importance_weights(**to_torch(inputs), lambda_=1.0)

    d, r, boot = inputs["discounts"], inputs["rewards"], inputs["bootstrap_value"]
    expected = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            total, disc = 0.0, 1.0
            for t in range(s, T):
                total += disc * r[t, b]
                disc *= d[t, b]
            expected[s, b] = total + disc * boot[b]
    np.testing.assert_allclose(out.vs.numpy(), expected, rtol=1e-12, atol=1e-12)

    vs_tp1 = np.concatenate([expected[1:], boot[None]], axis=0)
    expected_pg = r + d * vs_tp1 - inputs["values"]
    np.testing.assert_allclose(out.pg_advantages.numpy(), expected_pg, rtol=1e-12, atol=1e-12)


def test_golden_tiny_example():
    # T=2, B=1; pi/mu = [0.5, 2.0], gamma = [0.9, 0.9], r = [1, 2], V = [0.5, 1.0], V(x_2) = 2.0,
    # clip_rho = clip_pg_rho = 1, lambda = 1.
    #   rho = min(1, pi/mu) = [0.5, 1.0];  c = min(1, pi/mu) = [0.5, 1.0]
    #   delta_1 = 1.0 * (2 + 0.9 * 2.0 - 1.0) = 2.8
    #   delta_0 = 0.5 * (1 + 0.9 * 1.0 - 0.5) = 0.7
    #   v_1 = 1.0 + 2.8                      = 3.8
    #   v_0 = 0.5 + 0.7 + 0.9 * 0.5 * 2.8    = 2.46
    #   pg_0 = 0.5 * (1 + 0.9 * 3.8 - 0.5)   = 1.96
    #   pg_1 = 1.0 * (2 + 0.9 * 2.0 - 1.0)   = 2.8
    f64 = torch.float64
    out = vtrace_from_importance_weights(
        log_rhos=torch.tensor([[math.log(0.5)], [math.log(2.0)]], dtype=f64),
        discounts=torch.tensor([[0.9], [0.9]], dtype=f64),
        rewards=torch.tensor([[1.0], [2.0]], dtype=f64),
        values=torch.tensor([[0.5], [1.0]], dtype=f64),
        bootstrap_value=torch.tensor([2.0], dtype=f64),
        clip_rho_threshold=1.0,
        clip_pg_rho_threshold=1.0,
    )
    torch.testing.assert_close(out.vs, torch.tensor([[2.46], [3.8]], dtype=f64))
    torch.testing.assert_close(out.pg_advantages, torch.tensor([[1.96], [2.8]], dtype=f64))


def test_episode_boundary_blocks_future():
    T, B, k = 8, 5, 3
    inputs = make_inputs(T, (B,), seed=21, terminal_at=k)
    base = vtrace_from_importance_weights(**to_torch(inputs), clip_pg_rho_threshold=0.8)

    rng = np.random.default_rng(22)
    perturbed = {key: value.copy() for key, value in inputs.items()}
    perturbed["values"][k + 1 :] += rng.normal(size=(T - k - 1, B)) * 10
    perturbed["rewards"][k + 1 :] += rng.normal(size=(T - k - 1, B)) * 10
    perturbed["log_rhos"][k + 1 :] = rng.uniform(-2, 2, size=(T - k - 1, B))
    perturbed["bootstrap_value"] += 100.0
    out = vtrace_from_importance_weights(**to_torch(perturbed), clip_pg_rho_threshold=0.8)

    torch.testing.assert_close(out.vs[: k + 1], base.vs[: k + 1], rtol=0, atol=1e-12)
    torch.testing.assert_close(
        out.pg_advantages[: k + 1], base.pg_advantages[: k + 1], rtol=0, atol=1e-12
    )
    # ...and the perturbation does reach the steps after k.
    assert not torch.allclose(out.vs[k + 1 :], base.vs[k + 1 :])


def test_from_log_probs_equals_from_importance_weights():
    T, B = 5, 3
    rng = np.random.default_rng(5)
    behaviour = torch.as_tensor(np.log(rng.uniform(0.05, 1.0, size=(T, B))))
    target = torch.as_tensor(np.log(rng.uniform(0.05, 1.0, size=(T, B))))
    common = to_torch(make_inputs(T, (B,), seed=6, terminal_at=1))
    del common["log_rhos"]
    kwargs = dict(clip_rho_threshold=1.5, clip_pg_rho_threshold=0.8, lambda_=0.95)

    a = vtrace_from_log_probs(
        behaviour_log_probs=behaviour, target_log_probs=target, **common, **kwargs
    )
    b = vtrace_from_importance_weights(log_rhos=target - behaviour, **common, **kwargs)
    torch.testing.assert_close(a.vs, b.vs, rtol=0, atol=0)
    torch.testing.assert_close(a.pg_advantages, b.pg_advantages, rtol=0, atol=0)


def test_outputs_carry_no_gradient():
    inputs = {k: v.requires_grad_(True) for k, v in to_torch(make_inputs(4, (2,), seed=8)).items()}
    out = vtrace_from_importance_weights(**inputs)
    assert not out.vs.requires_grad
    assert not out.pg_advantages.requires_grad
    assert out.vs.grad_fn is None

    out = vtrace_from_log_probs(
        behaviour_log_probs=torch.zeros(4, 2, dtype=torch.float64, requires_grad=True),
        target_log_probs=inputs["log_rhos"],
        discounts=inputs["discounts"],
        rewards=inputs["rewards"],
        values=inputs["values"],
        bootstrap_value=inputs["bootstrap_value"],
    )
    assert not out.vs.requires_grad
    assert not out.pg_advantages.requires_grad


def test_module_imports_only_numpy_torch_stdlib():
    tree = ast.parse(Path(vtrace_mod.__file__).read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    assert roots <= {"__future__", "typing", "numpy", "torch", "math"}, roots


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _valid(T: int = 3, B: int = 2) -> dict[str, torch.Tensor]:
    return to_torch(make_inputs(T, (B,), seed=0))


def test_rank_below_two_raises():
    kw = _valid()
    kw["log_rhos"] = torch.zeros(3)
    kw["discounts"] = kw["rewards"] = kw["values"] = torch.zeros(3)
    kw["bootstrap_value"] = torch.zeros(())
    with pytest.raises(ValueError, match=r"log_rhos.*rank"):
        vtrace_from_importance_weights(**kw)


@pytest.mark.parametrize("name", ["discounts", "rewards", "values"])
def test_per_step_shape_mismatch_raises(name):
    kw = _valid()
    kw[name] = torch.zeros(3, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=rf"{name} has shape \(3, 4\), expected \(3, 2\)"):
        vtrace_from_importance_weights(**kw)


@pytest.mark.parametrize("bad_shape", [(3,), (3, 2), (1, 2), ()])
def test_bootstrap_shape_mismatch_raises(bad_shape):
    kw = _valid()
    kw["bootstrap_value"] = torch.zeros(bad_shape, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"bootstrap_value has shape .*expected \(2,\)"):
        vtrace_from_importance_weights(**kw)


def test_log_probs_shape_mismatch_raises():
    kw = _valid()
    del kw["log_rhos"]
    with pytest.raises(ValueError, match="behaviour_log_probs"):
        vtrace_from_log_probs(
            behaviour_log_probs=torch.zeros(3, 3, dtype=torch.float64),
            target_log_probs=torch.zeros(3, 2, dtype=torch.float64),
            **kw,
        )


@pytest.mark.parametrize("name", ["clip_rho_threshold", "clip_pg_rho_threshold"])
@pytest.mark.parametrize("value", [0.0, -1.0])
def test_bad_threshold_raises(name, value):
    with pytest.raises(ValueError, match=name):
        vtrace_from_importance_weights(**_valid(), **{name: value})


@pytest.mark.parametrize("value", [-0.1, 1.1, float("nan")])
def test_bad_lambda_raises(value):
    with pytest.raises(ValueError, match="lambda_"):
        vtrace_from_importance_weights(**_valid(), lambda_=value)


@pytest.mark.parametrize("name", ["log_rhos", "discounts", "rewards", "values", "bootstrap_value"])
def test_non_tensor_raises_type_error(name):
    kw = _valid()
    kw[name] = kw[name].numpy()
    with pytest.raises(TypeError, match=name):
        vtrace_from_importance_weights(**kw)


def test_non_tensor_log_probs_raises_type_error():
    kw = _valid()
    del kw["log_rhos"]
    with pytest.raises(TypeError, match="target_log_probs"):
        vtrace_from_log_probs(
            behaviour_log_probs=torch.zeros(3, 2, dtype=torch.float64),
            target_log_probs=[[0.0, 0.0]] * 3,
            **kw,
        )
