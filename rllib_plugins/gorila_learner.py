"""Gorila's central learner on RLlib's ``DQNTorchLearner``.

It samples prioritized batches straight from the distributed replay (with prefetch), trains the
shared importance-weighted double-DQN loss (``rl_dist_ext.ops.priorities.double_dqn_loss``),
sends the new priorities back through ``update_priorities(keys, priorities)``, hard-updates the
target network every C gradient updates, and publishes versioned weights for the env runners.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from ray.rllib.algorithms.dqn.dqn_learner import (
    QF_LOSS_KEY,
    QF_MEAN_KEY,
    QF_NEXT_PREDS,
    QF_PREDS,
    QF_TARGET_NEXT_PREDS,
    TD_ERROR_MEAN_KEY,
    DQNLearner,
)
from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.utils import update_target_network
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import ALL_MODULES, NUM_TARGET_UPDATES
from ray.rllib.utils.numpy import convert_to_numpy

from rl_dist_ext.ops.priorities import double_dqn_loss

DISCOUNTS = "discounts"
WEIGHTS = "weights"


def replay_rows_to_batch(rows: dict[str, np.ndarray], weights: np.ndarray) -> SampleBatch:
    """A replay sample (``rl_dist_ext.gorila.TRANSITION_COLUMNS``) as RLlib columns."""
    return SampleBatch(
        {
            Columns.OBS: rows["obs"],
            Columns.ACTIONS: rows["action"],
            Columns.REWARDS: rows["reward"],
            DISCOUNTS: rows["discount"],
            Columns.NEXT_OBS: rows["next_obs"],
            WEIGHTS: weights,
        }
    )


class GorilaDQNTorchLearner(DQNTorchLearner):
    """Double DQN with importance weights, fed from the distributed replay."""

    def build(self) -> None:
        super().build()
        self._replay = None
        self._weights_server = None
        self._inference_server = None
        self._last_td_error: dict[str, torch.Tensor] = {}
        self.num_gradient_updates = 0
        self.weights_version = 0
        self._sample_wait_s = 0.0

    # ---- wiring -------------------------------------------------------------------------------
    def connect(self, replay, parameter_server, inference_server=None) -> int:
        """Hand over the replay client, the weights server and (SEED mode) the inference
        server; publish the current weights."""
        self._replay = replay
        self._weights_server = parameter_server
        self._inference_server = inference_server
        self.publish_weights()
        return self.weights_version

    def publish_weights(self) -> int:
        import ray

        self.weights_version += 1
        state = convert_to_numpy(self.module[DEFAULT_MODULE_ID].get_state(inference_only=True))
        if self._inference_server is not None:  # fire and forget; stale versions are ignored
            self._inference_server.set_weights.remote(state, self.weights_version)
        ray.get(self._weights_server.publish.remote(state, self.weights_version))
        return self.weights_version

    # ---- the training loop body ---------------------------------------------------------------
    def train_from_replay(self, num_updates: int, timesteps: dict[str, Any]) -> dict:
        """Run ``num_updates`` x [sample, gradient step, priority update]; return metrics."""
        config = self.config
        batch_size = config.train_batch_size_per_learner
        beta = config.effective_beta
        wait = 0.0
        started = time.monotonic()
        for _ in range(num_updates):
            t0 = time.monotonic()
            sample = self._replay.sample(batch_size, beta=beta)
            wait += time.monotonic() - t0
            batch = MultiAgentBatch(
                {DEFAULT_MODULE_ID: replay_rows_to_batch(sample.batch, sample.weights)},
                env_steps=batch_size,
            )
            self.update(batch=batch, timesteps=timesteps, _no_metrics_reduce=True)
            td = self._last_td_error[DEFAULT_MODULE_ID].abs().cpu().numpy()
            if config.replay_prioritized:
                self._replay.update_priorities(sample.keys, td)
            if self.num_gradient_updates % config.publish_every_n_updates == 0:
                self.publish_weights()
        elapsed = time.monotonic() - started
        self._sample_wait_s += wait
        self.metrics.log_value(
            (ALL_MODULES, "replay_sample_wait_fraction"), wait / elapsed, window=1
        )
        self.metrics.log_value(
            (ALL_MODULES, "gradient_updates_per_s"), num_updates / elapsed, window=1
        )
        self.metrics.log_value(
            (ALL_MODULES, "num_gradient_updates"), self.num_gradient_updates, window=1
        )
        self.metrics.log_value((ALL_MODULES, "weights_version"), self.weights_version, window=1)
        return self.metrics.reduce()

    # ---- loss and target network --------------------------------------------------------------
    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        # double_q=False: the target network also selects the action (plain DQN target).
        q_select_tp1 = fwd_out[QF_NEXT_PREDS] if config.double_q else fwd_out[QF_TARGET_NEXT_PREDS]
        out = double_dqn_loss(
            q_online_t=fwd_out[QF_PREDS],
            actions=batch[Columns.ACTIONS],
            rewards=batch[Columns.REWARDS],
            discounts=batch[DISCOUNTS],
            q_online_tp1=q_select_tp1,
            q_target_tp1=fwd_out[QF_TARGET_NEXT_PREDS],
            weights=batch[WEIGHTS],
            loss_type=config.td_error_loss_fn,
        )
        self._last_td_error[module_id] = out.td_error
        self.metrics.log_dict(
            {
                QF_LOSS_KEY: out.loss.detach(),
                QF_MEAN_KEY: out.q_selected.mean(),
                TD_ERROR_MEAN_KEY: out.td_error.mean(),
            },
            key=module_id,
            window=1,
        )
        return out.loss

    def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        # Skip DQNLearner's env-step-based target sync: Gorila counts gradient updates.
        super(DQNLearner, self).after_gradient_based_update(timesteps=timesteps)
        self.num_gradient_updates += 1
        if self.num_gradient_updates % self.config.target_update_every_n_updates:
            return
        for module_id, module in self.module._rl_modules.items():
            for main_net, target_net in module.unwrapped().get_target_network_pairs():
                update_target_network(main_net=main_net, target_net=target_net, tau=1.0)
            self.metrics.log_value((module_id, NUM_TARGET_UPDATES), 1, reduce="lifetime_sum")

    # ---- checkpoint the counters with the learner ----------------------------------------------
    def get_state(self, *args, **kwargs):
        state = super().get_state(*args, **kwargs)
        state["gorila"] = {
            "num_gradient_updates": self.num_gradient_updates,
            "weights_version": self.weights_version,
        }
        return state

    def set_state(self, state) -> None:
        """Restore the weights and counters. The weights version never goes back: runners and
        the inference server only take versions newer than theirs, so the restored weights
        are published (by ``GorilaDQN.restore_from_path``) as the version after the newest
        one this learner or the checkpoint has seen."""
        super().set_state(state)
        if "gorila" in state:
            self.num_gradient_updates = state["gorila"]["num_gradient_updates"]
            self.weights_version = max(self.weights_version, state["gorila"]["weights_version"])
