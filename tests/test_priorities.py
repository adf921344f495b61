"""Tests for rl_dist_ext.ops.priorities (PER priorities, IS weights) and ops.dqn (the loss)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rl_dist_ext.ops.dqn import double_dqn_loss, double_dqn_td_error, polyak_update
from rl_dist_ext.ops.priorities import importance_weights, td_priorities

# --------------------------------------------------------------------------------------------
# naive references
# --------------------------------------------------------------------------------------------


def _naive_priorities(td, alpha, eps):
    flat = [float(x) for x in np.asarray(td, dtype=np.float64).ravel()]
    out = [(abs(d) + eps) ** alpha for d in flat]
    return np.asarray(out, dtype=np.float64).reshape(np.shape(td))


def _naive_weights(priorities, total, size, beta, min_priority):
    raw = [(size * float(p) / total) ** -beta for p in priorities]
    max_w = max(raw) if min_priority is None else (size * min_priority / total) ** -beta
    return np.asarray([w / max_w for w in raw], dtype=np.float64)


def _naive_double_dqn(q_online_t, actions, rewards, discounts, q_online_tp1, q_target_tp1):
    """Per-row python loops: returns (q_selected, target, td) as lists of floats."""
    q_sel, targets, tds = [], [], []
    for i in range(len(actions)):
        q_s = float(q_online_t[i][int(actions[i])])
        row_online = [float(v) for v in q_online_tp1[i]]
        a_star = max(range(len(row_online)), key=lambda a, r=row_online: r[a])
        target = float(rewards[i]) + float(discounts[i]) * float(q_target_tp1[i][a_star])
        q_sel.append(q_s)
        targets.append(target)
        tds.append(target - q_s)
    return q_sel, targets, tds


def _naive_huber(x, delta):
    return 0.5 * x * x if abs(x) <= delta else delta * (abs(x) - 0.5 * delta)


def _naive_mse(x):
    return 0.5 * x * x


def _naive_loss(tds, weights, loss_type, delta):
    per = [_naive_huber(t, delta) if loss_type == "huber" else _naive_mse(t) for t in tds]
    return sum(w * loss for w, loss in zip(weights, per, strict=True)) / len(per)


# --------------------------------------------------------------------------------------------
# td_priorities
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.0, 0.4, 0.6, 1.0, 2.0])
@pytest.mark.parametrize("eps", [1e-6, 1e-2, 0.5])
def test_td_priorities_numpy_matches_naive(alpha, eps):
    rng = np.random.default_rng(0)
    td = rng.normal(scale=3.0, size=(5, 7))
    td[0, 0] = 0.0
    out = td_priorities(td, alpha=alpha, eps=eps)
    assert isinstance(out, np.ndarray)
    assert out.shape == td.shape
    np.testing.assert_allclose(out, _naive_priorities(td, alpha, eps), rtol=1e-12, atol=0)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_td_priorities_torch_matches_naive_and_is_detached(alpha, dtype):
    gen = torch.Generator().manual_seed(1)
    td = (torch.randn(4, 6, generator=gen, dtype=dtype) * 2.0).requires_grad_(True)
    out = td_priorities(td, alpha=alpha, eps=1e-3)
    assert isinstance(out, torch.Tensor)
    assert out.shape == td.shape
    assert out.dtype == dtype
    assert not out.requires_grad
    assert out.grad_fn is None
    expected = _naive_priorities(td.detach().numpy(), alpha, 1e-3)
    rtol = 1e-12 if dtype == torch.float64 else 1e-5
    np.testing.assert_allclose(out.numpy(), expected, rtol=rtol, atol=0)


def test_td_priorities_default_args_and_list_input():
    td = [0.0, -1.0, 2.5]
    out = td_priorities(np.asarray(td))
    np.testing.assert_allclose(out, _naive_priorities(td, 0.6, 1e-6), rtol=1e-12)


def test_td_priorities_alpha_zero_gives_ones():
    td = np.array([0.0, -3.0, 1e6, 1e-9])
    np.testing.assert_array_equal(td_priorities(td, alpha=0.0), np.ones(4))
    t = torch.tensor([0.0, -3.0, 1e6, 1e-9])
    assert torch.equal(td_priorities(t, alpha=0.0), torch.ones(4))


def test_td_priorities_all_positive_even_for_zero_td():
    out = td_priorities(np.zeros(3), alpha=0.6, eps=1e-6)
    assert np.all(out > 0)
    np.testing.assert_allclose(out, (1e-6) ** 0.6)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"alpha": -0.1}, "alpha"),
        ({"alpha": -1.0}, "alpha"),
        ({"alpha": float("nan")}, "alpha"),
        ({"eps": 0.0}, "eps"),
        ({"eps": -1e-6}, "eps"),
        ({"eps": float("nan")}, "eps"),
    ],
)
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_td_priorities_errors(kwargs, match, kind):
    td = np.ones(3) if kind == "numpy" else torch.ones(3)
    with pytest.raises(ValueError, match=match):
        td_priorities(td, **kwargs)


# --------------------------------------------------------------------------------------------
# importance_weights
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("beta", [0.0, 0.4, 0.7, 1.0])
def test_importance_weights_with_min_priority_matches_naive(beta):
    rng = np.random.default_rng(2)
    priorities = rng.uniform(0.1, 5.0, size=16)
    min_priority = 0.05  # smaller than every sampled priority
    total, size = 250.0, 1000
    out = importance_weights(
        priorities, total_priority=total, size=size, beta=beta, min_priority=min_priority
    )
    assert out.dtype == np.float32
    assert out.shape == (16,)
    expected = _naive_weights(priorities, total, size, beta, min_priority)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert np.all(out > 0) and np.all(out <= 1)
    if beta > 0:
        assert out.max() < 1.0  # normalised by the replay-wide max, not the batch max


@pytest.mark.parametrize("beta", [0.0, 0.4, 0.7, 1.0])
def test_importance_weights_batch_max_matches_naive(beta):
    rng = np.random.default_rng(3)
    priorities = rng.uniform(0.1, 5.0, size=9)
    total, size = 40.0, 64
    out = importance_weights(priorities, total_priority=total, size=size, beta=beta)
    assert out.dtype == np.float32
    expected = _naive_weights(priorities, total, size, beta, None)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert np.all(out > 0) and np.all(out <= 1)
    # the smallest priority gets the largest weight, which is exactly 1
    assert out[np.argmin(priorities)] == pytest.approx(1.0, abs=0)


def test_importance_weights_min_priority_equal_to_batch_min_gives_same_as_batch_max():
    priorities = np.array([0.5, 1.0, 2.0, 4.0])
    a = importance_weights(priorities, total_priority=10.0, size=20, beta=0.5, min_priority=0.5)
    b = importance_weights(priorities, total_priority=10.0, size=20, beta=0.5)
    np.testing.assert_allclose(a, b, rtol=1e-7)


def test_importance_weights_hand_value():
    # N=4, total=4 -> N*P(i) = p_i ; beta=1 -> w = 1/p_i ; batch max at p=0.5 -> 2
    out = importance_weights(np.array([0.5, 1.0, 2.0]), total_priority=4.0, size=4, beta=1.0)
    np.testing.assert_allclose(out, [1.0, 0.5, 0.25], rtol=1e-7)


@pytest.mark.parametrize("min_priority", [None, 0.01])
def test_importance_weights_beta_zero_gives_ones(min_priority):
    priorities = np.array([0.01, 0.3, 7.0])
    out = importance_weights(
        priorities, total_priority=10.0, size=5, beta=0.0, min_priority=min_priority
    )
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.ones(3, dtype=np.float32))


@pytest.mark.parametrize(
    ("priorities", "kwargs", "match"),
    [
        (np.ones(3), {"beta": -0.1}, "beta"),
        (np.ones(3), {"beta": 1.1}, "beta"),
        (np.ones(3), {"beta": float("nan")}, "beta"),
        (np.ones(3), {"size": 0}, "size"),
        (np.ones(3), {"size": -5}, "size"),
        (np.ones(3), {"total_priority": 0.0}, "total_priority"),
        (np.ones(3), {"total_priority": -1.0}, "total_priority"),
        (np.ones((3, 1)), {}, "priorities"),
        (np.ones((2, 2)), {}, "priorities"),
        (np.ones(3), {"min_priority": 0.0}, "min_priority"),
        (np.ones(3), {"min_priority": -0.5}, "min_priority"),
    ],
)
def test_importance_weights_errors(priorities, kwargs, match):
    args = {"total_priority": 10.0, "size": 10, "beta": 0.5}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        importance_weights(priorities, **args)


# --------------------------------------------------------------------------------------------
# double_dqn_td_error
# --------------------------------------------------------------------------------------------


def _tables(dtype=torch.float64):
    """Hand-made tables where argmax(q_online_tp1) != argmax(q_target_tp1) on every row."""
    q_online_t = torch.tensor(
        [[1.0, 2.0, 0.0], [0.5, -1.0, 3.0], [-2.0, 4.0, 1.0]], dtype=dtype
    ).requires_grad_(True)
    actions = torch.tensor([1, 0, 2])
    rewards = torch.tensor([1.0, -1.0, 0.5], dtype=dtype)
    discounts = torch.tensor([0.9, 0.81, 0.0], dtype=dtype)
    q_online_tp1 = torch.tensor(
        [[0.0, 3.0, 1.0], [5.0, 1.0, 2.0], [0.0, 0.0, 9.0]], dtype=dtype
    ).requires_grad_(True)
    q_target_tp1 = torch.tensor(
        [[10.0, 4.0, -1.0], [2.0, 7.0, 0.0], [6.0, 1.0, -3.0]], dtype=dtype
    ).requires_grad_(True)
    assert not torch.equal(q_online_tp1.argmax(1), q_target_tp1.argmax(1))
    assert (q_online_tp1.argmax(1) != q_target_tp1.argmax(1)).all()
    return {
        "q_online_t": q_online_t,
        "actions": actions,
        "rewards": rewards,
        "discounts": discounts,
        "q_online_tp1": q_online_tp1,
        "q_target_tp1": q_target_tp1,
    }


def _as_lists(kw):
    return {k: v.detach().tolist() for k, v in kw.items()}


def test_double_dqn_td_error_matches_naive():
    kw = _tables()
    out = double_dqn_td_error(**kw)
    q_sel, target, td = _naive_double_dqn(**_as_lists(kw))
    np.testing.assert_allclose(out.q_selected.detach().numpy(), q_sel, rtol=1e-12)
    np.testing.assert_allclose(out.target.numpy(), target, rtol=1e-12)
    np.testing.assert_allclose(out.td_error.numpy(), td, rtol=1e-12)
    # explicit values: online selects [1, 0, 2], target evaluates -> [4, 2, -3]
    np.testing.assert_allclose(out.target.numpy(), [1.0 + 0.9 * 4.0, -1.0 + 0.81 * 2.0, 0.5])
    # not the "vanilla DQN" max over the target net
    vanilla = kw["rewards"] + kw["discounts"] * kw["q_target_tp1"].detach().max(1).values
    assert not torch.allclose(out.target, vanilla)


def test_double_dqn_td_error_random_matches_naive():
    gen = torch.Generator().manual_seed(4)
    B, A = 11, 5
    kw = {
        "q_online_t": torch.randn(B, A, generator=gen, dtype=torch.float64),
        "actions": torch.randint(0, A, (B,), generator=gen),
        "rewards": torch.randn(B, generator=gen, dtype=torch.float64),
        "discounts": torch.rand(B, generator=gen, dtype=torch.float64),
        "q_online_tp1": torch.randn(B, A, generator=gen, dtype=torch.float64),
        "q_target_tp1": torch.randn(B, A, generator=gen, dtype=torch.float64),
    }
    out = double_dqn_td_error(**kw)
    q_sel, target, td = _naive_double_dqn(**_as_lists(kw))
    np.testing.assert_allclose(out.q_selected.numpy(), q_sel, rtol=1e-12)
    np.testing.assert_allclose(out.target.numpy(), target, rtol=1e-12)
    np.testing.assert_allclose(out.td_error.numpy(), td, rtol=1e-12)


def test_double_dqn_td_error_gradients():
    kw = _tables()
    out = double_dqn_td_error(**kw)
    assert out.q_selected.requires_grad
    assert not out.target.requires_grad
    assert out.target.grad_fn is None
    assert not out.td_error.requires_grad
    out.q_selected.sum().backward()
    expected = torch.zeros(3, 3, dtype=torch.float64)
    expected[0, 1] = expected[1, 0] = expected[2, 2] = 1.0
    assert torch.equal(kw["q_online_t"].grad, expected)
    assert kw["q_online_tp1"].grad is None
    assert kw["q_target_tp1"].grad is None


def test_double_dqn_td_error_termination_target_is_reward():
    kw = _tables()
    kw["discounts"] = torch.zeros(3, dtype=torch.float64)
    out = double_dqn_td_error(**kw)
    assert torch.equal(out.target, kw["rewards"])


def test_double_dqn_td_error_accepts_float32_rewards_with_float64_q():
    kw = _tables()
    kw["rewards"] = kw["rewards"].float()
    kw["discounts"] = kw["discounts"].float()
    out = double_dqn_td_error(**kw)
    assert out.target.dtype == torch.float64


# --------------------------------------------------------------------------------------------
# double_dqn_loss
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_type", ["huber", "mse"])
@pytest.mark.parametrize("huber_delta", [0.5, 1.0, 3.0])
def test_double_dqn_loss_matches_naive_weighted(loss_type, huber_delta):
    kw = _tables()
    weights = torch.tensor([0.2, 1.0, 0.55], dtype=torch.float64)
    out = double_dqn_loss(**kw, weights=weights, loss_type=loss_type, huber_delta=huber_delta)
    _, _, td = _naive_double_dqn(**_as_lists(kw))
    expected = _naive_loss(td, weights.tolist(), loss_type, huber_delta)
    assert out.loss.ndim == 0
    assert out.loss.item() == pytest.approx(expected, rel=1e-12)
    np.testing.assert_allclose(out.td_error.numpy(), td, rtol=1e-12)
    assert not out.td_error.requires_grad
    assert not out.q_selected.requires_grad
    assert not out.target.requires_grad


@pytest.mark.parametrize("loss_type", ["huber", "mse"])
def test_double_dqn_loss_random_matches_naive(loss_type):
    gen = torch.Generator().manual_seed(5)
    B, A = 13, 4
    kw = {
        "q_online_t": torch.randn(B, A, generator=gen, dtype=torch.float64) * 3,
        "actions": torch.randint(0, A, (B,), generator=gen),
        "rewards": torch.randn(B, generator=gen, dtype=torch.float64),
        "discounts": torch.rand(B, generator=gen, dtype=torch.float64),
        "q_online_tp1": torch.randn(B, A, generator=gen, dtype=torch.float64),
        "q_target_tp1": torch.randn(B, A, generator=gen, dtype=torch.float64),
    }
    weights = torch.rand(B, generator=gen, dtype=torch.float64)
    out = double_dqn_loss(**kw, weights=weights, loss_type=loss_type, huber_delta=0.7)
    _, _, td = _naive_double_dqn(**_as_lists(kw))
    # make sure both huber branches are exercised
    assert any(abs(t) <= 0.7 for t in td) and any(abs(t) > 0.7 for t in td)
    expected = _naive_loss(td, weights.tolist(), loss_type, 0.7)
    assert out.loss.item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("loss_type", ["huber", "mse"])
def test_double_dqn_loss_weights_none_equals_ones(loss_type):
    kw = _tables()
    a = double_dqn_loss(**kw, loss_type=loss_type)
    b = double_dqn_loss(**kw, weights=torch.ones(3, dtype=torch.float64), loss_type=loss_type)
    assert a.loss.item() == pytest.approx(b.loss.item(), rel=1e-15)
    _, _, td = _naive_double_dqn(**_as_lists(kw))
    assert a.loss.item() == pytest.approx(_naive_loss(td, [1.0] * 3, loss_type, 1.0), rel=1e-12)


@pytest.mark.parametrize("loss_type", ["huber", "mse"])
def test_double_dqn_loss_weights_change_loss_on_every_path(loss_type):
    kw = _tables()
    losses = []
    for w in ([1.0, 1.0, 1.0], [0.1, 1.0, 1.0], [1.0, 0.1, 1.0], [1.0, 1.0, 0.1]):
        weights = torch.tensor(w, dtype=torch.float64)
        losses.append(double_dqn_loss(**kw, weights=weights, loss_type=loss_type).loss.item())
    # every row has nonzero td, so down-weighting any row strictly lowers the loss
    for lower in losses[1:]:
        assert lower < losses[0]
    assert len({round(x, 12) for x in losses}) == len(losses)
    # zero weights -> zero loss
    zero = double_dqn_loss(**kw, weights=torch.zeros(3, dtype=torch.float64), loss_type=loss_type)
    assert zero.loss.item() == 0.0


@pytest.mark.parametrize("loss_type", ["huber", "mse"])
def test_double_dqn_loss_weights_scale_linearly(loss_type):
    kw = _tables()
    w = torch.tensor([0.3, 0.9, 0.6], dtype=torch.float64)
    a = double_dqn_loss(**kw, weights=w, loss_type=loss_type).loss.item()
    b = double_dqn_loss(**kw, weights=2.5 * w, loss_type=loss_type).loss.item()
    assert b == pytest.approx(2.5 * a, rel=1e-12)


@pytest.mark.parametrize("loss_type", ["huber", "mse"])
def test_double_dqn_loss_gradient_only_to_q_online_t(loss_type):
    kw = _tables()
    weights = torch.tensor([0.2, 1.0, 0.55], dtype=torch.float64, requires_grad=False)
    out = double_dqn_loss(**kw, weights=weights, loss_type=loss_type)
    assert out.loss.requires_grad
    out.loss.backward()
    grad = kw["q_online_t"].grad
    assert grad is not None
    assert kw["q_online_tp1"].grad is None
    assert kw["q_target_tp1"].grad is None
    # gradient only on the taken actions
    mask = torch.zeros(3, 3, dtype=torch.bool)
    mask[0, 1] = mask[1, 0] = mask[2, 2] = True
    assert torch.all(grad[~mask] == 0)
    # compare against the analytic gradient of mean_i w_i l(td_i) wrt q_selected
    _, _, td = _naive_double_dqn(**_as_lists(kw))
    B = 3
    for i, (r, c) in enumerate([(0, 1), (1, 0), (2, 2)]):
        if loss_type == "mse":
            dl = -td[i]
        else:
            dl = -td[i] if abs(td[i]) <= 1.0 else -math.copysign(1.0, td[i])
        assert grad[r, c].item() == pytest.approx(weights[i].item() * dl / B, rel=1e-12)


def test_double_dqn_loss_huber_delta_respected():
    kw = _tables()
    _, _, td = _naive_double_dqn(**_as_lists(kw))
    big = max(abs(t) for t in td) + 1.0
    # delta larger than every |td| -> huber equals mse
    huber_big = double_dqn_loss(**kw, loss_type="huber", huber_delta=big).loss.item()
    mse = double_dqn_loss(**kw, loss_type="mse").loss.item()
    assert huber_big == pytest.approx(mse, rel=1e-12)
    # different deltas give different losses, each matching the naive formula
    vals = {}
    for delta in (0.1, 1.0, 2.0):
        vals[delta] = double_dqn_loss(**kw, loss_type="huber", huber_delta=delta).loss.item()
        assert vals[delta] == pytest.approx(_naive_loss(td, [1.0] * 3, "huber", delta), rel=1e-12)
    assert len(set(vals.values())) == 3
    # mse ignores huber_delta
    assert double_dqn_loss(**kw, loss_type="mse", huber_delta=0.1).loss.item() == pytest.approx(
        mse, rel=1e-15
    )


def _golden_batch():
    q_online_t = torch.tensor([[1.0, 2.0], [0.5, -1.0]], dtype=torch.float64, requires_grad=True)
    return {
        "q_online_t": q_online_t,
        "actions": torch.tensor([1, 0]),  # q_selected = [2.0, 0.5]
        "rewards": torch.tensor([1.0, -1.0], dtype=torch.float64),
        "discounts": torch.tensor([0.5, 0.0], dtype=torch.float64),
        # online argmax = [1, 0]; target argmax = [0, 1] (differ)
        "q_online_tp1": torch.tensor([[0.0, 3.0], [5.0, 1.0]], dtype=torch.float64),
        "q_target_tp1": torch.tensor([[10.0, 4.0], [2.0, 7.0]], dtype=torch.float64),
    }


def test_double_dqn_loss_golden_two_rows():
    # target = [1 + 0.5 * 4, -1 + 0 * 2] = [3, -1]; td = target - q_sel = [1.0, -1.5]
    # huber(delta=1): [0.5 * 1^2, 1 * (1.5 - 0.5)] = [0.5, 1.0]
    # mse:            [0.5 * 1^2, 0.5 * 1.5^2]      = [0.5, 1.125]
    # weights [0.25, 1.0]: huber = (0.125 + 1.0) / 2 = 0.5625 ; mse = (0.125 + 1.125) / 2 = 0.625
    weights = torch.tensor([0.25, 1.0], dtype=torch.float64)
    kw = _golden_batch()
    huber = double_dqn_loss(**kw, weights=weights, loss_type="huber", huber_delta=1.0)
    assert huber.target.tolist() == [3.0, -1.0]
    assert huber.q_selected.tolist() == [2.0, 0.5]
    assert huber.td_error.tolist() == [1.0, -1.5]
    assert huber.loss.item() == 0.5625
    huber.loss.backward()
    # d/dq_sel: row0 -td*w/B = -0.125 ; row1 -delta*sign(td)*w/B = +0.5
    assert kw["q_online_t"].grad.tolist() == [[0.0, -0.125], [0.5, 0.0]]

    kw = _golden_batch()
    mse = double_dqn_loss(**kw, weights=weights, loss_type="mse")
    assert mse.loss.item() == 0.625
    mse.loss.backward()
    # d/dq_sel: -td*w/B = [-0.125, 0.75]
    assert kw["q_online_t"].grad.tolist() == [[0.0, -0.125], [0.75, 0.0]]


def test_double_dqn_loss_float32_weights_with_float64_q():
    kw = _golden_batch()
    out = double_dqn_loss(**kw, weights=torch.tensor([0.25, 1.0]), loss_type="huber")
    assert out.loss.dtype == torch.float64
    assert out.loss.item() == pytest.approx(0.5625, rel=1e-12)


# --------------------------------------------------------------------------------------------
# shape / argument errors
# --------------------------------------------------------------------------------------------


def _good(B=3, A=4):
    return {
        "q_online_t": torch.zeros(B, A),
        "actions": torch.zeros(B, dtype=torch.long),
        "rewards": torch.zeros(B),
        "discounts": torch.ones(B),
        "q_online_tp1": torch.zeros(B, A),
        "q_target_tp1": torch.zeros(B, A),
    }


_SHAPE_CASES = [
    ({"q_online_t": torch.zeros(3)}, "q_online_t"),
    ({"q_online_t": torch.zeros(3, 4, 1)}, "q_online_t"),
    ({"q_online_tp1": torch.zeros(3, 5)}, "q_online_tp1"),
    ({"q_online_tp1": torch.zeros(2, 4)}, "q_online_tp1"),
    ({"q_target_tp1": torch.zeros(3, 3)}, "q_target_tp1"),
    ({"q_target_tp1": torch.zeros(3, 4, 1)}, "q_target_tp1"),
    ({"actions": torch.zeros(2, dtype=torch.long)}, "actions"),
    ({"actions": torch.zeros(3, 1, dtype=torch.long)}, "actions"),
    ({"rewards": torch.zeros(4)}, "rewards"),
    ({"rewards": torch.zeros(3, 1)}, "rewards"),
    ({"discounts": torch.zeros(())}, "discounts"),
    ({"discounts": torch.zeros(1, 3)}, "discounts"),
]


@pytest.mark.parametrize(("override", "match"), _SHAPE_CASES)
def test_double_dqn_td_error_shape_errors(override, match):
    kw = _good()
    kw.update(override)
    with pytest.raises(ValueError, match=match):
        double_dqn_td_error(**kw)


@pytest.mark.parametrize(("override", "match"), _SHAPE_CASES)
def test_double_dqn_loss_shape_errors(override, match):
    kw = _good()
    kw.update(override)
    with pytest.raises(ValueError, match=match):
        double_dqn_loss(**kw)


@pytest.mark.parametrize("loss_type", ["huber", "mse"])
@pytest.mark.parametrize(
    "weights", [torch.ones(2), torch.ones(4), torch.ones(3, 1), torch.ones(())]
)
def test_double_dqn_loss_weights_shape_error(loss_type, weights):
    with pytest.raises(ValueError, match="weights"):
        double_dqn_loss(**_good(), weights=weights, loss_type=loss_type)


@pytest.mark.parametrize("loss_type", ["l1", "HUBER", "", None, "smooth_l1"])
def test_double_dqn_loss_bad_loss_type(loss_type):
    with pytest.raises(ValueError, match="loss_type"):
        double_dqn_loss(**_good(), loss_type=loss_type)


@pytest.mark.parametrize("delta", [0.0, -1.0, float("nan")])
def test_double_dqn_loss_bad_huber_delta(delta):
    with pytest.raises(ValueError, match="huber_delta"):
        double_dqn_loss(**_good(), huber_delta=delta)


@pytest.mark.parametrize("tau", [1.0, 0.25, 0.004])
def test_polyak_update_matches_naive_mix_and_copies_counters(tau):
    """Every float entry (weights and BatchNorm's running statistics) becomes ``tau * online +
    (1 - tau) * target`` element by element; the batch counter is copied; the target's
    parameters stay the same objects (an optimizer or a module holding them still sees them)."""

    def net() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))

    torch.manual_seed(0)
    online, target = net(), net()
    online.train()
    online(torch.randn(8, 3))  # running statistics and the batch counter move
    before = {k: v.clone() for k, v in target.state_dict().items()}
    params = list(target.parameters())
    polyak_update(online, target, tau)
    after, source = target.state_dict(), online.state_dict()
    for name, old in before.items():
        if old.is_floating_point():
            pairs = zip(source[name].flatten().tolist(), old.flatten().tolist(), strict=True)
            want = [tau * o + (1 - tau) * t for o, t in pairs]
            assert after[name].flatten().tolist() == pytest.approx(want, rel=1e-6, abs=1e-7)
        else:
            assert torch.equal(after[name], source[name]), name
    assert after["1.num_batches_tracked"].item() == 1
    assert all(a is b for a, b in zip(params, target.parameters(), strict=True))


def test_target_tau_is_the_one_given_or_picked_from_the_period():
    """``None`` picks a Polyak factor for a target moved after every update, whose mean lag
    (1 - tau) / tau is a copy's every 250 updates ((250 - 1) / 2), and a copy for a longer
    period; a given tau is used as it is."""
    from rl_dist_ext.ops.dqn import POLYAK_TAU, target_tau

    assert target_tau(None, 1) == POLYAK_TAU == 0.008
    assert abs((1 - POLYAK_TAU) / POLYAK_TAU - (250 - 1) / 2) <= 0.5
    assert target_tau(None, 2) == target_tau(None, 250) == 1.0
    assert target_tau(0.3, 1) == target_tau(0.3, 250) == 0.3
