"""Tests for rl_dist_ext.ops.vtrace against a naive implementation of IMPALA eq. (1)."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from vtrace_reference import Segment, segment_vtrace

from rl_dist_ext.ops import vtrace as vtrace_mod
from rl_dist_ext.ops.vtrace import (
    VTraceReturns,
    vtrace_from_importance_weights,
    vtrace_from_log_probs,
)

GAMMA = 0.95

# --------------------------------------------------------------------------------------------
# Naive reference: the explicit double sum of Espeholt et al. 2018, eq. (1), one segment at a
# time (tests/vtrace_reference.py). A [T, B] input without masks is a sequence of segments per
# column: a discount of 0 ends one ("terminated"), the row end cuts the last one.
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
    """The reference on a ``[T, B, ...]`` input whose discounts are ``GAMMA`` or 0."""
    log_rhos = np.asarray(log_rhos, dtype=np.float64)
    shape = log_rhos.shape
    T = shape[0]
    flat = lambda a: np.asarray(a, dtype=np.float64).reshape(T, -1)  # noqa: E731
    lr, gam, r, V = flat(log_rhos), flat(discounts), flat(rewards), flat(values)
    assert np.isin(gam, (0.0, GAMMA)).all()
    boot = np.asarray(bootstrap_value, dtype=np.float64).reshape(-1)
    vs, pg = np.zeros_like(lr), np.zeros_like(lr)
    for b in range(lr.shape[1]):
        start = 0
        while start < T:
            ends = np.flatnonzero(gam[start:, b] == 0.0)
            stop = start + int(ends[0]) + 1 if ends.size else T
            steps = slice(start, stop)
            segment = Segment(
                rewards=r[steps, b],
                values=V[steps, b],
                log_rhos=lr[steps, b],
                next_value=boot[b] if stop == T else V[stop, b],
                end="terminated" if ends.size else "cut",
            )
            vs[steps, b], pg[steps, b] = segment_vtrace(
                segment,
                gamma=GAMMA,
                clip_rho_threshold=clip_rho_threshold,
                clip_pg_rho_threshold=clip_pg_rho_threshold,
                lambda_=lambda_,
            )
            start = stop
    return vs.reshape(shape), pg.reshape(shape)


def make_inputs(T: int, batch_shape: tuple[int, ...], seed: int, terminal_at: int | None = None):
    rng = np.random.default_rng(seed)
    shape = (T, *batch_shape)
    log_rhos = rng.uniform(-2.0, 2.0, size=shape)
    discounts = np.full(shape, GAMMA)
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


# --------------------------------------------------------------------------------------------
# Episode pieces inside a row: terminations, truncations and fragment cuts (masked steps)
# --------------------------------------------------------------------------------------------

CLIPS = [(1.0, 0.8, 1.0), (None, None, 1.0), (1.0, 0.8, 0.9), (2.0, None, 0.9)]


def test_masked_extra_step_adds_no_error_term_golden():
    # The example: one row, r = [1, 1, 0], V = [5, 5, 10], mask = [1, 1, 0], gamma 0.9,
    # on-policy. The third step is RLlib's appended step (the final observation again): the
    # piece was truncated, so v_1 = 1 + 0.9 * 10 = 10, v_0 = 5 + 0.5 + 0.9 * (10 - 5) = 10;
    # the masked step's own target is its value and its advantage 0.
    f64 = torch.float64
    for masked_discount in (0.9, 0.0):  # whatever the adapter puts there, nothing changes
        out = vtrace_from_importance_weights(
            log_rhos=torch.zeros(3, 1, dtype=f64),
            discounts=torch.tensor([[0.9], [0.9], [masked_discount]], dtype=f64),
            rewards=torch.tensor([[1.0], [1.0], [0.0]], dtype=f64),
            values=torch.tensor([[5.0], [5.0], [10.0]], dtype=f64),
            bootstrap_value=torch.tensor([-7.0], dtype=f64),
            mask=torch.tensor([[True], [True], [False]]),
        )
        torch.testing.assert_close(out.vs, torch.tensor([[10.0], [10.0], [10.0]], dtype=f64))
        torch.testing.assert_close(
            out.pg_advantages, torch.tensor([[5.0], [5.0], [0.0]], dtype=f64)
        )


def place(inputs: dict, b: int, start: int, segment: Segment, extra_at: int | None) -> None:
    """Write ``segment`` into column ``b`` from ``start`` (RLlib's layout: its appended step,
    if any, at ``extra_at`` holds the final observation's value and garbage elsewhere)."""
    steps = slice(start, start + len(segment.rewards))
    inputs["rewards"][steps, b] = segment.rewards
    inputs["values"][steps, b] = segment.values
    inputs["log_rhos"][steps, b] = segment.log_rhos
    inputs["discounts"][steps, b] = GAMMA
    if segment.end == "terminated":
        inputs["discounts"][steps.stop - 1, b] = 0.0
    if extra_at is not None:
        inputs["mask"][extra_at, b] = False
        inputs["values"][extra_at, b] = segment.next_value
        # Garbage the op must ignore: a huge reward, rho ~ 150, any discount.
        inputs["rewards"][extra_at, b] = 1e3
        inputs["log_rhos"][extra_at, b] = 5.0
        inputs["discounts"][extra_at, b] = GAMMA


def empty_rows(T: int, B: int) -> dict[str, np.ndarray]:
    return {
        "log_rhos": np.zeros((T, B)),
        "discounts": np.zeros((T, B)),
        "rewards": np.zeros((T, B)),
        "values": np.zeros((T, B)),
        "bootstrap_value": np.zeros(B),
        "mask": np.ones((T, B), dtype=bool),
    }


def random_segment(rng, length: int, end: str, next_value: float) -> Segment:
    return Segment(
        rewards=rng.normal(size=length),
        values=rng.normal(size=length),
        log_rhos=rng.uniform(-2.0, 2.0, size=length),
        next_value=next_value,
        end=end,
    )


def random_rows(T: int, B: int, seed: int):
    """``[T, B]`` rows of random episode pieces in RLlib's layout, and the pieces' segments.

    Inside a row a piece ends by termination or truncation (a fragment cut is a truncation
    too) and is followed by its masked extra step; the row's end cuts whatever piece runs into
    it (bootstrap = ``bootstrap_value``), or falls right after a piece's last real step (its
    extra step then opens the next row: ``bootstrap_value`` is the final observation's value).
    """
    rng = np.random.default_rng(seed)
    inputs = empty_rows(T, B)
    inputs["bootstrap_value"] = rng.normal(size=B)
    placed = []  # (column, start, segment)
    for b in range(B):
        t = 0
        if rng.random() < 0.3:  # the row opens with the previous row's extra step
            place(inputs, b, 0, random_segment(rng, 1, "cut", 0.0), extra_at=0)
            t = 1
        while t < T:
            length = int(rng.integers(1, T - t + 1))
            if t + length == T:
                end = str(rng.choice(["cut", "truncated", "terminated"]))
                segment = random_segment(rng, length, end, inputs["bootstrap_value"][b])
                place(inputs, b, t, segment, extra_at=None)
            else:
                end = str(rng.choice(["truncated", "terminated"]))
                segment = random_segment(rng, length, end, rng.normal())
                place(inputs, b, t, segment, extra_at=t + length)
            placed.append((b, t, segment))
            t += length + (t + length < T)
    assert (~inputs["mask"]).any() and inputs["mask"].any()
    return inputs, placed


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("clip_rho", "clip_pg_rho", "lambda_"), CLIPS)
def test_rows_of_pieces_match_the_per_segment_reference(seed, clip_rho, clip_pg_rho, lambda_):
    T, B = 9, 8
    inputs, placed = random_rows(T, B, seed)
    assert {segment.end for _, _, segment in placed} == {"cut", "truncated", "terminated"}
    clips = dict(clip_rho_threshold=clip_rho, clip_pg_rho_threshold=clip_pg_rho, lambda_=lambda_)
    out = vtrace_from_importance_weights(**to_torch_masked(inputs), **clips)
    for b, start, segment in placed:
        steps = slice(start, start + len(segment.rewards))
        ref_vs, ref_pg = segment_vtrace(segment, gamma=GAMMA, **clips)
        np.testing.assert_allclose(out.vs[steps, b].numpy(), ref_vs, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(
            out.pg_advantages[steps, b].numpy(), ref_pg, rtol=1e-10, atol=1e-10
        )
    masked = ~inputs["mask"]
    np.testing.assert_array_equal(out.vs.numpy()[masked], inputs["values"][masked])
    np.testing.assert_array_equal(out.pg_advantages.numpy()[masked], 0.0)


def test_one_row_with_a_truncation_a_termination_and_a_fragment_cut():
    # [a0 a1 a2 X | b0 b1 X | c0 c1 c2]: a truncated by the env (bootstraps from V(final obs)
    # held by its extra step X), b terminated (no bootstrap), c cut by the row's end
    # (bootstraps from bootstrap_value); lambda < 1 and clipped, off-policy ratios.
    rng = np.random.default_rng(3)
    T = 10
    inputs = empty_rows(T, 1)
    inputs["bootstrap_value"][0] = 2.5
    a = random_segment(rng, 3, "truncated", next_value=4.0)
    b = random_segment(rng, 2, "terminated", next_value=-3.0)
    c = random_segment(rng, 3, "cut", next_value=2.5)
    place(inputs, 0, 0, a, extra_at=3)
    place(inputs, 0, 4, b, extra_at=6)
    place(inputs, 0, 7, c, extra_at=None)
    clips = dict(clip_rho_threshold=1.2, clip_pg_rho_threshold=0.9, lambda_=0.8)
    out = vtrace_from_importance_weights(**to_torch_masked(inputs), **clips)
    for start, segment in ((0, a), (4, b), (7, c)):
        steps = slice(start, start + len(segment.rewards))
        ref_vs, ref_pg = segment_vtrace(segment, gamma=GAMMA, **clips)
        np.testing.assert_allclose(out.vs[steps, 0].numpy(), ref_vs, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(
            out.pg_advantages[steps, 0].numpy(), ref_pg, rtol=1e-10, atol=1e-10
        )
    # The truncated piece does bootstrap: a different final value moves its targets.
    moved = dict(inputs, values=inputs["values"].copy())
    moved["values"][3, 0] += 1.0
    shifted = vtrace_from_importance_weights(**to_torch_masked(moved), **clips)
    assert (shifted.vs[:3, 0] > out.vs[:3, 0]).all()
    torch.testing.assert_close(shifted.vs[4:], out.vs[4:])


def to_torch_masked(inputs: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    out = to_torch({k: v for k, v in inputs.items() if k != "mask"})
    out["mask"] = torch.as_tensor(inputs["mask"])
    return out


def test_masked_steps_may_hold_non_finite_garbage():
    inputs, _ = random_rows(7, 4, seed=1)
    clean = vtrace_from_importance_weights(**to_torch_masked(inputs))
    dirty = {k: v.copy() for k, v in inputs.items()}
    masked = ~inputs["mask"]
    dirty["rewards"][masked] = np.nan
    dirty["log_rhos"][masked] = np.inf
    out = vtrace_from_importance_weights(**to_torch_masked(dirty))
    torch.testing.assert_close(out.vs, clean.vs)
    torch.testing.assert_close(out.pg_advantages, clean.pg_advantages)


def test_float_mask_equals_bool_mask():
    inputs, _ = random_rows(6, 3, seed=2)
    as_bool = vtrace_from_importance_weights(**to_torch_masked(inputs))
    as_float = to_torch_masked(inputs)
    as_float["mask"] = as_float["mask"].double()
    out = vtrace_from_importance_weights(**as_float)
    torch.testing.assert_close(out.vs, as_bool.vs)


def test_lambda_advantage_uses_the_lambda_return_bootstrap():
    # T=2 on-policy, no termination, lambda = 0.5: q_1 = 0.5 v_1 + 0.5 V(x_1) (rlax's form).
    #   v_1 = V_1 + (r_1 + g V_2 - V_1) = 2 + 0.9 * 4 = 5.6
    #   pg_0 = r_0 + g (0.5 * 5.6 + 0.5 * 1.0) - V_0 = 1 + 0.9 * 3.3 - 0.5 = 3.47
    f64 = torch.float64
    out = vtrace_from_importance_weights(
        log_rhos=torch.zeros(2, 1, dtype=f64),
        discounts=torch.full((2, 1), 0.9, dtype=f64),
        rewards=torch.tensor([[1.0], [2.0]], dtype=f64),
        values=torch.tensor([[0.5], [1.0]], dtype=f64),
        bootstrap_value=torch.tensor([4.0], dtype=f64),
        lambda_=0.5,
    )
    torch.testing.assert_close(out.vs[1], torch.tensor([5.6], dtype=f64))
    torch.testing.assert_close(out.pg_advantages[0], torch.tensor([3.47], dtype=f64))


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


def test_mask_shape_mismatch_raises():
    with pytest.raises(ValueError, match=r"mask has shape \(3,\), expected \(3, 2\)"):
        vtrace_from_importance_weights(**_valid(), mask=torch.ones(3, dtype=torch.bool))


@pytest.mark.parametrize(
    "name", ["log_rhos", "discounts", "rewards", "values", "bootstrap_value", "mask"]
)
def test_non_tensor_raises_type_error(name):
    kw = _valid()
    kw["mask"] = torch.ones(3, 2, dtype=torch.bool)
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
