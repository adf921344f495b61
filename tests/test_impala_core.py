"""The core IMPALA actor step and the learner's time-major batch (no Ray, no framework)."""

from __future__ import annotations

import numpy as np
import pytest

from rl_dist_ext.impala import TRAJECTORY_COLUMNS, TrajectoryActorStep, time_major_batch
from rl_dist_ext.params import ParameterServer


def columns(num_steps: int = 4, num_envs: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (num_steps, num_envs)
    truncated = np.zeros(shape, bool)
    truncated[1, 0] = True
    return {
        "obs": rng.normal(size=(*shape, 3)).astype(np.float32),
        "actions": rng.integers(2, size=shape),
        "rewards": rng.normal(size=shape).astype(np.float32),
        "next_obs": rng.normal(size=(*shape, 3)).astype(np.float32),
        "terminated": np.zeros(shape, bool),
        "truncated": truncated,
        "behaviour_logp": np.full(shape, -0.7, np.float32),
    }


def test_actor_step_pulls_every_k_env_steps_and_labels_trajectories_with_the_acting_version():
    server = ParameterServer()
    loaded = []
    step = TrajectoryActorStep(weights=server, pull_every_n_steps=16, name="actor 3")
    server.publish({"w": 0}, 0)
    assert step.pull_weights(loaded.append) and step.weights_version == 0
    server.publish({"w": 1}, 1)
    first = step.run(act=columns, load_weights=loaded.append)  # 8 steps: no pull due yet
    assert first.acting_version == 0 and loaded == [{"w": 0}]
    second = step.run(act=columns, load_weights=loaded.append)  # 16 steps counted: still v0
    assert second.acting_version == 0
    third = step.run(act=columns, load_weights=loaded.append)  # pulled before acting
    assert third.acting_version == 1 and loaded[-1] == {"w": 1}
    assert step.env_steps == 24
    assert set(third.columns) == set(TRAJECTORY_COLUMNS)


def test_a_seed_actor_never_pulls_and_reports_the_servers_versions():
    step = TrajectoryActorStep(weights=None, pull_every_n_steps=1)
    out = step.run(act=columns, load_weights=lambda w: None, acting_version=lambda: 6.5)
    assert out.acting_version == 6.5 and step.weights_version == -1


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda c: c.pop("behaviour_logp"), "lacks columns"),
        (lambda c: c.update(rewards=np.zeros(4)), "rewards must be"),
        (lambda c: c.update(actions=np.zeros((3, 2))), "actions has shape"),
        (lambda c: c["obs"].__setitem__((0, 0, 0), np.nan), "non-finite"),
    ],
)
def test_bad_trajectories_raise_naming_the_actor(change, match):
    def act():
        c = columns()
        change(c)
        return c

    step = TrajectoryActorStep(weights=None, name="actor 7")
    with pytest.raises(ValueError, match=f"actor 7.*{match}|{match}"):
        step.run(act=act, load_weights=lambda w: None)
    assert step.env_steps == 0


def test_time_major_batch_places_final_observations_at_masked_steps():
    from rl_dist_ext.impala import Trajectory

    a, b = Trajectory(columns(seed=1), 0.0), Trajectory(columns(seed=2), 1.0)
    batch = time_major_batch([a, b])
    assert batch.mask.shape == (6, 4)  # T=4 + a truncation in env 0 + the final step
    # Env 0 of trajectory a: steps 0, 1, final(1), 2, 3, final(3).
    np.testing.assert_array_equal(batch.mask[:, 0], [1, 1, 0, 1, 1, 0])
    np.testing.assert_array_equal(batch.obs[2, 0], a.columns["next_obs"][1, 0])
    np.testing.assert_array_equal(batch.obs[3, 0], a.columns["obs"][2, 0])
    np.testing.assert_array_equal(batch.obs[5, 0], a.columns["next_obs"][3, 0])
    # Env 1 of trajectory b (column 3): steps 0-3, final(3), padding (final(3) again).
    np.testing.assert_array_equal(batch.mask[:, 3], [1, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(batch.obs[5, 3], b.columns["next_obs"][3, 1])
    np.testing.assert_array_equal(batch.actions[:4, 3], b.columns["actions"][:, 1])

    with pytest.raises(ValueError, match="at least one"):
        time_major_batch([])
    with pytest.raises(ValueError, match="one length"):
        time_major_batch([a, Trajectory(columns(num_steps=5), 0.0)])
