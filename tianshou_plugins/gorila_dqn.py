"""``GorilaDQN``: Tianshou's DQN trained from the distributed replay on actor-folded n-step rows.

Tianshou's DQN computes its n-step targets by walking the buffer (``compute_nstep_return`` calls
``buffer.next``), which a remote replay cannot serve. Here the actors fold n-step transitions
(``rl_dist_ext.gorila``) and the learner uses the shared, importance-weighted double-DQN loss
(``rl_dist_ext.ops.dqn.double_dqn_loss``, the same function the RLlib learner calls), so every
loss path, Huber included, applies the weights.

One update runs through Tianshou's own template (``OffPolicyAlgorithm.update``: sample ->
``_preprocess_batch`` -> ``_update_with_batch`` -> ``_postprocess_batch``), whose hooks call the
core learner step's phases (:class:`rl_dist_ext.gorila.GorilaLearner`): the gradient step counts
one weights version and updates the target network every ``target_update_freq`` gradient steps
(a copy, or a Polyak mix with ``tau``); the post-processing sends ``|TD|`` back as priorities.
The collector publishes the weights (``GorilaLearner.publish``) each time the trainer hands
control to acting. Versions count gradient updates; loading a state moves the version past
every one published before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tianshou.algorithm.algorithm_base import TrainingStats
from tianshou.algorithm.modelfree.dqn import DQN, DiscreteQLearningPolicy
from tianshou.algorithm.optim import OptimizerFactory
from tianshou.data import Batch, ReplayBuffer

from rl_dist_ext.gorila import GorilaLearner, GorilaLearnerCounters
from rl_dist_ext.ops.dqn import DQNLoss, double_dqn_loss, polyak_update, target_tau
from rl_dist_ext.validation import check_int, check_real
from tianshou_plugins.actor import q_values
from tianshou_plugins.buffer import DistributedPrioritizedReplayBuffer
from tianshou_plugins.weights import cpu_state_dict

#: The batch field ``_update_with_batch`` hands to ``_postprocess_batch`` (Tianshou's template
#: passes only the batch between its hooks).
TD_ERROR = "td_error"


@dataclass(kw_only=True)
class GorilaTrainingStats(TrainingStats):
    loss: float
    q_mean: float
    td_error_abs_mean: float


class GorilaDQN(GorilaLearnerCounters, DQN[DiscreteQLearningPolicy]):
    """Gorila / Ape-X double DQN for Tianshou's ``OffPolicyTrainer``.

    Args:
        policy: a ``DiscreteQLearningPolicy`` over a ``Discrete`` action space; its
            ``eps_training`` is ignored by the actors, which use the Ape-X epsilon ladder.
        optim: optimizer factory (e.g. ``AdamOptimizerFactory(lr=1e-3)``).
        gamma: discount in [0, 1].
        n_step_return_horizon: n of the n-step transitions the actors fold (>= 1).
        target_update_freq: gradient steps between target updates (>= 1: Gorila always has a
            target network).
        tau: the share of the online network mixed into the target at each target update,
            ``target <- tau * online + (1 - tau) * target``, in (0, 1]; 1 copies (Tianshou's
            hard update). ``None`` (the default) picks it from ``target_update_freq``: 0.008
            for a target moved after every update (``target_update_freq=1``, a Polyak
            target), a copy for a longer period (:func:`rl_dist_ext.ops.dqn.target_tau`, as
            RLlib's GorilaDQN does with DQN's ``tau``).
        is_double: double-DQN target (online network selects, target evaluates); ``False`` uses
            the target network's max.
        huber_loss_delta: Huber loss with this delta; ``None`` for the squared loss
            ``0.5 * td ** 2``. Importance weights apply to both.
    """

    def __init__(
        self,
        *,
        policy: DiscreteQLearningPolicy,
        optim: OptimizerFactory,
        gamma: float = 0.99,
        n_step_return_horizon: int = 3,
        target_update_freq: int = 500,
        tau: float | None = None,
        is_double: bool = True,
        huber_loss_delta: float | None = 1.0,
    ) -> None:
        if not isinstance(policy, DiscreteQLearningPolicy):
            raise TypeError(
                f"policy must be a tianshou DiscreteQLearningPolicy, got {type(policy).__name__}"
            )
        if not isinstance(policy.action_space, gym.spaces.Discrete):
            raise TypeError(f"GorilaDQN needs a Discrete action space, got {policy.action_space!r}")
        check_real("gamma", gamma, low=0.0, high=1.0)
        check_int("n_step_return_horizon", n_step_return_horizon, 1)
        check_int("target_update_freq", target_update_freq, 1)
        if tau is not None:
            tau = check_real("tau", tau, low=0.0, high=1.0, strict=True)
        if huber_loss_delta is not None:
            check_real("huber_loss_delta", huber_loss_delta, low=0.0, strict=True)
        super().__init__(
            policy=policy,
            optim=optim,
            gamma=gamma,
            n_step_return_horizon=n_step_return_horizon,
            target_update_freq=target_update_freq,
            is_double=is_double,
            huber_loss_delta=huber_loss_delta,
        )
        #: the share of the online network mixed into the target at each target update
        self.target_tau = target_tau(tau, target_update_freq)
        self.gorila = GorilaLearner(
            replay=None,  # Tianshou's template samples; the buffer comes with each update
            batch_size=None,
            prioritized=True,
            target_update_every=target_update_freq,
            publish_every=1,
            sync_target=self._sync_target,
            export_weights=self._actor_weights,
        )

    def _sync_target(self) -> None:
        """Every ``target_update_freq`` updates: a copy (Tianshou's own hard update) or the
        Polyak mix of :attr:`target_tau` into the lagged network."""
        if self.target_tau == 1.0:
            self._update_lagged_network_weights()
        else:
            polyak_update(self.policy.model, self.model_old.module, self.target_tau)

    def _actor_weights(self) -> dict[str, torch.Tensor]:
        return cpu_state_dict(self.policy)

    # ---- Tianshou's update template -----------------------------------------------------------
    def update(self, buffer: ReplayBuffer, sample_size: int | None) -> TrainingStats:
        """Tianshou's update, from the distributed buffer only (checked before it samples)."""
        if not isinstance(buffer, DistributedPrioritizedReplayBuffer):
            raise TypeError(
                "GorilaDQN learns from actor-folded n-step rows: buffer must be a "
                f"DistributedPrioritizedReplayBuffer, got {type(buffer).__name__}"
            )
        return super().update(buffer, sample_size)

    def _preprocess_batch(self, batch: Batch, buffer: ReplayBuffer, indices: np.ndarray) -> Batch:  # type: ignore[override]
        """Targets come folded from the actors; priorities go back to ``buffer``."""
        self.gorila.replay = buffer
        return batch

    def _update_with_batch(self, batch: Batch) -> GorilaTrainingStats:  # type: ignore[override]
        """One gradient step; counts a weights version and syncs the target every C."""
        out = self.compute_loss(batch)
        self.optim.step(out.loss)
        self.gorila.after_gradient_step()
        batch[TD_ERROR] = out.td_error.cpu().numpy()
        return GorilaTrainingStats(
            loss=float(out.loss.detach()),
            q_mean=float(out.q_selected.mean()),
            td_error_abs_mean=float(out.td_error.abs().mean()),
        )

    def _postprocess_batch(self, batch: Batch, buffer: ReplayBuffer, indices: np.ndarray) -> None:  # type: ignore[override]
        """New priorities ``|TD|`` through the one typed call (``indices`` are replay keys)."""
        self.gorila.send_priorities(indices, batch[TD_ERROR])

    def compute_loss(self, batch: Batch) -> DQNLoss:
        """The shared double-DQN loss on a batch from ``DistributedPrioritizedReplayBuffer``."""
        model = self.policy.model
        device = next(model.parameters()).device

        def tensor(x: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            # Arrays from Ray's object store are read-only; torch wants writable memory.
            return torch.as_tensor(np.require(x, requirements="W"), dtype=dtype, device=device)

        obs, obs_next = tensor(batch.obs), tensor(batch.obs_next)
        q_online_t = q_values(model, obs)
        with torch.no_grad():
            q_target_tp1 = q_values(self.model_old, obs_next)
            q_select_tp1 = q_values(model, obs_next) if self.is_double else q_target_tp1
        return double_dqn_loss(
            q_online_t=q_online_t,
            actions=tensor(batch.act, torch.int64),
            rewards=tensor(batch.rew),
            discounts=tensor(batch.discount),
            q_online_tp1=q_select_tp1,
            q_target_tp1=q_target_tp1,
            weights=tensor(batch.weight) if "weight" in batch else None,
            loss_type="mse" if self.huber_loss_delta is None else "huber",
            huber_delta=1.0 if self.huber_loss_delta is None else float(self.huber_loss_delta),
            next_action_mask=tensor(batch.mask_next, torch.bool) if "mask_next" in batch else None,
        )

    # ---- counters travel with state_dict() ----------------------------------------------------
    def get_extra_state(self) -> dict[str, int]:
        return self.gorila.state_dict()

    def set_extra_state(self, state: dict[str, int]) -> None:
        """Restore the counters; the version moves past every one published before."""
        self.gorila.load_state_dict(state)
