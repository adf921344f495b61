"""The ``NotProvided`` idiom of RLlib's ``AlgorithmConfig`` setters, in one place."""

from __future__ import annotations

from typing import Any

from ray.rllib.utils.from_config import NotProvided


def set_provided(
    config: Any, values: dict[str, Any], attribute_names: dict[str, str] | None = None
) -> None:
    """``setattr(config, attribute_names[k], v)`` for every ``k, v`` in ``values`` that was given.

    RLlib's setters default every argument to ``NotProvided`` so that a call changes only what
    it names; ``attribute_names`` maps argument names to the config's attribute names (default:
    the same name).
    """
    names = attribute_names or {}
    for name, value in values.items():
        if value is not NotProvided:
            setattr(config, names.get(name, name), value)
