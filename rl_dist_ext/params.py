"""Versioned weights between one learner and many actors (Gorila's parameter server, pull-based).

The learner ``publish``-es a weights object with a version that only ever increases; actors call
``pull_if_newer(their_version)`` every K steps and get ``None`` (nothing to copy) or the newer
``(weights, version)``. A plain class; ``rl_dist_ext.ray_actors`` makes it a Ray actor.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from rl_dist_ext.validation import check_int


class VersionedWeights(NamedTuple):
    weights: Any
    version: int


class ParameterServer:
    """Holds the newest weights and their version; counts publishes and pulls."""

    def __init__(self) -> None:
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
        }
