"""``GorilaDQN``: Tianshou's DQN trained from the distributed replay on actor-folded n-step rows.

Tianshou's DQN computes its n-step targets by walking the buffer (``compute_nstep_return`` calls
``buffer.next``), which a remote replay cannot serve. Here the actors fold n-step transitions
(``rl_dist_ext.gorila``) and the learner uses the shared, importance-weighted double-DQN loss
(``rl_dist_ext.ops.priorities.double_dqn_loss``, the same function the RLlib learner calls), so
every loss path, Huber included, applies the weights. One :meth:`GorilaDQN.update` is:
sample -> gradient step -> priorities back (``buffer.update_priorities(keys, |TD|)``); the target
network is hard-updated every ``target_update_freq`` gradient steps. The actors get the weights
through :meth:`GorilaDQN.weights_for_actors`, which the collector publishes with their version:
one more per gradient step, and after ``load_state_dict`` one more than the newest version
this algorithm or the loaded state had, so that restored (even older) weights reach the actors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tianshou.algorithm.algorithm_base import TrainingStats
from tianshou.algorithm.modelfree.dqn import DQN, DiscreteQLearningPolicy
from tianshou.algorithm.optim import OptimizerFactory
from tianshou.data import Batch
from tianshou.utils.torch_utils import torch_train_mode

from rl_dist_ext.ops.priorities import DQNLoss, double_dqn_loss
from rl_dist_ext.validation import check_int, check_real
from tianshou_plugins.actor import cpu_state_dict, q_values
from tianshou_plugins.buffer import DistributedPrioritizedReplayBuffer


@dataclass(kw_only=True)
class GorilaTrainingStats(TrainingStats):
    loss: float
    q_mean: float
    td_error_abs_mean: float


class GorilaDQN(DQN[DiscreteQLearningPolicy]):
    """Gorila / Ape-X double DQN for Tianshou's ``OffPolicyTrainer``.

    Args:
        policy: a ``DiscreteQLearningPolicy`` over a ``Discrete`` action space; its
            ``eps_training`` is ignored by the actors, which use the Ape-X epsilon ladder.
        optim: optimizer factory (e.g. ``AdamOptimizerFactory(lr=1e-3)``).
        gamma: discount in [0, 1].
        n_step_return_horizon: n of the n-step transitions the actors fold (>= 1).
        target_update_freq: gradient steps between hard target updates (>= 1: Gorila always has
            a target network).
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
        self.num_gradient_updates = 0
        self.weights_version = 0

    # ---- what the actors get ------------------------------------------------------------------
    def weights_for_actors(self) -> tuple[dict[str, torch.Tensor], int]:
        """The policy's CPU state dict and its version (see the module docstring)."""
        return cpu_state_dict(self.policy), self.weights_version

    # ---- one update: sample -> gradient step -> priorities -----------------------------------
    def update(
        self, buffer: DistributedPrioritizedReplayBuffer, sample_size: int | None
    ) -> GorilaTrainingStats:
        if not isinstance(buffer, DistributedPrioritizedReplayBuffer):
            raise TypeError(
                "GorilaDQN learns from actor-folded n-step rows: buffer must be a "
                f"DistributedPrioritizedReplayBuffer, got {type(buffer).__name__}"
            )
        if not self.policy.is_within_training_step:
            raise RuntimeError(
                "update() was called outside of a training step; use Tianshou's trainer or "
                "wrap the call in tianshou.utils.torch_utils.policy_within_training_step"
            )
        started = time.time()
        batch, keys = buffer.sample(sample_size)
        with torch_train_mode(self):
            out = self._gradient_step(batch)
        buffer.update_priorities(keys, out.td_error.abs().cpu().numpy())
        for scheduler in self.lr_schedulers:
            scheduler.step()
        stats = self._stats(out)
        stats.train_time = time.time() - started
        return stats

    def _update_with_batch(self, batch: Batch) -> GorilaTrainingStats:
        """A gradient step on a sampled batch (no priority update; :meth:`update` does that)."""
        return self._stats(self._gradient_step(batch))

    def _gradient_step(self, batch: Batch) -> DQNLoss:
        self._periodically_update_lagged_network_weights()  # every target_update_freq steps
        out = self.compute_loss(batch)
        self.optim.step(out.loss)
        self.num_gradient_updates += 1
        self.weights_version += 1
        return out

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
        )

    @staticmethod
    def _stats(out: DQNLoss) -> GorilaTrainingStats:
        return GorilaTrainingStats(
            loss=float(out.loss.detach()),
            q_mean=float(out.q_selected.mean()),
            td_error_abs_mean=float(out.td_error.abs().mean()),
        )

    # ---- Tianshou's buffer-walking n-step path does not apply ---------------------------------
    def _preprocess_batch(self, batch, buffer, indices):  # type: ignore[override]
        return batch  # targets come folded from the actors

    def _target_q(self, buffer, indices):  # type: ignore[override]
        raise TypeError("GorilaDQN's targets come from actor-folded n-step rows, not the buffer")

    # ---- counters travel with state_dict() ----------------------------------------------------
    def get_extra_state(self) -> dict[str, int]:
        return {
            "num_gradient_updates": self.num_gradient_updates,
            "weights_version": self.weights_version,
            "iter": self._iter,
        }

    def set_extra_state(self, state: dict[str, int]) -> None:
        self.num_gradient_updates = int(state["num_gradient_updates"])
        self._iter = int(state["iter"])
        restored = int(state.get("weights_version", self.num_gradient_updates))
        # New weights need a new version, newer than anything published before the restore.
        self.weights_version = max(self.weights_version, restored) + 1
