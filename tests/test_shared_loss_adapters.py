"""One batch through both adapters: the RLlib learner and the Tianshou algorithm agree (STYLE 3).

Both adapters call ``rl_dist_ext.ops.dqn.double_dqn_loss``; this test checks that the glue
around it (batch columns, which network selects and which evaluates the next action, the loss
type, the importance weights) is the same on both sides. The RLlib learner is built in-process
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
