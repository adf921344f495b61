"""Gorila's central learner on RLlib's ``DQNTorchLearner``.

The learner step is the core's (:class:`rl_dist_ext.gorila.GorilaLearner`: sample from the
distributed replay with prefetch -> gradient step -> priorities back -> target every C gradient
updates -> publish every P); this class only translates: replay rows to an RLlib batch, the loss
to the shared importance-weighted double-DQN loss (``rl_dist_ext.ops.dqn.double_dqn_loss``), and
each gradient step RLlib's ``Learner._update`` takes to the core's clock (so ``k`` updates can
share one call: ``training(updates_per_learner_call=k)``). The update path is lean: the module's
training forward takes gradients over the sampled observations only
(``ActionMaskingDQNTorchRLModule._forward_train``), the gradients are clipped, checked and applied
in one pass each (:mod:`rllib_plugins.lean_gradients`), and a fused call runs RLlib's step
without ``Learner.update``'s per-call batch iterator (:meth:`GorilaDQNTorchLearner.fused_update`).

Several learners (``num_learners > 1``): RLlib's learner group runs N copies in lock step with
torch DDP averaging their gradients; each samples its own prioritized batches and updates their
priorities, and the first learner alone publishes weights (:meth:`connect`).

Multi-agent: one replay per trained module; every update samples a batch from each and takes
one step over all of them (RLlib's learner sums the modules' losses), and each module's TD
errors go back to its own replay (``GorilaLearner.update_modules``).
"""

from __future__ import annotations

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
)
from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.utils import update_target_network
from ray.rllib.policy.sample_batch import SampleBatch
from ray.rllib.utils.metrics import (
    ALL_MODULES,
    MODULE_TRAIN_BATCH_SIZE_MEAN,
    NUM_ENV_STEPS_TRAINED,
    NUM_ENV_STEPS_TRAINED_LIFETIME,
    NUM_MODULE_STEPS_TRAINED,
    NUM_MODULE_STEPS_TRAINED_LIFETIME,
    NUM_TARGET_UPDATES,
    WEIGHTS_SEQ_NO,
)
from ray.rllib.utils.numpy import convert_to_numpy
from ray.rllib.utils.torch_utils import convert_to_torch_tensor

from rl_dist_ext.gorila import NEXT_ACTION_MASK, GorilaLearner, GorilaLearnerCounters
from rl_dist_ext.ops.dqn import double_dqn_loss, polyak_update, target_tau
from rl_dist_ext.replay.prioritized import ReplaySample
from rllib_plugins.lean_gradients import LeanGradients
from rllib_plugins.multi_agent import OptimizeTrainedModulesOnly, trained_module_ids

DISCOUNTS = "discounts"
WEIGHTS = "weights"


def replay_rows_to_batch(rows: dict[str, np.ndarray], weights: np.ndarray) -> SampleBatch:
    """A replay sample (``rl_dist_ext.gorila.TRANSITION_COLUMNS``, and the legal actions at the
    bootstrap observation where the env masks actions) as RLlib columns."""
    columns = {
        Columns.OBS: rows["obs"],
        Columns.ACTIONS: rows["action"],
        Columns.REWARDS: rows["reward"],
        DISCOUNTS: rows["discount"],
        Columns.NEXT_OBS: rows["next_obs"],
        WEIGHTS: weights,
    }
    if NEXT_ACTION_MASK in rows:
        columns[NEXT_ACTION_MASK] = rows[NEXT_ACTION_MASK]
    return SampleBatch(columns)


class TrainedSteps:
    """Rows trained per module over several gradient steps, logged under RLlib's steps-trained
    keys as its ``Learner.update`` logs them (``Learner._log_steps_trained_metrics``): sums
    and lifetime sums per module and over all modules, env steps (the largest module batch of
    each step), the mean batch size per module and the weights sequence number."""

    def __init__(self) -> None:
        self.rows: dict[str, int] = {}
        self.steps: dict[str, int] = {}
        self.env_steps = 0

    def add(self, rows: dict[str, int]) -> None:
        """One gradient step that trained ``rows[module]`` rows of each module."""
        for module, n in rows.items():
            self.rows[module] = self.rows.get(module, 0) + n
            self.steps[module] = self.steps.get(module, 0) + 1
        self.env_steps += max(rows.values())

    def log(self, metrics, *, weights_seq_no: int) -> None:
        if not self.rows:
            return
        for module, rows in self.rows.items():
            metrics.log_value((module, WEIGHTS_SEQ_NO), weights_seq_no, window=1)
            metrics.log_value(
                (module, MODULE_TRAIN_BATCH_SIZE_MEAN), rows / self.steps[module], reduce="mean"
            )
            metrics.log_value((module, NUM_MODULE_STEPS_TRAINED), rows, reduce="sum")
            metrics.log_value(
                (module, NUM_MODULE_STEPS_TRAINED_LIFETIME),
                rows,
                reduce="lifetime_sum",
                with_throughput=True,
            )
        total = sum(self.rows.values())
        for key, value, reduce in (
            (NUM_MODULE_STEPS_TRAINED, total, "sum"),
            (NUM_MODULE_STEPS_TRAINED_LIFETIME, total, "lifetime_sum"),
            (NUM_ENV_STEPS_TRAINED, self.env_steps, "sum"),
            (NUM_ENV_STEPS_TRAINED_LIFETIME, self.env_steps, "lifetime_sum"),
        ):
            metrics.log_value((ALL_MODULES, key), value, reduce=reduce, with_throughput=True)


class WeightsSinks:
    """Where published weights go: the parameter server and, in SEED mode, the inference server
    (fire and forget there: the server ignores versions older than the one it holds)."""

    def __init__(self, parameter_server, inference_server=None) -> None:
        self._parameter_server = parameter_server
        self._inference_server = inference_server

    def publish(self, weights: Any, version: int) -> int:
        if self._inference_server is not None:
            self._inference_server.set_weights.remote(weights, version)
        return self._parameter_server.publish(weights, version)


class GorilaDQNTorchLearner(
    GorilaLearnerCounters, OptimizeTrainedModulesOnly, LeanGradients, DQNTorchLearner
):
    """Double DQN with importance weights, fed from the distributed replay (gradient
    clipping, finiteness checks and Adam in fewer passes: :mod:`rllib_plugins.lean_gradients`)."""

    def build(self) -> None:
        super().build()
        config = self.config
        self.gorila = GorilaLearner(
            replay=None,
            batch_size=config.train_batch_size_per_learner,
            prioritized=config.replay_prioritized,
            target_update_every=config.target_update_every_n_updates,
            publish_every=config.publish_every_n_updates,
            sync_target=self._sync_target_networks,
            export_weights=self.actor_weights,
        )
        # module id -> the last step's TD errors, kept until that module's next step (they
        # give its batch's priorities); the loss is dropped once its metrics are logged
        self._last_td_error: dict[str, torch.Tensor] = {}
        self._last_loss: dict[str, Any] = {}  # module id -> the last step's DQNLoss
        self._trained = TrainedSteps()  # rows trained in the running train_from_replay
        # each gradient step's TD errors while train_from_replay collects them (else None)
        self._step_td_errors: list[dict[str, torch.Tensor]] | None = None
        self._beta = config.replay_config().beta  # 0 with replay(prioritized=False)

    # ---- wiring -------------------------------------------------------------------------------
    def connect(self, replays: dict[str, Any], parameter_server, inference_server=None) -> int:
        """Hand over the replay clients (trained module id -> replay), the weights server and
        (SEED mode) the inference server; publish the current weights.

        With ``num_learners > 1`` (data-parallel learners: RLlib wraps the modules in torch DDP,
        which averages the gradients, so every learner holds the same weights) each learner
        samples its own batches and sends its own priorities; only the first learner publishes
        weights, so that one version goes out per update."""
        sink = WeightsSinks(parameter_server, inference_server) if self.is_first_learner else None
        return self.gorila.connect(replays=replays, weights=sink)

    @property
    def is_first_learner(self) -> bool:
        """Rank 0 of the data-parallel learners (the only learner when there is one)."""
        return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0

    def publish_weights(self, *, new_version: bool = False) -> int:
        return self.gorila.publish(new_version=new_version)

    @property
    def trained_modules(self) -> list[str]:
        if self.config.is_multi_agent:
            return trained_module_ids(self.config)
        return [DEFAULT_MODULE_ID]

    def actor_weights(self) -> dict[str, Any]:
        """The inference weights runners load: the module's state (multi-agent: trained module
        id -> its state, which a ``MultiRLModule.set_state`` takes)."""
        if not self.config.is_multi_agent:
            return convert_to_numpy(self.module[DEFAULT_MODULE_ID].get_state(inference_only=True))
        return {
            module: convert_to_numpy(self.module[module].get_state(inference_only=True))
            for module in self.trained_modules
        }

    # ---- the training loop body ---------------------------------------------------------------
    def train_from_replay(self, num_updates: int, timesteps: dict[str, Any]) -> dict:
        """Run ``num_updates`` core learner updates, ``updates_per_learner_call`` (k) of them per
        fused call (:meth:`fused_update`); return RLlib's reduced metrics.

        RLlib's hooks around gradient updates (``before/after_gradient_based_update``: the LR
        schedule and torch LR schedulers) run once per fused call, as ``Learner.update`` runs
        them once per call; the steps-trained and loss metrics (sums, and values whose window
        is one) are logged once, at the end."""

        def gradient_steps(batches: list[dict[str, ReplaySample]]) -> list[dict[str, torch.Tensor]]:
            self._step_td_errors = []
            try:
                self.fused_update(batches, timesteps)
                return self._step_td_errors
            finally:
                self._step_td_errors = None

        self._trained = TrainedSteps()
        stats = self.gorila.update_fused(
            num_updates,
            beta=self._beta,
            updates_per_call=self.config.updates_per_learner_call,
            gradient_steps=gradient_steps,
        )
        self._trained.log(self.metrics, weights_seq_no=self._weights_seq_no)
        self._log_loss_metrics()
        metrics = {
            "replay_sample_wait_fraction": stats.sample_wait_s / stats.seconds,
            "gradient_updates_per_s": stats.num_updates / stats.seconds,
            "num_gradient_updates": self.gorila.num_gradient_updates,
            "weights_version": self.gorila.weights_version,
        }
        self.metrics.log_dict(metrics, key=ALL_MODULES, window=1)
        return self.metrics.reduce()

    def fused_update(self, batches: list[dict[str, ReplaySample]], timesteps: dict) -> None:
        """One gradient step per sampled batch (module id -> sample), as a ``Learner.update``
        call of RLlib's takes them: its hooks before and after (the LR schedule), one weights
        sequence number, RLlib's ``_update`` on each batch's tensors, the rows counted for
        RLlib's steps-trained metrics (logged once per :meth:`train_from_replay`).
        ``Learner.update`` itself would add a batch iterator, a conversion and a metrics pass
        per call, as much as a third of a CartPole step."""
        self.before_gradient_based_update(timesteps=timesteps)
        self._weights_seq_no += 1
        for samples in batches:
            tensors = {
                module: convert_to_torch_tensor(
                    dict(replay_rows_to_batch(sample.batch, sample.weights)), device=self.device
                )
                for module, sample in samples.items()
            }
            self._update(tensors)
            self._trained.add({module: len(sample.keys) for module, sample in samples.items()})
        self.after_gradient_based_update(timesteps=timesteps)

    def _update(self, batch: dict[str, Any]) -> tuple[Any, Any, Any]:
        # One gradient step (a fused call takes several): its TD errors are kept for its own
        # batch's priorities, and the core counts it here, so the target network syncs at its
        # update even inside a fused call (after_gradient_based_update runs once per call).
        # DQNLearner's own env-step target sync never fires: GorilaDQNConfig sets its period
        # out of reach.
        out = super()._update(batch)
        if self._step_td_errors is not None:  # a direct Learner.update keeps none
            self._step_td_errors.append({m: self._last_td_error[m] for m in batch})
        self.gorila.after_gradient_step()
        return out

    def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        """RLlib's hook (the LR schedule); after a direct ``Learner.update`` call also the
        loss metrics (:meth:`train_from_replay` logs them once, at its end)."""
        super().after_gradient_based_update(timesteps=timesteps)
        if self._step_td_errors is None:
            self._log_loss_metrics()

    def _log_loss_metrics(self) -> None:
        """The last step's loss metrics per module (their window is one value)."""
        for module_id, out in self._last_loss.items():
            self.metrics.log_dict(
                {
                    self.TOTAL_LOSS_KEY: out.loss.detach(),
                    QF_LOSS_KEY: out.loss.detach(),
                    QF_MEAN_KEY: out.q_selected.detach().mean(),
                    TD_ERROR_MEAN_KEY: out.td_error.mean(),
                },
                key=module_id,
                window=1,
            )
        self._last_loss.clear()

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
            next_action_mask=batch.get(NEXT_ACTION_MASK),
        )
        self._last_td_error[module_id] = out.td_error
        self._last_loss[module_id] = out
        return out.loss

    def _sync_target_networks(self) -> None:
        """Every C updates: each trained module's target moves to ``tau * online + (1 - tau) *
        target`` (DQN's ``tau``, the module's own; ``None``, GorilaDQN's default, picks it from
        C: :func:`~rl_dist_ext.ops.dqn.target_tau`). 1.0 copies the online network with
        RLlib's own update, less mixes in place."""
        every = self.config.target_update_every_n_updates
        for module_id in self.trained_modules:
            module = self.module[module_id]
            tau = target_tau(self.config.get_config_for_module(module_id).tau, every)
            for main_net, target_net in module.unwrapped().get_target_network_pairs():
                if tau == 1.0:
                    update_target_network(main_net=main_net, target_net=target_net, tau=1.0)
                else:
                    polyak_update(main_net, target_net, tau)
            self.metrics.log_value((module_id, NUM_TARGET_UPDATES), 1, reduce="lifetime_sum")

    # ---- checkpoint the counters with the learner ----------------------------------------------
    def get_state(self, *args, **kwargs):
        state = super().get_state(*args, **kwargs)
        state["gorila"] = self.gorila.state_dict()
        return state

    def set_state(self, state) -> None:
        """Restore the weights and counters. The weights version moves past every version
        published before (see ``rl_dist_ext.params``); ``GorilaDQN.restore_from_path`` then
        publishes the restored weights."""
        super().set_state(state)
        if "gorila" in state:
            self.gorila.load_state_dict(state["gorila"])
