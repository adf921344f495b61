"""Tests for rl_dist_ext.ops.nstep: actor-side n-step folding (Ape-X)."""

from __future__ import annotations

import numpy as np
import pytest

from rl_dist_ext.ops.nstep import NStepTransitions, flatten_time_batch, fold_nstep


def _rollout(rewards, terminated, truncated, obs_dims=(2,)):
    """A rollout whose obs/next_obs encode (t, b) so gathers can be checked exactly."""
    rewards = np.asarray(rewards)
    T, B = rewards.shape
    t_idx = np.arange(T)[:, None, None]
    b_idx = np.arange(B)[None, :, None]
    width = int(np.prod(obs_dims))
    feat = np.arange(width)[None, None, :]
    obs = (1000 * t_idx + 10 * b_idx + feat).astype(np.float32).reshape(T, B, *obs_dims)
    next_obs = obs + 0.5  # next_obs[t, b] is distinct from obs and from every other (t, b)
    return dict(
        obs=obs,
        actions=np.arange(T * B).reshape(T, B),
        rewards=rewards,
        next_obs=next_obs,
        terminated=np.asarray(terminated, dtype=bool),
        truncated=np.asarray(truncated, dtype=bool),
    )


def naive_fold(*, obs, actions, rewards, next_obs, terminated, truncated, gamma, n):
    """Reference implementation with explicit Python loops over t, b and k."""
    T, B = rewards.shape
    rew = np.zeros((T, B), dtype=np.float64)
    disc = np.zeros((T, B), dtype=np.float64)
    hor = np.zeros((T, B), dtype=np.int64)
    nxt = np.zeros_like(next_obs)
    for t in range(T):
        for b in range(B):
            total, m, term = 0.0, 0, False
            for k in range(n):
                s = t + k
                if s >= T:
                    break
                total += gamma**k * float(rewards[s, b])
                m += 1
                if terminated[s, b]:
                    term = True
                    break
                if truncated[s, b]:
                    break
            rew[t, b] = total
            hor[t, b] = m
            disc[t, b] = 0.0 if term else gamma**m
            nxt[t, b] = next_obs[t + m - 1, b]
    return rew, disc, nxt, hor


# --------------------------------------------------------------------------------------------
# Hand-computed example
# --------------------------------------------------------------------------------------------


def test_hand_computed_example():
    # T=6, B=2, gamma=0.5, n=3.
    # env 0: terminated at t=2 (new episode from t=3 on, no further boundary).
    # env 1: truncated at t=3 (new episode from t=4 on, no further boundary).
    r = np.array(
        [
            [1.0, -1.0],
            [2.0, 0.0],
            [3.0, 2.0],
            [4.0, 1.0],
            [5.0, 3.0],
            [8.0, -2.0],
        ],
        dtype=np.float32,
    )
    terminated = np.zeros((6, 2), dtype=bool)
    truncated = np.zeros((6, 2), dtype=bool)
    terminated[2, 0] = True
    truncated[3, 1] = True
    ro = _rollout(r, terminated, truncated)
    out = fold_nstep(**ro, gamma=0.5, n=3)

    # env 0 (r = 1, 2, 3 | 4, 5, 8; terminal at t=2):
    #   t=0: steps 0..2 (hits terminal), 1 + .5*2 + .25*3 = 2.75, m=3, disc 0,     next t=2
    #   t=1: steps 1..2 (terminal),      2 + .5*3         = 3.5,  m=2, disc 0,     next t=2
    #   t=2: step  2    (terminal),      3                = 3.0,  m=1, disc 0,     next t=2
    #   t=3: steps 3..5 (n and rollout end), 4 + .5*5 + .25*8 = 8.5, m=3, disc .125, next t=5
    #   t=4: steps 4..5 (rollout end),   5 + .5*8         = 9.0,  m=2, disc .25,   next t=5
    #   t=5: step  5    (rollout end),   8                = 8.0,  m=1, disc .5,    next t=5
    # env 1 (r = -1, 0, 2, 1 | 3, -2; truncated at t=3):
    #   t=0: steps 0..2 (n),             -1 + .5*0 + .25*2 = -0.5, m=3, disc .125, next t=2
    #   t=1: steps 1..3 (n and trunc),   0 + .5*2 + .25*1  = 1.25, m=3, disc .125, next t=3
    #   t=2: steps 2..3 (trunc),         2 + .5*1          = 2.5,  m=2, disc .25,  next t=3
    #   t=3: step  3    (trunc),         1                 = 1.0,  m=1, disc .5,   next t=3
    #   t=4: steps 4..5 (rollout end),   3 + .5*(-2)       = 2.0,  m=2, disc .25,  next t=5
    #   t=5: step  5    (rollout end),   -2                = -2.0, m=1, disc .5,   next t=5
    expected_rewards = np.array(
        [[2.75, -0.5], [3.5, 1.25], [3.0, 2.5], [8.5, 1.0], [9.0, 2.0], [8.0, -2.0]]
    )
    expected_discounts = np.array(
        [[0.0, 0.125], [0.0, 0.125], [0.0, 0.25], [0.125, 0.5], [0.25, 0.25], [0.5, 0.5]]
    )
    expected_next_t = np.array([[2, 2], [2, 3], [2, 3], [5, 3], [5, 5], [5, 5]])
    expected_horizons = np.array([[3, 3], [2, 3], [1, 2], [3, 1], [2, 2], [1, 1]])

    assert isinstance(out, NStepTransitions)
    np.testing.assert_allclose(out.rewards, expected_rewards, rtol=0, atol=1e-6)
    np.testing.assert_allclose(out.discounts, expected_discounts, rtol=0, atol=1e-7)
    np.testing.assert_array_equal(out.horizons, expected_horizons)
    np.testing.assert_array_equal(
        out.next_obs, ro["next_obs"][expected_next_t, np.arange(2)[None, :]]
    )
    assert out.next_obs.shape == (6, 2, 2)
    # obs / actions pass through unchanged
    np.testing.assert_array_equal(out.obs, ro["obs"])
    np.testing.assert_array_equal(out.actions, ro["actions"])
    assert out.rewards.dtype == np.float32
    assert out.discounts.dtype == np.float32


def test_n1_is_identity_fold():
    rng = np.random.default_rng(1)
    T, B, gamma = 9, 4, 0.9
    r = rng.normal(size=(T, B))
    term = rng.random((T, B)) < 0.3
    trunc = rng.random((T, B)) < 0.3
    ro = _rollout(r, term, trunc, obs_dims=(3,))
    out = fold_nstep(**ro, gamma=gamma, n=1)
    np.testing.assert_array_equal(out.rewards, r)
    np.testing.assert_allclose(out.discounts, gamma * (1.0 - term))
    np.testing.assert_array_equal(out.next_obs, ro["next_obs"])
    np.testing.assert_array_equal(out.horizons, np.ones((T, B)))


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("gamma", [0.0, 0.9, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_naive_reference(n, gamma, seed):
    rng = np.random.default_rng(seed * 100 + n)
    T = int(rng.integers(1, 13))
    B = int(rng.integers(1, 5))
    r = rng.normal(size=(T, B)).astype(np.float32)
    term = rng.random((T, B)) < 0.15
    trunc = rng.random((T, B)) < 0.15  # may coincide with term: termination wins
    ro = _rollout(r, term, trunc, obs_dims=(4,))
    out = fold_nstep(**ro, gamma=gamma, n=n)
    rew, disc, nxt, hor = naive_fold(**ro, gamma=gamma, n=n)
    np.testing.assert_allclose(out.rewards, rew, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.discounts, disc, rtol=1e-6, atol=0)
    np.testing.assert_array_equal(out.next_obs, nxt)
    np.testing.assert_array_equal(out.horizons, hor)
    assert out.rewards.shape == out.discounts.shape == out.horizons.shape == (T, B)
    assert out.next_obs.shape == (T, B, 4)
    assert (out.horizons >= 1).all() and (out.horizons <= n).all()


def test_matches_naive_reference_image_obs_float64():
    rng = np.random.default_rng(7)
    T, B = 11, 3
    r = rng.normal(size=(T, B))  # float64 stays float64
    term = rng.random((T, B)) < 0.2
    trunc = rng.random((T, B)) < 0.2
    ro = _rollout(r, term, trunc, obs_dims=(2, 3))
    out = fold_nstep(**ro, gamma=0.97, n=4)
    rew, disc, nxt, hor = naive_fold(**ro, gamma=0.97, n=4)
    assert out.rewards.dtype == np.float64 and out.discounts.dtype == np.float64
    np.testing.assert_allclose(out.rewards, rew, rtol=1e-12)
    np.testing.assert_allclose(out.discounts, disc, rtol=1e-12)
    np.testing.assert_array_equal(out.next_obs, nxt)
    np.testing.assert_array_equal(out.horizons, hor)
    assert out.next_obs.shape == (T, B, 2, 3)


def test_terminated_vs_truncated():
    gamma, n = 0.9, 3
    r = np.array([[1.0], [2.0], [3.0], [4.0]])
    flags = np.zeros((4, 1), dtype=bool)
    flags[1, 0] = True
    no = np.zeros_like(flags)
    term_out = fold_nstep(**_rollout(r, flags, no), gamma=gamma, n=n)
    trunc_out = fold_nstep(**_rollout(r, no, flags), gamma=gamma, n=n)
    np.testing.assert_array_equal(term_out.rewards, trunc_out.rewards)
    np.testing.assert_array_equal(term_out.horizons, trunc_out.horizons)
    np.testing.assert_array_equal(term_out.next_obs, trunc_out.next_obs)
    # windows ending at step 1 (t=0 with m=2, t=1 with m=1)
    np.testing.assert_allclose(term_out.discounts[:2, 0], [0.0, 0.0])
    np.testing.assert_allclose(trunc_out.discounts[:2, 0], [gamma**2, gamma])
    # after the boundary both are identical (rollout-end shortening)
    np.testing.assert_allclose(term_out.discounts[2:, 0], [gamma**2, gamma])
    np.testing.assert_allclose(trunc_out.discounts[2:, 0], [gamma**2, gamma])


def test_terminated_and_truncated_same_step_counts_as_terminal():
    r = np.ones((3, 1))
    both = np.array([[False], [True], [False]])
    out = fold_nstep(**_rollout(r, both, both), gamma=0.5, n=3)
    np.testing.assert_allclose(out.discounts[:, 0], [0.0, 0.0, 0.5])


def test_integer_rewards_become_float32():
    r = np.array([[1, 2], [3, 4]], dtype=np.int64)
    out = fold_nstep(**_rollout(r, np.zeros((2, 2)), np.zeros((2, 2))), gamma=0.5, n=2)
    assert out.rewards.dtype == np.float32 and out.discounts.dtype == np.float32
    np.testing.assert_allclose(out.rewards, [[2.5, 4.0], [3.0, 4.0]])


def test_nonfinite_reward_outside_window_is_ignored():
    r = np.array([[1.0], [np.inf]])
    term = np.array([[True], [False]])
    out = fold_nstep(**_rollout(r, term, np.zeros_like(term)), gamma=0.5, n=2)
    assert out.rewards[0, 0] == 1.0


def test_flatten_time_batch_shapes_and_order():
    rng = np.random.default_rng(3)
    T, B = 5, 3
    ro = _rollout(rng.normal(size=(T, B)), rng.random((T, B)) < 0.3, np.zeros((T, B)), (4,))
    out = fold_nstep(**ro, gamma=0.9, n=3)
    flat = flatten_time_batch(out)
    assert set(flat) == {"obs", "action", "reward", "discount", "next_obs"}
    assert flat["obs"].shape == (T * B, 4)
    assert flat["next_obs"].shape == (T * B, 4)
    assert flat["action"].shape == (T * B,)
    assert flat["reward"].shape == (T * B,)
    assert flat["discount"].shape == (T * B,)
    for t in range(T):
        for b in range(B):
            i = t * B + b
            np.testing.assert_array_equal(flat["obs"][i], out.obs[t, b])
            np.testing.assert_array_equal(flat["next_obs"][i], out.next_obs[t, b])
            assert flat["action"][i] == out.actions[t, b]
            assert flat["reward"][i] == out.rewards[t, b]
            assert flat["discount"][i] == out.discounts[t, b]


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _good():
    return _rollout(np.zeros((4, 2)), np.zeros((4, 2)), np.zeros((4, 2)), (3,))


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("rewards", np.zeros(4), r"rewards.*\(4,\).*\[T, B\]"),
        ("rewards", np.zeros(()), r"rewards"),
        ("rewards", np.zeros((4, 2, 1)), r"rewards.*\(4, 2, 1\).*\[T, B\]"),
        ("rewards", np.zeros((0, 2)), r"rewards.*\(0, 2\).*T >= 1"),
        ("obs", np.zeros((4, 3, 3)), r"obs.*\(4, 3, 3\).*\(4, 2\)"),
        ("obs", np.zeros(4), r"obs.*\(4,\).*\(4, 2\)"),
        ("actions", np.zeros((3, 2)), r"actions.*\(3, 2\).*\(4, 2\)"),
        ("next_obs", np.zeros((5, 2, 3)), r"next_obs.*\(5, 2, 3\).*\(4, 2\)"),
        ("terminated", np.zeros((4, 2, 1)), r"terminated.*\(4, 2, 1\).*\(4, 2\)"),
        ("terminated", np.zeros((4,)), r"terminated.*\(4,\).*\(4, 2\)"),
        ("truncated", np.zeros((4, 3)), r"truncated.*\(4, 3\).*\(4, 2\)"),
    ],
)
def test_bad_shapes_raise(field, value, match):
    kw = _good()
    kw[field] = value
    with pytest.raises(ValueError, match=match):
        fold_nstep(**kw, gamma=0.9, n=2)


@pytest.mark.parametrize("gamma", [-0.1, 1.01, float("nan"), True, "0.9", None])
def test_bad_gamma_raises(gamma):
    with pytest.raises(ValueError, match="gamma"):
        fold_nstep(**_good(), gamma=gamma, n=2)


@pytest.mark.parametrize("n", [0, -1, 2.0, True, False, "3", None])
def test_bad_n_raises(n):
    with pytest.raises(ValueError, match=r"\bn\b"):
        fold_nstep(**_good(), gamma=0.9, n=n)


def test_numpy_int_n_and_edge_gammas_ok():
    out = fold_nstep(**_good(), gamma=0, n=np.int64(2))
    np.testing.assert_array_equal(out.discounts, 0.0)
    out = fold_nstep(**_good(), gamma=1, n=10)  # n > T is fine
    np.testing.assert_array_equal(out.horizons[:, 0], [4, 3, 2, 1])
    np.testing.assert_array_equal(out.discounts, 1.0)
