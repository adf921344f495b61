"""Tianshou adapter: the V-trace algorithm (no Ray), VTraceCollector's asynchronous trajectory
actors, Tianshou's on-policy trainer and logger, a killed actor, checkpoints and config errors
(one shared 2-CPU Ray session).

The loss equality with the RLlib learner is in test_shared_loss_adapters.py, the learning test
in test_tianshou_vtrace_training.py.
"""

from __future__ import annotations

import functools
import time
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import alive_actor_ids, wait_until_not_alive
from tianshou.algorithm.modelfree.reinforce import ProbabilisticActorPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Batch, Collector, VectorReplayBuffer
from tianshou.env import DummyVectorEnv
from tianshou.utils.net.common import Net
from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic
from tianshou.utils.torch_utils import policy_within_training_step

from rl_dist_ext.impala import Trajectory
from tianshou_plugins import VTrace, VTraceCollector, VTraceCollectStats, categorical_from_logits
from tianshou_plugins.actor import behaviour_log_probs
from tianshou_plugins.vtrace import steps_from_trajectory, trajectory_from_steps

# Picklable by reference to gymnasium: the actors cannot import this test module.
make_cartpole = functools.partial(gym.make, "CartPole-v1")


def make_algo(seed: int = 0, hidden: tuple[int, ...] = (32, 32), lr: float = 1e-3, **overrides):
    torch.manual_seed(seed)
    actor = DiscreteActor(
        preprocess_net=Net(state_shape=4, hidden_sizes=list(hidden)),
        action_shape=2,
        softmax_output=False,
    )
    critic = DiscreteCritic(preprocess_net=Net(state_shape=4, hidden_sizes=list(hidden)))
    policy = ProbabilisticActorPolicy(
        actor=actor,
        dist_fn=categorical_from_logits,
        action_scaling=False,
        action_bound_method=None,
        action_space=gym.spaces.Discrete(2),
        observation_space=gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
        deterministic_eval=True,
    )
    return VTrace(policy=policy, critic=critic, optim=AdamOptimizerFactory(lr=lr), **overrides)


def test_the_mlp_actor_critic_is_a_greedy_categorical_policy_and_a_critic():
    from tianshou_plugins import mlp_actor_critic

    obs_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    torch.manual_seed(0)
    policy, critic = mlp_actor_critic(obs_space, gym.spaces.Discrete(3), hidden_sizes=(16,))
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    logits, _ = policy.actor(obs)
    assert logits.shape == (5, 3) and critic(obs).shape == (5, 1)
    dist = policy.dist_fn(logits)
    torch.testing.assert_close(dist.probs, torch.softmax(logits, dim=-1))  # logits, not probs
    policy.eval()  # tests act greedily: the most likely action
    actions = policy(Batch(obs=obs, info={})).act
    np.testing.assert_array_equal(np.asarray(actions), logits.argmax(-1).numpy())
    with pytest.raises(ValueError, match="mlp_actor_critic needs a Discrete action space"):
        mlp_actor_critic(obs_space, gym.spaces.Box(-1, 1, (2,), np.float32))


def make_collector(algo, **overrides) -> VTraceCollector:
    settings = {
        "env_factory": make_cartpole,
        "num_actors": 2,
        "envs_per_actor": 2,
        "steps_per_env": 8,
        "weight_sync_every_n_steps": 16,
        "num_cpus_per_actor": 0.1,
        "seed": 0,
    }
    settings.update(overrides)
    return VTraceCollector(algo, **settings)


def random_trajectory(seed: int, num_steps: int = 5, num_envs: int = 3) -> Trajectory:
    rng = np.random.default_rng(seed)
    shape = (num_steps, num_envs)
    return Trajectory(
        {
            "obs": rng.normal(size=(*shape, 4)).astype(np.float32),
            "actions": rng.integers(2, size=shape),
            "rewards": rng.normal(size=shape).astype(np.float32),
            "next_obs": rng.normal(size=(*shape, 4)).astype(np.float32),
            "terminated": rng.random(shape) < 0.2,
            "truncated": rng.random(shape) < 0.2,
            "behaviour_logp": np.log(rng.uniform(0.2, 0.8, shape)).astype(np.float32),
        },
        acting_version=float(seed),
    )


def buffer_of(trajectories: list[Trajectory]) -> VectorReplayBuffer:
    rows = sum(t.columns["rewards"].shape[1] for t in trajectories)
    num_steps = trajectories[0].columns["rewards"].shape[0]
    buffer = VectorReplayBuffer(rows * num_steps, rows)
    first = 0
    for trajectory in trajectories:
        num_rows = trajectory.columns["rewards"].shape[1]
        for step in steps_from_trajectory(trajectory, first_row=first):
            buffer.add(step, buffer_ids=np.arange(first, first + num_rows))
        first += num_rows
    return buffer


# ---- no Ray: trajectories through Tianshou's buffer, the update --------------------------------
def test_trajectories_round_trip_through_a_tianshou_buffer_in_any_order():
    trajectories = [random_trajectory(1), random_trajectory(2)]
    buffer = buffer_of(trajectories)
    batch, _ = buffer.sample(0)
    shuffled = batch[np.random.default_rng(0).permutation(len(batch))]
    back = trajectory_from_steps(shuffled)
    for name, column in back.columns.items():
        expected = np.concatenate([t.columns[name] for t in trajectories], axis=1)
        np.testing.assert_array_equal(column, expected.astype(column.dtype), err_msg=name)
    assert back.acting_version == pytest.approx(1.5)


def test_incomplete_or_foreign_buffers_raise():
    batch, _ = buffer_of([random_trajectory(1)]).sample(0)
    with pytest.raises(ValueError, match="incomplete"):
        trajectory_from_steps(batch[1:])
    plain = Batch(obs=np.zeros((3, 4)), act=np.zeros(3), rew=np.zeros(3))
    with pytest.raises(ValueError, match="VTraceCollector"):
        trajectory_from_steps(plain)


def test_update_takes_gradient_steps_by_rows_and_counts_versions():
    algo = make_algo()
    buffer = buffer_of([random_trajectory(1, num_envs=4), random_trajectory(2, num_envs=4)])
    before = {k: v.clone() for k, v in algo.policy.state_dict().items()}
    with policy_within_training_step(algo.policy):
        # 5 real steps per row: batch_size 10 -> 2 rows per gradient step -> 4 steps per pass
        stats = algo.update(buffer, batch_size=10, repeat=2)
    assert stats.gradient_steps == 8 and stats.num_rows == 8
    assert algo.num_gradient_updates == algo.weights_version == 8
    assert np.isfinite([stats.loss, stats.pi_loss, stats.vf_loss, stats.entropy]).all()
    assert any(not torch.equal(before[k], v) for k, v in algo.policy.state_dict().items())
    with policy_within_training_step(algo.policy):
        assert algo.update(buffer, batch_size=None, repeat=1).gradient_steps == 1


def test_advantage_normalization_reaches_the_shared_loss():
    """The same weights and batch: the policy term is the shared loss's with standardized
    advantages; the value and entropy terms are the plain algorithm's."""
    from rl_dist_ext.impala import time_major_batch
    from rl_dist_ext.ops.vtrace_loss import vtrace_actor_critic_loss

    plain = make_algo(seed=3, eps_clip=None)  # compute_loss on a batch: no old log-probs
    normal = make_algo(seed=3, eps_clip=None, advantage_normalization=True)
    batch = plain._tensors(time_major_batch([random_trajectory(4, num_envs=4)]))
    a, b = plain.compute_loss(batch), normal.compute_loss(batch)
    torch.testing.assert_close(a.vf_loss, b.vf_loss)
    torch.testing.assert_close(a.entropy, b.entropy)
    assert abs(a.pi_loss.item() - b.pi_loss.item()) > 1e-4
    logits = normal.policy.actor(batch["obs"].flatten(0, 1), state=None, info={})[0]
    dist = normal.policy.dist_fn(logits)
    shape = batch["mask"].shape
    values = normal.critic(batch["obs"].flatten(0, 1)).reshape(shape)
    expected = vtrace_actor_critic_loss(
        target_log_probs=dist.log_prob(batch["actions"].flatten()).reshape(shape),
        behaviour_log_probs=batch["behaviour_logp"],
        entropy=dist.entropy().reshape(shape),
        values=values,
        bootstrap_value=values[-1].detach(),
        rewards=batch["rewards"],
        discounts=batch["discounts"],
        mask=batch["mask"],
        vf_loss_coeff=0.5,
        entropy_coeff=0.01,
        normalize_advantages=True,
    )
    torch.testing.assert_close(b.pi_loss, expected.pi_loss)


def recorded_steps(algo: VTrace, trajectory, repeat: int) -> list[tuple]:
    """One update of ``repeat`` passes over ``trajectory``; per gradient step: the old log-probs
    it was given, the loss it returned, and the shared loss's inputs on the weights it started
    from (all but the clip's ``ratio_clip``, ``old_log_probs`` and ``targets_for``)."""
    steps = []
    compute_loss = algo.compute_loss

    def recording(batch):  # called before each gradient step, on the weights it starts from
        loss = compute_loss(batch)
        with torch.no_grad():
            now, entropy = algo._log_probs_and_entropy(batch)
            values = algo.critic(batch["obs"].flatten(0, 1)).reshape(now.shape)
        inputs = dict(
            target_log_probs=now,
            behaviour_log_probs=batch["behaviour_logp"],
            entropy=entropy,
            values=values,
            bootstrap_value=values[-1],
            rewards=batch["rewards"],
            discounts=batch["discounts"],
            mask=batch["mask"],
            vf_loss_coeff=algo.vf_coef,
            entropy_coeff=algo.ent_coef,
        )
        steps.append((batch["old_logp"].clone(), loss, inputs))
        return loss

    algo.compute_loss = recording
    with policy_within_training_step(algo.policy):
        algo.update(buffer_of([trajectory]), batch_size=None, repeat=repeat)
    return steps


@pytest.mark.parametrize("targets_for", ["current", "old"])
def test_eps_clip_bounds_every_pass_around_the_policy_the_batch_arrived_to(targets_for):
    """With ``eps_clip`` each gradient step's loss is the shared loss's clipped surrogate, with
    ratios to the log-probs the policy gave the batch before its first step, in every pass
    (the policy moves between passes, those log-probs do not); ``targets_for`` reaches the
    loss (``"old"``: V-trace's targets for that arrival policy, APPO's form)."""
    from rl_dist_ext.impala import time_major_batch
    from rl_dist_ext.ops.vtrace_loss import vtrace_actor_critic_loss

    algo = make_algo(seed=5, lr=1e-2, eps_clip=0.1, clip_around="arrival", targets_for=targets_for)
    trajectory = random_trajectory(6, num_envs=4)
    arrived = algo._tensors(time_major_batch([trajectory]))
    with torch.no_grad():
        arrived_logp = algo._log_probs_and_entropy(arrived)[0]
    steps = recorded_steps(algo, trajectory, repeat=3)
    assert len(steps) == 3
    for old, _, _ in steps:
        torch.testing.assert_close(old, arrived_logp)
    _, loss, inputs = steps[-1]
    now = inputs["target_log_probs"]
    assert not torch.allclose(now, arrived_logp)  # the policy moved between passes
    clip = dict(ratio_clip=0.1, old_log_probs=arrived_logp)
    expected = vtrace_actor_critic_loss(**inputs, **clip, targets_for=targets_for)
    torch.testing.assert_close(loss.pi_loss, expected.pi_loss)
    other = "old" if targets_for == "current" else "current"
    assert not torch.allclose(
        loss.pi_loss, vtrace_actor_critic_loss(**inputs, **clip, targets_for=other).pi_loss
    )
    ratios = (now - arrived_logp).exp()[arrived["mask"].bool()]
    assert ((ratios < 0.9) | (ratios > 1.1)).any()  # by the third pass the clip binds


@pytest.mark.parametrize("targets_for", ["current", "old"])
def test_clip_around_behaviour_takes_the_ratios_to_the_actors_log_probs(targets_for):
    """``clip_around="behaviour"``: every step's ratios are to the behaviour log-probs the
    actors recorded (as RLlib VTrace's ``clip_param``), not to the learner's policy; each step's
    loss is the shared loss with them, V-trace's targets computed for ``targets_for``'s policy
    (``"old"``: the actors' own)."""
    from rl_dist_ext.impala import time_major_batch
    from rl_dist_ext.ops.vtrace_loss import vtrace_actor_critic_loss

    algo = make_algo(seed=5, eps_clip=0.1, clip_around="behaviour", targets_for=targets_for)
    trajectory = random_trajectory(7, num_envs=4)
    behaviour = algo._tensors(time_major_batch([trajectory]))["behaviour_logp"]
    steps = recorded_steps(algo, trajectory, repeat=2)
    assert len(steps) == 2
    for old, loss, inputs in steps:
        torch.testing.assert_close(old, behaviour)
        expected = vtrace_actor_critic_loss(
            **inputs, ratio_clip=0.1, old_log_probs=behaviour, targets_for=targets_for
        )
        torch.testing.assert_close(loss.pi_loss, expected.pi_loss)
        torch.testing.assert_close(loss.vf_loss, expected.vf_loss)


def test_default_loss_is_appos_form_around_the_behaviour_policy_and_no_clip_is_impalas():
    """``VTrace``'s defaults: the clipped surrogate (0.1) around the actors' behaviour policy on
    V-trace's targets for it, the form that kept CartPole's target; ``eps_clip=None`` leaves
    ``clip_around`` and ``targets_for`` to follow it, IMPALA's loss."""
    algo = make_algo()
    assert (algo.eps_clip, algo.clip_around, algo.targets_for) == (0.1, "behaviour", "old")
    plain = make_algo(eps_clip=None)
    assert (plain.eps_clip, plain.clip_around, plain.targets_for) == (None, "arrival", "current")


def test_state_dict_round_trips_the_version_and_moves_it_on():
    algo = make_algo()
    buffer = buffer_of([random_trajectory(1)])
    with policy_within_training_step(algo.policy):
        algo.update(buffer, batch_size=None, repeat=3)
    state = algo.state_dict()
    fresh = make_algo(seed=1)
    fresh.load_state_dict(state)
    assert fresh.num_gradient_updates == 3
    assert fresh.weights_version > 3  # restored weights are a new version
    for key, value in algo.policy.state_dict().items():
        torch.testing.assert_close(fresh.policy.state_dict()[key], value)


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"vf_coef": -1.0}, ValueError, "vf_coef"),
        ({"ent_coef": float("nan")}, ValueError, "ent_coef"),
        ({"gamma": 1.5}, ValueError, "gamma"),
        ({"max_grad_norm": 0.0}, ValueError, "max_grad_norm"),
        ({"clip_rho_threshold": 0.0}, ValueError, "clip_rho_threshold"),
        ({"clip_pg_rho_threshold": -1.0}, ValueError, "clip_pg_rho_threshold"),
        ({"vtrace_lambda": 2.0}, ValueError, "vtrace_lambda"),
        ({"advantage_normalization": "yes"}, TypeError, "advantage_normalization"),
        ({"eps_clip": 0.0}, ValueError, "eps_clip"),
        ({"clip_around": "target"}, ValueError, "clip_around must be 'arrival' or 'behaviour'"),
        (
            {"eps_clip": None, "clip_around": "behaviour"},
            ValueError,
            "clip_around='behaviour' needs eps_clip",
        ),
        ({"targets_for": "target"}, ValueError, "targets_for must be 'current' or 'old'"),
        (
            {"eps_clip": None, "targets_for": "old"},
            ValueError,
            "targets_for='old' needs the clipped surrogate: set eps_clip",
        ),
        ({"critic": "not a network"}, TypeError, "critic"),
    ],
)
def test_bad_algorithm_settings_raise(overrides, error, match):
    algo = make_algo()
    settings = {"policy": algo.policy, "critic": algo.critic, "optim": AdamOptimizerFactory()}
    settings.update(overrides)
    with pytest.raises(error, match=match):
        VTrace(**settings)


def test_a_non_probabilistic_policy_raises():
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy

    policy = DiscreteQLearningPolicy(
        model=Net(state_shape=4, action_shape=2), action_space=gym.spaces.Discrete(2)
    )
    with pytest.raises(TypeError, match="ProbabilisticActorPolicy"):
        VTrace(policy=policy, critic=make_algo().critic, optim=AdamOptimizerFactory())


# ---- Ray: the collector -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vtrace(cluster):
    """One algorithm and 2x2-env collector shared by the collector and trainer tests."""
    algo = make_algo()
    collector = make_collector(algo)
    try:
        yield SimpleNamespace(algo=algo, collector=collector)
    finally:
        collector.close()


def test_collector_returns_trajectories_with_the_acting_logp_and_versions(vtrace):
    algo, collector = vtrace.algo, vtrace.collector
    assert collector.env_num == 4
    obs, _ = collector.reset_env()
    assert obs.shape == (4, 4)

    stats = collector.collect(n_step=128)  # 3+ trajectories per env: episodes end inside
    assert isinstance(stats, VTraceCollectStats)
    assert stats.n_collected_steps >= 128 and stats.n_collected_steps % 16 == 0
    assert stats.num_trajectories == stats.n_collected_steps // 16
    assert 0.0 <= stats.queue_fill <= 1.0
    assert stats.weights_version == 0 and stats.policy_lag_mean == 0
    batch, _ = collector.buffer.sample(0)
    trajectory = trajectory_from_steps(batch)
    assert trajectory.columns["rewards"].shape == (8, 2 * stats.num_trajectories)
    # No update yet: the actors acted with the learner's weights, so their log-probs are its.
    expected = behaviour_log_probs(
        algo.policy, trajectory.columns["obs"], trajectory.columns["actions"]
    )
    np.testing.assert_allclose(trajectory.columns["behaviour_logp"], expected, atol=1e-5)
    # Episodes end inside rows (CartPole under a random policy lasts ~20 steps).
    assert trajectory.columns["terminated"].any()
    obs_next = trajectory.columns["next_obs"][:-1]
    continuing = ~(trajectory.columns["terminated"] | trajectory.columns["truncated"])[:-1]
    np.testing.assert_array_equal(obs_next[continuing], trajectory.columns["obs"][1:][continuing])

    with policy_within_training_step(algo.policy):
        algo.update(collector.buffer, batch_size=None, repeat=1)
    collector.reset_buffer(keep_statistics=True)
    lag_max = []
    for _ in range(30):  # queued trajectories used older weights; later ones the new ones
        stats = collector.collect(n_step=16)
        assert stats.weights_version == algo.weights_version == 1
        assert 0 <= stats.policy_lag_mean <= stats.policy_lag_max <= 1
        lag_max.append(stats.policy_lag_max)
        collector.reset_buffer(keep_statistics=True)
        if stats.policy_lag_max == 0:
            break
    assert lag_max[-1] == 0, f"the actors never pulled the new weights: {lag_max}"

    with pytest.raises(ValueError, match="collection_step_num_env_steps"):
        collector.collect(n_step=collector.max_steps_per_collect + 4)
    with pytest.raises(ValueError, match="random"):
        collector.collect(n_step=16, random=True)


@pytest.mark.parametrize("stepping", ["threads", "processes"])
def test_actors_that_step_their_envs_on_threads_or_processes_act_the_same(cluster, stepping):
    """An actor's first trajectory (seeded envs and sampling, the learner's first weights) is
    the same whether its envs step one after another, on threads or in spawned processes."""
    import ray

    algo = make_algo()
    first = {}
    built = {"sequential": "DummyVectorEnv", "threads": "ThreadedVectorEnv"}
    built["processes"] = "SubprocVectorEnv"
    for mode in ("sequential", stepping):
        collector = make_collector(algo, num_actors=1, env_stepping=mode)
        try:
            (actor,) = collector.env.pool.handles
            kind = ray.get(actor.__ray_call__.remote(lambda a: type(a.envs).__name__))
            assert kind == built[mode]  # the fleet's setting reached the actor
            stats = collector.collect(n_step=16)
            assert stats.num_trajectories == 1
            batch, _ = collector.buffer.sample(0)
            first[mode] = trajectory_from_steps(batch).columns
        finally:
            collector.close()
    for name in ("obs", "actions", "rewards", "next_obs", "terminated", "behaviour_logp"):
        np.testing.assert_array_equal(first[stepping][name], first["sequential"][name])


def test_a_full_buffer_leaves_finished_trajectories_for_the_next_collect(cluster):
    algo = make_algo()
    collector = make_collector(algo, max_trajectories_per_collect=2, max_in_flight_per_actor=2)
    try:
        collector.collect(n_step=16)  # the actors start acting
        collector.reset_buffer()
        time.sleep(3.0)  # each actor finishes its 2 queued trajectories: only 2 of 4 fit
        first = collector.collect(n_step=16)
        assert first.num_trajectories == 2 and len(collector.buffer) == 32
        assert first.queue_fill >= 0.75  # 3 or 4 of the 4 trajectories were waiting
        collector.reset_buffer()
        second = collector.collect(n_step=16)
        assert second.num_trajectories == 2
        assert second.queue_fill > 0  # they were waiting, not acted anew
    finally:
        collector.close()


def test_pause_acting_stops_the_actors_until_the_next_collect_and_loses_nothing(cluster):
    algo = make_algo()
    collector = make_collector(algo, max_in_flight_per_actor=2)
    try:
        collector.collect(n_step=16)  # the actors start acting: 2 trajectories queued each
        collector.reset_buffer()
        assert collector.env.pool.num_in_flight() == 4
        collector.pause_acting()  # the 4 in flight finish and wait for the next collect
        assert collector.env.pool.num_in_flight() == 0
        waiting = len(collector.env.waiting)
        assert waiting >= 4
        time.sleep(1.5)  # paused actors take no steps: nothing new finishes
        assert collector.env.pool.num_in_flight() == 0 and len(collector.env.waiting) == waiting
        stats = collector.collect(n_step=16)  # the waiting ones first; acting goes on
        assert stats.num_trajectories == waiting and stats.queue_fill == 1.0
        assert collector.env.pool.num_in_flight() == 4
    finally:
        collector.close()


def test_the_race_clock_stops_acting_for_each_test(cluster):
    """The benchmark's clock leaves the greedy tests out of training time: a VTrace run's
    actors must not step their envs meanwhile (their steps would cost no time). Each test
    starts with no rollout in flight."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import tianshou_race

    algo = make_algo()
    collector = make_collector(algo, max_in_flight_per_actor=2)
    clock = tianshou_race.RunClock(max_seconds=3.0, target=float("inf"))
    test = tianshou_race.test_collector(algo.policy, 0, clock)
    in_flight_at_tests = []
    collect = test.collect

    def counting_collect(*args, **kwargs):
        in_flight_at_tests.append(collector.env.pool.num_in_flight())
        return collect(*args, **kwargs)

    test.collect = counting_collect
    try:
        run = tianshou_race.train_until_target(
            algo,
            collector,
            test,
            clock,
            SimpleNamespace(epoch_steps=64),
            on_policy=True,
            collection_step_num_env_steps=32,
            batch_size=None,
            update_step_num_repetitions=1,
        )
    finally:
        test.close()
        collector.close()
    assert len(in_flight_at_tests) >= 3 and run["env_steps"] >= 128
    assert in_flight_at_tests == [0] * len(in_flight_at_tests)


class BoxActionEnv(gym.Env):
    action_space = gym.spaces.Box(-1.0, 1.0, (1,))
    observation_space = gym.spaces.Box(-1.0, 1.0, (4,))


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"env_factory": lambda: gym.make("Acrobot-v1")}, ValueError, "action space"),
        ({"env_factory": BoxActionEnv}, ValueError, "action space"),
        ({"num_actors": 0}, ValueError, "num_actors"),
        ({"steps_per_env": 0}, ValueError, "steps_per_env"),
        ({"max_trajectories_per_collect": 1}, ValueError, "max_trajectories_per_collect"),
        ({"num_cpus_per_actor": 8.0}, ValueError, "CPUs"),
        ({"seed": -1}, ValueError, "seed"),
        ({"env_stepping": "parallel"}, ValueError, "env_stepping"),
    ],
)
def test_collector_config_errors_raise_before_any_actor_starts(cluster, overrides, error, match):
    before = alive_actor_ids()
    with pytest.raises(error, match=match):
        make_collector(make_algo(), **overrides)
    assert alive_actor_ids() <= before


def test_collector_needs_the_vtrace_algorithm(cluster):
    with pytest.raises(TypeError, match="VTrace algorithm"):
        VTraceCollector(make_algo().policy, env_factory=make_cartpole)


# ---- Ray: Tianshou's trainer and logger ---------------------------------------------------------
def test_onpolicy_trainer_runs_and_logs_vtrace_fields(vtrace, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tianshou.trainer import OnPolicyTrainerParams
    from tianshou.utils import TensorboardLogger
    from torch.utils.tensorboard import SummaryWriter

    algo = vtrace.algo
    updates_before = algo.num_gradient_updates
    logger = TensorboardLogger(
        SummaryWriter(str(tmp_path / "tb")), training_interval=1, update_interval=1
    )
    test_envs = DummyVectorEnv([make_cartpole])
    test_envs.seed(100)
    try:
        result = algo.run_training(
            OnPolicyTrainerParams(
                training_collector=vtrace.collector,
                test_collector=Collector(algo.policy, test_envs),
                max_epochs=1,
                epoch_num_steps=256,
                collection_step_num_env_steps=32,
                batch_size=16,
                test_step_num_episodes=1,
                logger=logger,
                show_progress=False,
            )
        )
    finally:
        logger.finalize()
        test_envs.close()
    assert result.train_step >= 256
    assert algo.num_gradient_updates - updates_before >= 256 // 16

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = events.Tags()["scalars"]
    for wanted in ("policy_lag_mean", "queue_fill", "env_steps_per_s", "actors/rollouts_lost"):
        assert any(wanted in tag for tag in tags), (wanted, tags)
    for wanted in ("mean_rho", "vf_loss", "weights_version"):
        assert any(wanted in tag for tag in tags), (wanted, tags)


def test_restored_weights_reach_the_actors_as_a_new_version(vtrace):
    """On the module's collector (its last user): loading an older state gives the older
    weights a version newer than any published, and every actor pulls them."""
    algo, collector = vtrace.algo, vtrace.collector
    collector.reset_buffer()
    collector.collect(n_step=16)
    snapshot = algo.state_dict()
    with policy_within_training_step(algo.policy):
        algo.update(collector.buffer, batch_size=None, repeat=2)
    collector.reset_buffer()
    version_before = algo.weights_version
    algo.load_state_dict(snapshot)  # older weights, but a newer version
    assert algo.weights_version > version_before
    for _ in range(30):
        stats = collector.collect(n_step=16)
        collector.reset_buffer()
        if stats.policy_lag_max == 0:
            break
    assert stats.policy_lag_max == 0 and stats.weights_version == algo.weights_version


# ---- Ray: faults and checkpoints ----------------------------------------------------------------
def test_killed_actor_restarts_and_training_continues(cluster):
    import ray

    def make_slow_cartpole():  # defined here so that Ray ships it by value
        class SlowCartPole(gym.Wrapper):
            def step(self, action):
                time.sleep(0.02)  # a trajectory (2 envs x 8 steps) takes ~0.35 s
                return self.env.step(action)

        return SlowCartPole(gym.make("CartPole-v1"))

    algo = make_algo()
    before = alive_actor_ids()
    collector = make_collector(algo, env_factory=make_slow_cartpole)
    try:
        handle = collector._actor_pool.handles[0]
        started = alive_actor_ids() - before  # 2 actors and the weights server
        collector.collect(n_step=16)
        ray.kill(handle, no_restart=False)
        failures, from_restarted = 0, []
        for _ in range(100):
            stats = collector.collect(n_step=16)
            batch, _ = collector.buffer.sample(0)
            trajectory_from_steps(batch)  # whole trajectories only, even around the kill
            with policy_within_training_step(algo.policy):
                algo.update(collector.buffer, batch_size=None, repeat=1)
            collector.reset_buffer(keep_statistics=True)
            failures = max(failures, stats.actors["failures"])
            if failures and stats.n_collected_steps:
                from_restarted.append(stats)
            if len(from_restarted) >= 3:
                break
        assert failures >= 1 and stats.actors["rollouts_lost"] >= 1
        assert alive_actor_ids() - before <= started  # restarted in place, nothing new
    finally:
        collector.close()
    assert not wait_until_not_alive(started)


def local_actor(algo, env_factory=make_cartpole, **settings):
    """A VTraceActor (no Ray) on CartPole acting with ``algo``'s policy, whose weights its
    parameter server holds; ``settings`` are the actor's own (envs, steps, index, seed)."""
    from rl_dist_ext.params import ParameterServer
    from tianshou_plugins.actor import VTraceActor
    from tianshou_plugins.weights import cpu_state_dict

    server = ParameterServer()
    server.publish(cpu_state_dict(algo.policy), 0)
    return VTraceActor(
        policy=algo.policy, env_factory=env_factory, weights_server=server, **settings
    )


class CountingResets(gym.Wrapper):
    """CartPole counting the resets of every instance."""

    resets = 0

    def reset(self, **kwargs):
        CountingResets.resets += 1
        return super().reset(**kwargs)


def seeded_then_reset(seed: int) -> np.ndarray:
    """CartPole's first observation where Tianshou seeds it: ``venv.seed`` resets the env with
    the seed, and the collector's reset starts the first episode."""
    env = gym.make("CartPole-v1")
    env.reset(seed=seed)
    return env.reset()[0]


def test_an_actor_starts_each_env_as_tianshous_collector_does():
    """An actor's first observations are its envs' as Tianshou's collector starts them on
    their seeds: two resets per env (the seed's and the collector's), not a third that would
    start every first episode elsewhere."""
    CountingResets.resets = 0
    actor = local_actor(
        make_algo(),
        env_factory=lambda: CountingResets(gym.make("CartPole-v1")),
        num_envs=3,
        weight_sync_every_n_steps=10**6,
        steps_per_env=4,
        actor_index=1,
        seed=5,
    )
    try:
        assert CountingResets.resets == 2 * 3
        base = 5 + 10_000 * 1  # EnvActor's seeds: seed + 10,000 x actor index, one per env
        firsts = np.stack([seeded_then_reset(base + i) for i in range(3)])
        columns, _ = actor.sample_rollout()
        np.testing.assert_array_equal(columns["obs"][0], firsts)
    finally:
        actor.envs.close()


def test_actors_report_whole_episodes_across_trajectories():
    """An episode longer than one trajectory is reported with its whole return and length
    (CartPole pays 1 per step), not only the steps of the trajectory it ended in."""
    actor = local_actor(
        make_algo(),
        num_envs=2,
        weight_sync_every_n_steps=16,
        steps_per_env=4,
        actor_index=0,
        seed=0,
    )
    lens, returns = [], []
    for _ in range(30):
        result = actor.collect_trajectory()
        lens += result["lens"].tolist()
        returns += result["returns"].tolist()
    assert lens and max(lens) > 4, lens
    np.testing.assert_allclose(returns, lens)


@pytest.mark.parametrize("stepping", ["sequential", "threads"])
def test_an_actors_sampled_rollout_is_the_tianshou_collectors_on_the_same_seeds(stepping):
    """VTraceActor.sample_rollout (one forward per vector step, no Collector) against
    Tianshou's Collector from the same env state and torch seed: the same steps, episodes
    crossing trajectories and ending in them (resets), and log-probs that are the policy's."""
    from tianshou_plugins.actor import EnvActor

    algo = make_algo()
    settings = dict(num_envs=3, weight_sync_every_n_steps=10**6, steps_per_env=16)
    settings.update(actor_index=1, seed=5, env_stepping=stepping)
    sampled, reference = local_actor(algo, **settings), local_actor(algo, **settings)
    ended = 0
    try:
        for rollout in range(4):
            torch.manual_seed(rollout)
            columns, recorded = sampled.sample_rollout()
            torch.manual_seed(rollout)
            expected, _ = EnvActor.collect_rollout(reference)
            assert columns.keys() == expected.keys()
            for name, value in expected.items():
                assert columns[name].shape == value.shape and value.shape[:2] == (16, 3), name
                assert columns[name].dtype == value.dtype, name
                np.testing.assert_array_equal(columns[name], value, err_msg=name)
            np.testing.assert_allclose(
                recorded["logp"],
                behaviour_log_probs(algo.policy, expected["obs"], expected["actions"]),
                rtol=1e-6,
            )
            ended += int((columns["terminated"] | columns["truncated"]).sum())
    finally:
        sampled.envs.close()
        reference.envs.close()
    assert ended >= 2  # episodes ended inside the rollouts: the resets were compared too


def test_an_actor_samples_with_its_networks_in_eval_mode():
    """As Tianshou's Collector acts (dropout off, batch norm on its running stats), and the
    actor's networks are back in their own mode after the rollout."""
    actor = local_actor(
        make_algo(),
        num_envs=2,
        weight_sync_every_n_steps=10**6,
        steps_per_env=4,
        actor_index=0,
        seed=0,
    )
    modes = []
    actor.policy.actor.register_forward_hook(lambda module, *_: modes.append(module.training))
    actor.policy.train()
    try:
        actor.collect_trajectory()
    finally:
        actor.envs.close()
    assert modes == [False] * 4
    assert actor.policy.training and actor.policy.actor.training


# ---- Ray: SEED mode (central inference) ---------------------------------------------------------
def test_seed_mode_actors_act_through_the_server_and_survive_its_death(cluster):
    """The actors act on the server's log-probs and versions; a killed server is restarted by
    Ray with its initial weights (version -1), the actors wait out the restart, and the
    learner's weights return to it."""
    import ray

    from tianshou_plugins import CentralInference

    algo = make_algo()
    collector = make_collector(
        algo, central_inference=CentralInference(max_batch_size=64, num_cpus=0.1)
    )
    try:
        assert collector.env.weights_server is None  # the actors hold no weights
        stats = collector.collect(n_step=64)
        batch, _ = collector.buffer.sample(0)
        trajectory = trajectory_from_steps(batch)
        # The server sampled with the learner's weights: its log-probs are the learner's.
        expected = behaviour_log_probs(
            algo.policy, trajectory.columns["obs"], trajectory.columns["actions"]
        )
        np.testing.assert_allclose(trajectory.columns["behaviour_logp"], expected, atol=1e-5)
        assert stats.inference["requests_per_s"] > 0 and stats.inference["mean_batch_rows"] >= 2
        assert stats.inference["version"] == 0

        with policy_within_training_step(algo.policy):
            algo.update(collector.buffer, batch_size=None, repeat=3)
        collector.reset_buffer()
        for _ in range(30):  # trajectories queued before the push used version 0
            stats = collector.collect(n_step=16)
            collector.reset_buffer()
            if stats.policy_lag_max == 0:
                break
        assert stats.policy_lag_max == 0 and stats.inference["version"] == 3
        assert stats.weights_version == 3

        ray.kill(collector.env.inference.handle, no_restart=False)
        versions = []
        for _ in range(40):  # actors wait out the restart; the learner's weights return
            stats = collector.collect(n_step=16)
            batch, _ = collector.buffer.sample(0)
            trajectory_from_steps(batch)  # whole trajectories only
            collector.reset_buffer()
            versions.append(stats.inference.get("version"))
            if -1.0 in versions and versions[-1] == 3:
                break
        assert -1.0 in versions, versions  # the restarted server held its initial weights
        assert versions[-1] == 3, versions  # the restarted server got the weights again
    finally:
        collector.close()


class RecurrentActor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.GRU(4, 8)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, obs, state=None, info=None):
        return self.head(self.rnn(torch.as_tensor(obs)[None])[0][0]), state


def test_seed_mode_refuses_recurrent_policies_and_bad_settings(cluster):
    from tianshou_plugins import CentralInference

    algo = make_algo()
    algo.policy.actor = RecurrentActor()
    before = alive_actor_ids()
    with pytest.raises(ValueError, match="recurrent"):
        make_collector(algo, central_inference=CentralInference())
    with pytest.raises(TypeError, match="CentralInference"):
        make_collector(make_algo(), central_inference={"max_batch_size": 8})
    with pytest.raises(ValueError, match="CPUs"):
        make_collector(make_algo(), central_inference=CentralInference(num_cpus=8.0))
    with pytest.raises(ValueError, match="max_batch_size"):
        CentralInference(max_batch_size=0)
    assert alive_actor_ids() <= before
