"""Argument checks shared by the core and the adapters (one message format everywhere)."""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import sys
from collections.abc import Iterable
from typing import Any


def is_torch_tensor(value: Any) -> bool:
    """Whether ``value`` is a ``torch.Tensor``, without importing torch: processes that only
    move numpy arrays (replay shards, the weights server) never pay torch's import."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def check_int(name: str, value: Any, low: int) -> int:
    """Return ``int(value)``; raise ``ValueError`` naming ``name`` unless it is an int >= ``low``.

    ``bool`` is refused; numpy integers are accepted.
    """
    if type(value) is int and value >= low:  # the common case, kept cheap for hot paths
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


def check_choice(name: str, value: Any, allowed: Iterable[str]) -> str:
    """Return ``value``; raise ``ValueError`` naming ``name`` unless it is one of the strings
    ``allowed`` (listed in the message)."""
    allowed = list(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def check_real(
    name: str, value: Any, *, low: float, high: float | None = None, strict: bool = False
) -> float:
    """Return ``float(value)``; raise ``ValueError`` naming ``name`` unless it is a real number
    ``>= low`` (``> low`` when ``strict``) and ``<= high`` when ``high`` is given."""
    ok = (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and (value > low if strict else value >= low)
        and (high is None or value <= high)
    )
    if not ok:
        bound = f"> {low}" if strict else f">= {low}"
        if high is not None:
            bound += f" and <= {high}"
        raise ValueError(f"{name} must be a number {bound}, got {value!r}")
    return float(value)


def with_settings(base: Any, settings: dict[str, Any]) -> Any:
    """``base`` (a settings dataclass) with the given fields replaced, validated again.

    How an adapter "takes or builds" one settings object: it takes ``base`` (the object a user
    passed, or the adapter's defaults) and the keyword settings of the same names. A name the
    dataclass does not have raises ``TypeError`` naming it and the fields it has.
    """
    if not settings:
        return base
    check_setting_names(
        type(base).__name__, settings, {f.name for f in dataclasses.fields(base) if f.init}
    )
    return dataclasses.replace(base, **settings)


def check_setting_names(owner: str, given: Iterable[str], allowed: Iterable[str]) -> None:
    """Raise ``TypeError`` naming every name in ``given`` that ``owner`` does not take, and the
    names it takes (before any value is looked at: values may still be Tune search spaces)."""
    allowed = set(allowed)
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise TypeError(
            f"{owner} has no setting {', '.join(map(repr, unknown))}; it takes "
            f"{', '.join(sorted(allowed))}"
        )


#: the environment variable that sets a floor under every wait for Ray actors to start
START_TIMEOUT_ENV = "RL_DIST_EXT_START_TIMEOUT_S"


def start_timeout_s(configured: float) -> float:
    """How long to wait for actors (collector actors, replay shards) to start: ``configured``,
    or the seconds in ``RL_DIST_EXT_START_TIMEOUT_S`` where that is longer (for a machine where
    starting a process can take minutes, a small one under load, without changing the code)."""
    raw = os.environ.get(START_TIMEOUT_ENV, "").strip()
    if not raw:
        return configured
    try:
        floor = float(raw)
    except ValueError:
        floor = math.nan
    if not (math.isfinite(floor) and floor > 0):
        raise ValueError(
            f"{START_TIMEOUT_ENV}={raw!r}: give a number of seconds > 0, or leave it unset"
        )
    return max(configured, floor)
