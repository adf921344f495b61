"""The core pieces multi-agent runs add, without Ray: action masks in the DQN ops and the n-step
fold, the actor step with one replay per module (and its rate-limiter credit), the learner step
over several modules, and inserts that count env steps at a replay shard."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from rl_dist_ext.gorila import NEXT_ACTION_MASK, ActorStep, GorilaLearner, ModuleRollouts, Rollout
from rl_dist_ext.ops.dqn import (
    double_dqn_loss,
    double_dqn_td_error,
    epsilon_greedy_masked,
    mask_q_values,
    masked_argmax,
)
from rl_dist_ext.ops.nstep import flatten_time_batch, fold_nstep
from rl_dist_ext.params import ParameterServer
from rl_dist_ext.replay.rate_limiter import RateLimit
from rl_dist_ext.replay.shard import ReplayShardServer, ShardSpec


# ---- masks in the DQN ops ----------------------------------------------------------------------
def naive_masked_targets(q_t, actions, rewards, discounts, q_online_tp1, q_target_tp1, mask):
    """Paper notation, one row at a time: a* = argmax over legal a of Q_online(s', a)."""
    out = []
    for b in range(len(actions)):
        legal = [a for a in range(q_t.shape[1]) if mask[b, a]] or [0]
        best = max(legal, key=lambda a: (q_online_tp1[b, a], -a))
        target = rewards[b] + discounts[b] * q_target_tp1[b, best]
        out.append(target - q_t[b, actions[b]])
    return np.array(out)


def test_masked_double_dqn_td_error_matches_a_naive_loop_and_never_selects_illegal_actions():
    rng = np.random.default_rng(1)
    batch, num_actions = 64, 5
    q_t = rng.normal(size=(batch, num_actions))
    q_online_tp1 = rng.normal(size=(batch, num_actions))
    q_online_tp1[:, 0] = 100.0  # the unmasked argmax would always be the (often illegal) action 0
    q_target_tp1 = rng.normal(size=(batch, num_actions))
    mask = rng.random((batch, num_actions)) < 0.5
    mask[0] = False  # no legal action (a terminal board): still a finite target
    actions = rng.integers(0, num_actions, batch)
    rewards = rng.normal(size=batch)
    discounts = np.where(rng.random(batch) < 0.3, 0.0, 0.9)
    discounts[0] = 0.0
    t = torch.as_tensor
    out = double_dqn_td_error(
        q_online_t=t(q_t),
        actions=t(actions),
        rewards=t(rewards),
        discounts=t(discounts),
        q_online_tp1=t(q_online_tp1),
        q_target_tp1=t(q_target_tp1),
        next_action_mask=t(mask),
    )
    expected = naive_masked_targets(
        q_t, actions, rewards, discounts, q_online_tp1, q_target_tp1, mask
    )
    np.testing.assert_allclose(out.td_error.numpy(), expected, rtol=1e-12)
    assert torch.isfinite(out.target).all()
    unmasked = double_dqn_td_error(
        q_online_t=t(q_t),
        actions=t(actions),
        rewards=t(rewards),
        discounts=t(discounts),
        q_online_tp1=t(q_online_tp1),
        q_target_tp1=t(q_target_tp1),
    )
    assert not torch.allclose(unmasked.td_error, out.td_error)  # the mask changed the targets
    loss = double_dqn_loss(
        q_online_t=t(q_t),
        actions=t(actions),
        rewards=t(rewards),
        discounts=t(discounts),
        q_online_tp1=t(q_online_tp1),
        q_target_tp1=t(q_target_tp1),
        next_action_mask=t(mask),
    )
    torch.testing.assert_close(loss.td_error, out.td_error)


def test_masked_argmax_and_epsilon_greedy_choose_only_legal_actions():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2000, 9, generator=gen)
    mask = torch.rand(2000, 9, generator=gen) < 0.4
    mask[:, 4] = True  # every row has a legal action
    greedy = masked_argmax(q, mask)
    assert mask[torch.arange(2000), greedy].all()
    expected = torch.where(mask, q, -torch.inf).argmax(-1)
    torch.testing.assert_close(greedy, expected)
    for epsilon in (0.0, 0.5, 1.0):
        acts = epsilon_greedy_masked(q, mask, epsilon, generator=gen)
        assert mask[torch.arange(2000), acts].all()
        explored = (acts != greedy).float().mean().item()
        assert explored <= epsilon + 0.03
    # epsilon 1: uniform over the legal actions of a row
    row_mask = torch.tensor([[False, True, True, False, True]]).repeat(30_000, 1)
    acts = epsilon_greedy_masked(torch.zeros(30_000, 5), row_mask, 1.0, generator=gen)
    counts = torch.bincount(acts, minlength=5).float() / 30_000
    torch.testing.assert_close(
        counts, torch.tensor([0, 1 / 3, 1 / 3, 0, 1 / 3]), atol=0.015, rtol=0
    )
    assert mask_q_values(q, None) is q
    with pytest.raises(ValueError, match="action_mask must have the shape"):
        mask_q_values(q, mask[:, :3])


def test_fold_nstep_carries_the_mask_of_the_bootstrap_observation():
    rng = np.random.default_rng(2)
    steps, envs, num_actions = 6, 2, 4
    rollout = dict(
        obs=rng.normal(size=(steps, envs, 3)),
        actions=rng.integers(0, num_actions, (steps, envs)),
        rewards=rng.normal(size=(steps, envs)),
        next_obs=rng.normal(size=(steps, envs, 3)),
        terminated=rng.random((steps, envs)) < 0.2,
        truncated=rng.random((steps, envs)) < 0.2,
    )
    masks = rng.random((steps, envs, num_actions)) < 0.5
    out = fold_nstep(**rollout, gamma=0.9, n=3, next_action_mask=masks)
    for t in range(steps):
        for b in range(envs):
            last = t + out.horizons[t, b] - 1
            np.testing.assert_array_equal(out.next_obs[t, b], rollout["next_obs"][last, b])
            np.testing.assert_array_equal(out.next_action_mask[t, b], masks[last, b])
    rows = flatten_time_batch(out)
    assert rows[NEXT_ACTION_MASK].shape == (steps * envs, num_actions)
    assert fold_nstep(**rollout, gamma=0.9, n=3).next_action_mask is None
    assert NEXT_ACTION_MASK not in flatten_time_batch(fold_nstep(**rollout, gamma=0.9, n=3))
    with pytest.raises(ValueError, match="next_action_mask"):
        fold_nstep(**rollout, gamma=0.9, n=3, next_action_mask=masks[:2])


# ---- the actor step with one replay per module --------------------------------------------------
class CountingReplay:
    def __init__(self):
        self.added = []

    def add(self, transitions, priorities=None, *, count=None):
        self.added.append((transitions, priorities, count))


def rollout(steps, envs=1, masked=False, seed=0):
    rng = np.random.default_rng(seed)
    columns = {
        "obs": rng.normal(size=(steps, envs, 3)).astype(np.float32),
        "actions": rng.integers(0, 2, size=(steps, envs)),
        "rewards": rng.normal(size=(steps, envs)).astype(np.float32),
        "next_obs": rng.normal(size=(steps, envs, 3)).astype(np.float32),
        "terminated": np.zeros((steps, envs), bool),
        "truncated": np.zeros((steps, envs), bool),
    }
    if masked:
        columns[NEXT_ACTION_MASK] = np.ones((steps, envs, 2), bool)
        columns[NEXT_ACTION_MASK][..., 1] = False
    return Rollout(columns)


def test_multi_module_actor_step_pushes_each_module_to_its_replay_and_credits_env_steps():
    replays = {"learner": CountingReplay(), "shared": CountingReplay()}
    server = ParameterServer()
    server.publish({"w": 1}, 4)
    loaded = []
    step = ActorStep(
        replays=replays, gamma=0.9, n_step=2, weights=server, pull_every_n_steps=8, name="r1"
    )
    nets = {"learner": torch.nn.Linear(3, 2), "shared": torch.nn.Linear(3, 2)}
    # call 1: both modules act; call 2: only "shared" has steps; call 3: both again
    plan = [
        ModuleRollouts({"learner": rollout(3, masked=True), "shared": rollout(4)}, env_steps=6),
        ModuleRollouts({"shared": rollout(2)}, env_steps=2),
        ModuleRollouts({"learner": rollout(1, masked=True), "shared": rollout(5)}, env_steps=5),
    ]
    results = [
        step.run_modules(act=lambda p=p: p, q_values=nets, load_weights=loaded.append) for p in plan
    ]
    assert [r.env_steps for r in results] == [6, 2, 5]
    assert results[1].agent_steps == {"learner": 0, "shared": 2}
    assert [w["w"] for w in loaded] == [1]  # due once: 6 + 2 env steps had passed before call 3
    # env-step credit: the learner module's second insert carries the 2 env steps it had no rows in
    assert [c for _, _, c in replays["learner"].added] == [6, 2 + 5]
    assert [c for _, _, c in replays["shared"].added] == [6, 2, 5]
    transitions, priorities, _ = replays["learner"].added[0]
    assert transitions[NEXT_ACTION_MASK].shape == (3, 2) and priorities.shape == (3,)
    assert NEXT_ACTION_MASK not in replays["shared"].added[0][0]
    assert step.env_steps == 13


def test_multi_module_actor_step_counts_agent_steps_when_asked_and_rejects_unknown_modules():
    replays = {"a": CountingReplay()}
    step = ActorStep(replays=replays, gamma=0.9, n_step=1, count_steps_by="agent_steps")
    step.push_modules(ModuleRollouts({"a": rollout(4)}, env_steps=8), {"a": torch.nn.Linear(3, 2)})
    assert replays["a"].added[0][2] is None  # the shard counts the rows
    with pytest.raises(ValueError, match=r"modules \['b'\] that have no replay"):
        step.push_modules(ModuleRollouts({"b": rollout(2)}, env_steps=2), {})
    with pytest.raises(RuntimeError, match="push_modules"):
        step.push(rollout(2), torch.nn.Linear(3, 2))
    with pytest.raises(ValueError, match="exactly one of replay= and replays="):
        ActorStep(gamma=0.9, n_step=1)
    with pytest.raises(ValueError, match="count_steps_by"):
        ActorStep(replays=replays, gamma=0.9, n_step=1, count_steps_by="agents")


def test_masked_initial_priorities_bootstrap_from_legal_actions_only():
    from rl_dist_ext.gorila import nstep_batch_with_priorities

    net = torch.nn.Linear(3, 2)
    with torch.no_grad():
        net.weight.zero_()
        net.bias.copy_(torch.tensor([0.0, 50.0]))  # Q = (0, 50) everywhere; action 1 illegal
    columns = rollout(4, masked=True).columns
    columns["actions"][:] = 0
    columns["rewards"][:] = 1.0
    batch = nstep_batch_with_priorities(**columns, gamma=0.5, n_step=1, q_values=net)
    np.testing.assert_allclose(batch.priorities, 1.0, rtol=1e-6)  # |1 + 0.5 * 0 - 0|
    columns.pop(NEXT_ACTION_MASK)
    batch = nstep_batch_with_priorities(**columns, gamma=0.5, n_step=1, q_values=net)
    np.testing.assert_allclose(batch.priorities, 26.0, rtol=1e-6)  # |1 + 0.5 * 50 - 0|


# ---- the learner step over several modules ----------------------------------------------------
class SampledReplay:
    def __init__(self, name):
        self.name = name
        self.samples = 0
        self.priority_updates = []

    def sample(self, batch_size, *, beta):
        from rl_dist_ext.replay.prioritized import ReplaySample

        self.samples += 1
        keys = np.arange(batch_size) + 1000 * self.samples
        return ReplaySample({"x": np.full(batch_size, self.name)}, keys, np.ones(batch_size))

    def update_priorities(self, keys, priorities):
        self.priority_updates.append((keys, priorities))


def test_learner_update_modules_samples_every_module_and_sends_each_its_priorities():
    replays = {"a": SampledReplay("a"), "b": SampledReplay("b")}
    events = []
    learner = GorilaLearner(
        replay=None,
        batch_size=3,
        prioritized=True,
        target_update_every=2,
        publish_every=1,
        sync_target=lambda: events.append("target"),
        export_weights=lambda: {},
    )
    server = ParameterServer()
    learner.connect(replays=replays, weights=server)

    def gradient_step(samples):
        assert set(samples) == {"a", "b"}
        assert all((s.batch["x"] == m).all() for m, s in samples.items())
        learner.after_gradient_step()
        return {"a": torch.full((3,), -1.0), "b": torch.full((3,), 2.0)}

    stats = learner.update_modules(4, beta=0.4, gradient_step=gradient_step)
    assert stats.num_updates == 4 and events == ["target", "target"]
    assert [int(k[0]) for k, _ in replays["a"].priority_updates] == [1000, 2000, 3000, 4000]
    np.testing.assert_array_equal(replays["a"].priority_updates[0][1], [1, 1, 1])
    np.testing.assert_array_equal(replays["b"].priority_updates[0][1], [2, 2, 2])
    assert server.version() == 4
    with pytest.raises(ValueError, match="not both"):
        learner.connect(replay=replays["a"], replays=replays, weights=None)


# ---- a shard's limiter counts what an insert says ----------------------------------------------
def test_shard_insert_count_drives_the_rate_limiter():
    async def run():
        spec = ShardSpec(
            shard_index=0,
            capacity=100,
            rate_limit=RateLimit(min_size_to_sample=1, samples_per_insert=1.0, error_buffer=5.0),
            timeout_s=0.2,
        )
        shard = ReplayShardServer(spec)
        batch = {"x": np.zeros((2, 1), np.float32)}
        await shard.add(batch, count=10)  # 2 rows that count as 10 env steps
        assert shard.status().size == 2
        # window [1 - 5, 1 + 5]: a sample is let through while 10 - sampled >= -4 (counted as
        # rows, 2 inserted rows would have allowed 4 samples of 2, not 8)
        for _ in range(8):
            await shard.sample(2)
        assert not shard.status().can_sample  # diff 10 - 16 = -6 < -4: the learner is ahead
        await shard.add(batch)  # counts its 2 rows
        assert shard.status().can_sample

    asyncio.run(run())


# ---- each agent's transitions from an AEC step stream -------------------------------------------
def naive_agent_transitions(steps, agents):
    """Reference: for each agent, pair each of its actions with its next turn in the same
    episode; rewards summed from its action up to the step before its next turn."""
    out = []
    episode_start = 0
    for end, step in enumerate(steps):
        if not (step["terminated"] or step["truncated"]):
            continue
        episode = steps[episode_start : end + 1]
        for i, agent in enumerate(agents):
            turns = [k for k, s in enumerate(episode) if s["agent"] == agent]
            for j, k in enumerate(turns):
                later = turns[j + 1] if j + 1 < len(turns) else None
                last = (later - 1) if later is not None else len(episode) - 1
                reward = sum(episode[m]["rewards"][i] for m in range(k, last + 1))
                if later is not None:
                    out.append((agent, k + episode_start, reward, episode[later]["obs"], False))
                elif episode[-1]["terminated"]:
                    out.append((agent, k + episode_start, reward, None, True))
                elif episode[-1]["next_agent"] == agent:  # truncated: the env showed its obs
                    out.append((agent, k + episode_start, reward, episode[-1]["next_obs"], False))
        episode_start = end + 1
    return sorted(out, key=lambda x: (x[0], x[1]))


def random_stream(rng, agents, num_steps, simultaneous=False):
    steps, turn = [], 0
    for k in range(num_steps):
        agent = agents[turn % len(agents)]
        end = rng.random() < 0.08
        terminated = end and rng.random() < 0.5
        truncated = end and not terminated
        next_agent = agents[(turn + 1) % len(agents)]
        rewards = rng.normal(size=len(agents))
        if simultaneous and (turn + 1) % len(agents):  # rewards only when a cycle closes
            rewards[:] = 0.0
        steps.append(
            dict(
                agent=agent,
                obs=np.full(2, 100.0 * k),
                action=int(rng.integers(4)),
                rewards=rewards,
                terminated=terminated,
                truncated=truncated,
                next_agent=next_agent,
                next_obs=np.full(2, 100.0 * (k + 1)),
                next_action_mask=rng.random(4) < 0.7,
            )
        )
        turn = 0 if end else turn + 1
    steps[-1].update(terminated=True, truncated=False)  # the reference needs whole episodes
    return steps


@pytest.mark.parametrize("simultaneous", [False, True])
def test_turn_assembler_matches_a_naive_pairing_of_each_agents_turns(simultaneous):
    from rl_dist_ext.gorila.turns import TurnAssembler

    rng = np.random.default_rng(4)
    agents = ["a", "b", "c"]
    steps = random_stream(rng, agents, 300, simultaneous)
    assembler = TurnAssembler(agents)
    got = []
    for first in range(0, len(steps), 7):  # calls (rollouts) of 7 steps: pending ones carry over
        for step in steps[first : first + 7]:
            got.extend(assembler.step(**step))
    expected = naive_agent_transitions(steps, agents)
    by_obs = {float(s["obs"][0]): k for k, s in enumerate(steps)}
    actual = sorted(
        (
            t.agent,
            by_obs[float(t.obs[0])],
            t.reward,
            None if t.terminated else t.next_obs,
            t.terminated,
        )
        for t in got
    )
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert a[:2] == e[:2] and a[4] == e[4]
        assert a[2] == pytest.approx(e[2])
        if e[3] is not None:
            np.testing.assert_array_equal(a[3], e[3])
    # dropped: at each truncation, every agent but the next one that acted in the episode
    dropped, acted = 0, set()
    for step in steps:
        acted.add(step["agent"])
        if step["truncated"]:
            dropped += len(acted - {step["next_agent"]})
        if step["terminated"] or step["truncated"]:
            acted = set()
    assert dropped > 0 and assembler.dropped == dropped
    for t in got:
        if t.terminated:
            assert not t.next_action_mask.any()  # nothing is bootstrapped from a terminal


def test_transitions_to_rollout_lays_each_agents_run_end_to_end():
    from rl_dist_ext.gorila import NEXT_ACTION_MASK
    from rl_dist_ext.gorila.turns import AgentTransition, transitions_to_rollout

    def t(agent, k, terminated=False):
        return AgentTransition(
            agent, np.full(2, k), k % 3, float(k), np.full(2, k + 1), np.ones(3, bool),
            terminated, False,
        )  # fmt: skip

    rollout = transitions_to_rollout([t("a", 0), t("b", 1), t("a", 2), t("b", 3, True)])
    np.testing.assert_array_equal(rollout["obs"][:, 0, 0], [0, 2, 1, 3])  # a's run, then b's
    np.testing.assert_array_equal(rollout["truncated"][:, 0], [False, True, False, False])
    np.testing.assert_array_equal(rollout["terminated"][:, 0], [False, False, False, True])
    assert rollout[NEXT_ACTION_MASK].shape == (4, 1, 3)
    with pytest.raises(ValueError, match="no transitions"):
        transitions_to_rollout([])
