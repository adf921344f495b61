"""Lay fixed-length trajectories out for V-trace: a masked step after every episode piece.

An IMPALA actor hands the learner ``[T, B]`` trajectories: row ``b`` is ``T`` consecutive steps
of one env, cut at the rollout's end whatever the episode is doing, and may hold several
episodes. V-trace (:mod:`rl_dist_ext.ops.vtrace`) runs one trace per row and bootstraps the
step before a masked step from that masked step's value. So every place where a step must
bootstrap from its own next observation gets a masked step holding that observation:

- after a step the env truncated (the next step of the row starts a new episode, whose first
  observation is not the truncated episode's final one);
- after the row's last step (the cut: the trace bootstraps from the final observation).

A terminated step needs none (its discount is 0), except at the row end, where the masked step
is added for uniformity. Rows with fewer truncations are padded with copies of their final
masked step; every row then has ``T' = T + 1 + (most truncations before the last step of any
row)`` steps. The result is the layout RLlib's ``AddOneTsToEpisodesAndTruncate`` gives each
episode piece, so both adapters feed the V-trace op the same thing.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["FinalStepLayout", "final_step_layout", "gather_time_major"]


class FinalStepLayout(NamedTuple):
    """Where each step of the ``[T', B]`` layout reads from the ``[T, B]`` trajectories."""

    source: np.ndarray  # [T', B] int64: the input step t (row b) this step reads
    final: np.ndarray  # [T', B] bool: reads next_obs[t] (a masked final-observation step)

    @property
    def mask(self) -> np.ndarray:
        """``[T', B]`` bool, True at real steps."""
        return ~self.final


def final_step_layout(terminated: np.ndarray, truncated: np.ndarray) -> FinalStepLayout:
    """The layout of :mod:`this module <rl_dist_ext.ops.vtrace_layout>` for ``[T, B]`` flags.

    Args:
        terminated: ``[T, B]`` bool, the episode ended at step t (no bootstrap).
        truncated: ``[T, B]`` bool, the env cut the episode at step t (bootstrap from
            ``next_obs[t]``). A step both terminated and truncated counts as terminated.

    Raises:
        ValueError: the flags are not ``[T, B]`` with ``T >= 1`` or their shapes differ.
    """
    terminated = np.asarray(terminated, dtype=bool)
    truncated = np.asarray(truncated, dtype=bool)
    if terminated.ndim != 2 or terminated.shape[0] < 1:
        raise ValueError(f"terminated must be [T, B] with T >= 1, got shape {terminated.shape}")
    if truncated.shape != terminated.shape:
        raise ValueError(
            f"truncated has shape {truncated.shape}, expected {terminated.shape} "
            f"(the shape of terminated)"
        )
    num_steps, num_rows = terminated.shape
    # A final-observation step after step t where the env truncated (t < T - 1), and after T-1.
    needs_final = truncated & ~terminated
    needs_final[-1] = True
    inserted_before = np.cumsum(needs_final, axis=0) - needs_final  # finals before step t
    length = num_steps + needs_final.sum(axis=0)  # per row
    out_steps = int(length.max())
    # Padding repeats the row's last final step.
    source = np.full((out_steps, num_rows), num_steps - 1, dtype=np.int64)
    final = np.ones((out_steps, num_rows), dtype=bool)
    columns = np.broadcast_to(np.arange(num_rows), (num_steps, num_rows))
    steps = np.broadcast_to(np.arange(num_steps)[:, None], (num_steps, num_rows))
    real_at = steps + inserted_before  # where input step t lands
    source[real_at, columns] = steps
    final[real_at, columns] = False
    final_at = real_at[needs_final] + 1
    source[final_at, columns[needs_final]] = steps[needs_final]
    return FinalStepLayout(source=source, final=final)


def gather_time_major(x: np.ndarray, layout: FinalStepLayout) -> np.ndarray:
    """``x[source[t', b], b]``: a ``[T, B, ...]`` array in the ``[T', B, ...]`` layout."""
    return x[layout.source, np.arange(layout.source.shape[1])[None, :]]
