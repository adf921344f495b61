"""RLlib (2.60, new API stack) adapters for rl-dist-ext.

Importing this package registers ``"GorilaDQN"`` and ``"VTrace"`` with Tune and RLlib's
algorithm registry, so ``tune.Tuner("GorilaDQN", param_space=config)`` and
``get_trainable_cls("VTrace")`` work. PettingZoo multi-agent envs: RLlib's own
``.multi_agent(...)``; :mod:`rllib_plugins.pettingzoo` has picklable env creators and policy
mappings, :mod:`rllib_plugins.action_masking` the modules that honour action masks.
"""

from rllib_plugins.action_masking import ActionMaskingDQNTorchRLModule, RandomLegalActionRLModule
from rllib_plugins.gorila import GorilaDQN, GorilaDQNConfig
from rllib_plugins.gorila_env_runner import GorilaEnvRunner, GorilaMultiAgentEnvRunner
from rllib_plugins.gorila_learner import GorilaDQNTorchLearner
from rllib_plugins.pettingzoo import AlternatingSeats, PettingZooCreator, ShareOneModule
from rllib_plugins.registration import register_algorithms
from rllib_plugins.vtrace import VTrace, VTraceConfig, VTraceEnvRunner, VTraceMultiAgentEnvRunner
from rllib_plugins.vtrace_learner import VTraceTorchLearner

register_algorithms()

__all__ = [
    "ActionMaskingDQNTorchRLModule",
    "AlternatingSeats",
    "GorilaDQN",
    "GorilaDQNConfig",
    "GorilaDQNTorchLearner",
    "GorilaEnvRunner",
    "GorilaMultiAgentEnvRunner",
    "PettingZooCreator",
    "RandomLegalActionRLModule",
    "ShareOneModule",
    "VTrace",
    "VTraceConfig",
    "VTraceEnvRunner",
    "VTraceMultiAgentEnvRunner",
    "VTraceTorchLearner",
]
