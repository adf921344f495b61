"""What both RLlib algorithms need to know about a multi-agent config."""

from __future__ import annotations

from typing import Any


def trained_module_ids(config: Any) -> list[str]:
    """The modules that learn, sorted: RLlib's ``policies_to_train`` (a collection, or a
    ``(module_id, batch) -> bool`` callable; ``None``: every policy) over ``policies``."""
    policies = sorted(config.policies)
    chosen = config.policies_to_train
    if chosen is None:
        return policies
    if callable(chosen):
        return [p for p in policies if chosen(p, None)]
    return [p for p in policies if p in set(chosen)]


class OptimizeTrainedModulesOnly:
    """Learner mixin: optimizers for the trained modules only. RLlib's torch learner builds one
    for every torch module of the ``MultiRLModule``, which fails on a module without
    parameters (a fixed or random opponent) and would give a frozen module an optimizer."""

    def configure_optimizers_for_module(self, module_id, config=None) -> None:
        if not self.config.is_multi_agent or module_id in trained_module_ids(self.config):
            super().configure_optimizers_for_module(module_id=module_id, config=config)
