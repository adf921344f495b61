"""How observations are kept on their way from the env to the network: one rule, used by every
actor, replay row and inference request.

Pixel observations (uint8) stay uint8 until the network's first layer converts them (on the
learner and on the inference server): a float32 copy would be four times the bytes sent, stored
and compressed. Every other observation is float32.
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
