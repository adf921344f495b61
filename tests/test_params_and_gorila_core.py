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


# ---- one version unit, one policy lag ------------------------------------------------------------
def test_weights_version_counts_gradient_updates_and_moves_past_on_load():
    from rl_dist_ext.params import WeightsVersion

    clock = WeightsVersion()
    assert (clock.num_gradient_updates, clock.version) == (0, 0)
    for _ in range(5):
        clock.advance()
    saved = clock.state_dict()
    assert saved == {"num_gradient_updates": 5, "version": 5}
    for _ in range(3):
        clock.advance()
    clock.load_state_dict(saved)  # older weights back: a version newer than any published
    assert (clock.num_gradient_updates, clock.version) == (5, 9)
    fresh = WeightsVersion()
    fresh.load_state_dict(saved)
    assert (fresh.num_gradient_updates, fresh.version) == (5, 6)
    with pytest.raises(ValueError, match="version"):
        fresh.load_state_dict({"num_gradient_updates": 1, "version": -2})


def test_policy_lag_is_learner_minus_acting_version_without_unknown_ones():
    import math

    from rl_dist_ext.params import policy_lag

    lag = policy_lag(10, [10, 7, 4.5, -1])
    assert lag.mean == pytest.approx((0 + 3 + 5.5) / 3) and lag.max == 5.5
    assert all(math.isnan(x) for x in policy_lag(3, [-1]))


# ---- the actor step ----------------------------------------------------------------------------
class RecordingReplay:
    def __init__(self):
        self.added = []
        self.priority_updates = []
        self.samples = 0

    def add(self, transitions, priorities=None):
        self.added.append((transitions, priorities))

    def sample(self, batch_size, *, beta):
        from rl_dist_ext.replay.prioritized import ReplaySample

        self.samples += 1
        keys = np.arange(batch_size) + 100 * self.samples
        return ReplaySample({"x": np.zeros(batch_size)}, keys, np.ones(batch_size, np.float32))

    def update_priorities(self, keys, priorities):
        self.priority_updates.append((keys, priorities))


def small_rollout(steps=4, envs=2, nan_at=None):
    rng = np.random.default_rng(0)
    columns = {
        "obs": rng.normal(size=(steps, envs, 3)).astype(np.float32),
        "actions": rng.integers(0, 2, size=(steps, envs)),
        "rewards": rng.normal(size=(steps, envs)).astype(np.float32),
        "next_obs": rng.normal(size=(steps, envs, 3)).astype(np.float32),
        "terminated": np.zeros((steps, envs), bool),
        "truncated": np.zeros((steps, envs), bool),
    }
    if nan_at is not None:
        columns[nan_at][1, 0] = np.nan
    return columns


def test_actor_step_pulls_every_k_steps_and_pushes_folded_prioritized_rows():
    from rl_dist_ext.gorila import ActorStep, Rollout

    server = ParameterServer()
    server.publish({"w": 0}, 0)
    replay = RecordingReplay()
    loaded = []
    net = torch.nn.Linear(3, 2)
    step = ActorStep(replay=replay, gamma=0.9, n_step=2, weights=server, pull_every_n_steps=16)
    assert step.pull_weights(loaded.append) and step.weights_version == 0
    for call in range(4):  # 8 env steps per call: 16 have passed before call 2 only
        server.publish({"w": call + 1}, call + 1)
        result = step.run(
            act=lambda: Rollout(small_rollout()), q_values=net, load_weights=loaded.append
        )
        assert result.env_steps == 8
    assert [w["w"] for w in loaded] == [0, 3]
    assert step.weights_version == 3 and step.env_steps == 32
    transitions, priorities = replay.added[0]
    assert set(transitions) == set(TRANSITION_COLUMNS) and priorities.shape == (8,)
    assert (priorities >= 0).all()


def test_actor_step_without_prioritization_pushes_no_priorities_and_seed_reports_server_version():
    from rl_dist_ext.gorila import ActorStep, Rollout

    replay = RecordingReplay()
    step = ActorStep(replay=replay, gamma=0.9, n_step=1, prioritized=False, weights=None)
    result = step.run(
        act=lambda: Rollout(small_rollout(), acting_version=6.5),
        q_values=torch.nn.Linear(3, 2),
        load_weights=lambda w: pytest.fail("a SEED actor never loads weights"),
    )
    assert replay.added[0][1] is None
    assert result.weights_version == 6.5


@pytest.mark.parametrize("column", ["obs", "rewards", "next_obs"])
def test_actor_step_rejects_non_finite_rollouts_and_pushes_nothing(column):
    from rl_dist_ext.gorila import ActorStep, Rollout

    replay = RecordingReplay()
    step = ActorStep(replay=replay, gamma=0.9, n_step=1, name="actor 3")
    with pytest.raises(ValueError, match=r"actor 3: .*non-finite"):
        step.run(
            act=lambda: Rollout(small_rollout(nan_at=column)),
            q_values=torch.nn.Linear(3, 2),
            load_weights=lambda w: None,
        )
    assert replay.added == []


# ---- the learner step --------------------------------------------------------------------------
def make_learner(replay, **overrides):
    from rl_dist_ext.gorila import GorilaLearner

    events = []
    settings = dict(
        replay=replay,
        batch_size=4,
        prioritized=True,
        target_update_every=3,
        publish_every=2,
        sync_target=lambda: events.append("target"),
        export_weights=lambda: {"w": len(events)},
    )
    settings.update(overrides)
    return GorilaLearner(**settings), events


def test_learner_step_sends_priorities_syncs_target_every_c_and_publishes_every_p():
    replay = RecordingReplay()
    learner, events = make_learner(replay)
    server = ParameterServer()
    assert learner.connect(weights=server) == 0 and server.version() == 0

    def gradient_step(sample):
        events.append(f"update {learner.num_gradient_updates + 1}")
        learner.after_gradient_step()
        return -torch.arange(len(sample.keys), dtype=torch.float32)

    stats = learner.update(6, beta=0.5, gradient_step=gradient_step)
    assert stats.num_updates == 6 and 0 <= stats.sample_wait_s <= stats.seconds
    assert events == [
        "update 1", "update 2", "update 3", "target",
        "update 4", "update 5", "update 6", "target",
    ]  # fmt: skip
    assert [int(k[0]) for k, _ in replay.priority_updates] == [100, 200, 300, 400, 500, 600]
    np.testing.assert_array_equal(replay.priority_updates[0][1], [0, 1, 2, 3])  # |TD|
    assert server.version() == 6 and server.stats()["num_publishes"] == 4  # 0, 2, 4, 6
    assert learner.publish() == 6 and server.stats()["num_publishes"] == 4  # nothing new


def test_fused_updates_sync_the_target_inside_a_call_and_send_priorities_per_batch():
    """k = 4 updates per framework call, C = 3, P = 2: the target syncs after update 3 (inside
    the first call) and 6; each of the 10 batches gets its own priorities; a call that reached
    a multiple of P publishes once after it; the last call takes the 2 updates left."""
    replay = RecordingReplay()
    learner, events = make_learner(replay)
    server = ParameterServer()
    learner.connect(weights=server)
    calls = []

    def gradient_steps(batches):
        calls.append(len(batches))
        errors = []
        for samples in batches:
            events.append(f"update {learner.num_gradient_updates + 1}")
            learner.after_gradient_step()
            errors.append(
                {m: -torch.full((4,), learner.num_gradient_updates * 1.0) for m in samples}
            )
        return errors

    stats = learner.update_fused(10, beta=0.5, updates_per_call=4, gradient_steps=gradient_steps)
    assert stats.num_updates == 10 and calls == [4, 4, 2]
    assert events == [
        "update 1", "update 2", "update 3", "target", "update 4",
        "update 5", "update 6", "target", "update 7", "update 8",
        "update 9", "target", "update 10",
    ]  # fmt: skip
    assert [int(k[0]) for k, _ in replay.priority_updates] == [100 * i for i in range(1, 11)]
    for update, (_, priorities) in enumerate(replay.priority_updates, start=1):
        np.testing.assert_array_equal(priorities, [update] * 4)  # |TD| of its own update
    assert server.version() == 10 and server.stats()["num_publishes"] == 4  # 0, 4, 8, 10
    with pytest.raises(ValueError, match="updates_per_call"):
        learner.update_fused(1, beta=0.5, updates_per_call=0, gradient_steps=gradient_steps)


def test_fused_updates_refuse_a_call_that_applies_fewer_updates_than_batches():
    learner, _ = make_learner(RecordingReplay())

    def one_update(batches):
        learner.after_gradient_step()
        return [{m: torch.zeros(4) for m in samples} for samples in batches]

    with pytest.raises(RuntimeError, match=r"given 3 batches: it must apply 3 updates.*applied 1"):
        learner.update_fused(3, beta=0.4, updates_per_call=3, gradient_steps=one_update)


def test_learner_step_refuses_a_gradient_step_that_does_not_count_itself():
    learner, _ = make_learner(RecordingReplay())
    with pytest.raises(RuntimeError, match="after_gradient_step"):
        learner.update(1, beta=0.4, gradient_step=lambda sample: torch.zeros(4))


def test_uniform_learner_sends_no_priorities_and_pickles_without_connections():
    import pickle

    replay = RecordingReplay()
    learner, _ = make_learner(replay, prioritized=False, sync_target=print, export_weights=dict)
    learner.connect(weights=ParameterServer())

    def gradient_step(sample):
        learner.after_gradient_step()
        return torch.ones(4)

    learner.update(2, beta=0.0, gradient_step=gradient_step)
    assert replay.priority_updates == []
    clone = pickle.loads(pickle.dumps(learner))
    assert clone.replay is None and clone.num_gradient_updates == 2
    assert clone.state_dict() == learner.state_dict()


def test_weights_version_bumps_and_reads_the_version_key_of_older_checkpoints():
    from rl_dist_ext.params import WeightsVersion

    clock = WeightsVersion()
    clock.advance()
    assert clock.bump() == 2 and clock.num_gradient_updates == 1  # new weights, no update
    clock.load_state_dict({"num_gradient_updates": 7, "weights_version": 9})  # rl-dist-ext 0.1
    assert (clock.num_gradient_updates, clock.version) == (7, 10)


def test_learner_publishes_restored_weights_under_a_new_version():
    learner, _ = make_learner(RecordingReplay())
    server = ParameterServer()
    learner.connect(weights=server)
    assert learner.publish() == 0 and server.stats()["num_publishes"] == 1  # nothing new
    assert learner.publish(new_version=True) == 1 and server.version() == 1


def test_parameter_server_client_keeps_its_weights_while_the_server_restarts(ray_session):
    import time

    import ray

    from rl_dist_ext.ray_actors import start_parameter_server

    client = start_parameter_server(timeout_s=30)
    try:
        assert client.publish({"w": 0}, 0) == 0
        ray.kill(client.handle, no_restart=False)
        # Pulls and publishes during the restart: nothing newer (the actor keeps its weights),
        # a missed publish is logged; neither raises (was: a raw ActorUnavailableError).
        for version in range(1, 21):
            latest = client.pull_if_newer(-1)
            assert latest is None or latest.version < version
            assert client.publish({"w": version}, version) == version
        deadline = time.monotonic() + 30
        version = 21
        while True:  # the next publishes reach the restarted (empty) server
            client.publish({"w": version}, version)
            latest = client.pull_if_newer(-1)
            if latest is not None and latest.version == version:
                break
            assert time.monotonic() < deadline, latest
            version += 1
            time.sleep(0.2)
        assert latest.weights == {"w": version}
    finally:
        client.close()


def test_a_parameter_server_gone_for_good_raises_the_projects_error_after_timeout_s(
    ray_session,
):
    import time

    import ray

    from rl_dist_ext.params import ParameterServerUnavailable
    from rl_dist_ext.ray_actors import start_parameter_server

    for call in ("pull", "publish"):
        client = start_parameter_server(timeout_s=2)
        client.publish({"w": 0}, 0)
        ray.kill(client.handle, no_restart=True)  # takes effect a moment later
        started, version = time.monotonic(), 0
        with pytest.raises(ParameterServerUnavailable, match="timeout_s=2"):
            while time.monotonic() - started < 30:
                version += 1
                if call == "pull":  # within the bound: nothing newer (or the last weights)
                    latest = client.pull_if_newer(-1)
                    assert latest is None or latest.version == 0
                else:  # within the bound: logged
                    assert client.publish({"w": version}, version) == version
                time.sleep(0.1)
        assert time.monotonic() - started >= 2
