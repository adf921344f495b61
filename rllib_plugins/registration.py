"""Register rl-dist-ext's algorithms with Tune and RLlib's algorithm registry (idempotent)."""

from __future__ import annotations


def _gorila_dqn():
    from rllib_plugins.gorila import GorilaDQN

    return GorilaDQN, GorilaDQN.get_default_config()


def _vtrace():
    from rllib_plugins.vtrace import VTrace

    return VTrace, VTrace.get_default_config()


ALGORITHMS = {"GorilaDQN": _gorila_dqn, "VTrace": _vtrace}


def register_algorithms() -> None:
    """Make ``tune.Tuner(name)``, ``get_trainable_cls(name)`` and
    ``AlgorithmConfig(algo_class=name)`` work for ``"GorilaDQN"`` and ``"VTrace"``
    (``register_trainable``), and list them in RLlib's algorithm registry beside its own
    (``registry.ALGORITHMS``, a module dict: see docs/internals.md)."""
    from ray.rllib.algorithms import registry
    from ray.tune.registry import register_trainable

    for name, loader in ALGORITHMS.items():
        registry.ALGORITHMS[name] = loader
        register_trainable(name, loader()[0])
