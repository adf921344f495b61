"""Tianshou 2.0 adapters: Gorila / Ape-X DQN with a distributed replay and Ray actors.

``GorilaDQN`` (the algorithm), ``GorilaCollector`` (N asynchronous Ray actors, each running
Tianshou's own ``Collector``) and ``DistributedPrioritizedReplayBuffer`` (rl-dist-ext's sharded
replay behind Tianshou's buffer API); Tianshou's ``OffPolicyTrainer`` drives them unchanged.
"""

from tianshou_plugins.buffer import DistributedPrioritizedReplayBuffer
from tianshou_plugins.collector import GorilaCollector, GorilaCollectStats
from tianshou_plugins.gorila_dqn import GorilaDQN, GorilaTrainingStats

__all__ = [
    "DistributedPrioritizedReplayBuffer",
    "GorilaCollectStats",
    "GorilaCollector",
    "GorilaDQN",
    "GorilaTrainingStats",
]
