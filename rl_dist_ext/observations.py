"""How observations are kept on their way from the env to the network: one rule, used by every
actor, replay row and inference request.

Pixel observations (uint8) stay uint8 until the network's first layer converts them (on the
learner and on the inference server): a float32 copy would be four times the bytes sent, stored
and compressed. Every other observation is float32. The networks divide uint8 pixels by their
observation space's ``high`` (:func:`pixel_scale`).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def observation_array(values: Any) -> np.ndarray:
    """``values`` as an array: uint8 kept as it is, anything else as float32 (no copy when it
    already is)."""
    array = np.asarray(values)
    if array.dtype == np.uint8:
        return array
    return array.astype(np.float32, copy=False)


def pixel_scale(space: Any) -> float | None:
    """What a network multiplies uint8 observations of ``space`` by at its first layer:
    ``1 / high`` (1/255 for Atari frames, 1 for MinAtar's 0/1 channels); ``None`` unless
    ``space`` is a uint8 box (anything with ``dtype`` and ``high``, e.g. a gymnasium ``Box``)."""
    if getattr(space, "dtype", None) != np.uint8 or getattr(space, "high", None) is None:
        return None
    return 1.0 / float(np.max(space.high))
