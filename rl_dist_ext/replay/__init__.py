"""Prioritized replay: a sum/min tree sampler over columnar storage (one shard, no Ray)."""

from rl_dist_ext.replay.compression import ObsCompression
from rl_dist_ext.replay.prioritized import PrioritizedReplay, ReplaySample, SampledItems
from rl_dist_ext.replay.storage import ColumnarStorage
from rl_dist_ext.replay.sum_tree import SumTree

__all__ = [
    "ColumnarStorage",
    "ObsCompression",
    "PrioritizedReplay",
    "ReplaySample",
    "SampledItems",
    "SumTree",
]
