"""Weights as the actors, the weights server and the inference server receive them."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def cpu_state_dict(module: torch.nn.Module) -> dict[str, np.ndarray]:
    """A numpy copy of ``module``'s state dict: what the actors load. Numpy, so that the
    weights server (which only stores and hands out weights) never imports torch."""
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


def load_cpu_state_dict(module: torch.nn.Module, weights: dict[str, Any]) -> None:
    """Load :func:`cpu_state_dict` output (numpy arrays, possibly read-only from Ray's object
    store, or tensors) into ``module``."""
    module.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in weights.items()})
