"""One batch through both adapters: the RLlib learner and the Tianshou algorithm agree (STYLE 3).

Both adapters call ``rl_dist_ext.ops.dqn.double_dqn_loss``; this test checks that the glue
around it (batch columns, which network selects and which evaluates the next action, the loss
type, the importance weights) is the same on both sides. The RLlib learners are built in-process
(``config.build_learner``, no Ray actors); its online and target networks are copied layer by layer
into a Tianshou ``Net`` and the algorithm's target copy, so both compute identical Q-values.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("ray.rllib")
pytest.importorskip("tianshou")

OBS_DIM, NUM_ACTIONS, HIDDEN, BATCH = 4, 2, 8, 64


def replay_rows(seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Rows as the distributed replay returns them, plus non-uniform importance weights."""
    rng = np.random.default_rng(seed)
    discount = np.full(BATCH, 0.99**3, dtype=np.float32)
    discount[rng.random(BATCH) < 0.25] = 0.0  # windows that ended in a termination
    rows = {
        "obs": rng.normal(size=(BATCH, OBS_DIM)).astype(np.float32),
        "action": rng.integers(NUM_ACTIONS, size=BATCH).astype(np.int64),
        # large enough that some |TD| > 1: both Huber branches are exercised
        "reward": rng.normal(scale=3.0, size=BATCH).astype(np.float32),
        "discount": discount,
        "next_obs": rng.normal(size=(BATCH, OBS_DIM)).astype(np.float32),
    }
    weights = rng.uniform(0.05, 1.0, size=BATCH).astype(np.float32)
    assert (discount == 0).any() and (discount > 0).any()
    return rows, weights


def rllib_learner(*, loss: str, double_q: bool):
    from rllib_plugins import GorilaDQNConfig

    config = (
        GorilaDQNConfig()
        .environment("CartPole-v1")
        .framework("torch")
        .rl_module(
            model_config={
                "fcnet_hiddens": [HIDDEN],
                "fcnet_activation": "relu",
                "head_fcnet_hiddens": [],
            }
        )
        .training(dueling=False, double_q=double_q, td_error_loss_fn=loss)
        .debugging(seed=0)
    )
    learner = config.build_learner(env=gym.make("CartPole-v1"))
    module = learner.module["default_policy"]
    # A target network different from the online one, so "who selects, who evaluates" matters.
    with torch.no_grad():
        for _, target in module.get_target_network_pairs():
            for param in target.parameters():
                param.add_(0.5 * torch.randn_like(param))
    return learner


def linear_layers(module: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in module.modules() if isinstance(m, torch.nn.Linear)]


def copy_linears(source: list[torch.nn.Module], target: torch.nn.Module) -> None:
    """Copy the Linear layers of ``source`` (encoder then head) into ``target``'s, in order."""
    src = [layer for part in source for layer in linear_layers(part)]
    dst = linear_layers(target)
    assert [tuple(s.weight.shape) for s in src] == [tuple(d.weight.shape) for d in dst]
    with torch.no_grad():
        for s, d in zip(src, dst, strict=True):
            d.weight.copy_(s.weight)
            d.bias.copy_(s.bias)


def tianshou_algorithm(learner, *, huber_loss_delta: float | None, is_double: bool):
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.utils.net.common import Net

    from tianshou_plugins import GorilaDQN

    module = learner.module["default_policy"]
    # The RLlib module must be the plain MLP the Tianshou Net reproduces.
    for part in (module.encoder, module.af):
        activations = {type(m).__name__ for m in part.modules() if not list(m.children())}
        assert activations <= {"Linear", "ReLU"}, activations
    net = Net(state_shape=OBS_DIM, action_shape=NUM_ACTIONS, hidden_sizes=[HIDDEN])
    policy = DiscreteQLearningPolicy(
        model=net,
        action_space=gym.spaces.Discrete(NUM_ACTIONS),
        observation_space=gym.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32),
    )
    algorithm = GorilaDQN(
        policy=policy,
        optim=AdamOptimizerFactory(lr=1e-3),
        gamma=0.99,
        n_step_return_horizon=3,
        target_update_freq=100,
        is_double=is_double,
        huber_loss_delta=huber_loss_delta,
    )
    copy_linears([module.encoder, module.af], algorithm.policy.model)
    copy_linears([module._target_encoder, module._target_af], algorithm.model_old)
    return algorithm


def rllib_loss(learner, rows, weights):
    from ray.rllib.algorithms.dqn.dqn_learner import (
        QF_NEXT_PREDS,
        QF_PREDS,
        QF_TARGET_NEXT_PREDS,
    )
    from ray.rllib.policy.sample_batch import MultiAgentBatch

    from rllib_plugins.gorila_learner import replay_rows_to_batch

    batch = MultiAgentBatch(
        {"default_policy": replay_rows_to_batch(rows, weights)}, env_steps=BATCH
    )
    batch = learner._convert_batch_type(batch).policy_batches  # what Learner.update trains on
    fwd_out = learner.module.forward_train(batch)
    loss = learner.compute_losses(fwd_out=fwd_out, batch=batch)["default_policy"]
    td_error = learner._last_td_error["default_policy"]
    q = {k: fwd_out["default_policy"][k] for k in (QF_PREDS, QF_TARGET_NEXT_PREDS)}
    q["next_online"] = fwd_out["default_policy"].get(QF_NEXT_PREDS)
    return loss, td_error, q


def tianshou_loss(algorithm, rows, weights):
    from tianshou.data import Batch

    batch = Batch(
        obs=rows["obs"],
        act=rows["action"],
        rew=rows["reward"],
        discount=rows["discount"],
        obs_next=rows["next_obs"],
        weight=weights,
    )
    return algorithm.compute_loss(batch)


@pytest.mark.parametrize("double_q", [True, False], ids=["double", "plain"])
@pytest.mark.parametrize(("loss_fn", "huber_loss_delta"), [("huber", 1.0), ("mse", None)])
def test_one_batch_gives_the_same_loss_and_td_errors_on_both_adapters(
    loss_fn, huber_loss_delta, double_q
):
    from ray.rllib.algorithms.dqn.dqn_learner import QF_PREDS, QF_TARGET_NEXT_PREDS

    from tianshou_plugins.actor import q_values

    torch.manual_seed(0)
    learner = rllib_learner(loss=loss_fn, double_q=double_q)
    algorithm = tianshou_algorithm(learner, huber_loss_delta=huber_loss_delta, is_double=double_q)
    rows, weights = replay_rows()

    r_loss, r_td, r_q = rllib_loss(learner, rows, weights)
    t_out = tianshou_loss(algorithm, rows, weights)

    # Same networks on both sides (so any disagreement below is in the adapters' glue).
    obs, next_obs = torch.as_tensor(rows["obs"]), torch.as_tensor(rows["next_obs"])
    with torch.no_grad():
        t_online = q_values(algorithm.policy.model, obs)
        t_target_next = q_values(algorithm.model_old, next_obs)
        t_online_next = q_values(algorithm.policy.model, next_obs)
    torch.testing.assert_close(r_q[QF_PREDS].detach(), t_online, atol=1e-6, rtol=0)
    torch.testing.assert_close(r_q[QF_TARGET_NEXT_PREDS].detach(), t_target_next, atol=1e-6, rtol=0)
    if double_q:
        torch.testing.assert_close(r_q["next_online"].detach(), t_online_next, atol=1e-6, rtol=0)
    # The batch distinguishes double from plain DQN targets and exercises both Huber branches.
    assert (t_online_next.argmax(1) != t_target_next.argmax(1)).any()
    assert (t_out.td_error.abs() > 1.0).any() and (t_out.td_error.abs() < 1.0).any()

    assert r_loss.shape == t_out.loss.shape == ()
    assert torch.allclose(r_loss, t_out.loss, atol=1e-6), (float(r_loss), float(t_out.loss))
    assert torch.allclose(r_td, t_out.td_error, atol=1e-6)

    # The weights really enter both losses: the unweighted loss differs.
    ones = np.ones_like(weights)
    unweighted = tianshou_loss(algorithm, rows, ones).loss
    assert not torch.allclose(unweighted, t_out.loss, atol=1e-3)
    assert torch.allclose(rllib_loss(learner, rows, ones)[0], unweighted, atol=1e-6)


# ---- V-trace: the RLlib VTrace learner and the Tianshou VTrace algorithm ------------------------

VT_T = 6  # the Tianshou trajectory length
VT_FRAGMENT = VT_T + 2  # RLlib's row length that puts one Tianshou row (plus extra steps) per row
VT_GAMMA, VT_VF, VT_ENT, VT_RHO, VT_PG_RHO, VT_LAMBDA = 0.95, 0.7, 0.03, 1.5, 1.0, 0.9


def vtrace_trajectory(seed: int = 0):
    """``[T, 3]`` steps: row 0 truncated by the env at t=2 then cut; row 1 terminated at t=3,
    a new episode, then cut; row 2 one episode cut at the end. Behaviour probabilities far from
    the initial policy's, so that some importance ratios are clipped."""
    from rl_dist_ext.impala import Trajectory

    rng = np.random.default_rng(seed)
    shape = (VT_T, 3)
    terminated = np.zeros(shape, bool)
    truncated = np.zeros(shape, bool)
    truncated[2, 0] = True
    terminated[3, 1] = True
    columns = {
        "obs": rng.normal(size=(*shape, OBS_DIM)).astype(np.float32),
        "actions": rng.integers(NUM_ACTIONS, size=shape),
        "rewards": rng.normal(1.0, 0.5, size=shape).astype(np.float32),
        "next_obs": rng.normal(size=(*shape, OBS_DIM)).astype(np.float32),
        "terminated": terminated,
        "truncated": truncated,
        "behaviour_logp": np.log(rng.choice([0.08, 0.3, 0.6, 0.95], size=shape)).astype(np.float32),
    }
    # Within an episode, next_obs[t] is obs[t + 1]; across an episode end it is the final obs.
    for b in range(3):
        for t in range(VT_T - 1):
            if not (terminated[t, b] or truncated[t, b]):
                columns["next_obs"][t, b] = columns["obs"][t + 1, b]
    return Trajectory(columns, acting_version=0.0)


def rllib_vtrace_batch(trajectory) -> dict:
    """The trajectory as RLlib's learner connector lays it out: each episode piece followed by
    an extra step holding its final observation (LOSS_MASK False, reward 0, not terminated)."""
    from ray.rllib.core.columns import Columns

    c = trajectory.columns
    columns = {k: [] for k in ("obs", "act", "rew", "term", "mask", "logp")}

    def add(obs, act, rew, term, mask, logp):
        for key, value in zip(columns, (obs, act, rew, term, mask, logp), strict=True):
            columns[key].append(value)

    for b in range(c["rewards"].shape[1]):
        for t in range(VT_T):
            add(c["obs"][t, b], c["actions"][t, b], c["rewards"][t, b],
                c["terminated"][t, b], True, c["behaviour_logp"][t, b])  # fmt: skip
            if c["terminated"][t, b] or c["truncated"][t, b] or t == VT_T - 1:
                add(c["next_obs"][t, b], 0, 0.0, False, False, 0.0)
    assert len(columns["obs"]) == 2 * VT_FRAGMENT + VT_FRAGMENT - 1  # rows 0, 1 full; 2 padded
    return {
        Columns.OBS: torch.as_tensor(np.stack(columns["obs"])),
        Columns.ACTIONS: torch.as_tensor(np.asarray(columns["act"], dtype=np.int64)),
        Columns.REWARDS: torch.as_tensor(np.asarray(columns["rew"], dtype=np.float32)),
        Columns.TERMINATEDS: torch.as_tensor(np.asarray(columns["term"])),
        Columns.LOSS_MASK: torch.as_tensor(np.asarray(columns["mask"])),
        Columns.ACTION_LOGP: torch.as_tensor(np.asarray(columns["logp"], dtype=np.float32)),
    }


@pytest.mark.parametrize("loss", ["defaults", "impala"])
def test_one_trajectory_batch_gives_the_same_vtrace_loss_on_both_adapters(loss):
    """Same networks, same steps (an env truncation, a termination, cuts at the row ends): the
    RLlib VTrace learner's loss on its own layout equals the Tianshou VTrace algorithm's, with
    each adapter's default loss (APPO's form around the behaviour policy) and with IMPALA's."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.core.columns import Columns
    from tianshou.algorithm.modelfree.reinforce import ProbabilisticActorPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.utils.net.common import Net
    from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic

    from rl_dist_ext.impala import time_major_batch
    from rllib_plugins import VTraceConfig
    from rllib_plugins.vtrace import IMPALA_LOSS
    from tianshou_plugins import VTrace

    impala = loss == "impala"
    rllib_loss, tianshou_loss = (IMPALA_LOSS, {"eps_clip": None}) if impala else ({}, {})
    torch.manual_seed(0)
    config = (
        VTraceConfig()
        .environment("CartPole-v1")
        .framework("torch")
        .env_runners(rollout_fragment_length=VT_FRAGMENT)
        .rl_module(
            model_config={
                "fcnet_hiddens": [HIDDEN],
                "fcnet_activation": "relu",
                "head_fcnet_hiddens": [],
                "vf_share_layers": False,
            }
        )
        .training(
            gamma=VT_GAMMA,
            vf_loss_coeff=VT_VF,
            entropy_coeff=VT_ENT,
            vtrace_clip_rho_threshold=VT_RHO,
            vtrace_clip_pg_rho_threshold=VT_PG_RHO,
            vtrace_lambda=VT_LAMBDA,
            **rllib_loss,
        )
        .central_inference(enabled=False)
        .debugging(seed=0)
    )
    learner = config.build_learner(env=gym.make("CartPole-v1"))
    try:
        module = learner.module[DEFAULT_MODULE_ID]
        obs_space = gym.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
        actor = DiscreteActor(
            preprocess_net=Net(state_shape=OBS_DIM, hidden_sizes=[HIDDEN]),
            action_shape=NUM_ACTIONS,
            hidden_sizes=[],
            softmax_output=False,
        )
        critic = DiscreteCritic(
            preprocess_net=Net(state_shape=OBS_DIM, hidden_sizes=[HIDDEN]), hidden_sizes=[]
        )
        copy_linears([module.encoder.actor_encoder, module.pi], actor)
        copy_linears([module.encoder.critic_encoder, module.vf], critic)
        algorithm = VTrace(
            policy=ProbabilisticActorPolicy(
                actor=actor,
                dist_fn=lambda logits: torch.distributions.Categorical(logits=logits),
                action_scaling=False,
                action_bound_method=None,
                action_space=gym.spaces.Discrete(NUM_ACTIONS),
                observation_space=obs_space,
            ),
            critic=critic,
            optim=AdamOptimizerFactory(lr=1e-3),
            vf_coef=VT_VF,
            ent_coef=VT_ENT,
            gamma=VT_GAMMA,
            clip_rho_threshold=VT_RHO,
            clip_pg_rho_threshold=VT_PG_RHO,
            vtrace_lambda=VT_LAMBDA,
            **tianshou_loss,
        )
        trajectory = vtrace_trajectory()
        batch = rllib_vtrace_batch(trajectory)
        fwd_out = module.forward_train(batch)
        r_loss = learner.compute_loss_for_module(
            module_id=DEFAULT_MODULE_ID, config=learner.config, batch=batch, fwd_out=fwd_out
        )
        tensors = algorithm._tensors(time_major_batch([trajectory]))
        # as an update's gradient step: the clip's ratios to the actors' policy
        t_loss = algorithm.compute_loss({**tensors, "old_logp": algorithm._old_log_probs(tensors)})
    finally:
        learner.shutdown()

    # Same networks on both sides.
    obs = batch[Columns.OBS]
    with torch.no_grad():
        logits = actor(obs)[0]
        torch.testing.assert_close(fwd_out[Columns.ACTION_DIST_INPUTS], logits, atol=1e-6, rtol=0)
        torch.testing.assert_close(
            module.compute_values(batch), critic(obs)[:, 0], atol=1e-6, rtol=0
        )
    # Some importance ratios are clipped, some not: the thresholds matter.
    log_rhos = torch.log_softmax(logits, -1).gather(1, batch[Columns.ACTIONS][:, None])[:, 0]
    rhos = (log_rhos - batch[Columns.ACTION_LOGP]).exp()[batch[Columns.LOSS_MASK]]
    assert (rhos > VT_RHO).any() and (rhos < 1.0).any()
    torch.testing.assert_close(t_loss.total, r_loss, atol=1e-6, rtol=1e-6)
    logged = learner.metrics.peek(DEFAULT_MODULE_ID)
    for name, value in (("mean_pi_loss", t_loss.pi_loss), ("mean_vf_loss", t_loss.vf_loss)):
        np.testing.assert_allclose(float(logged[name]), float(value), rtol=1e-5)
