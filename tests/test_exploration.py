"""Tests for rl_dist_ext.exploration: the Ape-X per-actor epsilon ladder."""

from __future__ import annotations

import numpy as np
import pytest

from rl_dist_ext.exploration import apex_epsilons


def _naive(num_actors, base, alpha):
    if num_actors == 1:
        return [base]
    return [base ** (1 + i / (num_actors - 1) * alpha) for i in range(num_actors)]


def test_single_actor_uses_base():
    out = apex_epsilons(1)
    assert isinstance(out, np.ndarray)
    assert out.dtype == np.float64
    assert out.shape == (1,)
    assert out.tolist() == [0.4]


def test_two_actors_golden():
    out = apex_epsilons(2)
    assert out.shape == (2,)
    np.testing.assert_allclose(out, [0.4, 0.4**8], rtol=1e-15)


def test_eight_actors_formula():
    out = apex_epsilons(8)
    assert out.shape == (8,)
    assert out.dtype == np.float64
    for i in range(8):
        assert out[i] == pytest.approx(0.4 ** (1 + i / 7 * 7), rel=1e-13)
        assert out[i] == pytest.approx(0.4 ** (1 + i), rel=1e-13)
    assert out[0] == 0.4
    assert out[-1] == pytest.approx(0.4**8, rel=1e-13)


@pytest.mark.parametrize("num_actors", [1, 2, 3, 5, 16, 100])
@pytest.mark.parametrize(("base", "alpha"), [(0.4, 7.0), (0.5, 3.0), (0.9, 0.5), (0.1, 2.0)])
def test_matches_naive_loop(num_actors, base, alpha):
    out = apex_epsilons(num_actors, base=base, alpha=alpha)
    assert out.shape == (num_actors,)
    np.testing.assert_allclose(out, _naive(num_actors, base, alpha), rtol=1e-12)
    assert out[0] == pytest.approx(base, rel=1e-15)
    if num_actors > 1:
        assert out[-1] == pytest.approx(base ** (1 + alpha), rel=1e-12)


def test_custom_base_alpha_positional():
    np.testing.assert_allclose(apex_epsilons(3, 0.5, 2.0), [0.5, 0.25, 0.125], rtol=1e-15)


def test_alpha_zero_is_constant():
    np.testing.assert_array_equal(apex_epsilons(6, base=0.3, alpha=0.0), np.full(6, 0.3))


@pytest.mark.parametrize("base", [0.0, 1.0])
def test_boundary_bases(base):
    np.testing.assert_array_equal(apex_epsilons(4, base=base), np.full(4, base))


@pytest.mark.parametrize("num_actors", [2, 3, 8, 64])
@pytest.mark.parametrize(("base", "alpha"), [(0.4, 7.0), (0.5, 1.0), (0.99, 0.1)])
def test_monotone_decreasing(num_actors, base, alpha):
    out = apex_epsilons(num_actors, base=base, alpha=alpha)
    assert np.all(np.diff(out) < 0)
    assert np.all((out > 0) & (out <= 1))


def test_accepts_numpy_integer():
    np.testing.assert_allclose(apex_epsilons(np.int64(8)), apex_epsilons(8), rtol=0)


@pytest.mark.parametrize("num_actors", [0, -1, 2.5, True, False, "3", None, 3.0])
def test_bad_num_actors(num_actors):
    with pytest.raises(ValueError, match="num_actors"):
        apex_epsilons(num_actors)


@pytest.mark.parametrize("base", [-0.1, 1.1, float("nan")])
def test_bad_base(base):
    with pytest.raises(ValueError, match="base"):
        apex_epsilons(4, base=base)


@pytest.mark.parametrize("alpha", [-1.0, -1e-9, float("nan")])
def test_bad_alpha(alpha):
    with pytest.raises(ValueError, match="alpha"):
        apex_epsilons(4, alpha=alpha)
