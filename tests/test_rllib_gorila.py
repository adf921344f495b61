"""GorilaDQN on RLlib: registration, config errors, epsilons, checkpoints, runner faults."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import alive_actor_ids
from metrics_keys import documented_keys, undocumented

ray = pytest.importorskip("ray")


def small_config(*, runners: int = 2, **training):
    """CartPole, ``runners`` env runners x 4 envs (2 by default: the epsilon ladder; tests of
    one algorithm's own lifecycle take 1, a process fewer), 2 replay shards, small CPU asks.

    Unseeded: RLlib's seeding turns on torch's deterministic algorithms, which imports torch's
    compiler stack in every runner and learner process (about 1 CPU-s each); the learning tests
    seed their runs."""
    from rllib_plugins import GorilaDQNConfig

    settings = {
        "lr": 1e-3,
        "n_step": 3,
        "target_update_every_n_updates": 250,
        "weight_sync_every_n_steps": 200,
        "env_steps_per_request": 128,
        "updates_per_iteration": 32,
    }
    settings.update(training)
    return (
        GorilaDQNConfig()
        .environment("CartPole-v1")
        .env_runners(
            num_env_runners=runners, num_cpus_per_env_runner=0.2, num_envs_per_env_runner=4
        )
        .learners(num_learners=0)
        .resources(num_cpus_for_main_process=0.5)
        .training(**settings)
        .replay(num_shards=2, capacity=20_000, min_size_to_sample=500, num_cpus_per_shard=0.1)
        .reporting(min_sample_timesteps_per_iteration=500)
    )


def alive_actors() -> int:
    from conftest import alive_actor_count

    return alive_actor_count()


@pytest.fixture(scope="module")
def algo(ray_session):
    # delta weight pulls, so that every test of this algorithm runs them (fp32 is the default)
    algorithm = small_config(weights_encoding="delta").build_algo()
    yield algorithm
    algorithm.stop()


def test_registered_with_tune_and_rllib(ray_session):
    from ray.rllib.algorithms import registry
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
    from ray.tune.registry import get_trainable_cls

    import rllib_plugins

    assert get_trainable_cls("GorilaDQN") is rllib_plugins.GorilaDQN
    assert "GorilaDQN" in registry.ALGORITHMS
    config = AlgorithmConfig(algo_class="GorilaDQN")
    assert get_trainable_cls(config.algo_class) is rllib_plugins.GorilaDQN
    assert isinstance(rllib_plugins.GorilaDQN.get_default_config(), rllib_plugins.GorilaDQNConfig)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda c: c.training(target_update_every_n_updates=0), "target_update_every_n_updates"),
        (lambda c: c.training(weight_sync_every_n_steps=-5), "weight_sync_every_n_steps"),
        (lambda c: c.training(updates_per_iteration=1.5), "updates_per_iteration"),
        (
            lambda c: c.training(updates_per_learner_call=0),
            "updates_per_learner_call must be an int >= 1, got 0",
        ),
        (lambda c: c.training(epsilon_base=1.5), "epsilon_base"),
        (lambda c: c.training(epsilon_alpha=-1.0), "epsilon_alpha"),
        (lambda c: c.training(n_step=(1, 3)), "n_step"),
        (lambda c: c.training(num_atoms=51), "num_atoms"),
        (lambda c: c.training(noisy=True), "noisy"),
        (lambda c: c.training(adam_epsilon=0.0), "adam_epsilon must be a number > 0.0, got 0.0"),
        (
            lambda c: c.multi_agent(
                algorithm_config_overrides_per_module={"default_policy": {"adam_epsilon": -1}}
            ),
            r"\['default_policy'\]\['adam_epsilon'\] must be a number > 0.0, got -1",
        ),
        (
            lambda c: c.multi_agent(
                algorithm_config_overrides_per_module={"default_policy": {"tau": 2}}
            ),
            r"\['default_policy'\]\['tau'\] must be a number > 0.0 and <= 1.0, got 2",
        ),
        (lambda c: c.training(target_network_update_freq=1000), "target_update_every_n_updates"),
        (
            lambda c: c.multi_agent(
                algorithm_config_overrides_per_module={
                    "default_policy": {"target_update_every_n_updates": 10}
                }
            ),
            r"\['default_policy'\]\['target_update_every_n_updates'\]=10: GorilaDQN updates",
        ),
        (
            lambda c: c.multi_agent(
                algorithm_config_overrides_per_module={
                    "default_policy": {"target_network_update_freq": 500}
                }
            ),
            r"\['default_policy'\]\['target_network_update_freq'\]=500: GorilaDQN updates",
        ),
        (lambda c: c.training(tau=0.0), "tau must be a number > 0.0 and <= 1.0, got 0.0"),
        (lambda c: c.training(tau=1.5), "tau must be a number > 0.0 and <= 1.0, got 1.5"),
        (lambda c: c.training(tau="0.5"), "tau must be a number > 0.0 and <= 1.0, got '0.5'"),
        (lambda c: c.replay(alpha=-0.5), "alpha"),
        (lambda c: c.replay(beta=2.0), "beta"),
        (lambda c: c.replay(num_shards=0), "num_shards"),
        (lambda c: c.replay(min_size_to_sample=10**9), "min_size_to_sample"),
        (lambda c: c.replay(batches_per_request=0), "batches_per_request"),
        (lambda c: c.env_runners(num_env_runners=0), "num_env_runners"),
    ],
)
def test_bad_config_values_raise_on_validate(change, match):
    config = change(small_config())
    with pytest.raises(ValueError, match=match):
        config.validate()


def test_the_adam_epsilon_reaches_the_learners_optimizer():
    """DQNConfig's ``adam_epsilon`` (documented as Adam's epsilon; RLlib's new-stack learner
    builds Adam without it) is the epsilon of GorilaDQN's optimizer."""
    import gymnasium as gym

    for eps in (1e-8, 1e-3):
        config = small_config().training(adam_epsilon=eps).learners(num_learners=0)
        learner = config.build_learner(env=gym.make("CartPole-v1"))
        [optimizer] = learner.get_optimizers_for_module("default_policy")
        assert [group["eps"] for group in optimizer[1].param_groups] == [eps]


def test_replay_settings_reach_the_replay_config():
    config = small_config().replay(batches_per_request=2, prefetch=3, num_shards=3)
    replay = config.replay_config()
    assert (replay.batches_per_request, replay.prefetch, replay.num_shards) == (2, 3, 3)
    # a later call changes only what it names (the default: 4 batches per round trip)
    assert small_config().replay(prefetch=5).replay_config().batches_per_request == 4


def test_the_default_target_is_a_polyak_one_moved_after_every_update():
    """GorilaDQN's class defaults: C = 1 with ``tau=None``, which the learner reads as 0.008
    (the mix itself: ``test_learner_target_update_mixes_in_tau_of_the_online_network``)."""
    from rl_dist_ext.ops.dqn import target_tau
    from rllib_plugins import GorilaDQNConfig

    config = GorilaDQNConfig()
    assert (config.target_update_every_n_updates, config.tau) == (1, None)
    assert target_tau(config.tau, config.target_update_every_n_updates) == 0.008
    config.environment("CartPole-v1").validate()  # None is taken


def test_the_default_loss_is_the_squared_td_error_not_dqns_huber():
    """GorilaDQN's class default departs from DQN's (the loss itself, both kinds:
    ``test_learner_loss_is_the_core_double_dqn_loss_with_weights``)."""
    from ray.rllib.algorithms.dqn import DQNConfig

    from rllib_plugins import GorilaDQNConfig

    assert GorilaDQNConfig().td_error_loss_fn == "mse"
    assert DQNConfig().td_error_loss_fn == "huber"
    huber = GorilaDQNConfig().environment("CartPole-v1").training(td_error_loss_fn="huber")
    huber.validate()
    assert huber.td_error_loss_fn == "huber"


def test_replay_defaults_are_the_core_configs_but_where_gorila_says_otherwise():
    """One definition of each replay default: DistributedReplayConfig's, except the fields in
    REPLAY_DEFAULTS (with their reasons); the algorithm's own fields are not replay() settings."""
    import dataclasses

    from rl_dist_ext.replay.distributed import DistributedReplayConfig
    from rllib_plugins import GorilaDQNConfig
    from rllib_plugins.gorila import REPLAY_DEFAULTS

    built = GorilaDQNConfig().replay_config()
    core = DistributedReplayConfig()
    for field in dataclasses.fields(DistributedReplayConfig):
        expected = REPLAY_DEFAULTS.get(field.name, getattr(core, field.name))
        assert getattr(built, field.name) == expected, field.name
    assert REPLAY_DEFAULTS == {"samples_per_insert": 16.0}
    with pytest.raises(TypeError, match=r"replay\(\) has no setting 'num_shard'"):
        GorilaDQNConfig().replay(num_shard=3)
    with pytest.raises(TypeError, match="'placement_group'"):
        GorilaDQNConfig().replay(placement_group=None)
    uniform = GorilaDQNConfig().replay(prioritized=False).replay_config()
    assert (uniform.alpha, uniform.beta) == (0.0, 0.0)


@pytest.mark.parametrize(
    ("env", "match"),
    [("Pendulum-v1", "Discrete action space"), ("FrozenLake-v1", "Box observation space")],
)
def test_unsupported_env_spaces_raise_before_any_actor_starts(ray_session, env, match):
    before = alive_actor_ids()
    with pytest.raises(ValueError, match=match):
        small_config().environment(env).build_algo()
    assert alive_actor_ids() <= before  # none started and left (one dying before may be gone)


def test_impossible_resource_ask_raises_before_any_actor_starts(ray_session):
    before = alive_actor_ids()
    config = small_config().env_runners(num_env_runners=8, num_cpus_per_env_runner=1)
    with pytest.raises(ValueError, match=r"GorilaDQN asks for 8\.[0-9]+ CPUs"):
        config.build_algo()
    assert alive_actor_ids() <= before  # none started and left (one dying before may be gone)


def flat_keys(tree: dict, prefix: str = "") -> set[str]:
    """``a/b`` paths of a nested result dict."""
    keys = set()
    for key, value in tree.items():
        path = f"{prefix}{key}"
        keys |= flat_keys(value, f"{path}/") if isinstance(value, dict) else {path}
    return keys


def test_each_runner_keeps_its_apex_epsilon_across_weight_syncs(algo):
    from rl_dist_ext.exploration import apex_epsilons

    def epsilons():
        return dict(
            algo.env_runner_group.foreach_env_runner(
                lambda r: (r.worker_index, r.module.epsilon_schedule.get_current_value()),
                local_env_runner=False,
            )
        )

    expected = {i + 1: eps for i, eps in enumerate(apex_epsilons(2))}
    assert epsilons() == pytest.approx(expected)
    result = algo.train()
    assert epsilons() == pytest.approx(expected)
    gorila = result["gorila"]
    assert gorila["epsilon_runner_1"] == pytest.approx(0.4)
    assert gorila["epsilon_runner_2"] == pytest.approx(0.4**8)
    # docs/metrics.md lists exactly what an iteration reports (and the learner's, timers' keys)
    progress = documented_keys("RLlib GorilaDQN progress")
    assert not undocumented(gorila, progress)
    assert {key for key in progress if "<" not in key} <= set(gorila)
    for _ in range(5):  # the learner reports once it has trained in an iteration
        if "learners" in result:
            break
        result = algo.train()
    for section, reported in (
        ("RLlib GorilaDQN learner", flat_keys(result["learners"])),
        ("RLlib GorilaDQN timers", set(result["timers"])),
    ):
        documented = {k.replace("<module>", "default_policy") for k in documented_keys(section)}
        # absent until the first target sync (every 250 updates; this run made fewer)
        documented.discard("default_policy/num_target_updates")
        assert documented <= reported, (section, documented - reported)


def test_runners_hold_the_learners_weights_within_the_delta_bound(algo):
    """weights_encoding="delta": after training, every runner pulls; the weights it holds are
    the learner's published ones within the bound (4 grid units an element), not equal (the
    encoding is lossy), and the server served deltas after the runners' first full pulls."""
    import ray

    from rl_dist_ext.weight_deltas import UNITS_PER_TOLERANCE, flatten_weights

    algo.train()
    server = algo._param_server
    algo.env_runner_group.foreach_env_runner(lambda r: r.pull_weights(), local_env_runner=False)
    published = ray.get(server.handle.pull_if_newer.remote(-1))  # the learner's float32 weights
    units = ray.get(server.handle.__ray_call__.remote(lambda s: s._deltas._unit.copy()))
    held = algo.env_runner_group.foreach_env_runner(
        lambda r: (r._connected_actor().weights_version, r.module.get_state(inference_only=True)),
        local_env_runner=False,
    )
    exact = flatten_weights(published.weights).values
    for version, state in held:
        assert version == published.version
        error = np.abs(flatten_weights(state).values - exact)
        assert np.all(error <= UNITS_PER_TOLERANCE * units * (1 + 1e-5))
        assert error.max() > 0
    pulls = ray.get(server.handle.stats.remote())
    # the runners' first pulls were full; later ones deltas (or full where a delta would be
    # larger than the full copy: everything moved)
    assert pulls["num_full_pulls"] >= 2 and pulls["num_delta_pulls"] >= 1, pulls


def test_checkpoint_restores_weights_and_replay(algo, tmp_path):
    for _ in range(2):
        result = algo.train()
    assert result["gorila"]["replay_size"] >= 500
    path = algo.save_to_path(str(tmp_path / "ckpt"))
    manifest = json.loads((tmp_path / "ckpt" / "replay" / "manifest.json").read_text())
    saved_sizes = manifest["size_per_shard"]
    # The runners go on inserting while the shards are saved: the checkpoint holds each shard
    # as it was when saved, never more than it holds afterwards.
    sizes_now = algo.replay().stats(wait=True)["size_per_shard"]
    assert all(0 < saved <= now for saved, now in zip(saved_sizes, sizes_now, strict=True))
    saved_weights = {k: v.clone() for k, v in algo.get_module().state_dict().items()}

    # RLlib's own entry point builds a fresh algorithm from the checkpoint's config and restores
    # it with restore_from_path: weights, and every replay shard.
    from rllib_plugins import GorilaDQN

    restored = GorilaDQN.from_checkpoint(path)
    try:
        stats = restored.replay().stats(wait=True)
        assert stats["size_per_shard"] == saved_sizes
        for key, value in restored.get_module().state_dict().items():
            torch.testing.assert_close(value, saved_weights[key])
        # Learning continues from there.
        restored.train()
        assert restored.replay().stats(wait=True)["num_inserted"] > sum(
            manifest["num_inserted_per_shard"]
        )
    finally:
        restored.stop()

    # The same (now older) checkpoint restored into the running algorithm: the restored
    # weights get a version newer than any published, so the parameter server takes them and
    # the runners pull them. (SEED mode: the next test.)
    obs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    saved_q = q_values_of(algo.get_module(), obs)
    version = train_on_then_restore(algo, path, obs, saved_q)
    pulled = algo.env_runner_group.foreach_env_runner(
        lambda runner: (runner.pull_weights(), runner.weights_version)[1],
        local_env_runner=False,
    )
    assert pulled == [version, version]
    runner_q = algo.env_runner_group.foreach_env_runner(
        lambda runner: q_values_of(runner.module, obs), local_env_runner=False
    )
    for q in runner_q:
        np.testing.assert_allclose(q, saved_q, atol=1e-5)
    algo.train()  # and training goes on from there


def q_values_of(module, obs: np.ndarray) -> np.ndarray:
    from ray.rllib.core.columns import Columns

    with torch.no_grad():
        return module.compute_q_values({Columns.OBS: torch.as_tensor(obs)})["qf_preds"].numpy()


def train_on_then_restore(algorithm, path: str, obs: np.ndarray, saved_q: np.ndarray) -> int:
    """Train past the checkpoint at ``path`` (whose Q-values on ``obs`` are ``saved_q``), restore
    it into the running algorithm and check that its (older) weights came back under a version
    newer than any published before, which the parameter server holds; returns that version."""
    for _ in range(2):
        result = algorithm.train()
    version_before = result["gorila"]["learner_weights_version"]
    assert not np.allclose(q_values_of(algorithm.get_module(), obs), saved_q)

    algorithm.restore_from_path(path)

    version = algorithm._learner_weights_version()
    assert version > version_before
    np.testing.assert_allclose(q_values_of(algorithm.get_module(), obs), saved_q, atol=1e-5)
    assert algorithm._param_server.pull_if_newer(-1).version == version
    return version


def test_stop_does_not_wait_on_runners_blocked_by_the_rate_limiter(ray_session):
    """samples_per_insert=1000: the runners' inserts soon wait for a learner that can never
    catch up. stop() lifts the limiter first, so it neither waits out the limiter's 60 s
    timeout nor leaves an actor behind."""
    from test_rllib_vtrace import actors_left_since, alive_actor_classes

    before = alive_actor_classes()
    # two runners: their inserts outrun the learner's samples, so that both soon block (with
    # one, the learner's samples let a trickle of inserts through and it never blocks for good)
    algorithm = small_config().replay(samples_per_insert=1000.0).build_algo()
    try:
        inserted = []  # until two reads 1 s apart see no new row: the runners are blocked
        deadline = time.monotonic() + 120
        while len(inserted) < 2 or inserted[-1] != inserted[-2]:
            assert time.monotonic() < deadline, inserted
            result = algorithm.train()
            time.sleep(1.0)
            inserted.append(algorithm.replay().stats(wait=True)["num_inserted"])
        assert result["gorila"]["replay_samples_per_insert"] < 1000.0  # the learner is behind
    finally:
        started = time.monotonic()
        algorithm.stop()
        stopped_in = time.monotonic() - started
    assert stopped_in < 30.0, stopped_in
    assert actors_left_since(before) == []


@pytest.mark.parametrize(
    "rounds",
    [
        # make test-long only, for CI time: make test kills each component kind in its own test
        pytest.param(1, id="short", marks=pytest.mark.long),
        pytest.param(10, id="long", marks=pytest.mark.long),
    ],
)
def test_chaos_then_restoring_an_older_checkpoint_reaches_the_restarted_server(
    ray_session, tmp_path, rounds
):
    """SEED mode, so that every kind of component runs: replay shards, env runners, the
    parameter server (the learner publishes to it) and the inference server are killed at
    seeded random times, each once per round (one round in make test, ten in make
    test-long). Training goes on, no iteration waits without bound, every component comes back
    (the restarted runners reconnected), and every row is accounted for: the shards'
    acknowledged rows are stored, evicted or lost with a shard, and the rows the runners sent
    and never saw acknowledged (a killed runner's, or the last ones in flight at the end) are
    dropped in transit.

    Then a checkpoint taken before the chaos is restored into the running algorithm: its
    (older) weights get a version newer than any published before, so the parameter server
    takes them and the restarted inference server uses them. The run checkpoints without its
    replay (``replay(checkpoint=False)``): no replay directory, and the restore needs none."""
    from chaos import Chaos, assert_every_row_accounted_for

    ledger = str(tmp_path / "ledger")
    algorithm = (
        small_config()
        .central_inference(enabled=True, num_cpus=0.1, max_batch_size=64, max_wait_ms=1.0)
        .replay(
            checkpoint=False,
            snapshot_dir=str(tmp_path / "snapshots"),
            snapshot_every_inserts=400,
            row_ledger_dir=ledger,
            retry_down_shard_after_s=0.5,
            timeout_s=20.0,
        )
        .build_algo()
    )
    runners = algorithm.env_runner_group._worker_manager._actors
    chaos = Chaos(
        {
            "shard": lambda: algorithm.replay().handles,
            "env runner": lambda: list(runners.values()),
            "parameter server": lambda: [algorithm._param_server.handle],
            "inference server": lambda: [algorithm._inference.handle],
        },
        seed=0,
        rounds=rounds,
        gap_s=(0.5, 2.5),
    )
    obs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    try:
        for _ in range(2):
            algorithm.train()
        path = algorithm.save_to_path(str(tmp_path / "old"))
        assert not (tmp_path / "old" / "replay").exists()
        saved_q = q_values_of(algorithm.get_module(), obs)

        longest = 0.0
        while not chaos.done:
            started = time.monotonic()
            result = algorithm.train()
            longest = max(longest, time.monotonic() - started)
            chaos.step()
        version_at_last_kill = result["gorila"]["learner_weights_version"]
        deadline = time.monotonic() + 120
        while True:
            started = time.monotonic()
            gorila = algorithm.train()["gorila"]
            longest = max(longest, time.monotonic() - started)
            if (
                gorila["num_healthy_env_runners"] == 2
                and gorila["replay_shards_alive"] == 2
                and gorila["learner_weights_version"] > version_at_last_kill + 32
                and not gorila["degraded"]
            ):
                break
            assert time.monotonic() < deadline, (chaos.kills, gorila)
        assert longest < 60.0, (longest, chaos.kills)  # no iteration waited without bound
        assert {kill.kind for kill in chaos.kills} == set(chaos.targets)
        connected = dict(
            algorithm.env_runner_group.foreach_env_runner(
                lambda r: (r.worker_index, r.connected), local_env_runner=False
            )
        )
        assert connected == {1: True, 2: True}
        assert gorila["replay_shard_failures"] >= rounds

        version = train_on_then_restore(algorithm, path, obs, saved_q)
        server = algorithm._inference.handle
        deadline = time.monotonic() + 30
        while ray.get(server.get_version.remote()) < version:  # fire-and-forget push
            assert time.monotonic() < deadline, "the server never took the restored weights"
            time.sleep(0.1)
        reply = ray.get(server.infer.remote("test-probe", obs))
        assert reply.version == version
        np.testing.assert_allclose(reply.outputs["q_values"], saved_q, atol=1e-5)
        algorithm.train()  # and training goes on from there

        for runner in list(runners.values()):  # the end: what was in flight is dropped
            ray.kill(runner, no_restart=True)
        assert_every_row_accounted_for(ledger, algorithm.replay())
    finally:
        algorithm.stop()


def test_episodes_to_rollout_on_hand_built_chunks():
    """A chunk continuing an episode (lookback data excluded, cut at its end: truncated), a
    terminated episode, an env-truncated one and an empty chunk, laid end to end in [T, 1]."""
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    from rllib_plugins.gorila_env_runner import episodes_to_rollout

    def obs(*values):
        return [np.array([v, -v], dtype=np.float32) for v in values]

    continuing = SingleAgentEpisode(
        observations=obs(0.5, 1, 2, 3),  # 0.5: the previous chunk's, in the lookback
        actions=[5, 0, 1],
        rewards=[9.0, 1.0, 2.0],
        len_lookback_buffer=1,
    )
    terminated = SingleAgentEpisode(
        observations=obs(10, 11, 12),
        actions=[1, 0],
        rewards=[1.0, 1.0],
        terminated=True,
        len_lookback_buffer=0,
    )
    truncated = SingleAgentEpisode(
        observations=obs(20, 21), actions=[1], rewards=[0.5], truncated=True, len_lookback_buffer=0
    )
    empty = SingleAgentEpisode(observations=obs(30), len_lookback_buffer=0)
    assert [len(e) for e in (continuing, terminated, truncated, empty)] == [2, 2, 1, 0]

    rollout = episodes_to_rollout([continuing, terminated, empty, truncated])

    def column(values, dtype):
        return np.asarray(values, dtype=dtype).reshape(len(values), 1, *np.shape(values)[1:])

    expected = {
        "obs": column(obs(1, 2, 10, 11, 20), np.float32),
        "next_obs": column(obs(2, 3, 11, 12, 21), np.float32),
        "actions": column([0, 1, 1, 0, 1], np.int64),
        "rewards": column([1.0, 2.0, 1.0, 1.0, 0.5], np.float32),
        "terminated": column([False, False, False, True, False], bool),
        "truncated": column([False, True, False, False, True], bool),
    }
    assert rollout.keys() == expected.keys()
    for name, value in expected.items():
        assert rollout[name].shape == value.shape, name
        np.testing.assert_array_equal(rollout[name], value, err_msg=name)
    with pytest.raises(ValueError, match="no steps"):
        episodes_to_rollout([empty])


def target_updates(
    overrides: dict | None = None, every: int = 3, **training
) -> tuple[list[list[dict]], list[list[dict]]]:
    """A learner with C = ``every`` (and ``training``; ``overrides``: the default module's
    ``algorithm_config_overrides_per_module``) after each of 10 updates on random CartPole
    rows: its online and its target networks' states, index 0 before the first update."""
    import gymnasium as gym
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

    from rllib_plugins.gorila_learner import replay_rows_to_batch

    torch.manual_seed(0)
    config = small_config(target_update_every_n_updates=every, lr=1e-2, **training)
    if overrides:
        config.multi_agent(algorithm_config_overrides_per_module={DEFAULT_MODULE_ID: overrides})
    learner = config.build_learner(env=gym.make("CartPole-v1"))
    module = learner.module[DEFAULT_MODULE_ID].unwrapped()
    pairs = module.get_target_network_pairs()
    assert len(pairs) == 3  # the encoder, the advantage head and (dueling) the value head

    def states(which: int) -> list[dict]:
        return [{k: v.clone() for k, v in pair[which].state_dict().items()} for pair in pairs]

    rng = np.random.default_rng(0)
    online, target = [states(0)], [states(1)]
    try:
        for k in range(1, 11):
            rows = {
                "obs": rng.normal(size=(32, 4)).astype(np.float32),
                "action": rng.integers(0, 2, size=32),
                "reward": rng.normal(size=32).astype(np.float32),
                "discount": np.full(32, 0.97, dtype=np.float32),
                "next_obs": rng.normal(size=(32, 4)).astype(np.float32),
            }
            batch = replay_rows_to_batch(rows, np.ones(32, dtype=np.float32))
            learner.update(
                batch=MultiAgentBatch({DEFAULT_MODULE_ID: batch}, env_steps=32),
                timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 32 * k},
            )
            assert learner.num_gradient_updates == k
            online.append(states(0))
            target.append(states(1))
    finally:
        learner.shutdown()
    return online, target


def equal_states(a: list[dict], b: list[dict]) -> bool:
    return all(torch.equal(x[k], y[k]) for x, y in zip(a, b, strict=True) for k in x)


def test_learner_target_network_is_updated_exactly_every_c_gradient_updates():
    """C = 3 set alone (``tau`` left at GorilaDQN's ``None``: a copy for C > 1): after update
    k the target equals the online network as it was after update 3 * (k // 3) (the initial
    weights before the first multiple), and nothing in between."""
    online, target = target_updates()
    assert equal_states(target[0], online[0])
    for k in range(1, 11):
        assert not equal_states(online[k], online[k - 1])  # every update trains
        assert equal_states(target[k], online[3 * (k // 3)]), k


@pytest.mark.parametrize(
    "settings, tau, every",
    [
        ({"tau": 0.25}, 0.25, 3),
        ({"overrides": {"tau": 0.25}}, 0.25, 3),
        ({}, 0.008, 1),
    ],
    ids=["tau", "the module's own tau", "GorilaDQN's default: C = 1, tau None"],
)
def test_learner_target_update_mixes_in_tau_of_the_online_network(settings, tau, every):
    """DQN's ``tau`` (the config's, or a module's override of it): every C updates the target
    moves to ``tau * online + (1 - tau) * target`` (a Polyak update; tau = 1 is the hard copy
    above), and stays put in between. GorilaDQN's default, C = 1 with ``tau=None``, moves it
    0.008 of the way after every update."""
    online, target = target_updates(every=every, **settings)
    expected = target[0]
    for k in range(1, 11):
        if k % every == 0:
            expected = [
                {name: tau * on[name] + (1 - tau) * old[name] for name in old}
                for on, old in zip(online[k], expected, strict=True)
            ]
        for got, want in zip(target[k], expected, strict=True):
            for name in want:
                torch.testing.assert_close(got[name], want[name], msg=f"update {k}: {name}")


class ScriptedReplay:
    """CartPole-shaped batches from a seeded generator (the same sequence for every learner
    built on the same seed); records the priorities sent back."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.samples = 0
        self.priorities: list[tuple[np.ndarray, np.ndarray]] = []

    def sample(self, batch_size, *, beta):
        from rl_dist_ext.replay.prioritized import ReplaySample

        self.samples += 1
        rows = {
            "obs": self.rng.normal(size=(batch_size, 4)).astype(np.float32),
            "action": self.rng.integers(0, 2, size=batch_size),
            "reward": self.rng.normal(size=batch_size).astype(np.float32),
            "discount": self.rng.choice([0.0, 0.97], size=batch_size).astype(np.float32),
            "next_obs": self.rng.normal(size=(batch_size, 4)).astype(np.float32),
        }
        weights = self.rng.uniform(0.2, 1.0, size=batch_size).astype(np.float32)
        return ReplaySample(rows, np.arange(batch_size) + 1000 * self.samples, weights)

    def update_priorities(self, keys, priorities):
        self.priorities.append((np.asarray(keys), np.asarray(priorities)))


def train_fused(k: int, initial: dict | None) -> tuple[dict, dict, list, list, list]:
    """A learner with C = 3 and ``updates_per_learner_call=k`` (from the module state
    ``initial`` when given) after ``train_from_replay(10)`` on a :class:`ScriptedReplay`: its
    initial and final module states, the priorities sent, the updates after which the target
    synced, and the batches each of its fused calls took with RLlib's after-update hook
    (``"hooks"``) between them."""
    import gymnasium as gym
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

    config = small_config(target_update_every_n_updates=3, lr=1e-2, updates_per_learner_call=k)
    learner = config.training(train_batch_size_per_learner=32).build_learner(
        env=gym.make("CartPole-v1")
    )
    try:
        module = learner.module[DEFAULT_MODULE_ID]
        if initial is not None:
            module.set_state(initial)
        initial = module.get_state()
        replay = ScriptedReplay(seed=0)
        learner.gorila.connect(replays={DEFAULT_MODULE_ID: replay}, weights=None)
        syncs, calls = [], []
        sync, fused_update = learner.gorila._sync_target, learner.fused_update
        after_update = learner.after_gradient_based_update

        def counted_sync():
            syncs.append(learner.gorila.num_gradient_updates)
            sync()

        def counted_update(batches, timesteps):
            calls.append(len(batches))
            return fused_update(batches, timesteps)

        def counted_after_update(**kwargs):
            calls.append("hooks")
            return after_update(**kwargs)

        learner.gorila._sync_target, learner.fused_update = counted_sync, counted_update
        learner.after_gradient_based_update = counted_after_update
        learner.train_from_replay(10, {NUM_ENV_STEPS_SAMPLED_LIFETIME: 0})
        assert learner.num_gradient_updates == 10
        return initial, module.get_state(), replay.priorities, syncs, calls
    finally:
        learner.shutdown()


def test_fused_learner_calls_take_the_same_steps_as_single_ones_and_sync_the_target_inside():
    """updates_per_learner_call=4 with C = 3: 10 updates in 3 fused calls (of 4, 4 and 2
    batches of 32 rows), each followed by RLlib's after-update hook (the LR schedule) as a
    ``Learner.update`` call is, the target synced after updates 3, 6 and 9 (inside the calls),
    and the same weights and per-batch priorities as 10 single-update calls on the same
    batches."""
    initial, single, single_priorities, syncs, calls = train_fused(1, None)
    assert syncs == [3, 6, 9] and calls == [1, "hooks"] * 10
    _, fused, fused_priorities, syncs, calls = train_fused(4, initial)
    assert syncs == [3, 6, 9] and calls == [4, "hooks", 4, "hooks", 2, "hooks"]
    assert len(single_priorities) == len(fused_priorities) == 10
    for (keys_1, p_1), (keys_4, p_4) in zip(single_priorities, fused_priorities, strict=True):
        np.testing.assert_array_equal(keys_1, keys_4)
        np.testing.assert_allclose(p_1, p_4, rtol=1e-5, atol=1e-6)
    assert single.keys() == fused.keys()
    for name in single:
        torch.testing.assert_close(torch.as_tensor(fused[name]), torch.as_tensor(single[name]))
    assert any(
        not np.allclose(np.asarray(initial[name]), np.asarray(single[name])) for name in single
    )  # the updates trained


def rllib_step_learner(config):
    """A GorilaDQN learner on RLlib's own gradient step (``benchmarks/learner_bench.py``'s
    baseline: the DQN module's training forward over observations and next observations
    stacked, with gradients; RLlib's clipping and NaN/inf handling; Adam's per-tensor loop; one
    ``Learner.update`` per batch). The reference for the lean path."""
    import gymnasium as gym
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from learner_bench import rllib_step_classes

    learner_class, module_class = rllib_step_classes()
    config = config.learners(learner_class=learner_class).rl_module(
        rl_module_spec=RLModuleSpec(module_class=module_class)
    )
    return config.build_learner(env=gym.make("CartPole-v1"))


def test_lean_learner_step_takes_rllibs_own_step():
    """10 updates (clipped: grad_clip 0.1 binds) through ``train_from_replay`` give the weights,
    priorities and steps-trained metrics of RLlib's own step on the same batches
    (:func:`rllib_step_learner`), and the lean path's forward leaves no graph behind the next
    observations' Q-values."""
    import gymnasium as gym
    from ray.rllib.algorithms.dqn.default_dqn_rl_module import (
        QF_NEXT_PREDS,
        QF_PREDS,
        QF_TARGET_NEXT_PREDS,
    )
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.core.columns import Columns
    from ray.rllib.policy.sample_batch import MultiAgentBatch
    from ray.rllib.utils.metrics import (
        ALL_MODULES,
        NUM_ENV_STEPS_SAMPLED_LIFETIME,
        NUM_ENV_STEPS_TRAINED_LIFETIME,
        NUM_MODULE_STEPS_TRAINED_LIFETIME,
    )

    from rllib_plugins.gorila_learner import replay_rows_to_batch

    NORM = "gradients_default_optimizer_global_norm"
    config = small_config(target_update_every_n_updates=3, lr=1e-2, grad_clip=0.1)
    config = config.training(train_batch_size_per_learner=32)
    timesteps = {NUM_ENV_STEPS_SAMPLED_LIFETIME: 0}
    lean = config.build_learner(env=gym.make("CartPole-v1"))
    reference = rllib_step_learner(config)
    try:
        lean_module, reference_module = (x.module[DEFAULT_MODULE_ID] for x in (lean, reference))
        reference_module.set_state(lean_module.get_state())
        replay = ScriptedReplay(seed=0)
        lean.gorila.connect(replays={DEFAULT_MODULE_ID: replay}, weights=None)
        lean_results = lean.train_from_replay(10, timesteps)

        reference_replay, reference_priorities, reference_results = ScriptedReplay(seed=0), [], []
        for _ in range(10):
            sample = reference_replay.sample(32, beta=0.0)
            batch = replay_rows_to_batch(sample.batch, sample.weights)
            results = reference.update(
                batch=MultiAgentBatch({DEFAULT_MODULE_ID: batch}, env_steps=32),
                timesteps=timesteps,
            )
            reference_priorities.append(reference._last_td_error[DEFAULT_MODULE_ID].abs())
            reference_results.append(results)
        assert min(r[DEFAULT_MODULE_ID][NORM].peek() for r in reference_results) > 0.1  # clipped

        lean_state, reference_state = lean_module.get_state(), reference_module.get_state()
        for name in reference_state:
            torch.testing.assert_close(
                torch.as_tensor(lean_state[name]), torch.as_tensor(reference_state[name])
            )
        assert len(replay.priorities) == 10
        for (_, sent), expected in zip(replay.priorities, reference_priorities, strict=True):
            np.testing.assert_allclose(sent, expected.detach().numpy(), rtol=1e-5, atol=1e-6)
        for key in (NUM_ENV_STEPS_TRAINED_LIFETIME, NUM_MODULE_STEPS_TRAINED_LIFETIME):
            reference_count = sum(r[ALL_MODULES][key].peek() for r in reference_results)
            assert lean_results[ALL_MODULES][key].peek() == reference_count == 320, key
        assert lean_results[DEFAULT_MODULE_ID][NORM].peek() > 0.1

        obs = torch.as_tensor(sample.batch["obs"])
        out = lean_module.forward_train({Columns.OBS: obs, Columns.NEXT_OBS: obs})
        assert out[QF_PREDS].requires_grad
        assert not out[QF_NEXT_PREDS].requires_grad
        assert not out[QF_TARGET_NEXT_PREDS].requires_grad
        torch.testing.assert_close(out[QF_NEXT_PREDS], out[QF_PREDS].detach())
    finally:
        lean.shutdown()
        reference.shutdown()


@pytest.mark.parametrize("loss_type", ["huber", "mse"])
def test_learner_loss_is_the_core_double_dqn_loss_with_weights(algo, loss_type):
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.core.columns import Columns

    from rl_dist_ext.ops.dqn import double_dqn_loss
    from rllib_plugins.gorila_learner import DISCOUNTS, WEIGHTS

    learner = algo.learner_group._learner
    module = learner.module[DEFAULT_MODULE_ID]
    config = learner.config.copy(copy_frozen=False).training(td_error_loss_fn=loss_type)
    rng = np.random.default_rng(0)
    batch = {
        Columns.OBS: torch.as_tensor(rng.standard_normal((16, 4)), dtype=torch.float32),
        Columns.NEXT_OBS: torch.as_tensor(rng.standard_normal((16, 4)), dtype=torch.float32),
        Columns.ACTIONS: torch.as_tensor(rng.integers(0, 2, 16)),
        Columns.REWARDS: torch.as_tensor(rng.standard_normal(16), dtype=torch.float32),
        DISCOUNTS: torch.as_tensor(rng.choice([0.0, 0.97], 16), dtype=torch.float32),
        WEIGHTS: torch.as_tensor(rng.uniform(0.1, 1.0, 16), dtype=torch.float32),
    }
    fwd_out = module.forward_train(batch)
    loss = learner.compute_loss_for_module(
        module_id=DEFAULT_MODULE_ID, config=config, batch=batch, fwd_out=fwd_out
    )
    from ray.rllib.algorithms.dqn.dqn_learner import (
        QF_NEXT_PREDS,
        QF_PREDS,
        QF_TARGET_NEXT_PREDS,
    )

    direct = double_dqn_loss(
        q_online_t=fwd_out[QF_PREDS],
        actions=batch[Columns.ACTIONS],
        rewards=batch[Columns.REWARDS],
        discounts=batch[DISCOUNTS],
        q_online_tp1=fwd_out[QF_NEXT_PREDS],
        q_target_tp1=fwd_out[QF_TARGET_NEXT_PREDS],
        weights=batch[WEIGHTS],
        loss_type=loss_type,
    )
    torch.testing.assert_close(loss, direct.loss)
    unweighted = double_dqn_loss(
        q_online_t=fwd_out[QF_PREDS],
        actions=batch[Columns.ACTIONS],
        rewards=batch[Columns.REWARDS],
        discounts=batch[DISCOUNTS],
        q_online_tp1=fwd_out[QF_NEXT_PREDS],
        q_target_tp1=fwd_out[QF_TARGET_NEXT_PREDS],
        loss_type=loss_type,
    )
    assert not torch.allclose(loss, unweighted.loss)  # the weights are applied on this path


def test_learner_in_its_own_actor_samples_every_shard_and_survives_a_killed_shard(
    ray_session, tmp_path
):
    """num_learners=1: the learner actor samples the replay and publishes weights itself (the
    layout a GPU learner uses; here on CPU). Its replay client was unpickled in that actor: it
    must still sample every shard, and go on when a shard is killed (restarted from its
    snapshot; the failure is reported). Its updates are fused 4 to a ``Learner.update`` call,
    and its target is GorilaDQN's default (``tau=None`` with C = 1: a Polyak mix after every
    update, ``tau`` picked inside the actor)."""
    algorithm = (
        small_config(runners=1, updates_per_learner_call=4, target_update_every_n_updates=1)
        .learners(num_learners=1, num_cpus_per_learner=0.3)
        .replay(
            num_shards=4,
            num_cpus_per_shard=0.05,
            snapshot_dir=str(tmp_path / "snapshots"),
            snapshot_every_inserts=500,
        )
        .build_algo()
    )
    try:
        versions = []
        # A shard is sampled once it holds its share of min_size_to_sample; on a loaded
        # machine that can take a few more iterations than three.
        for i in range(8):
            result = algorithm.train()
            versions.append(result["gorila"]["learner_weights_version"])
            sampled = [status.num_sampled for status in algorithm.replay().refresh()]
            if i >= 2 and all(n > 0 for n in sampled):
                break
        # Versions count gradient updates: 0 until the replay first holds enough rows.
        assert versions[-1] > versions[0] >= 0
        assert result["learners"]["__all_modules__"]["num_gradient_updates"] > 0
        # the default target moved after every gradient update (versions count them)
        assert result["learners"]["default_policy"]["num_target_updates"] == versions[-1]
        # Every runner acts with weights the learner actor published after the first ones.
        assert 0 <= result["gorila"]["policy_lag_max"] < versions[-1] - 1
        assert all(n > 0 for n in sampled), sampled

        ray.kill(algorithm.replay().handles[0], no_restart=False)
        inserted_before = algorithm.replay().stats(wait=True)["num_inserted"]
        updates_before = result["learners"]["__all_modules__"]["num_gradient_updates"]
        failures = 0
        for _ in range(6):
            result = algorithm.train()
            failures = max(failures, result["gorila"]["replay_shard_failures"])
        stats = algorithm.replay().stats(wait=True)
        assert stats["shards_alive"] == 4
        assert stats["num_inserted"] > inserted_before  # acting and learning went on
        # The learner's client saw the failure (a failed call or a restarted incarnation).
        assert failures >= 1 or stats["items_lost"] > 0
        assert result["learners"]["__all_modules__"]["num_gradient_updates"] > updates_before
    finally:
        algorithm.stop()
