"""Versioned weights between one learner and many actors (Gorila's parameter server, pull-based).

**One version unit.** A weights version advances by one with each of the learner's gradient
updates (:class:`WeightsVersion`): version k after k updates, until weights are replaced from
outside. Replacing them (loading a checkpoint, restoring only the module) moves the version past
every one published before, so restored (even older) weights still reach actors and servers,
which only take versions newer than theirs. **One policy lag**:
:func:`policy_lag`, the learner's version minus the version of the weights that acted, in
gradient updates. Every algorithm (GorilaDQN, V-trace; RLlib and Tianshou) reports these.

The learner ``publish``-es weights with their version; actors call
``pull_if_newer(their_version)`` every K steps and get ``None`` (nothing to copy) or the newer
``(weights, version)``. :class:`ParameterServer` is a plain class; ``rl_dist_ext.ray_actors``
makes it a Ray actor and gives the handle the same two methods
(:class:`~rl_dist_ext.ray_actors.ParameterServerClient`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple, Protocol

from rl_dist_ext.validation import check_int
from rl_dist_ext.weight_deltas import DeltaPublisher, DeltaPull


class ParameterServerUnavailable(RuntimeError):
    """The parameter server did not answer for longer than the client's bound: it is down and
    did not come back in time (restarting, or nowhere to restart because its node is gone)."""


class VersionedWeights(NamedTuple):
    weights: Any
    version: int


class WeightsVersion:
    """The learner's clock: gradient updates done and the version of its current weights."""

    def __init__(self) -> None:
        self.num_gradient_updates = 0
        self.version = 0

    def advance(self) -> int:
        """Count one gradient update; returns the new version."""
        self.num_gradient_updates += 1
        self.version += 1
        return self.version

    def bump(self) -> int:
        """New weights that no gradient update made (e.g. restored): a new version."""
        self.version += 1
        return self.version

    def state_dict(self) -> dict[str, int]:
        return {"num_gradient_updates": self.num_gradient_updates, "version": self.version}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Take the saved update count; the version moves past both the saved and the own one.

        Also reads checkpoints of rl-dist-ext 0.1, which named the version ``weights_version``.
        """
        self.num_gradient_updates = check_int(
            "num_gradient_updates", state["num_gradient_updates"], 0
        )
        saved = state["version"] if "version" in state else state.get("weights_version", 0)
        self.version = max(self.version, check_int("version", saved, 0)) + 1


class PolicyLag(NamedTuple):
    mean: float  # gradient updates; nan when no actor has acted with known weights yet
    max: float


def policy_lag(learner_version: int, acting_versions: Iterable[float]) -> PolicyLag:
    """The learner's weights version minus the versions that acted, in gradient updates.

    ``acting_versions`` may be means over one rollout (a SEED actor's replies can come from
    several versions); negative ones (initial weights, nothing pulled yet) are left out.
    """
    lags = [learner_version - float(v) for v in acting_versions if v >= 0]
    if not lags:
        return PolicyLag(math.nan, math.nan)
    return PolicyLag(sum(lags) / len(lags), max(lags))


class WeightsSource(Protocol):
    def pull_if_newer(self, version: int) -> VersionedWeights | None: ...


class WeightsPuller:
    """An actor's side of the parameter server: newer weights every ``every_n_steps`` env steps.

    Args:
        source: the parameter server (``pull_if_newer``); ``None`` for an actor that holds no
            weights (SEED): it never pulls and keeps version -1.
        every_n_steps: the actor's env steps between pulls (Gorila's K).
    """

    def __init__(self, source: WeightsSource | None, every_n_steps: int) -> None:
        self._source = source
        self._every = check_int("pull_every_n_steps", every_n_steps, 1)
        self.version = -1  # of the weights held; -1 = initial weights, nothing pulled yet
        self._steps_since_pull = 0

    def pull(self, load: Callable[[Any], None]) -> bool:
        """Pull newer weights now (``load`` puts them in the local network); ``True`` if any."""
        self._steps_since_pull = 0
        if self._source is None:
            return False
        latest = self._source.pull_if_newer(self.version)
        if latest is None:
            return False
        load(latest.weights)
        self.version = latest.version
        return True

    def pull_if_due(self, load: Callable[[Any], None]) -> bool:
        """:meth:`pull` if ``every_n_steps`` env steps were :meth:`count`-ed since the last."""
        return self._steps_since_pull >= self._every and self.pull(load)

    def count(self, env_steps: int) -> None:
        self._steps_since_pull += env_steps


class HoldsPulledWeights:
    """For an actor step whose local weights come through ``self._weights`` (a
    :class:`WeightsPuller`): their version and an explicit pull."""

    _weights: WeightsPuller

    @property
    def weights_version(self) -> int:
        """Version of the weights held (-1: initial weights, nothing pulled yet)."""
        return self._weights.version

    def pull_weights(self, load: Callable[[Any], None]) -> bool:
        """Pull newer weights now (``load`` puts them in the local network); ``True`` if any."""
        return self._weights.pull(load)


class ParameterServer:
    """Holds the newest weights and their version; counts publishes and pulls.

    Args:
        delta_tolerance: serve delta pulls (:meth:`pull_delta_if_newer`) within this bound, as a
            fraction of each tensor's RMS (:mod:`rl_dist_ext.weight_deltas`); ``None``: none.
    """

    def __init__(self, *, delta_tolerance: float | None = None) -> None:
        self._deltas = None if delta_tolerance is None else DeltaPublisher(delta_tolerance)
        self._latest: VersionedWeights | None = None
        self._published_at = 0.0
        self.num_publishes = 0
        self.num_pulls = 0
        self.num_pulls_served = 0

    def publish(self, weights: Any, version: int) -> int:
        """Store ``weights`` as ``version``; an older or equal version is rejected.

        Returns:
            The version now held.
        """
        version = check_int("version", version, 0)
        if self._latest is not None and version <= self._latest.version:
            raise ValueError(
                f"version {version} is not newer than the held version {self._latest.version}"
            )
        self._latest = VersionedWeights(weights, version)
        self._published_at = time.monotonic()
        self.num_publishes += 1
        return version

    def pull_if_newer(self, version: int) -> VersionedWeights | None:
        """The held weights if they are newer than ``version`` (use -1 for "none yet")."""
        self.num_pulls += 1
        if self._latest is None or self._latest.version <= version:
            return None
        self.num_pulls_served += 1
        return self._latest

    def pull_delta_if_newer(self, version: int, held: tuple[str, int] | None) -> DeltaPull | None:
        """Like :meth:`pull_if_newer`, as a delta from the shadow ``held`` (``(grid, version)``
        of :class:`~rl_dist_ext.weight_deltas.DeltaReceiver`; ``None``: nothing held yet)."""
        if self._deltas is None:
            raise ValueError(
                "this parameter server serves no delta pulls: start it with delta_tolerance"
            )
        latest = self.pull_if_newer(version)
        if latest is None:
            return None
        return self._deltas.pull(latest.weights, latest.version, held)

    def version(self) -> int:
        """The held version, -1 before the first publish."""
        return -1 if self._latest is None else self._latest.version

    def stats(self) -> dict[str, float]:
        return {
            "version": self.version(),
            "num_publishes": self.num_publishes,
            "num_pulls": self.num_pulls,
            "num_pulls_served": self.num_pulls_served,
            "seconds_since_publish": (
                time.monotonic() - self._published_at if self._latest is not None else -1.0
            ),
            **(self._deltas.stats() if self._deltas is not None else {}),
        }
