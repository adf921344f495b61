"""The V-trace learner: RLlib's IMPALA learner with the loss computed by ``rl_dist_ext.ops.vtrace``.

Same batch layout as RLlib's IMPALA: episode pieces laid end to end, each followed by one extra
step (``AddOneTsToEpisodesAndTruncate``: the final observation again, ``LOSS_MASK`` False), the
flat batch cut into rows of ``rollout_fragment_length``. The V-trace targets and advantages come
from :func:`rl_dist_ext.ops.vtrace.vtrace_from_log_probs` (Espeholt et al. 2018), and the loss
from :func:`rl_dist_ext.ops.vtrace_loss.vtrace_actor_critic_loss` (shared with the Tianshou
adapter), with the loss mask passed as the op's ``mask``: the extra step adds no error term, so a
piece truncated by the env or cut at a fragment end bootstraps from V(final observation) and
only a termination cuts the return. (RLlib 2.60's own IMPALA loss only zeroes the extra step's
discount, which lets its error ``-V(x_L)`` into the step before: every piece is learned as if
the episode ended there.) The rho and pg-rho thresholds and the trace factor lambda are
configurable.

An update whose episodes all died with their env runner (RLlib's ``TrainingData.solve_refs``
drops references whose owner is gone, e.g. with its node) is skipped and counted, by every
data-parallel learner at once: a learner that skipped alone would leave its peers waiting in
DDP's gradient all-reduce.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed
from ray.rllib.algorithms.impala.torch.impala_torch_learner import IMPALATorchLearner
from ray.rllib.algorithms.impala.torch.vtrace_torch_v2 import make_time_major
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.learner import ENTROPY_KEY
from ray.rllib.core.learner.training_data import TrainingData
from ray.rllib.utils.metrics import ALL_MODULES
from ray.rllib.utils.numpy import convert_to_numpy

from rl_dist_ext.ops.vtrace_loss import resolve_targets_for, vtrace_actor_critic_loss
from rl_dist_ext.params import VersionedWeights, WeightsVersion
from rllib_plugins.multi_agent import OptimizeTrainedModulesOnly, trained_module_ids

log = logging.getLogger(__name__)

UPDATES_SKIPPED_KEY = "num_updates_skipped_without_episodes_lifetime"


class VTraceTorchLearner(OptimizeTrainedModulesOnly, IMPALATorchLearner):
    """IMPALA's learner whose loss calls the shared V-trace core.

    Its weights carry a version that counts gradient updates (``rl_dist_ext.params``), the
    unit the inference server's replies and the policy lag are reported in.
    """

    def build(self) -> None:
        super().build()
        self.weights_clock = WeightsVersion()
        self._steps_this_update = 0  # gradient steps of the update under way (_counted)
        self.updates_skipped = 0
        # Data-parallel learners agree on each update over a process group of their own: IMPALA's
        # learner thread runs DDP's collectives on the default group meanwhile.
        self._peers = (
            torch.distributed.new_group(backend="gloo")
            if torch.distributed.is_initialized()
            else None
        )

    def update(self, training_data: TrainingData, *, timesteps: dict[str, Any], **kwargs: Any):
        """IMPALA's update, unless this learner or a data-parallel peer has no episodes for it:
        then every learner skips it, counts it (``updates_skipped``, and in the learner results
        under ``num_updates_skipped_without_episodes_lifetime``) and returns no results."""
        training_data.solve_refs()  # IMPALA's update calls it again: then a no-op
        if self._every_learner_has_episodes(training_data):
            return super().update(training_data, timesteps=timesteps, **kwargs)
        self.updates_skipped += 1
        log.warning(
            "skipped a learner update: no episodes for it on this learner or a peer (their "
            "env runner was lost); %d skipped so far",
            self.updates_skipped,
        )
        self.metrics.log_value((ALL_MODULES, UPDATES_SKIPPED_KEY), 1, reduce="lifetime_sum")
        return {}

    def _create_iterator_if_necessary(
        self,
        *,
        training_data: TrainingData,
        num_epochs: int = 1,
        minibatch_size: int | None = None,
        shuffle_batch_per_epoch: bool = False,
        **kwargs: Any,
    ) -> Iterable:
        """Each of ``num_epochs`` passes trains on the whole batch, its rows in order (V-trace
        runs along them, each bootstrapping from the next). RLlib's own iterator takes passes
        of ``batch.count`` rows, the batch's env steps: with aggregator actors they were counted
        before the learner connector added the extra step after each episode piece, and with
        several agents they are env steps, not a module's rows, so its passes would wrap around
        the batch and cut rows. ``validate()`` refuses the minibatches and the shuffle this
        leaves out."""
        if training_data.data_iterators:
            return self._counted(
                super()._create_iterator_if_necessary(
                    training_data=training_data,
                    num_epochs=num_epochs,
                    minibatch_size=minibatch_size,
                    shuffle_batch_per_epoch=shuffle_batch_per_epoch,
                    **kwargs,
                )
            )
        # one pass: the whole batch (nothing, where no module of it is trained)
        whole = list(super()._create_iterator_if_necessary(training_data=training_data, **kwargs))
        # Learner.update turns the batch's slicing flag off after each pass
        return self._counted(
            self._set_slicing_by_batch_id(batch, value=True)
            for _ in range(num_epochs)
            for batch in whole
        )

    def _counted(self, batches: Iterable) -> Iterable:
        """``batches`` as ``Learner.update`` takes them, one gradient step each, counted for
        :meth:`after_gradient_based_update` (which RLlib calls once per update, after them
        all): versions count gradient steps, as the Tianshou learner's do."""
        self._steps_this_update = 0
        for batch in batches:
            self._steps_this_update += 1
            yield batch

    def _every_learner_has_episodes(self, training_data: TrainingData) -> bool:
        has_episodes = training_data.episodes is None or len(training_data.episodes) > 0
        if self._peers is None:
            return has_episodes
        flag = torch.tensor([int(has_episodes)], dtype=torch.int32)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN, group=self._peers)
        return bool(flag.item())

    def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        super().after_gradient_based_update(timesteps=timesteps)
        for _ in range(self._steps_this_update):
            self.weights_clock.advance()

    def versioned_weights(self) -> VersionedWeights:
        """The module's inference weights (numpy; multi-agent: trained module id -> weights)
        and their version.

        The version is read first: IMPALA's learner thread may update meanwhile, and weights
        newer than their label are harmless where a label newer than its weights is not.
        """
        version = self.weights_clock.version
        if not self.config.is_multi_agent:
            state = self.module[DEFAULT_MODULE_ID].get_state(inference_only=True)
            return VersionedWeights(convert_to_numpy(state), version)
        states = {  # multi-agent: the server holds every trained module
            module: convert_to_numpy(self.module[module].get_state(inference_only=True))
            for module in trained_module_ids(self.config)
        }
        return VersionedWeights(states, version)

    def get_state(self, *args: Any, **kwargs: Any):
        state = super().get_state(*args, **kwargs)
        state["weights_version"] = self.weights_clock.state_dict()
        return state

    def set_state(self, state) -> None:
        """Restore; the weights version moves past every one pushed before."""
        super().set_state(state)
        if "weights_version" in state:
            self.weights_clock.load_state_dict(state["weights_version"])

    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out) -> torch.Tensor:
        module = self.module[module_id].unwrapped()
        length = config.get_rollout_fragment_length()
        seq_lens = batch.get("seq_lens")

        def time_major(x: torch.Tensor) -> torch.Tensor:
            return make_time_major(x, trajectory_len=length, recurrent_seq_len=seq_lens)

        mask_tm = time_major(batch[Columns.LOSS_MASK].float())
        dist = module.get_train_action_dist_cls().from_logits(fwd_out[Columns.ACTION_DIST_INPUTS])
        values_tm = time_major(
            module.compute_values(batch, embeddings=fwd_out.get(Columns.EMBEDDINGS))
        )
        # Row b's bootstrap is the first value of row b+1 (rows cut the flat batch); the last
        # row ends on an extra step or padding, both masked, so its bootstrap is never used.
        bootstrap = torch.cat([values_tm[0][1:], values_tm[0][:1]], dim=0)
        terminated_tm = time_major(batch[Columns.TERMINATEDS]).float()
        entropy_coeff = self.entropy_coeff_schedulers_per_module[module_id].get_current_value()
        behaviour_logp = time_major(batch[Columns.ACTION_LOGP])
        loss = vtrace_actor_critic_loss(
            target_log_probs=time_major(dist.logp(batch[Columns.ACTIONS])),
            behaviour_log_probs=behaviour_logp,
            entropy=time_major(dist.entropy()),
            values=values_tm,
            bootstrap_value=bootstrap.detach(),
            rewards=time_major(batch[Columns.REWARDS]),
            discounts=(1.0 - terminated_tm) * config.gamma,
            # RLlib's extra step after each piece holds the final observation: masked, it adds
            # no error term, so truncated and cut pieces bootstrap from V(final observation).
            mask=mask_tm,
            vf_loss_coeff=config.vf_loss_coeff,
            entropy_coeff=entropy_coeff,
            clip_rho_threshold=config.vtrace_clip_rho_threshold,
            clip_pg_rho_threshold=config.vtrace_clip_pg_rho_threshold,
            lambda_=config.vtrace_lambda,
            ratio_clip=config.clip_param,
            old_log_probs=None if config.clip_param is None else behaviour_logp,
            targets_for=resolve_targets_for(
                config.targets_for, config.clip_param, clip_name="clip_param"
            ),
        )
        self.metrics.log_dict(
            {
                "mean_pi_loss": loss.pi_loss,
                "mean_vf_loss": loss.vf_loss,
                ENTROPY_KEY: loss.entropy,
                "mean_rho": loss.mean_rho,
            },
            key=module_id,
            window=1,
        )
        return loss.total
