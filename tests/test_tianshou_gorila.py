"""Tianshou adapter: GorilaDQN's loss and target updates (no Ray), the distributed buffer behind
Tianshou's buffer API, GorilaCollector's actors, config errors, Tianshou's trainer and logger,
actor failures and checkpoints (one shared 2-CPU Ray session).

The learning test is in test_tianshou_gorila_training.py.
"""

from __future__ import annotations

import functools
import io
import pickle
import threading
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import alive_actor_ids, wait_until_not_alive
from metrics_keys import documented_keys, undocumented
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Batch, Collector, ReplayBuffer
from tianshou.env import DummyVectorEnv
from tianshou.utils.net.common import Net
from tianshou.utils.torch_utils import policy_within_training_step

from rl_dist_ext.exploration import apex_epsilons
from rl_dist_ext.gorila import TRANSITION_COLUMNS
from tianshou_plugins import (
    DistributedPrioritizedReplayBuffer,
    GorilaCollector,
    GorilaCollectStats,
    GorilaDQN,
)

ENV_ID = "CartPole-v1"


# Picklable by reference to gymnasium: the actors cannot import this test module.
make_cartpole = functools.partial(gym.make, ENV_ID)


def make_algo(seed: int = 0, hidden: tuple[int, ...] = (32, 32), **overrides) -> GorilaDQN:
    torch.manual_seed(seed)
    net = Net(state_shape=(4,), action_shape=2, hidden_sizes=list(hidden))
    policy = DiscreteQLearningPolicy(model=net, action_space=gym.spaces.Discrete(2))
    settings = {"gamma": 0.99, "n_step_return_horizon": 3, "target_update_freq": 50}
    settings.update(overrides)
    return GorilaDQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), **settings)


def make_buffer(capacity: int = 4_000, **overrides) -> DistributedPrioritizedReplayBuffer:
    settings = {
        "num_shards": 2,
        "min_size_to_sample": 64,
        "num_cpus_per_shard": 0.05,
        "timeout_s": 30.0,
        "seed": 0,
    }
    settings.update(overrides)
    return DistributedPrioritizedReplayBuffer(capacity, **settings)


def make_collector(algo, buffer, **overrides) -> GorilaCollector:
    settings = {
        "env_factory": make_cartpole,
        "buffer": buffer,
        "num_actors": 2,
        "envs_per_actor": 2,
        "steps_per_env": 16,
        "weight_sync_every_n_steps": 32,
        "num_cpus_per_actor": 0.1,
        "seed": 0,
    }
    settings.update(overrides)
    return GorilaCollector(algo, **settings)


def hand_batch(size: int = 16, seed: int = 0) -> Batch:
    rng = np.random.default_rng(seed)
    return Batch(
        obs=rng.standard_normal((size, 4)).astype(np.float32),
        act=rng.integers(0, 2, size),
        rew=rng.standard_normal(size).astype(np.float32),
        discount=rng.choice([0.0, 0.99**3], size).astype(np.float32),
        obs_next=rng.standard_normal((size, 4)).astype(np.float32),
        weight=rng.uniform(0.1, 1.0, size).astype(np.float32),
    )


def gradient_steps(algo: GorilaDQN, buffer, n: int, batch_size: int = 32) -> None:
    with policy_within_training_step(algo.policy):
        for _ in range(n):
            algo.update(buffer, batch_size)


# ---- GorilaDQN without Ray ----------------------------------------------------------------------
def naive_loss(algo: GorilaDQN, batch: Batch, delta: float | None) -> tuple[torch.Tensor, ...]:
    """Row by row: y = r + discount * Q_target(s', argmax_a Q_online(s', a)); weighted loss.

    Returns the loss, the TD errors and which Huber branches the rows took.
    """
    online, target = algo.policy.model, algo.model_old
    losses, tds, branches = [], [], set()
    with torch.no_grad():
        for i in range(len(batch.act)):
            q_sa = online(batch.obs[i : i + 1])[0][0, int(batch.act[i])]
            q_online_next = online(batch.obs_next[i : i + 1])[0][0]
            q_target_next = target(batch.obs_next[i : i + 1])[0][0]
            a_star = int(q_online_next.argmax()) if algo.is_double else int(q_target_next.argmax())
            y = float(batch.rew[i]) + float(batch.discount[i]) * q_target_next[a_star]
            td = y - q_sa
            if delta is None or abs(td) <= delta:
                loss = 0.5 * td**2
                branches.add("quadratic")
            else:
                loss = delta * (abs(td) - 0.5 * delta)
                branches.add("linear")
            losses.append(float(batch.weight[i]) * loss)
            tds.append(td)
    return torch.stack(losses).mean(), torch.stack(tds), branches


@pytest.mark.parametrize("is_double", [True, False])
@pytest.mark.parametrize("delta", [0.5, None])
def test_compute_loss_matches_naive_weighted_double_dqn(is_double, delta):
    algo = make_algo(huber_loss_delta=delta, is_double=is_double)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # two unrelated random networks: online and target disagree
        for p in [*algo.policy.model.parameters(), *algo.model_old.parameters()]:
            p.copy_(0.3 * torch.randn(p.shape, generator=generator))
    batch = hand_batch()
    with torch.no_grad():
        online_pick = algo.policy.model(torch.as_tensor(batch.obs_next))[0].argmax(1)
        target_pick = algo.model_old(torch.as_tensor(batch.obs_next))[0].argmax(1)
    assert (online_pick != target_pick).any(), "the batch must tell double DQN from plain DQN"

    out = algo.compute_loss(batch)
    expected_loss, expected_td, branches = naive_loss(algo, batch, delta)
    torch.testing.assert_close(out.loss, expected_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.td_error, expected_td, rtol=1e-5, atol=1e-6)
    if delta is not None:
        assert branches == {"quadratic", "linear"}  # both Huber branches are exercised
    # The importance weights are applied on this path (Tianshou's DQN drops them under Huber).
    unweighted = algo.compute_loss(Batch({**batch, "weight": np.ones_like(batch.weight)}))
    assert not torch.allclose(out.loss, unweighted.loss)


def test_target_network_is_hard_updated_every_target_update_freq_steps():
    algo = make_algo(target_update_freq=3)
    batch = hand_batch(seed=1)

    def online_params():
        return [p.detach().clone() for p in algo.policy.model.parameters()]

    def target_params():
        return [p.detach().clone() for p in algo.model_old.parameters()]

    after_step = {0: online_params()}
    with policy_within_training_step(algo.policy):
        for step in range(1, 9):
            algo._update_with_batch(batch)
            after_step[step] = online_params()
            synced_at = (step // 3) * 3  # the core step syncs after gradient updates 3, 6
            for target, online in zip(target_params(), after_step[synced_at], strict=True):
                torch.testing.assert_close(target, online, rtol=0, atol=0)
            assert (step % 3 == 0) == all(
                torch.equal(t, o) for t, o in zip(target_params(), online_params(), strict=True)
            )
    assert algo.num_gradient_updates == 8


@pytest.mark.parametrize(
    ("settings", "tau"),
    [
        ({"target_update_freq": 1}, 0.008),  # tau None and a period of 1: Polyak's 0.008
        ({"target_update_freq": 1, "tau": 0.1}, 0.1),
        ({"target_update_freq": 2, "tau": 0.5}, 0.5),  # a tau given mixes every C updates
    ],
)
def test_target_network_mixes_in_tau_of_the_online_network(settings, tau):
    """Naive reference: at each target update, every target entry becomes ``tau * online + (1
    - tau) * target`` from the values just before it; between updates it stays."""
    algo = make_algo(**settings)
    every = settings["target_update_freq"]

    def entries(module) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in module.state_dict().items()}

    online = algo.policy.model
    target = entries(algo.model_old.module)
    with policy_within_training_step(algo.policy):
        for step in range(1, 7):
            algo._update_with_batch(hand_batch(seed=step))
            if step % every == 0:
                after = entries(online)
                target = {k: tau * after[k] + (1 - tau) * v for k, v in target.items()}
            for key, value in entries(algo.model_old.module).items():
                torch.testing.assert_close(value, target[key], rtol=1e-6, atol=1e-7)
    moved = entries(online)
    assert any(not torch.allclose(target[k], moved[k]) for k in target), "a mix, not a copy"


def test_state_dict_round_trips_counters_and_optimizer():
    algo = make_algo(seed=0, target_update_freq=4)
    with policy_within_training_step(algo.policy):
        for i in range(5):
            algo._update_with_batch(hand_batch(seed=i))
    data = io.BytesIO()
    torch.save(algo.state_dict(), data)
    data.seek(0)

    restored = make_algo(seed=1, target_update_freq=4)
    restored.load_state_dict(torch.load(data))
    assert restored.num_gradient_updates == 5
    for key, value in algo.policy.state_dict().items():
        torch.testing.assert_close(restored.policy.state_dict()[key], value)
    # the target network too (synced at update 4, so not the online one of update 5): a Polyak
    # target cannot be rebuilt from the online weights
    for key, value in algo.model_old.state_dict().items():
        torch.testing.assert_close(restored.model_old.state_dict()[key], value)
    assert not all(
        torch.equal(t, o)
        for t, o in zip(algo.model_old.parameters(), algo.policy.model.parameters(), strict=True)
    )
    saved_optim, loaded_optim = algo.optim.state_dict(), restored.optim.state_dict()
    assert saved_optim["state"].keys() == loaded_optim["state"].keys() != set()
    for key, state in saved_optim["state"].items():
        torch.testing.assert_close(loaded_optim["state"][key]["exp_avg"], state["exp_avg"])
        torch.testing.assert_close(loaded_optim["state"][key]["step"], state["step"])
    # Restored weights are a new weights version (one past the saved 5), and the restored
    # counters drive the next target update and version.
    assert restored.weights_version == 6
    with policy_within_training_step(restored.policy):
        restored._update_with_batch(hand_batch(seed=9))
    assert restored.weights_version == 7
    assert restored.num_gradient_updates == 6


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"gamma": 1.5}, ValueError, "gamma"),
        ({"gamma": -0.1}, ValueError, "gamma"),
        ({"n_step_return_horizon": 0}, ValueError, "n_step_return_horizon"),
        ({"target_update_freq": 0}, ValueError, "target_update_freq"),
        ({"huber_loss_delta": 0.0}, ValueError, "huber_loss_delta"),
        ({"huber_loss_delta": -1.0}, ValueError, "huber_loss_delta"),
        ({"tau": 0.0}, ValueError, "tau"),
        ({"tau": 1.5}, ValueError, "tau"),
        ({"tau": "0.5"}, ValueError, "tau"),
        ({"tau": True}, ValueError, "tau"),
    ],
)
def test_bad_algorithm_settings_raise(overrides, error, match):
    with pytest.raises(error, match=match):
        make_algo(**overrides)


def test_non_discrete_or_foreign_policy_raises():
    box = gym.spaces.Box(-1.0, 1.0, (1,))
    policy = DiscreteQLearningPolicy(model=Net(state_shape=(4,), action_shape=1), action_space=box)
    with pytest.raises(TypeError, match="Discrete action space"):
        GorilaDQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3))
    with pytest.raises(TypeError, match="policy"):
        GorilaDQN(policy=object(), optim=AdamOptimizerFactory(lr=1e-3))


def test_update_needs_the_distributed_buffer_and_a_training_step():
    algo = make_algo()
    with policy_within_training_step(algo.policy), pytest.raises(TypeError, match="buffer"):
        algo.update(ReplayBuffer(10), 4)
    with pytest.raises(RuntimeError, match="training step"):
        algo.update(make_buffer(), 4)


# ---- the buffer without starting it -------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"num_shards": 0}, "num_shards"),
        ({"beta": 1.5}, "beta"),
        ({"alpha": -0.5}, "alpha"),
        ({"capacity": 100, "min_size_to_sample": 1_000}, "min_size_to_sample"),
        ({"num_cpus_per_shard": -1.0}, "num_cpus_per_shard"),
    ],
)
def test_bad_buffer_settings_raise(overrides, match):
    with pytest.raises(ValueError, match=match):
        make_buffer(**overrides)


def test_unstarted_buffer_is_empty_and_does_not_pickle():
    buffer = make_buffer()
    assert not buffer.started
    assert len(buffer) == 0
    assert buffer.stats(wait=True)["size"] == 0
    assert buffer.maxsize == 4_000
    with pytest.raises(TypeError, match="save"):
        pickle.dumps(buffer)
    with pytest.raises(RuntimeError, match="start"):
        buffer.sample(8)
    with pytest.raises(ValueError, match="beta"):
        buffer.set_beta(-0.1)


# ---- Ray: the buffer's API ----------------------------------------------------------------------
@pytest.fixture
def started_buffer(cluster, request):
    buffers: list[DistributedPrioritizedReplayBuffer] = []

    def start(**overrides) -> DistributedPrioritizedReplayBuffer:
        buffer = make_buffer(**{"capacity": 256, "min_size_to_sample": 8, **overrides})
        buffers.append(buffer)
        buffer.start()
        return buffer

    request.addfinalizer(lambda: [b.close() for b in buffers])
    return start


def transitions(n: int) -> dict[str, np.ndarray]:
    """Rows whose first obs entry is their row number (rew = id, next obs = obs + 1)."""
    ids = np.arange(n)
    obs = np.repeat(ids[:, None], 4, axis=1).astype(np.float32)
    columns = (obs, ids % 2, ids.astype(np.float32), np.full(n, 0.5, np.float32), obs + 1)
    return dict(zip(TRANSITION_COLUMNS, columns, strict=True))


def test_buffer_round_trip_through_tianshou_api(started_buffer, tmp_path):
    # one batch per replay round trip: each update_weight goes out at once (the default, 4,
    # gathers the priorities of 4 batches)
    buffer = started_buffer(batches_per_request=1)
    buffer.client.add(transitions(64), np.full(64, 1e-3))
    buffer.client.flush()
    assert len(buffer) == 64
    assert not buffer.hasnull()

    batch, keys = buffer.sample(16)
    assert isinstance(batch, Batch)
    assert set(batch.keys()) == {"obs", "act", "rew", "discount", "obs_next", "weight"}
    assert keys.shape == (16,) and keys.dtype.kind in "iu"
    ids = batch.obs[:, 0].astype(int)
    np.testing.assert_array_equal(batch.act, ids % 2)
    np.testing.assert_array_equal(batch.rew, ids)
    np.testing.assert_array_equal(batch.obs_next, batch.obs + 1)
    np.testing.assert_array_equal(batch.discount, 0.5)
    assert np.all((batch.weight > 0) & (batch.weight <= 1))

    # One huge |TD error| (sign dropped) makes that row come back most of the time.
    favourite = int(ids[0])
    buffer.update_weight(keys[:1], torch.tensor([-1e6]))
    buffer.client.flush()
    drawn = []
    for _ in range(10):  # the first `prefetch` batches were drawn before the update
        batch, _ = buffer.sample(16)
        drawn += batch.obs[:, 0].astype(int).tolist()
    assert drawn.count(favourite) > len(drawn) / 2, drawn
    # Its importance weight is tiny: (p_min / p) ** beta with p / p_min ~ 10 ** (9 * alpha).
    assert batch.weight[batch.obs[:, 0] == favourite].max() < 0.1
    assert batch.weight[batch.obs[:, 0] != favourite].min(initial=1.0) == pytest.approx(1.0)

    # save() then restore() into a fresh buffer keeps every row.
    buffer.save(str(tmp_path / "replay"))
    copy = started_buffer()
    copy.restore(str(tmp_path / "replay"))
    assert len(copy) == 64
    assert set(copy.sample(32)[0].obs[:, 0].astype(int)) <= set(range(64))

    # reset() empties it; keys sampled before are stale and do not touch new rows.
    buffer.reset()
    assert len(buffer) == 0
    buffer.client.add(transitions(64), np.full(64, 1e-3))
    buffer.update_weight(keys, np.full(16, 1e6))
    buffer.client.flush()
    assert buffer.stats(wait=True)["stale_updates"] >= 16
    assert len(buffer) == 64
    assert buffer.stats(wait=True)["size"] == 64


def test_restore_into_a_different_layout_raises(started_buffer, tmp_path):
    buffer = started_buffer()
    buffer.client.add(transitions(16))
    buffer.save(str(tmp_path / "replay"))
    other = started_buffer(capacity=512)
    with pytest.raises(ValueError, match="capacity"):
        other.restore(str(tmp_path / "replay"))


# ---- Ray: the collector -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gorila(cluster, tmp_path_factory):
    """One algorithm, replay and 2x2-env collector shared by the collector and trainer tests
    and, last, the chaos run (its replay snapshots and keeps a row ledger for that)."""
    algo = make_algo()
    directory = tmp_path_factory.mktemp("gorila")
    buffer = make_buffer(**chaos_replay_settings(directory))
    collector = None
    try:
        # delta weight pulls, so that the collector, trainer and chaos tests run them too
        collector = make_collector(algo, buffer, weights_encoding="delta")
        yield SimpleNamespace(
            algo=algo, buffer=buffer, collector=collector, ledger=str(directory / "ledger")
        )
    finally:
        if collector is not None:
            collector.close()
        buffer.close()


def chaos_replay_settings(directory) -> dict:
    """What a chaos run needs of its replay: snapshots, a row ledger, quick retries."""
    return {
        "snapshot_dir": str(directory / "snapshots"),
        "snapshot_every_inserts": 200,
        "row_ledger_dir": str(directory / "ledger"),
        "retry_down_shard_after_s": 0.5,
        "timeout_s": 20.0,
    }


def test_collector_reports_actors_replay_and_policy_lag(gorila):
    algo, buffer, collector = gorila.algo, gorila.buffer, gorila.collector
    assert collector.env_num == 4
    np.testing.assert_allclose(collector.epsilons, apex_epsilons(2, 0.4, 7.0))
    obs, _ = collector.reset_env()
    assert obs.shape == (4, 4)

    stats = collector.collect(n_step=100)
    assert isinstance(stats, GorilaCollectStats)
    assert stats.n_collected_steps >= 100
    assert len(buffer) >= 64  # the first collect() waits until the replay can be sampled
    assert stats.replay["size"] >= 64 and stats.replay["shards_alive"] == 2
    assert stats.actors["num_actors"] == 2
    assert stats.actors["failures"] == stats.actors["rollouts_lost"] == 0
    assert stats.actors["epsilon/actor_0"] == pytest.approx(0.4)
    assert stats.actors["epsilon/actor_1"] == pytest.approx(0.4**8)
    assert stats.weights_version == 0
    assert stats.policy_lag_mean == stats.policy_lag_max == 0

    gradient_steps(algo, buffer, 10)
    lag_max = []
    for _ in range(30):  # queued rollouts used older weights; later ones the new ones
        stats = collector.collect(n_step=32)
        assert stats.weights_version == algo.num_gradient_updates == 10
        assert 0 <= stats.policy_lag_mean <= stats.policy_lag_max <= 10
        lag_max.append(stats.policy_lag_max)
        if stats.policy_lag_max == 0:
            break
    assert lag_max[-1] == 0, f"the actors never pulled the new weights: {lag_max}"
    # the module collector pulls deltas: each actor's first pull was full, later ones deltas
    # (or full where a delta would be larger)
    import ray

    pulls = ray.get(collector.env.weights_server.handle.stats.remote())
    assert pulls["num_full_pulls"] >= 2 and pulls["num_delta_pulls"] >= 1, pulls

    stats = collector.collect(n_episode=4)
    assert stats.n_collected_episodes >= 4 and len(stats.returns) == stats.n_collected_episodes
    with pytest.raises(ValueError, match="random"):
        collector.collect(n_step=32, random=True)


class DictObsEnv(gym.Env):
    action_space = gym.spaces.Discrete(2)
    observation_space = gym.spaces.Dict({"x": gym.spaces.Box(-1.0, 1.0, (4,))})


def broken_factory() -> gym.Env:
    raise RuntimeError("no such simulator")


def factory_holding_a_lock():
    lock = threading.Lock()
    return lambda: (lock, make_cartpole())[1]


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"env_factory": broken_factory}, ValueError, "env_factory failed"),
        ({"env_factory": lambda: gym.make("Pendulum-v1")}, TypeError, "Discrete action space"),
        ({"env_factory": lambda: gym.make("Acrobot-v1")}, ValueError, "3 actions"),
        ({"env_factory": DictObsEnv}, TypeError, "Box observation space"),
        ({"env_factory": factory_holding_a_lock()}, TypeError, "picklable"),
        ({"num_actors": 0}, ValueError, "num_actors"),
        ({"num_actorz": 2}, TypeError, "ActorFleet has no setting 'num_actorz'"),
        ({"fleet": {"num_actors": 2}}, TypeError, "fleet must be an ActorFleet"),
        ({"buffer": ReplayBuffer(100)}, TypeError, "buffer"),
    ],
)
def test_collector_config_errors_raise_before_ray_starts(overrides, error, match):
    # a fast test: the tier guard (tests/tiers.py) fails it if anything starts a process
    buffer = make_buffer()
    with pytest.raises(error, match=match):
        make_collector(make_algo(), buffer, **overrides)
    assert not buffer.started


def test_collector_takes_the_algorithm_not_a_bare_policy():
    """The actors' weights are versioned by the algorithm's gradient updates (one meaning of
    "weights version"); a bare policy has none."""
    with pytest.raises(TypeError, match="GorilaDQN or MultiAgentGorilaDQN"):
        make_collector(make_algo().policy, make_buffer())


def test_collector_resource_ask_raises_before_any_actor_starts(cluster):
    buffer = make_buffer()
    before = alive_actor_ids()
    with pytest.raises(ValueError, match="CPUs"):
        make_collector(make_algo(), buffer, num_cpus_per_actor=8.0)
    assert not buffer.started
    assert alive_actor_ids() <= before


# ---- Ray: Tianshou's trainer and logger ---------------------------------------------------------
def test_offpolicy_trainer_runs_and_logs_gorila_fields(gorila, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tianshou.trainer import OffPolicyTrainerParams
    from tianshou.utils import TensorboardLogger
    from torch.utils.tensorboard import SummaryWriter

    algo = gorila.algo
    updates_before = algo.num_gradient_updates
    logger = TensorboardLogger(
        SummaryWriter(str(tmp_path / "tb")), training_interval=1, update_interval=1
    )
    test_envs = DummyVectorEnv([make_cartpole])
    test_envs.seed(100)
    try:
        result = algo.run_training(
            OffPolicyTrainerParams(
                training_collector=gorila.collector,
                test_collector=Collector(algo.policy, test_envs),
                max_epochs=1,
                epoch_num_steps=512,
                collection_step_num_env_steps=128,
                update_step_num_gradient_steps_per_sample=0.125,
                batch_size=32,
                test_step_num_episodes=1,
                logger=logger,
                show_progress=False,
            )
        )
    finally:
        logger.finalize()
        test_envs.close()
    assert result.train_step >= 512
    assert algo.num_gradient_updates - updates_before >= 512 * 0.125

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = events.Tags()["scalars"]
    for wanted in ("policy_lag_mean", "replay/size", "actors/rollouts_lost", "epsilon/actor_0"):
        assert any(wanted in tag for tag in tags), (wanted, tags)
    epsilon_tag = next(tag for tag in tags if tag.endswith("epsilon/actor_0"))
    epsilons = [e.value for e in events.Scalars(epsilon_tag)]
    assert len(epsilons) >= 2 and np.allclose(epsilons, 0.4)
    size_tag = next(tag for tag in tags if tag.endswith("replay/size"))
    assert max(e.value for e in events.Scalars(size_tag)) >= 64
    # docs/metrics.md lists every key the logger wrote for the collector and the algorithm
    logged: dict[str, set[str]] = {"training": set(), "update": set()}
    for tag in tags:
        kind, _, key = tag.partition("/")
        if kind in logged and key not in ("env_step", "update_step"):  # the logger's x axes
            logged[kind].add(key)
    collect_keys = documented_keys("Tianshou ActorCollectStats") | documented_keys(
        "Tianshou GorilaCollectStats"
    )
    assert logged["training"] and not undocumented(logged["training"], collect_keys)
    training_keys = documented_keys("Tianshou GorilaTrainingStats")
    assert logged["update"] and not undocumented(logged["update"], training_keys)


def test_trainer_asking_more_updates_than_the_rate_limiter_allows_keeps_the_actors_acting(cluster):
    """A rate-limited buffer (Ape-X's samples_per_insert) under Tianshou's trainer asking for
    more gradient steps per collect than the inserted rows pay for: while the learner waits on
    the rate limiter the collector keeps its actors acting, so the update step goes on instead
    of timing out (it waited on actors that were idle until the next collect())."""
    from tianshou.trainer import OffPolicyTrainerParams

    algo = make_algo()
    buffer = make_buffer(
        num_shards=1,
        min_size_to_sample=128,
        samples_per_insert=4.0,
        error_buffer=256.0,  # the learner may run 256 sampled rows ahead of the ratio
        timeout_s=15.0,
    )
    collector = make_collector(algo, buffer, num_actors=1, max_in_flight_per_actor=1)
    try:
        result = algo.run_training(
            OffPolicyTrainerParams(
                training_collector=collector,
                max_epochs=1,
                epoch_num_steps=128,
                collection_step_num_env_steps=64,
                update_step_num_gradient_steps_per_sample=0.5,  # 16 rows per inserted row
                batch_size=32,
                test_step_num_episodes=0,
                show_progress=False,
            )
        )
        stats = buffer.stats(wait=True)
        # Acting paused (as the race clock does for a test), then more gradient steps than
        # the inserted rows pay for: the learner's wait on the rate limiter resumes acting
        # instead of timing out on actors that stay paused.
        collector.pause_acting()
        inserted = buffer.stats(wait=True)["num_inserted"]
        gradient_steps(algo, buffer, 32)
        after_pause = buffer.stats(wait=True)
    finally:
        collector.close()
        buffer.close()
    assert result.train_step >= 128
    assert after_pause["num_inserted"] > inserted
    assert after_pause["num_sampled"] <= 4.0 * after_pause["num_inserted"]
    assert stats["num_sampled"] >= 128 * 0.5 * 32  # every gradient step the trainer asked for
    # ... within the ratio: the actors inserted a row for every 4 the learner sampled
    assert stats["num_sampled"] <= 4.0 * stats["num_inserted"]


# ---- Ray: faults and checkpoints ----------------------------------------------------------------
# A killed actor's restart (the lost rollout counted, the restarted actor acting with weights
# it pulled, the learner training on) is tested on pixels, where the actor's constructor
# arguments are largest: tests/test_pixels.py::test_tianshou_gorila_trains_on_pixels_*[atari].


def test_checkpoint_restores_weights_counters_and_replay_and_reaches_the_actors(cluster, tmp_path):
    from tianshou_plugins.weights import cpu_state_dict

    algo = make_algo(seed=0)
    with make_buffer() as buffer:
        collector = make_collector(algo, buffer, num_actors=1)
        try:
            for _ in range(3):
                collector.collect(n_step=64)
                gradient_steps(algo, buffer, 8)
        finally:
            handles = collector._actor_pool.handles
            collector.close()
        # Rollouts the actors sent before they died may still land: wait until they are gone.
        assert not wait_until_not_alive({h._actor_id.hex() for h in handles})
        buffer.client.flush()
        torch.save(algo.state_dict(), tmp_path / "algo.pt")
        buffer.save(str(tmp_path / "replay"))
        saved_len = len(buffer)
    assert saved_len >= 64 and algo.num_gradient_updates == 24

    restored = make_algo(seed=1)
    restored.load_state_dict(torch.load(tmp_path / "algo.pt"))
    assert restored.num_gradient_updates == 24
    for key, value in algo.state_dict().items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(restored.state_dict()[key], value)
    with make_buffer() as new_buffer:
        new_buffer.restore(str(tmp_path / "replay"))
        assert len(new_buffer) == saved_len
        inserted = new_buffer.stats(wait=True)["num_inserted"]
        collector = make_collector(restored, new_buffer, num_actors=1)
        try:
            stats = collector.collect(n_step=64)
            # The actors act with the restored weights, published as a new version.
            assert stats.weights_version == 25
            gradient_steps(restored, new_buffer, 8)
            assert restored.num_gradient_updates == 32
            version_before = collector.collect(n_step=64).weights_version
            assert version_before == 33
            assert new_buffer.stats(wait=True)["num_inserted"] > inserted

            # Loading an older state into the running algorithm: the restored weights get a
            # version newer than any published, so the collector publishes them and every
            # actor pulls them.
            restored.load_state_dict(torch.load(tmp_path / "algo.pt"))
            for _ in range(10):  # actors pull every 32 steps: each rollout is 32 steps
                stats = collector.collect(n_step=64)
                if stats.policy_lag_max == 0:
                    break
            assert stats.weights_version > version_before
            assert stats.policy_lag_max == 0  # every actor acts with the restored version
            held = collector.env.weights_server.pull_if_newer(-1)
            assert held.version == stats.weights_version
            for key, value in cpu_state_dict(algo.policy).items():
                torch.testing.assert_close(held.weights[key], value)
        finally:
            collector.close()


# ---- Ray: SEED mode (central inference) ---------------------------------------------------------
def test_seed_mode_actors_act_on_server_q_values_with_their_own_epsilon(cluster):
    from tianshou_plugins import CentralInference

    algo = make_algo()
    with make_buffer() as buffer:
        collector = make_collector(algo, buffer, central_inference=CentralInference(num_cpus=0.1))
        try:
            assert collector.env.weights_server is None  # the actors hold no weights
            stats = collector.collect(n_step=100)
            assert stats.n_collected_steps >= 100 and len(buffer) >= 64
            assert stats.inference["requests_per_s"] > 0 and stats.inference["version"] == 0
            assert stats.actors["epsilon/actor_1"] == pytest.approx(0.4**8)
            gradient_steps(algo, buffer, 5)
            for _ in range(30):
                stats = collector.collect(n_step=32)
                if stats.policy_lag_max == 0:
                    break
            assert stats.policy_lag_max == 0 and stats.inference["version"] == 5
        finally:
            collector.close()


# ---- Ray: chaos ---------------------------------------------------------------------------------
def run_chaos(algo, buffer, collector, ledger: str, *, rounds: int, central: bool) -> None:
    """Replay shards, actors and the weights server (SEED mode: the inference server) are
    killed at seeded random times while collect() and gradient steps alternate, each once per
    round. Training goes on, no collect() or step waits without bound, every component comes
    back, and every row is accounted for: the shards' acknowledged rows are stored, evicted or
    lost with a shard; the rows the actors sent and never saw acknowledged are dropped in
    transit. The actors are gone afterwards."""
    import time

    import ray
    from chaos import Chaos, assert_every_row_accounted_for

    server = "inference server" if central else "weights server"
    chaos = Chaos(
        {
            "shard": lambda: buffer.client.handles,
            "actor": lambda: collector._actor_pool.handles,
            server: lambda: [
                collector.env.inference.handle if central else collector.env.weights_server.handle
            ],
        },
        seed=1,
        rounds=rounds,
    )
    longest = 0.0

    def train_step():
        nonlocal longest
        started = time.monotonic()
        stats = collector.collect(n_step=64)
        gradient_steps(algo, buffer, 4)
        longest = max(longest, time.monotonic() - started)
        return stats

    failures_before = collector.collect(n_step=64).actors["failures"]
    while not chaos.done:
        train_step()
        chaos.step()
    updates_at_last_kill = algo.num_gradient_updates
    deadline = time.monotonic() + 120
    while True:
        stats = train_step()
        if (
            stats.actors["down"] == 0
            and buffer.stats(wait=True)["shards_alive"] == 2
            and stats.policy_lag_max <= 8
            and algo.num_gradient_updates > updates_at_last_kill + 40
        ):
            break
        assert time.monotonic() < deadline, (chaos.kills, stats.actors)
    assert longest < 60.0, (longest, chaos.kills)  # nothing waited without bound
    assert {kill.kind for kill in chaos.kills} == set(chaos.targets)
    assert buffer.stats()["shard_failures"] >= rounds
    assert stats.actors["failures"] >= failures_before + rounds
    for handle in collector._actor_pool.handles:  # the end: what was in flight is dropped
        ray.kill(handle, no_restart=True)
    assert_every_row_accounted_for(ledger, buffer.client)


def test_chaos_run_on_the_module_collector(gorila):
    """Last of the module's collector tests (it leaves no actor running): one round of
    kills, about a minute (make test-long runs ten rounds in both modes, about three minutes
    each, below)."""
    run_chaos(gorila.algo, gorila.buffer, gorila.collector, gorila.ledger, rounds=1, central=False)


@pytest.mark.long
@pytest.mark.parametrize("central", [False, True], ids=["local", "seed"])
def test_chaos_run_of_ten_rounds(cluster, tmp_path, central):
    from tianshou_plugins import CentralInference

    algo = make_algo()
    buffer = make_buffer(capacity=3_000, **chaos_replay_settings(tmp_path))
    collector = None
    try:
        collector = make_collector(
            algo, buffer, central_inference=CentralInference(num_cpus=0.1) if central else None
        )
        run_chaos(algo, buffer, collector, str(tmp_path / "ledger"), rounds=10, central=central)
    finally:
        if collector is not None:
            collector.close()
        buffer.close()
