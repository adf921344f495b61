"""ParameterServer (versioned weights) and the actor-side Gorila step, without Ray."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_dist_ext.gorila import TRANSITION_COLUMNS, nstep_batch_with_priorities
from rl_dist_ext.params import ParameterServer


def test_parameter_server_serves_only_newer_weights():
    server = ParameterServer()
    assert server.version() == -1
    assert server.pull_if_newer(-1) is None
    server.publish({"w": 1}, 0)
    latest = server.pull_if_newer(-1)
    assert latest.weights == {"w": 1} and latest.version == 0
    assert server.pull_if_newer(0) is None
    server.publish({"w": 2}, 5)
    assert server.pull_if_newer(0).version == 5
    assert server.pull_if_newer(7) is None  # an actor ahead (after a restore) gets nothing
    stats = server.stats()
    assert stats["version"] == 5 and stats["num_publishes"] == 2
    assert stats["num_pulls"] == 5 and stats["num_pulls_served"] == 2


@pytest.mark.parametrize("version", [-1, 1.5, True, "3"])
def test_parameter_server_rejects_bad_versions(version):
    with pytest.raises(ValueError, match="version"):
        ParameterServer().publish({}, version)


def test_parameter_server_rejects_going_back():
    server = ParameterServer()
    server.publish({}, 3)
    with pytest.raises(ValueError, match="not newer"):
        server.publish({}, 3)


def naive_priorities(rollout, gamma, n, q_table):
    """Per-transition |TD| in plain python: online net selects and evaluates (no target net)."""
    obs, actions, rewards = rollout["obs"], rollout["actions"], rollout["rewards"]
    next_obs, term, trunc = rollout["next_obs"], rollout["terminated"], rollout["truncated"]
    steps, envs = rewards.shape
    out = []
    for t in range(steps):
        for b in range(envs):
            ret, discount, k = 0.0, 1.0, t
            while True:
                ret += discount * rewards[k, b]
                discount *= gamma
                if term[k, b]:
                    discount = 0.0
                    break
                if trunc[k, b] or k - t + 1 == n or k == steps - 1:
                    break
                k += 1
            q_next = q_table(next_obs[k, b]).max()
            target = ret + discount * q_next
            out.append(abs(target - q_table(obs[t, b])[actions[t, b]]))
    return np.array(out)


def test_nstep_batch_with_priorities_matches_a_naive_loop():
    rng = np.random.default_rng(0)
    steps, envs = 7, 3
    weights = torch.as_tensor(rng.standard_normal((4, 2)), dtype=torch.float32)

    def q_values(obs: torch.Tensor) -> torch.Tensor:
        return obs @ weights

    rollout = {
        "obs": rng.standard_normal((steps, envs, 4)).astype(np.float32),
        "actions": rng.integers(0, 2, (steps, envs)),
        "rewards": rng.standard_normal((steps, envs)).astype(np.float32),
        "next_obs": rng.standard_normal((steps, envs, 4)).astype(np.float32),
        "terminated": rng.random((steps, envs)) < 0.15,
        "truncated": rng.random((steps, envs)) < 0.1,
    }
    batch = nstep_batch_with_priorities(**rollout, gamma=0.9, n_step=3, q_values=q_values)
    assert set(batch.transitions) == set(TRANSITION_COLUMNS)
    assert batch.transitions["obs"].shape == (steps * envs, 4)
    assert batch.priorities.dtype == np.float64 and batch.priorities.shape == (steps * envs,)

    def q_table(o):
        return (torch.as_tensor(o) @ weights).numpy()

    expected = naive_priorities(rollout, 0.9, 3, q_table)
    np.testing.assert_allclose(batch.priorities, expected, rtol=1e-4, atol=1e-5)
