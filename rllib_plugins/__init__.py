"""RLlib (2.60, new API stack) adapters for rl-dist-ext.

Importing this package registers ``"GorilaDQN"`` and ``"VTrace"`` with Tune and RLlib's
algorithm registry, so ``tune.Tuner("GorilaDQN", param_space=config)`` and
``get_trainable_cls("VTrace")`` work.
"""

from rllib_plugins.gorila import GorilaDQN
from rllib_plugins.gorila_config import GorilaDQNConfig
from rllib_plugins.gorila_env_runner import GorilaEnvRunner
from rllib_plugins.gorila_learner import GorilaDQNTorchLearner
from rllib_plugins.registration import register_algorithms
from rllib_plugins.vtrace import VTrace, VTraceConfig, VTraceEnvRunner
from rllib_plugins.vtrace_learner import VTraceTorchLearner

register_algorithms()

__all__ = [
    "GorilaDQN",
    "GorilaDQNConfig",
    "GorilaDQNTorchLearner",
    "GorilaEnvRunner",
    "VTrace",
    "VTraceConfig",
    "VTraceEnvRunner",
    "VTraceTorchLearner",
]
