"""The Gorila / Ape-X learner step, written once for every adapter.

One update: sample a prioritized batch -> gradient step on the importance-weighted double-DQN loss
(:func:`rl_dist_ext.ops.dqn.double_dqn_loss`) -> new priorities ``|TD|`` back through
``update_priorities(keys, priorities)`` -> target update (a copy, or the adapter's Polyak mix)
every ``target_update_every`` gradient updates -> weights published every ``publish_every``
updates. Versions count gradient updates (:class:`rl_dist_ext.params.WeightsVersion`).

:meth:`GorilaLearner.update` runs the whole update for loops that own their training step (the
RLlib learner, the core example). A framework whose own update template already samples and
calls hooks (Tianshou) calls the phases from those hooks: :meth:`after_gradient_step` where its
gradients are applied, :meth:`send_priorities` after, :meth:`publish` when it hands control to
acting. The adapter supplies the framework parts: the gradient step, how to copy the online
network into the target network, and how to export weights for actors.

Multi-agent learners hold one replay per trained module (``connect(replays=...)``) and run
:meth:`GorilaLearner.update_modules`: each update samples a batch from every module's replay,
takes one gradient step over all of them (the framework sums the modules' losses), and sends
each module's ``|TD|`` back to its own replay. The version, target period and publishes count
these joint updates.

:meth:`GorilaLearner.update_fused` fuses k updates into one call of the framework (its
per-call cost paid once per k); the target sync and the priorities stay per update.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from rl_dist_ext.params import WeightsVersion
from rl_dist_ext.replay.prioritized import ReplaySample
from rl_dist_ext.validation import check_int

#: The key of the one replay of a single-agent learner in :attr:`GorilaLearner.replays`.
SINGLE = ""


class LearnerReplay(Protocol):
    def sample(self, batch_size: int, *, beta: float) -> ReplaySample: ...

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> Any: ...


class WeightsSink(Protocol):
    def publish(self, weights: Any, version: int) -> int: ...


class UpdateStats(NamedTuple):
    num_updates: int
    seconds: float
    sample_wait_s: float  # of ``seconds``, waiting for the replay


class GorilaLearner:
    """The learner's schedule and its replay/weights traffic; see the module docstring.

    Args:
        replay: sampled from and given priorities (``None`` when the framework samples, e.g.
            Tianshou's template; then only the priority and publish phases are used).
        batch_size: rows per gradient update (``None`` when the framework samples).
        prioritized: send ``|TD|`` back as new priorities.
        target_update_every: gradient updates between target updates (Gorila's C); the
            first comes after update C (the target network starts as a copy of the online one).
        publish_every: gradient updates between weight publishes (when a sink is connected).
        sync_target: updates the target network (a copy of the online network, or the
            adapter's Polyak mix of the two).
        export_weights: the online weights as actors load them (called at publish only).
    """

    def __init__(
        self,
        *,
        replay: LearnerReplay | None,
        batch_size: int | None,
        prioritized: bool,
        target_update_every: int,
        publish_every: int,
        sync_target: Callable[[], None],
        export_weights: Callable[[], Any],
    ) -> None:
        self.replays: dict[str, LearnerReplay] = {} if replay is None else {SINGLE: replay}
        self.batch_size = None if batch_size is None else check_int("batch_size", batch_size, 1)
        self.prioritized = prioritized
        self.target_update_every = check_int("target_update_every", target_update_every, 1)
        self.publish_every = check_int("publish_every", publish_every, 1)
        self._sync_target = sync_target
        self._export_weights = export_weights
        self.clock = WeightsVersion()
        self.num_target_updates = 0
        self._sink: WeightsSink | None = None
        self._published_version = -1

    @property
    def num_gradient_updates(self) -> int:
        return self.clock.num_gradient_updates

    @property
    def weights_version(self) -> int:
        return self.clock.version

    @property
    def replay(self) -> LearnerReplay | None:
        """The replay of a single-agent learner (``None`` before one is connected)."""
        return self.replays.get(SINGLE)

    @replay.setter
    def replay(self, replay: LearnerReplay | None) -> None:
        self.replays = {} if replay is None else {SINGLE: replay}

    # ---- wiring -------------------------------------------------------------------------------
    def connect(
        self,
        *,
        replay: LearnerReplay | None = None,
        replays: dict[str, LearnerReplay] | None = None,
        weights: WeightsSink | None,
    ) -> int:
        """Take the replay (or, multi-agent, module id -> replay) if given and the weights sink;
        publish the current weights."""
        if replay is not None and replays is not None:
            raise ValueError("connect() takes replay= or replays=, not both")
        if replay is not None:
            self.replay = replay
        if replays is not None:
            self.replays = dict(replays)
        self._sink = weights
        self._published_version = -1
        return self.publish()

    # ---- the phases ---------------------------------------------------------------------------
    def sample(self, beta: float) -> ReplaySample:
        return self.sample_modules(beta)[SINGLE]

    def sample_modules(self, beta: float) -> dict[str, ReplaySample]:
        """A batch from every module's replay (single-agent: the key :data:`SINGLE`)."""
        if not self.replays or self.batch_size is None:
            raise RuntimeError("GorilaLearner.sample() needs a replay and a batch_size")
        return {m: replay.sample(self.batch_size, beta=beta) for m, replay in self.replays.items()}

    def after_gradient_step(self) -> None:
        """Count the update that was just applied; every C-th, sync the target network."""
        self.clock.advance()
        if self.clock.num_gradient_updates % self.target_update_every == 0:
            self._sync_target()
            self.num_target_updates += 1

    def send_priorities(
        self, keys: np.ndarray, td_error: torch.Tensor | np.ndarray, *, module: str = SINGLE
    ) -> None:
        """New priorities ``|td_error|`` for the sampled ``keys`` of ``module``'s replay (if
        prioritized)."""
        if not self.prioritized:
            return
        if isinstance(td_error, torch.Tensor):
            td_error = td_error.detach().cpu().numpy()
        self.replays[module].update_priorities(keys, np.abs(td_error))

    def publish(self, *, new_version: bool = False) -> int:
        """Publish the current weights unless this version already went out; returns it.

        ``new_version=True``: the weights were replaced from outside (a restore), so they go
        out under a new version even if no gradient update happened since the last publish.
        """
        if new_version:
            self.clock.bump()
        version = self.clock.version
        if self._sink is not None and version != self._published_version:
            self._sink.publish(self._export_weights(), version)
            self._published_version = version
        return version

    # ---- the whole update, for loops that own their step --------------------------------------
    def update(
        self, num_updates: int, *, beta: float, gradient_step: Callable[[ReplaySample], Any]
    ) -> UpdateStats:
        """``num_updates`` x [sample, gradient step, priorities back, publish if due].

        ``gradient_step(sample)`` applies one gradient step, calls :meth:`after_gradient_step`
        once where its framework finishes the step (RLlib's ``after_gradient_based_update``
        hook), and returns the ``[B]`` TD errors.
        """
        return self.update_modules(
            num_updates,
            beta=beta,
            gradient_step=lambda samples: {SINGLE: gradient_step(samples[SINGLE])},
        )

    def update_modules(
        self,
        num_updates: int,
        *,
        beta: float,
        gradient_step: Callable[[dict[str, ReplaySample]], dict[str, Any]],
    ) -> UpdateStats:
        """:meth:`update` with one replay per module: ``gradient_step(samples)`` takes module
        id -> sample, applies one joint update and returns module id -> ``[B]`` TD errors."""
        return self.update_fused(
            num_updates,
            beta=beta,
            updates_per_call=1,
            gradient_steps=lambda samples: [gradient_step(samples[0])],
        )

    def update_fused(
        self,
        num_updates: int,
        *,
        beta: float,
        updates_per_call: int,
        gradient_steps: Callable[[list[dict[str, ReplaySample]]], list[dict[str, Any]]],
    ) -> UpdateStats:
        """:meth:`update_modules` with ``updates_per_call`` (k) gradient updates fused into one
        call of the framework, which then pays its per-call cost once per k updates.

        ``gradient_steps(samples)`` takes k batches (each module id -> sample, sampled before
        the call) and applies k gradient updates in order, calling :meth:`after_gradient_step`
        after each one (so the target network syncs at its update even inside a call); it
        returns the k batches' TD errors (module id -> ``[B]``), whose priorities go back per
        batch. Weights are published after a call whose updates reached a multiple of
        ``publish_every``. The last call takes what is left when k does not divide
        ``num_updates``.
        """
        k = check_int("updates_per_call", updates_per_call, 1)
        started = time.monotonic()
        wait = 0.0
        remaining = num_updates
        while remaining > 0:
            n = min(k, remaining)
            t0 = time.monotonic()
            batches = [self.sample_modules(beta) for _ in range(n)]
            wait += time.monotonic() - t0
            updates_before = self.clock.num_gradient_updates
            td_errors = gradient_steps(batches)
            updates_after = self.clock.num_gradient_updates
            if updates_after != updates_before + n or len(td_errors) != n:
                raise RuntimeError(
                    f"gradient_steps was given {n} batches: it must apply {n} updates, call "
                    f"GorilaLearner.after_gradient_step() after each (it applied "
                    f"{updates_after - updates_before}) and return {n} TD errors (it "
                    f"returned {len(td_errors)})"
                )
            for samples, errors in zip(batches, td_errors, strict=True):
                for module, sample in samples.items():
                    self.send_priorities(sample.keys, errors[module], module=module)
            if updates_after // self.publish_every > updates_before // self.publish_every:
                self.publish()
            remaining -= n
        return UpdateStats(num_updates, time.monotonic() - started, wait)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (e.g. with a whole framework algorithm), the learner leaves its replay and
        weights connections behind: they belong to the running process."""
        state = self.__dict__.copy()
        state.update(replays={}, _sink=None, _published_version=-1)
        return state

    # ---- checkpoints --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, int]:
        return {**self.clock.state_dict(), "num_target_updates": self.num_target_updates}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore the counters; the version moves past every one published before."""
        self.clock.load_state_dict(state)
        self.num_target_updates = int(state.get("num_target_updates", 0))


class GorilaLearnerCounters:
    """For a framework's learner that runs the core step as ``self.gorila``: its counters."""

    gorila: GorilaLearner

    @property
    def num_gradient_updates(self) -> int:
        return self.gorila.num_gradient_updates

    @property
    def weights_version(self) -> int:
        return self.gorila.weights_version
