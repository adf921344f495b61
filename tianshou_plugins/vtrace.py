"""``VTrace``: IMPALA's off-policy actor-critic for Tianshou, trained by its ``OnPolicyTrainer``.

Espeholt et al. 2018 (arXiv:1802.01561). Actors act with (possibly stale) copies of the policy
and record the behaviour log-probs mu(a|x); the learner corrects for the lag with V-trace
targets and advantages (``rl_dist_ext.ops.vtrace``) and minimises the shared IMPALA loss
(:func:`rl_dist_ext.ops.vtrace_loss.vtrace_actor_critic_loss`, the function the RLlib learner
calls too): policy gradient + ``vf_coef`` x value error + ``ent_coef`` x entropy bonus.

Why Tianshou's ``OnPolicyTrainer``: V-trace learns from each trajectory once, as it arrives,
with no replay. The on-policy trainer does exactly that with whatever its collector gathered
since the last update (it passes the whole buffer to :meth:`update` and empties it); the
:class:`~tianshou_plugins.VTraceCollector` fills that buffer with the trajectories its
asynchronous actors finished meanwhile, so acting never waits for learning.

Why not Tianshou's ``ActorCriticOnPolicyAlgorithm``: its one job beyond the constructor is GAE
returns computed by walking the buffer; V-trace replaces exactly that step. ``VTrace`` takes the
same pieces (a ``ProbabilisticActorPolicy``, a critic, one optimizer over both, gradient
clipping) and runs Tianshou's update template (``_preprocess_batch`` lays the trajectories out
time-major, ``_update_with_batch`` takes the gradient steps).

Versions count gradient updates and the policy lag is reported in them (``rl_dist_ext.params``);
loading a state moves the version past every one published before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tianshou.algorithm.algorithm_base import OnPolicyAlgorithm, TrainingStats
from tianshou.algorithm.modelfree.reinforce import ProbabilisticActorPolicy
from tianshou.algorithm.optim import OptimizerFactory
from tianshou.data import Batch, ReplayBuffer
from tianshou.utils.net.common import ActorCritic, Net
from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic

from rl_dist_ext.impala import TimeMajorBatch, Trajectory, time_major_batch
from rl_dist_ext.observations import observation_array
from rl_dist_ext.ops.vtrace_loss import VTraceLoss, resolve_targets_for, vtrace_actor_critic_loss
from rl_dist_ext.params import VersionedWeights, WeightsVersion
from rl_dist_ext.validation import check_real
from tianshou_plugins.weights import cpu_state_dict

#: The tensors ``_preprocess_batch`` hands to ``_update_with_batch`` (time-major ``[T', B]``).
TENSOR_KEYS = ("obs", "actions", "rewards", "discounts", "behaviour_logp", "mask")
#: The buffer's per-step ``policy`` fields that hold a trajectory's structure and behaviour.
TRAJECTORY_FIELDS = ("logp", "row", "t", "version")


#: ``VTrace``'s default ``eps_clip``: with ``clip_around`` and ``targets_for`` left to follow it,
#: PPO's clipped surrogate around the actors' behaviour policy on V-trace's targets for that
#: policy (APPO's form), the loss that kept CartPole's target in the retention race (97 % of the
#: greedy tests after it over 10 seeds; IMPALA's plain loss, ``eps_clip=None``, kept 15 %)
DEFAULT_EPS_CLIP = 0.1


def resolve_clip_settings(
    eps_clip: float | None, clip_around: str | None = None, targets_for: str | None = None
) -> tuple[str, str]:
    """``VTrace``'s clipped-surrogate settings, refused by name (also checked by
    ``VTraceParams`` before an experiment builds anything), as ``(clip_around, targets_for)``
    with ``None`` following the clip: ``"behaviour"`` and ``"old"`` with one (APPO's form),
    ``"arrival"`` and ``"current"`` without (IMPALA's loss)."""
    if eps_clip is not None:
        check_real("eps_clip", eps_clip, low=0.0, strict=True)
    if clip_around is None:
        clip_around = "arrival" if eps_clip is None else "behaviour"
    if clip_around not in ("arrival", "behaviour"):
        raise ValueError(f"clip_around must be 'arrival' or 'behaviour', got {clip_around!r}")
    if eps_clip is None and clip_around != "arrival":
        raise ValueError(
            f"clip_around={clip_around!r} needs eps_clip: without it the loss has no ratio "
            "to take (eps_clip=None is IMPALA's plain policy gradient)"
        )
    return clip_around, resolve_targets_for(targets_for, eps_clip, clip_name="eps_clip")


def categorical_from_logits(logits: torch.Tensor) -> torch.distributions.Categorical:
    """``dist_fn`` for a discrete ``ProbabilisticActorPolicy`` whose actor outputs logits
    (e.g. ``DiscreteActor(..., softmax_output=False)``); importable, so actors unpickle it."""
    return torch.distributions.Categorical(logits=logits)


def _check_discrete(name: str, action_space: gym.Space) -> None:
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"{name} needs a Discrete action space, got {action_space!r}")


def discrete_actor_policy(
    actor: torch.nn.Module, observation_space: gym.Space, action_space: gym.Space
) -> ProbabilisticActorPolicy:
    """The policy ``VTrace`` trains for a discrete action space: ``actor``'s logits as a
    categorical (:func:`categorical_from_logits`), the most likely action in tests."""
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(
            f"discrete_actor_policy needs a Discrete action space, got {action_space!r}"
        )
    return ProbabilisticActorPolicy(
        actor=actor,
        dist_fn=categorical_from_logits,
        action_scaling=False,
        action_bound_method=None,
        action_space=action_space,
        observation_space=observation_space,
        deterministic_eval=True,
    )


def mlp_actor_critic(
    observation_space: gym.Space,
    action_space: gym.Space,
    hidden_sizes: tuple[int, ...] = (64, 64),
) -> tuple[ProbabilisticActorPolicy, DiscreteCritic]:
    """A discrete policy (an MLP actor with logits, :func:`discrete_actor_policy`) and a critic
    (an MLP of its own) for a vector observation space: the pair ``VTrace`` takes as ``policy``
    and ``critic``."""
    _check_discrete("mlp_actor_critic", action_space)
    shape = observation_space.shape
    actor = DiscreteActor(
        preprocess_net=Net(state_shape=shape, hidden_sizes=list(hidden_sizes)),
        action_shape=int(action_space.n),
        softmax_output=False,
    )
    critic = DiscreteCritic(preprocess_net=Net(state_shape=shape, hidden_sizes=list(hidden_sizes)))
    return discrete_actor_policy(actor, observation_space, action_space), critic


@dataclass(kw_only=True)
class VTraceTrainingStats(TrainingStats):
    loss: float
    pi_loss: float
    vf_loss: float
    entropy: float
    mean_rho: float  # mean pi/mu over the batch's steps (1 = no policy lag)
    gradient_steps: int
    num_rows: int  # trajectories of one env each
    weights_version: int


class VTrace(OnPolicyAlgorithm[ProbabilisticActorPolicy]):
    """IMPALA / V-trace for Tianshou's ``OnPolicyTrainer`` (see the module docstring).

    Args:
        policy: a ``ProbabilisticActorPolicy`` (its ``dist_fn`` gives the log-probs).
        critic: ``obs -> V(obs)`` (e.g. ``tianshou.utils.net.discrete.DiscreteCritic``).
        optim: one optimizer factory for the actor and the critic together.
        vf_coef: weight of the value loss ``0.5 (V - v_s)^2``.
        ent_coef: weight of the entropy bonus.
        max_grad_norm: clip the gradients' global L2 norm to this (``None``: no clipping).
        gamma: discount in [0, 1].
        clip_rho_threshold: rho-bar of the V-trace targets (``None``: no clipping).
        clip_pg_rho_threshold: rho-bar of the policy-gradient advantages (``None``: none).
        vtrace_lambda: trace factor lambda in [0, 1] (1 is the paper's V-trace).
        advantage_normalization: standardize the policy-gradient advantages of each gradient
            step's batch (mean 0, standard deviation 1), as Tianshou's PPO does by default.
        eps_clip: PPO's clipped surrogate on the V-trace advantages, with ratios to the
            ``clip_around`` policy clipped to ``[1 - eps_clip, 1 + eps_clip]``: it bounds how
            far the passes over one batch (``update_step_num_repetitions``) move the policy, as
            in Tianshou's PPO. Default 0.1 (``DEFAULT_EPS_CLIP``); ``None``: IMPALA's plain
            policy gradient (with ``clip_around`` and ``targets_for`` left to follow it, the
            paper's loss).
        clip_around: the policy ``eps_clip``'s ratios are taken to: ``"arrival"`` (the
            learner's as the batch arrived) or ``"behaviour"`` (the actors' that acted, whose
            log-probs ride with the trajectories; RLlib VTrace's ``clip_param`` does this).
            ``None`` (the default): ``"behaviour"`` with a clip, ``"arrival"`` without.
        targets_for: the policy V-trace's targets and advantages are computed for:
            ``"current"`` (the learner's, IMPALA's) or ``"old"`` (the one ``clip_around``
            names, as RLlib's APPO does for its target network: each step is then weighed by
            its importance ratio once; needs ``eps_clip``). ``None`` (the default): ``"old"``
            with a clip, ``"current"`` without.

    The defaults are APPO's form around the behaviour policy: every importance weight in the
    targets is then 1, so they are lambda-returns and the clipped ratio pi/mu is the only
    correction for policy lag. It kept CartPole's target where IMPALA's loss forgot it
    (``docs/benchmarks.md``, the retention races).
    """

    def __init__(
        self,
        *,
        policy: ProbabilisticActorPolicy,
        critic: torch.nn.Module,
        optim: OptimizerFactory,
        vf_coef: float = 0.5,
        ent_coef: float = 0.01,
        max_grad_norm: float | None = 40.0,
        gamma: float = 0.99,
        clip_rho_threshold: float | None = 1.0,
        clip_pg_rho_threshold: float | None = 1.0,
        vtrace_lambda: float = 1.0,
        advantage_normalization: bool = False,
        eps_clip: float | None = DEFAULT_EPS_CLIP,
        clip_around: str | None = None,
        targets_for: str | None = None,
    ) -> None:
        if not isinstance(policy, ProbabilisticActorPolicy):
            raise TypeError(
                f"policy must be a tianshou ProbabilisticActorPolicy, got {type(policy).__name__}"
            )
        if not isinstance(critic, torch.nn.Module):
            raise TypeError(f"critic must be a torch.nn.Module, got {type(critic).__name__}")
        check_real("vf_coef", vf_coef, low=0.0)
        check_real("ent_coef", ent_coef, low=0.0)
        if max_grad_norm is not None:
            check_real("max_grad_norm", max_grad_norm, low=0.0, strict=True)
        check_real("gamma", gamma, low=0.0, high=1.0)
        for name, value in (
            ("clip_rho_threshold", clip_rho_threshold),
            ("clip_pg_rho_threshold", clip_pg_rho_threshold),
        ):
            if value is not None:
                check_real(name, value, low=0.0, strict=True)
        check_real("vtrace_lambda", vtrace_lambda, low=0.0, high=1.0)
        clip_around, targets_for = resolve_clip_settings(eps_clip, clip_around, targets_for)
        if not isinstance(advantage_normalization, bool):
            raise TypeError(
                f"advantage_normalization must be True or False, got {advantage_normalization!r}"
            )
        super().__init__(policy=policy)
        self.critic = critic
        self.optim = self._create_optimizer(
            ActorCritic(self.policy.actor, self.critic), optim, max_grad_norm=max_grad_norm
        )
        self.vf_coef = float(vf_coef)
        self.ent_coef = float(ent_coef)
        self.max_grad_norm = max_grad_norm
        self.gamma = float(gamma)
        self.clip_rho_threshold = clip_rho_threshold
        self.clip_pg_rho_threshold = clip_pg_rho_threshold
        self.vtrace_lambda = float(vtrace_lambda)
        self.advantage_normalization = advantage_normalization
        self.eps_clip = None if eps_clip is None else float(eps_clip)
        self.clip_around = clip_around
        self.targets_for = targets_for
        self.weights_clock = WeightsVersion()

    # ---- versions -----------------------------------------------------------------------------
    @property
    def weights_version(self) -> int:
        return self.weights_clock.version

    @property
    def num_gradient_updates(self) -> int:
        return self.weights_clock.num_gradient_updates

    def versioned_weights(self) -> VersionedWeights:
        """The acting policy's weights (CPU copies) and their version: what actors pull."""
        return VersionedWeights(cpu_state_dict(self.policy), self.weights_clock.version)

    # ---- Tianshou's update template -----------------------------------------------------------
    def _preprocess_batch(self, batch: Batch, buffer: ReplayBuffer, indices: np.ndarray) -> Batch:  # type: ignore[override]
        """The buffer's steps back into trajectories, laid out time-major for V-trace."""
        tensors = self._tensors(time_major_batch([trajectory_from_steps(batch)]))
        return Batch(**tensors)

    def _update_with_batch(  # type: ignore[override]
        self, batch: Batch, batch_size: int | None, repeat: int
    ) -> VTraceTrainingStats:
        """``repeat`` passes over the batch's rows, ``batch_size`` env steps per gradient step
        (whole rows, at least one; ``None``: every row in one step)."""
        tensors = {key: batch[key] for key in TENSOR_KEYS}
        old_logp = self._old_log_probs(tensors)  # fixed for every pass
        if old_logp is not None:
            tensors["old_logp"] = old_logp
        num_rows = tensors["mask"].shape[1]
        real_per_row = max(int(tensors["mask"].sum()) // num_rows, 1)
        rows_per_step = num_rows if batch_size is None else max(batch_size // real_per_row, 1)
        losses: list[VTraceLoss] = []
        for _ in range(repeat):
            for start in range(0, num_rows, rows_per_step):
                rows = slice(start, start + rows_per_step)
                loss = self.compute_loss({k: v[:, rows] for k, v in tensors.items()})
                self.optim.step(loss.total)
                self.weights_clock.advance()
                losses.append(loss._replace(total=loss.total.detach()))

        def mean(field: str) -> float:
            return float(np.mean([float(getattr(x, field)) for x in losses]))

        return VTraceTrainingStats(
            loss=mean("total"),
            pi_loss=mean("pi_loss"),
            vf_loss=mean("vf_loss"),
            entropy=mean("entropy"),
            mean_rho=mean("mean_rho"),
            gradient_steps=len(losses),
            num_rows=num_rows,
            weights_version=self.weights_clock.version,
        )

    def _tensors(self, data: TimeMajorBatch) -> dict[str, torch.Tensor]:
        device = next(self.critic.parameters()).device
        discounts = self.gamma * (1.0 - data.terminated.astype(np.float32))
        return {
            "obs": torch.as_tensor(data.obs, dtype=torch.float32, device=device),
            "actions": torch.as_tensor(data.actions, device=device),
            "rewards": torch.as_tensor(data.rewards, dtype=torch.float32, device=device),
            "discounts": torch.as_tensor(discounts, dtype=torch.float32, device=device),
            "behaviour_logp": torch.as_tensor(
                data.behaviour_logp, dtype=torch.float32, device=device
            ),
            "mask": torch.as_tensor(data.mask, device=device),
        }

    def _old_log_probs(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """The log-probs ``eps_clip``'s ratios are taken to (``None`` without a clip): the
        actors' behaviour policy's, or the learner's policy's as the batch arrived."""
        if self.eps_clip is None:
            return None
        if self.clip_around == "behaviour":
            return tensors["behaviour_logp"]
        with torch.no_grad():
            return self._log_probs_and_entropy(tensors)[0]

    def compute_loss(self, batch: dict[str, torch.Tensor]) -> VTraceLoss:
        """The shared IMPALA loss on ``[T', B]`` tensors (``_tensors``' keys)."""
        target_logp, entropy = self._log_probs_and_entropy(batch)
        num_steps, num_rows = batch["mask"].shape
        flat_obs = batch["obs"].reshape(num_steps * num_rows, *batch["obs"].shape[2:])
        values = self.critic(flat_obs).reshape(num_steps, num_rows)
        return vtrace_actor_critic_loss(
            target_log_probs=target_logp,
            behaviour_log_probs=batch["behaviour_logp"],
            entropy=entropy,
            values=values,
            # Every row ends on a masked final-observation step: the bootstrap is never used.
            bootstrap_value=values[-1].detach(),
            rewards=batch["rewards"],
            discounts=batch["discounts"],
            mask=batch["mask"],
            vf_loss_coeff=self.vf_coef,
            entropy_coeff=self.ent_coef,
            clip_rho_threshold=self.clip_rho_threshold,
            clip_pg_rho_threshold=self.clip_pg_rho_threshold,
            lambda_=self.vtrace_lambda,
            normalize_advantages=self.advantage_normalization,
            ratio_clip=self.eps_clip,
            old_log_probs=batch.get("old_logp"),
            targets_for=self.targets_for,
        )

    def _log_probs_and_entropy(
        self, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """log pi(a_t|x_t) and H(pi(.|x_t)) of the current policy, ``[T', B]`` each."""
        num_steps, num_rows = batch["mask"].shape
        flat_obs = batch["obs"].reshape(num_steps * num_rows, *batch["obs"].shape[2:])
        dist = self.policy.dist_fn(self.policy.actor(flat_obs, state=None, info={})[0])
        flat_actions = batch["actions"].reshape(num_steps * num_rows, *batch["actions"].shape[2:])
        shape = (num_steps, num_rows)
        return dist.log_prob(flat_actions).reshape(shape), dist.entropy().reshape(shape)

    # ---- the version travels with state_dict() ------------------------------------------------
    def get_extra_state(self) -> dict[str, int]:
        return self.weights_clock.state_dict()

    def set_extra_state(self, state: dict[str, int]) -> None:
        """Restore the update count; the version moves past every one published before."""
        self.weights_clock.load_state_dict(state)


def steps_from_trajectory(trajectory: Trajectory, first_row: int) -> list[Batch]:
    """One Tianshou batch per time step of ``trajectory`` (its ``B`` rows numbered from
    ``first_row``), as a ``VectorReplayBuffer`` takes them with one row per sub-buffer; the
    behaviour log-prob, row, time index and acting version ride in the ``policy`` field."""
    columns = trajectory.columns
    num_steps, num_rows = np.shape(columns["rewards"])
    rows = np.arange(first_row, first_row + num_rows)
    version = np.full(num_rows, trajectory.acting_version, dtype=np.float64)
    return [
        Batch(
            obs=columns["obs"][t],
            act=columns["actions"][t],
            rew=columns["rewards"][t],
            terminated=columns["terminated"][t],
            truncated=columns["truncated"][t],
            obs_next=columns["next_obs"][t],
            info=Batch(),
            policy=Batch(
                logp=columns["behaviour_logp"][t],
                row=rows,
                t=np.full(num_rows, t),
                version=version,
            ),
        )
        for t in range(num_steps)
    ]


def trajectory_from_steps(batch: Batch) -> Trajectory:
    """Inverse of :func:`steps_from_trajectory` for a buffer's steps in any order: one
    ``[T, B]`` trajectory of every row (its acting version the rows' mean).

    Raises:
        ValueError: the steps lack the trajectory fields (the buffer was not filled by a
            ``VTraceCollector``) or a row's time indices are not ``0..T-1`` of one shared ``T``.
    """
    policy = batch.get("policy", Batch())
    missing = [f for f in TRAJECTORY_FIELDS if len(batch) == 0 or f not in policy.get_keys()]
    if missing:
        raise ValueError(
            "VTrace learns from whole trajectories recorded by a VTraceCollector; the buffer's "
            f"steps lack the policy fields {missing}"
        )
    row, t = np.asarray(policy.row, dtype=np.int64), np.asarray(policy.t, dtype=np.int64)
    order = np.lexsort((t, row))
    _, counts = np.unique(row[order], return_counts=True)
    num_steps = int(counts[0])
    same_length = bool((counts == num_steps).all())
    if not same_length or not (t[order] == np.tile(np.arange(num_steps), len(counts))).all():
        raise ValueError(
            "the buffer's trajectories are incomplete: every row must hold time steps "
            f"0..T-1 of one shared T (row lengths {sorted(set(counts.tolist()))})"
        )

    def column(x: Any, dtype: Any = None) -> np.ndarray:
        x = np.asarray(x, dtype=dtype)[order]
        return x.reshape(len(counts), num_steps, *x.shape[1:]).swapaxes(0, 1)  # [T, B, ...]

    columns = {
        "obs": observation_array(column(batch.obs)),
        "actions": column(batch.act),
        "rewards": column(batch.rew, np.float32),
        "next_obs": observation_array(column(batch.obs_next)),
        "terminated": column(batch.terminated, bool),
        "truncated": column(batch.truncated, bool),
        "behaviour_logp": column(policy.logp, np.float32),
    }
    return Trajectory(columns, float(np.mean(policy.version)))
