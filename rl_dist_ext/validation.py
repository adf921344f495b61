"""Argument checks shared by the core and the adapters (one message format everywhere)."""

from __future__ import annotations

import numbers
from typing import Any


def check_int(name: str, value: Any, low: int) -> int:
    """Return ``int(value)``; raise ``ValueError`` naming ``name`` unless it is an int >= ``low``.

    ``bool`` is refused; numpy integers are accepted.
    """
    if type(value) is int and value >= low:  # the common case, kept cheap for hot paths
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)
