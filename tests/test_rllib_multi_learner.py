"""GorilaDQN and VTrace with two data-parallel RLlib learners (torch DDP on gloo, CPU).

Each learner samples its own prioritized batch and sends its own priorities; DDP averages the
gradients, so one synchronous step must leave both learners with the weights a single learner
reaches by stepping on the union of their batches (same starting weights and Adam state). With
``beta=0`` the importance weights are all 1, so the union's mean loss has exactly the average
of the two learners' gradients. The VTrace tests share one SEED-mode algorithm: a step on
each learner's own share equals one step on their union, an update that leaves one learner
without episodes is skipped by both, and training keeps one version on both replicas.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")


def two_learner_config():
    from test_rllib_gorila import small_config

    return (
        small_config(updates_per_iteration=8)
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.2, num_envs_per_env_runner=4)
        .learners(num_learners=2, num_cpus_per_learner=0.4)
        .resources(num_cpus_for_main_process=0.3)
        .replay(beta=0.0, min_size_to_sample=300)
    )


def test_two_learners_step_like_one_learner_on_the_union_of_their_batches(ray_session):
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch
    from ray.rllib.utils.numpy import convert_to_numpy

    from rllib_plugins.gorila_learner import replay_rows_to_batch

    config = two_learner_config()
    algorithm = config.build_algo()
    try:
        for _ in range(20):  # until the replay holds enough rows and learning has started
            result = algorithm.train()
            if result["gorila"]["learner_weights_version"] > 0:
                break
        version_before = result["gorila"]["learner_weights_version"]
        assert version_before > 0
        before = algorithm.learner_group.get_state(components="learner")["learner"]

        def one_recorded_update(learner):
            """One train_from_replay step, recording what this learner sampled and the
            priorities it sent (wrappers on this learner's own replay client)."""
            import numpy as np
            from ray.rllib.core import DEFAULT_MODULE_ID
            from ray.rllib.utils.numpy import convert_to_numpy

            client = learner.gorila.replays[DEFAULT_MODULE_ID]
            seen = {}
            sample, update = client.sample, client.update_priorities

            def recording_sample(batch_size, **kwargs):
                out = sample(batch_size, **kwargs)
                seen["sample"] = (dict(out.batch), np.asarray(out.keys), np.asarray(out.weights))
                return out

            def recording_update(keys, priorities):
                seen["priorities"] = (np.asarray(keys), np.asarray(priorities))
                return update(keys, priorities)

            client.sample, client.update_priorities = recording_sample, recording_update
            try:
                learner.train_from_replay(1, {})
            finally:
                del client.sample, client.update_priorities
            weights = convert_to_numpy(learner.module[DEFAULT_MODULE_ID].unwrapped().state_dict())
            return seen, weights, learner.gorila.weights_version, learner.is_first_learner

        results = algorithm.learner_group.foreach_learner(one_recorded_update)
        (seen_a, weights_a, version_a, first_a), (seen_b, weights_b, version_b, first_b) = [
            r.get() for r in results.result_or_errors
        ]
        assert sorted([first_a, first_b]) == [False, True]
        assert version_a == version_b == version_before + 1
        # The two learners sampled different batches, and each sent priorities for its own.
        rows_a, keys_a, w_a = seen_a["sample"]
        rows_b, keys_b, w_b = seen_b["sample"]
        assert not np.array_equal(keys_a, keys_b)
        np.testing.assert_array_equal(seen_a["priorities"][0], keys_a)
        np.testing.assert_array_equal(seen_b["priorities"][0], keys_b)
        assert np.all(w_a == 1.0) and np.all(w_b == 1.0)  # beta=0
        for name, value in weights_a.items():  # DDP kept the replicas identical
            np.testing.assert_array_equal(value, weights_b[name])

        # One learner, same state, one step on the union of the two batches.
        import gymnasium as gym

        reference = (
            config.copy().learners(num_learners=0).build_learner(env=gym.make("CartPole-v1"))
        )
        reference.set_state(before)
        union = {k: np.concatenate([rows_a[k], rows_b[k]]) for k in rows_a}
        batch = MultiAgentBatch(
            {DEFAULT_MODULE_ID: replay_rows_to_batch(union, np.concatenate([w_a, w_b]))},
            env_steps=len(keys_a) + len(keys_b),
        )
        reference.update(batch=batch, timesteps={})
        expected = convert_to_numpy(reference.module[DEFAULT_MODULE_ID].state_dict())
        for name, value in expected.items():
            np.testing.assert_allclose(weights_a[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
        # Each learner's priorities are |TD| of its rows under the pre-step weights.
        td = reference._last_td_error[DEFAULT_MODULE_ID].detach().abs().numpy()
        np.testing.assert_allclose(
            np.concatenate([seen_a["priorities"][1], seen_b["priorities"][1]]), td, rtol=1e-4
        )

        # Training goes on with both learners in lock step: one version per synchronous update
        # (not one per learner), and the runners act on published versions.
        result = algorithm.train()
        version = result["gorila"]["learner_weights_version"]
        assert version >= version_a + config.updates_per_iteration
        assert (version - version_a) % config.updates_per_iteration == 0
        assert 0 <= result["gorila"]["policy_lag_max"] <= version
    finally:
        algorithm.stop()


def pad_to_whole_rows(rows: dict, length: int) -> dict:
    """Zero-pad every column to a whole number of ``length``-step rows (padding masked), as
    RLlib's ``make_time_major`` pads a learner's batch."""
    pad = -len(rows["loss_mask"]) % length
    return {
        k: np.concatenate([v, np.zeros((pad, *v.shape[1:]), dtype=v.dtype)])
        for k, v in rows.items()
    }


@pytest.fixture(scope="module")
def vtrace_two_learners(ray_session):
    """VTrace in SEED mode (one inference server) with two data-parallel learners: the config
    and the algorithm."""
    from test_rllib_vtrace import small_config

    config = (
        small_config(central=True)
        .env_runners(num_env_runners=1)
        .learners(num_learners=2, num_cpus_per_learner=0.4)
    )
    algorithm = config.build_algo()
    yield config, algorithm
    algorithm.stop()


def test_vtrace_learners_skip_an_update_together_when_one_has_no_episodes(vtrace_two_learners):
    """RLlib's learner group hands each learner a share of an update's episode references. A
    share can hold no episodes: every reference in it died with its env runner's node (RLlib's
    ``TrainingData.solve_refs`` drops those), or the update had fewer references than learners,
    as here. That learner has nothing to learn from, and skipping alone would leave its peer
    waiting in DDP's gradient all-reduce: both skip and count it, at one version; the next
    update, with episodes for both, steps both."""
    from ray.rllib.core.learner.training_data import TrainingData

    _, algorithm = vtrace_two_learners
    (episodes,) = algorithm.env_runner_group.foreach_env_runner(
        lambda runner: runner.sample(num_timesteps=400), local_env_runner=False
    )

    def replicas():
        from ray.rllib.core import DEFAULT_MODULE_ID
        from ray.rllib.utils.numpy import convert_to_numpy

        results = algorithm.learner_group.foreach_learner(
            lambda learner: (
                learner.weights_clock.version,
                learner.updates_skipped,
                convert_to_numpy(learner.module[DEFAULT_MODULE_ID].unwrapped().state_dict()),
            )
        )
        return [r.get() for r in results.result_or_errors]

    def update(refs):
        algorithm.learner_group.update(
            training_data=TrainingData(episodes_refs=refs),
            timesteps={},
            defer_solve_refs_to_learner=True,
        )

    (version, skipped, weights), _ = before = replicas()
    assert [(v, s) for v, s, _ in before] == [(version, skipped)] * 2

    update([ray.put(episodes)])  # one reference, two learners: the second one's share is empty

    after = replicas()
    assert [(v, s) for v, s, _ in after] == [(version, skipped + 1)] * 2
    for name, value in weights.items():
        np.testing.assert_array_equal(after[1][2][name], value, err_msg=name)
    half = len(episodes) // 2
    update([ray.put(episodes[:half]), ray.put(episodes[half:])])
    deadline = time.monotonic() + 60  # IMPALA's learner threads take the step
    while (after := replicas())[0][0] == version or after[1][0] == version:
        assert time.monotonic() < deadline, "the learners did not step"
        time.sleep(0.05)
    assert [(v, s) for v, s, _ in after] == [(version + 1, skipped + 1)] * 2
    for name, value in after[0][2].items():  # still in lock step
        np.testing.assert_array_equal(after[1][2][name], value, err_msg=name)
    assert any(not np.array_equal(after[0][2][k], weights[k]) for k in weights)


def test_vtrace_two_learners_step_like_one_learner_on_the_union_of_their_batches(
    vtrace_two_learners,
):
    """One synchronous VTrace step of two learners, each on its own batch of episode pieces,
    leaves both with the weights one learner reaches on the union of the two batches.

    DDP averages the replicas' gradients and each replica's loss is a masked mean, so the two
    agree when the replicas' batches hold the same number of loss steps. RLlib's learner group
    hands each learner an equal share; here each learner gets four 12-step pieces (one of them
    ending in a termination), so both batches have the same layout and different data.
    """
    import gymnasium as gym
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.core.learner.learner import Learner
    from ray.rllib.core.learner.training_data import TrainingData
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
    from ray.rllib.utils.numpy import convert_to_numpy

    length = 12
    config, algorithm = vtrace_two_learners
    starts, ends = [], []  # 12-step pieces: episode starts (cut) and episode ends (terminated)
    while len(starts) < 6 or len(ends) < 2:
        for episodes in algorithm.env_runner_group.foreach_env_runner(
            lambda runner: runner.sample(num_episodes=8), local_env_runner=False
        ):
            for episode in episodes:
                if episode.is_done and len(episode) > length:
                    starts.append(episode[:length])
                    ends.append(episode[-length:])
    assert all(piece.is_terminated for piece in ends[:2])
    assert not any(piece.is_done for piece in starts[:6])
    pieces = [starts[0:3] + ends[0:1], starts[3:6] + ends[1:2]]  # one share per learner
    before = algorithm.learner_group.get_state(components="learner")["learner"]

    def one_update(learner):
        """Build this learner's batch from its share (its learner connector) and take one
        gradient step, synchronously (not through IMPALA's learner thread)."""
        import torch.distributed as dist
        from ray.rllib.core import DEFAULT_MODULE_ID
        from ray.rllib.core.learner.learner import Learner
        from ray.rllib.core.learner.training_data import TrainingData
        from ray.rllib.utils.numpy import convert_to_numpy

        rank = dist.get_rank()
        batch = learner._make_batch_if_necessary(TrainingData(episodes=pieces[rank]))
        rows = convert_to_numpy(dict(batch.policy_batches[DEFAULT_MODULE_ID]))
        Learner.update(learner, training_data=TrainingData(batch=batch), timesteps={})
        module = learner.module[DEFAULT_MODULE_ID].unwrapped()
        weights = convert_to_numpy(module.state_dict())
        grads = {n: p.grad.numpy().copy() for n, p in module.named_parameters()}
        return rank, rows, weights, grads

    results = algorithm.learner_group.foreach_learner(one_update)
    (rank_a, rows_a, weights_a, grads_a), (rank_b, rows_b, weights_b, _) = sorted(
        (r.get() for r in results.result_or_errors), key=lambda r: r[0]
    )
    assert (rank_a, rank_b) == (0, 1)
    mask = "loss_mask"
    assert rows_a[mask].sum() == rows_b[mask].sum() == 4 * length  # same number of loss steps
    assert not np.array_equal(rows_a["obs"], rows_b["obs"])
    for name, value in weights_a.items():  # DDP kept the replicas identical
        np.testing.assert_array_equal(value, weights_b[name], err_msg=name)
    start = convert_to_numpy(before["rl_module"][DEFAULT_MODULE_ID])
    assert any(not np.allclose(weights_a[k], start[k]) for k in start)  # it stepped

    # One learner, same state, one step on the union of the two batches.
    reference = config.copy().learners(num_learners=0).build_learner(env=gym.make("CartPole-v1"))
    try:
        # Time-major, each learner's batch is whole rows of the fragment length (its last
        # row zero-padded, masked): the union puts B's rows after A's.
        length_t = config.get_rollout_fragment_length()
        padded = [pad_to_whole_rows(rows, length_t) for rows in (rows_a, rows_b)]
        union = {k: np.concatenate([p[k] for p in padded]) for k in rows_a}
        batch = MultiAgentBatch(
            {DEFAULT_MODULE_ID: SampleBatch(union, _zero_padded=True)},
            env_steps=len(union[mask]),
        )
        reference.set_state(before)
        Learner.update(reference, training_data=TrainingData(batch=batch), timesteps={})
        expected = convert_to_numpy(reference.module[DEFAULT_MODULE_ID].state_dict())
        expected_grads = {
            n: p.grad.numpy().copy()
            for n, p in reference.module[DEFAULT_MODULE_ID].named_parameters()
        }
    finally:
        reference.shutdown()
    for name, value in expected_grads.items():  # DDP's averaged gradient = the union's
        np.testing.assert_allclose(grads_a[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    for name, value in expected.items():
        np.testing.assert_allclose(weights_a[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_vtrace_with_two_learners_trains_in_seed_mode_and_keeps_one_version(vtrace_two_learners):
    """VTrace on RLlib's learner group with two learners (RLlib shards each train batch over
    them; DDP averages the gradients): both replicas hold the same weights and version after
    training, and the SEED inference server serves that version. (Last of the tests sharing
    the algorithm: IMPALA's asynchronous updates may still be landing after train().)"""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.utils.numpy import convert_to_numpy

    _, algorithm = vtrace_two_learners
    version_before = algorithm._learner_version()  # the tests above stepped the learners
    # Sampling and the learners' updates are asynchronous: under load the first updates can
    # land after a few iterations. The server must get a newer version within the bound.
    for _ in range(30):
        result = algorithm.train()
        if result.get("central_inference", {}).get("version", 0) > version_before and result.get(
            "env_runners", {}
        ).get("num_env_steps_sampled_lifetime", 0):
            break
    replicas = algorithm.learner_group.foreach_learner(
        lambda learner: (
            learner.versioned_weights()[1],
            convert_to_numpy(learner.module[DEFAULT_MODULE_ID].unwrapped().state_dict()),
        )
    )
    (version_a, weights_a), (version_b, weights_b) = [r.get() for r in replicas.result_or_errors]
    assert version_a == version_b > version_before
    for name, value in weights_a.items():
        np.testing.assert_array_equal(value, weights_b[name], err_msg=name)
    assert result["central_inference"]["version"] > version_before
    assert result["env_runners"]["num_env_steps_sampled_lifetime"] > 0
