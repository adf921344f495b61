"""The final-observation layout of fixed-length trajectories and the shared IMPALA loss (no Ray).

Checked against a step-by-step construction and, through the V-trace op, against the per-segment
reference of the paper (tests/vtrace_reference.py), which knows nothing of masks or layouts.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vtrace_reference import Segment, segment_vtrace

from rl_dist_ext.ops.vtrace import vtrace_from_log_probs
from rl_dist_ext.ops.vtrace_layout import final_step_layout, gather_time_major
from rl_dist_ext.ops.vtrace_loss import vtrace_actor_critic_loss

GAMMA = 0.9


def naive_layout(terminated: np.ndarray, truncated: np.ndarray) -> list[list[tuple[int, bool]]]:
    """Per row: (input step, is a final-observation step), then padding."""
    rows = []
    num_steps = terminated.shape[0]
    for b in range(terminated.shape[1]):
        row = []
        for t in range(num_steps):
            row.append((t, False))
            if t == num_steps - 1 or (truncated[t, b] and not terminated[t, b]):
                row.append((t, True))
        rows.append(row)
    longest = max(map(len, rows))
    return [row + [row[-1]] * (longest - len(row)) for row in rows]


def random_flags(rng, num_steps: int, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    terminated = rng.random((num_steps, num_rows)) < 0.15
    truncated = rng.random((num_steps, num_rows)) < 0.15
    return terminated, truncated


@pytest.mark.parametrize("seed", range(20))
def test_layout_equals_the_step_by_step_construction(seed):
    rng = np.random.default_rng(seed)
    terminated, truncated = random_flags(rng, int(rng.integers(1, 9)), int(rng.integers(1, 6)))
    layout = final_step_layout(terminated, truncated)
    expected = naive_layout(terminated, truncated)
    got = [
        list(zip(layout.source[:, b].tolist(), layout.final[:, b].tolist(), strict=True))
        for b in range(terminated.shape[1])
    ]
    assert got == expected
    np.testing.assert_array_equal(layout.mask, ~layout.final)


def test_layout_of_a_row_without_episode_ends_adds_one_final_step():
    flags = np.zeros((4, 2), dtype=bool)
    layout = final_step_layout(flags, flags)
    assert layout.source.shape == (5, 2)
    np.testing.assert_array_equal(layout.source[:, 0], [0, 1, 2, 3, 3])
    np.testing.assert_array_equal(layout.final[:, 1], [False] * 4 + [True])


def segments_of_row(terminated, truncated, b) -> list[tuple[int, int, str]]:
    """(start, stop, end) of the episode pieces in row b of [T, B] trajectories."""
    pieces, start = [], 0
    num_steps = terminated.shape[0]
    for t in range(num_steps):
        if terminated[t, b] or truncated[t, b] or t == num_steps - 1:
            end = "terminated" if terminated[t, b] else "truncated"
            pieces.append((start, t + 1, end))
            start = t + 1
    return pieces


@pytest.mark.parametrize("lambda_", [1.0, 0.8])
@pytest.mark.parametrize("seed", range(8))
def test_vtrace_over_the_layout_equals_the_per_segment_reference(seed, lambda_):
    """Trajectories with terminations, env truncations and a cut at the row end: every real
    step's target and advantage equal the paper's double sum over its own episode piece."""
    rng = np.random.default_rng(100 + seed)
    num_steps, num_rows = 7, 4
    terminated, truncated = random_flags(rng, num_steps, num_rows)
    v_obs = rng.normal(size=(num_steps, num_rows))  # V(obs_t)
    v_next = rng.normal(size=(num_steps, num_rows))  # V(next_obs_t)
    rewards = rng.normal(size=(num_steps, num_rows))
    log_rhos = np.log(rng.choice([0.2, 0.7, 1.0, 1.6, 3.0], size=(num_steps, num_rows)))

    layout = final_step_layout(terminated, truncated)
    values = np.where(
        layout.final, gather_time_major(v_next, layout), gather_time_major(v_obs, layout)
    )
    t64 = lambda x: torch.as_tensor(np.asarray(x, dtype=np.float64))  # noqa: E731
    out = vtrace_from_log_probs(
        behaviour_log_probs=torch.zeros(layout.source.shape, dtype=torch.float64),
        target_log_probs=t64(gather_time_major(log_rhos, layout)),
        discounts=t64(GAMMA * (1.0 - gather_time_major(terminated, layout))),
        rewards=t64(gather_time_major(rewards, layout)),
        values=t64(values),
        bootstrap_value=t64(values[-1]),
        mask=torch.as_tensor(layout.mask),
        clip_rho_threshold=1.2,
        clip_pg_rho_threshold=1.0,
        lambda_=lambda_,
    )
    for b in range(num_rows):
        real_positions = np.flatnonzero(layout.mask[:, b])
        assert layout.source[real_positions, b].tolist() == list(range(num_steps))
        for start, stop, end in segments_of_row(terminated, truncated, b):
            vs, pg = segment_vtrace(
                Segment(
                    rewards=rewards[start:stop, b],
                    values=v_obs[start:stop, b],
                    log_rhos=log_rhos[start:stop, b],
                    next_value=float(v_next[stop - 1, b]),
                    end=end,
                ),
                gamma=GAMMA,
                clip_rho_threshold=1.2,
                clip_pg_rho_threshold=1.0,
                lambda_=lambda_,
            )
            at = real_positions[start:stop]
            np.testing.assert_allclose(out.vs[at, b].numpy(), vs, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(out.pg_advantages[at, b].numpy(), pg, rtol=1e-10)


@pytest.mark.parametrize(
    ("terminated", "truncated", "match"),
    [
        (np.zeros(3, bool), np.zeros(3, bool), "terminated must be"),
        (np.zeros((0, 2), bool), np.zeros((0, 2), bool), "terminated must be"),
        (np.zeros((3, 2), bool), np.zeros((3, 1), bool), "truncated has shape"),
    ],
)
def test_layout_rejects_bad_shapes(terminated, truncated, match):
    with pytest.raises(ValueError, match=match):
        final_step_layout(terminated, truncated)


def test_loss_is_the_masked_mean_of_its_terms_with_gradients():
    """Each term by hand over the real steps; masked steps (even -inf log-probs there) add
    nothing; gradients reach the log-probs, values and entropy."""
    rng = np.random.default_rng(0)
    shape = (5, 3)
    mask = torch.as_tensor(rng.random(shape) < 0.7)
    mask[0, 0] = True
    target_logp = torch.tensor(np.log(rng.uniform(0.1, 0.9, shape)), requires_grad=True)
    behaviour_logp = torch.as_tensor(np.log(rng.uniform(0.1, 0.9, shape)))
    values = torch.tensor(rng.normal(size=shape), requires_grad=True)
    entropy = torch.tensor(rng.uniform(0.1, 0.7, shape), requires_grad=True)
    rewards = torch.as_tensor(rng.normal(size=shape))
    discounts = torch.full(shape, GAMMA, dtype=torch.float64)
    bootstrap = torch.as_tensor(rng.normal(size=shape[1]))
    with torch.no_grad():
        padded_logp = torch.where(mask, target_logp, torch.tensor(-np.inf, dtype=torch.float64))
    kwargs = dict(
        behaviour_log_probs=behaviour_logp,
        rewards=rewards,
        discounts=discounts,
        bootstrap_value=bootstrap,
        mask=mask,
        vf_loss_coeff=0.3,
        entropy_coeff=0.02,
        clip_rho_threshold=1.0,
        clip_pg_rho_threshold=1.0,
        lambda_=0.9,
    )
    loss = vtrace_actor_critic_loss(
        target_log_probs=target_logp, entropy=entropy, values=values, **kwargs
    )
    targets = vtrace_from_log_probs(
        behaviour_log_probs=behaviour_logp,
        target_log_probs=target_logp,
        discounts=discounts,
        rewards=rewards,
        values=values,
        bootstrap_value=bootstrap,
        mask=mask,
        lambda_=0.9,
    )
    real = mask.numpy()
    pi = -(target_logp.detach().numpy() * targets.pg_advantages.numpy())[real].mean()
    vf = 0.5 * ((values.detach().numpy() - targets.vs.numpy()) ** 2)[real].mean()
    ent = entropy.detach().numpy()[real].mean()
    rho = np.exp(target_logp.detach().numpy() - behaviour_logp.numpy())[real].mean()
    np.testing.assert_allclose(loss.pi_loss.item(), pi, rtol=1e-12)
    np.testing.assert_allclose(loss.vf_loss.item(), vf, rtol=1e-12)
    np.testing.assert_allclose(loss.entropy.item(), ent, rtol=1e-12)
    np.testing.assert_allclose(loss.mean_rho.item(), rho, rtol=1e-12)
    np.testing.assert_allclose(loss.total.item(), pi + 0.3 * vf - 0.02 * ent, rtol=1e-12)
    loss.total.backward()
    for x in (target_logp, values, entropy):
        assert x.grad is not None and torch.all(x.grad[~mask] == 0) and x.grad[mask].abs().sum() > 0

    with torch.no_grad():  # -inf log-probs at masked steps change nothing
        masked = vtrace_actor_critic_loss(
            target_log_probs=torch.where(mask, target_logp, padded_logp),
            entropy=entropy,
            values=values,
            **kwargs,
        )
    assert torch.isfinite(masked.total)
    np.testing.assert_allclose(masked.total.item(), loss.total.item(), rtol=1e-12)


def test_normalized_advantages_are_standardized_over_the_real_steps_only():
    """By hand: the policy term with the advantages of the real steps less their mean, over
    their (population) standard deviation; the value and entropy terms unchanged; a masked
    step's advantage (however large) changes nothing."""
    rng = np.random.default_rng(1)
    shape = (6, 4)
    mask = torch.as_tensor(rng.random(shape) < 0.6)
    mask[0, 0] = True
    target_logp = torch.tensor(np.log(rng.uniform(0.1, 0.9, shape)), requires_grad=True)
    kwargs = dict(
        behaviour_log_probs=torch.as_tensor(np.log(rng.uniform(0.1, 0.9, shape))),
        entropy=torch.as_tensor(rng.uniform(0.1, 0.7, shape)),
        values=torch.as_tensor(rng.normal(size=shape)),
        rewards=torch.as_tensor(rng.normal(5.0, 3.0, size=shape)),  # advantages far from 0
        discounts=torch.full(shape, GAMMA, dtype=torch.float64),
        bootstrap_value=torch.as_tensor(rng.normal(size=shape[1])),
        mask=mask,
        vf_loss_coeff=0.5,
        entropy_coeff=0.01,
    )
    plain = vtrace_actor_critic_loss(target_log_probs=target_logp, **kwargs)
    normal = vtrace_actor_critic_loss(
        target_log_probs=target_logp, normalize_advantages=True, **kwargs
    )
    targets = vtrace_from_log_probs(
        behaviour_log_probs=kwargs["behaviour_log_probs"],
        target_log_probs=target_logp,
        discounts=kwargs["discounts"],
        rewards=kwargs["rewards"],
        values=kwargs["values"],
        bootstrap_value=kwargs["bootstrap_value"],
        mask=mask,
    )
    real = mask.numpy()
    advantages = targets.pg_advantages.numpy()[real]
    standardized = (advantages - advantages.mean()) / advantages.std()
    logp = target_logp.detach().numpy()[real]
    np.testing.assert_allclose(normal.pi_loss.item(), -(logp * standardized).mean(), rtol=1e-6)
    assert abs(plain.pi_loss.item() - normal.pi_loss.item()) > 0.1
    np.testing.assert_allclose(normal.vf_loss.item(), plain.vf_loss.item(), rtol=1e-12)
    np.testing.assert_allclose(normal.entropy.item(), plain.entropy.item(), rtol=1e-12)
    normal.total.backward()
    assert torch.all(target_logp.grad[~mask] == 0)


def test_clipped_surrogate_equals_the_step_by_step_reference_with_its_gradient():
    """PPO's clipped surrogate on the V-trace advantages, one real step at a time in plain
    floats: the term min(r A, clip(r) A) and its gradient in log pi (r A where the unclipped
    side is the smaller, else 0); masked steps (-inf log-probs on both sides) add nothing;
    around pi_old = pi the gradient is the plain term's."""
    rng = np.random.default_rng(2)
    shape = (7, 5)
    mask = torch.as_tensor(rng.random(shape) < 0.7)
    mask[0, 0] = True
    logp = np.log(rng.uniform(0.1, 0.9, shape))
    old_logp = logp + rng.normal(0.0, 0.3, shape)  # ratios from about 0.5 to 2: both sides clip
    epsilon = 0.2
    kwargs = dict(
        behaviour_log_probs=torch.as_tensor(np.log(rng.uniform(0.1, 0.9, shape))),
        entropy=torch.as_tensor(rng.uniform(0.1, 0.7, shape)),
        values=torch.as_tensor(rng.normal(size=shape)),
        rewards=torch.as_tensor(rng.normal(size=shape)),
        discounts=torch.full(shape, GAMMA, dtype=torch.float64),
        bootstrap_value=torch.as_tensor(rng.normal(size=shape[1])),
        mask=mask,
        vf_loss_coeff=0.5,
        entropy_coeff=0.01,
    )
    target_logp = torch.tensor(logp, requires_grad=True)
    minus_inf = torch.tensor(-np.inf, dtype=torch.float64)
    old = torch.where(mask, torch.as_tensor(old_logp), minus_inf)  # -inf at masked steps
    clipped = vtrace_actor_critic_loss(
        target_log_probs=target_logp, ratio_clip=epsilon, old_log_probs=old, **kwargs
    )
    advantages = vtrace_from_log_probs(
        behaviour_log_probs=kwargs["behaviour_log_probs"],
        target_log_probs=target_logp,
        discounts=kwargs["discounts"],
        rewards=kwargs["rewards"],
        values=kwargs["values"],
        bootstrap_value=kwargs["bootstrap_value"],
        mask=mask,
    ).pg_advantages.numpy()
    real = [(t, b) for t in range(shape[0]) for b in range(shape[1]) if mask[t, b]]
    total, grad = 0.0, np.zeros(shape)
    num_clipped = 0
    for t, b in real:
        r = float(np.exp(logp[t, b] - old_logp[t, b]))
        a = float(advantages[t, b])
        unclipped, bounded = r * a, min(max(r, 1 - epsilon), 1 + epsilon) * a
        total += min(unclipped, bounded)
        if unclipped <= bounded:
            grad[t, b] = -r * a / len(real)  # d(-r A / N) / d log pi
        else:
            num_clipped += 1
    assert 0 < num_clipped < len(real)  # the reference covers both branches
    np.testing.assert_allclose(clipped.pi_loss.item(), -total / len(real), rtol=1e-12)
    clipped.total.backward()
    assert torch.isfinite(clipped.total)
    # the value and entropy terms take no gradient in log pi (V-trace's targets are detached)
    np.testing.assert_allclose(target_logp.grad.numpy(), grad, rtol=1e-10, atol=1e-15)

    # -inf log-probs at masked steps on both sides (padding): same loss, finite gradients, 0 there
    leaf = torch.tensor(logp, requires_grad=True)
    padded = vtrace_actor_critic_loss(
        target_log_probs=torch.where(mask, leaf, minus_inf),
        ratio_clip=epsilon,
        old_log_probs=old,
        **kwargs,
    )
    padded.total.backward()
    np.testing.assert_allclose(padded.total.item(), clipped.total.item(), rtol=1e-12)
    assert torch.isfinite(leaf.grad).all() and torch.all(leaf.grad[~mask] == 0)

    at_old = torch.tensor(logp, requires_grad=True)  # pi_old = pi: r = 1 everywhere
    plain_logp = torch.tensor(logp, requires_grad=True)
    vtrace_actor_critic_loss(
        target_log_probs=at_old, ratio_clip=epsilon, old_log_probs=at_old.detach(), **kwargs
    ).total.backward()
    vtrace_actor_critic_loss(target_log_probs=plain_logp, **kwargs).total.backward()
    np.testing.assert_allclose(at_old.grad.numpy(), plain_logp.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("lambda_", [1.0, 0.9])
def test_targets_for_the_old_policy_around_the_behaviour_policy_is_ppo_with_gae(lambda_):
    """``targets_for="old"`` with ``pi_old = mu`` (APPO's form around the behaviour policy): every
    importance weight is 1, so no trace is cut: the advantages are GAE(lambda),
    ``sum_k (gamma lambda)^k delta_{t+k}``, and the value targets ``V(x_t)`` plus them (at
    lambda 1 the discounted returns bootstrapped from V(x_T)), whatever pi is; the policy term
    is PPO's clipped surrogate on them with ``r = pi/mu``. By hand, one step at a time, with the
    gradient in log pi; the current-policy form gives other advantages on the same input."""
    rng = np.random.default_rng(3)
    shape = (6, 3)
    logp = np.log(rng.uniform(0.1, 0.9, shape))
    behaviour = logp + rng.normal(0.0, 0.3, shape)  # r = pi/mu from about 0.5 to 2
    values = rng.normal(size=shape)
    rewards = rng.normal(size=shape)
    bootstrap = rng.normal(size=shape[1])
    epsilon, vf_coeff, ent_coeff = 0.2, 0.5, 0.01
    entropy = rng.uniform(0.1, 0.7, shape)
    kwargs = dict(
        behaviour_log_probs=torch.as_tensor(behaviour),
        entropy=torch.as_tensor(entropy),
        values=torch.as_tensor(values),
        rewards=torch.as_tensor(rewards),
        discounts=torch.full(shape, GAMMA, dtype=torch.float64),
        bootstrap_value=torch.as_tensor(bootstrap),
        mask=torch.ones(shape, dtype=torch.bool),
        vf_loss_coeff=vf_coeff,
        entropy_coeff=ent_coeff,
        lambda_=lambda_,
        ratio_clip=epsilon,
    )
    target_logp = torch.tensor(logp, requires_grad=True)
    old = torch.tensor(behaviour, requires_grad=True)  # the loss must not send it a gradient
    loss = vtrace_actor_critic_loss(
        target_log_probs=target_logp, old_log_probs=old, targets_for="old", **kwargs
    )

    num_steps, num_rows = shape
    n = num_steps * num_rows
    pi_total, vf_total, grad, num_clipped = 0.0, 0.0, np.zeros(shape), 0
    for b in range(num_rows):
        next_values = [*(float(v) for v in values[1:, b]), float(bootstrap[b])]
        deltas = [
            float(rewards[t, b]) + GAMMA * next_values[t] - float(values[t, b])
            for t in range(num_steps)
        ]
        for t in range(num_steps):
            a = sum((GAMMA * lambda_) ** k * deltas[t + k] for k in range(num_steps - t))
            r = float(np.exp(logp[t, b] - behaviour[t, b]))
            unclipped, bounded = r * a, min(max(r, 1 - epsilon), 1 + epsilon) * a
            pi_total += min(unclipped, bounded)
            if unclipped <= bounded:
                grad[t, b] = -r * a / n
            else:
                num_clipped += 1
            vf_total += 0.5 * a**2  # (V - v_s)^2 with v_s = V + A
    assert 0 < num_clipped < n  # both branches of the min
    np.testing.assert_allclose(loss.pi_loss.item(), -pi_total / n, rtol=1e-12)
    np.testing.assert_allclose(loss.vf_loss.item(), vf_total / n, rtol=1e-12)
    expected_total = -pi_total / n + vf_coeff * vf_total / n - ent_coeff * entropy.mean()
    np.testing.assert_allclose(loss.total.item(), expected_total, rtol=1e-12)
    loss.total.backward()
    np.testing.assert_allclose(target_logp.grad.numpy(), grad, rtol=1e-10, atol=1e-15)
    assert old.grad is None

    current = vtrace_actor_critic_loss(
        target_log_probs=torch.as_tensor(logp), old_log_probs=old.detach(), **kwargs
    )
    assert abs(current.pi_loss.item() - loss.pi_loss.item()) > 1e-3
    assert abs(current.vf_loss.item() - loss.vf_loss.item()) > 1e-3


def test_targets_for_the_old_policy_are_vtraces_targets_for_pi_old():
    """With any ``pi_old``, the advantages and value targets are V-trace's for ``pi_old`` (the
    reference-tested ``vtrace_from_log_probs``), masked steps included: there the old and the
    behaviour log-probs are -inf (padding), and the loss and its gradients stay finite, 0 at
    the masked steps; ``pi_old`` takes no gradient."""
    rng = np.random.default_rng(4)
    shape = (7, 4)
    mask = torch.as_tensor(rng.random(shape) < 0.7)
    mask[0, 0] = True
    minus_inf = torch.tensor(-np.inf, dtype=torch.float64)
    logp = torch.tensor(np.log(rng.uniform(0.1, 0.9, shape)), requires_grad=True)
    finite_old = torch.as_tensor(np.log(rng.uniform(0.1, 0.9, shape)))
    old = torch.where(mask, finite_old, minus_inf).requires_grad_()
    finite_behaviour = torch.as_tensor(np.log(rng.uniform(0.1, 0.9, shape)))
    inputs = dict(
        discounts=torch.full(shape, GAMMA, dtype=torch.float64),
        rewards=torch.as_tensor(rng.normal(size=shape)),
        values=torch.as_tensor(rng.normal(size=shape)),
        bootstrap_value=torch.as_tensor(rng.normal(size=shape[1])),
        mask=mask,
    )
    loss = vtrace_actor_critic_loss(
        target_log_probs=logp,
        behaviour_log_probs=torch.where(mask, finite_behaviour, minus_inf),
        entropy=torch.zeros(shape, dtype=torch.float64),
        vf_loss_coeff=1.0,
        entropy_coeff=0.0,
        ratio_clip=0.3,
        old_log_probs=old,
        targets_for="old",
        **inputs,
    )
    targets = vtrace_from_log_probs(
        target_log_probs=finite_old, behaviour_log_probs=finite_behaviour, **inputs
    )
    real = mask.numpy()
    ratio = np.exp(logp.detach().numpy() - finite_old.numpy())[real]
    advantages = targets.pg_advantages.numpy()[real]
    surrogate = np.minimum(ratio * advantages, np.clip(ratio, 0.7, 1.3) * advantages)
    np.testing.assert_allclose(loss.pi_loss.item(), -surrogate.mean(), rtol=1e-12)
    vf = 0.5 * ((inputs["values"].numpy() - targets.vs.numpy()) ** 2)[real].mean()
    np.testing.assert_allclose(loss.vf_loss.item(), vf, rtol=1e-12)
    loss.total.backward()
    assert torch.isfinite(loss.total)
    assert torch.isfinite(logp.grad).all() and torch.all(logp.grad[~mask] == 0)
    assert logp.grad[mask].abs().sum() > 0
    assert old.grad is None


def all_ones_inputs() -> tuple[torch.Tensor, dict]:
    """A ``[3, 2]`` tensor of ones and the loss's inputs made of it (all but ``mask``), for the
    tests of what the loss refuses."""
    ones = torch.ones(3, 2)
    kwargs = dict(
        target_log_probs=ones,
        behaviour_log_probs=ones,
        entropy=ones,
        values=ones,
        bootstrap_value=torch.ones(2),
        rewards=ones,
        discounts=ones,
        vf_loss_coeff=0.5,
        entropy_coeff=0.0,
    )
    return ones, kwargs


def test_clipped_surrogate_needs_its_old_log_probs_and_a_positive_clip():
    ones, inputs = all_ones_inputs()
    kwargs = {**inputs, "mask": torch.ones(3, 2)}
    with pytest.raises(ValueError, match="old_log_probs missing"):
        vtrace_actor_critic_loss(ratio_clip=0.2, **kwargs)
    with pytest.raises(ValueError, match="ratio_clip=None"):
        vtrace_actor_critic_loss(old_log_probs=ones, **kwargs)
    with pytest.raises(ValueError, match=r"ratio_clip must be None or > 0, got 0\.0"):
        vtrace_actor_critic_loss(ratio_clip=0.0, old_log_probs=ones, **kwargs)
    with pytest.raises(ValueError, match="ratio_clip must be None or > 0, got True"):
        vtrace_actor_critic_loss(ratio_clip=True, old_log_probs=ones, **kwargs)
    with pytest.raises(ValueError, match="old_log_probs has shape"):
        vtrace_actor_critic_loss(ratio_clip=0.2, old_log_probs=torch.ones(3), **kwargs)
    with pytest.raises(ValueError, match="targets_for must be 'current' or 'old', got 'new'"):
        vtrace_actor_critic_loss(ratio_clip=0.2, old_log_probs=ones, targets_for="new", **kwargs)
    with pytest.raises(ValueError, match="needs the clipped surrogate: set ratio_clip"):
        vtrace_actor_critic_loss(targets_for="old", **kwargs)


def test_loss_rejects_an_all_masked_batch_and_mismatched_shapes():
    _, kwargs = all_ones_inputs()
    with pytest.raises(ValueError, match="no real step"):
        vtrace_actor_critic_loss(mask=torch.zeros(3, 2), **kwargs)
    with pytest.raises(ValueError, match="entropy has shape"):
        vtrace_actor_critic_loss(mask=torch.ones(3, 2), **{**kwargs, "entropy": torch.ones(3)})
