"""Tianshou 2.0 adapters: Gorila / Ape-X DQN and IMPALA / V-trace with Ray actors.

``GorilaDQN`` (the algorithm), ``GorilaCollector`` (N asynchronous Ray actors, each running
Tianshou's own ``Collector``) and ``DistributedPrioritizedReplayBuffer`` (rl-dist-ext's sharded
replay behind Tianshou's buffer API); Tianshou's ``OffPolicyTrainer`` drives them unchanged.
``VTrace`` (IMPALA's off-policy actor-critic) and ``VTraceCollector`` (asynchronous actors
returning fixed-length trajectories with their behaviour log-probs); Tianshou's
``OnPolicyTrainer`` drives them. Both collectors run in SEED mode with
``central_inference=CentralInference(...)``: one inference server acts for every actor.
Settings, one object per concern: ``ActorFleet`` (a collector's actors) and
``DistributedReplayConfig`` (the replay); collectors and buffers take one, or its fields as
keywords.
PettingZoo multi-agent envs: ``MultiAgentGorilaDQN`` (Tianshou's ``MultiAgentOffPolicyAlgorithm``
with ``GorilaDQN`` learners) and ``MultiAgentDistributedReplayBuffer`` (one replay per learning
module) with the same ``GorilaCollector``.
"""

from rl_dist_ext.replay.distributed import DistributedReplayConfig
from tianshou_plugins.actor_collector import VTRACE_FLEET, ActorCollectStats, ActorFleet
from tianshou_plugins.buffer import DistributedPrioritizedReplayBuffer
from tianshou_plugins.central_inference import CentralInference
from tianshou_plugins.collector import GorilaCollector, GorilaCollectStats
from tianshou_plugins.gorila_dqn import GorilaDQN, GorilaTrainingStats
from tianshou_plugins.kernel_cache import cache_tianshou_kernels
from tianshou_plugins.multi_agent import (
    MultiAgentDistributedReplayBuffer,
    MultiAgentGorilaDQN,
    PettingZooFactory,
)
from tianshou_plugins.vtrace import (
    VTrace,
    VTraceTrainingStats,
    categorical_from_logits,
    discrete_actor_policy,
    mlp_actor_critic,
)
from tianshou_plugins.vtrace_collector import VTraceCollector, VTraceCollectStats

# Before any process of this package builds a policy or a buffer: see kernel_cache.
cache_tianshou_kernels()

__all__ = [
    "VTRACE_FLEET",
    "ActorCollectStats",
    "ActorFleet",
    "CentralInference",
    "DistributedPrioritizedReplayBuffer",
    "DistributedReplayConfig",
    "GorilaCollectStats",
    "GorilaCollector",
    "GorilaDQN",
    "GorilaTrainingStats",
    "MultiAgentDistributedReplayBuffer",
    "MultiAgentGorilaDQN",
    "PettingZooFactory",
    "VTrace",
    "VTraceCollectStats",
    "VTraceCollector",
    "VTraceTrainingStats",
    "categorical_from_logits",
    "discrete_actor_policy",
    "mlp_actor_critic",
]
