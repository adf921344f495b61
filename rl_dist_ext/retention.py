"""What a run kept after it first reached its target: the share of its later greedy evaluations
that stay at or above a keep line (80 % of the target by default), and the worst of them.

A run that reaches the target and then forgets it ends with a figure that hides the collapse
when it stops at the target; run to a budget, its curve and this summary show it. The
benchmark races report the same measure per arm (``benchmarks/evidence.py``); the example
scripts print it at the end of a run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

#: the share of the target a kept evaluation reaches
KEEP = 0.8


def keep_line(target: float, keep: float = KEEP) -> float:
    """The return a kept evaluation reaches: ``keep`` of the target (for a negative target, as
    Acrobot's -100, the target less ``1 - keep`` of its size: -120)."""
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must be in (0, 1], got {keep!r}")
    return target - (1.0 - keep) * abs(target)


def draw_target(ax, target: float) -> None:
    """The target (dashed) and the keep line (dotted) on matplotlib axes ``ax``, labelled."""
    ax.axhline(target, color="grey", linestyle="--", linewidth=1, label="target")
    ax.axhline(
        keep_line(target), color="grey", linestyle=":", linewidth=1, label="80 % of the target"
    )


@dataclass(frozen=True)
class Retention:
    """What a run kept after it first reached the target at ``first`` (its curve's x: env steps
    or seconds): of its ``later`` evaluations after that one, ``kept`` were at or above the
    keep line; ``worst`` is the lowest of them."""

    later: int
    kept: int
    worst: float
    first: float = math.nan
    line: float = math.nan

    @property
    def share(self) -> float:
        return self.kept / self.later

    def describe(self, target: float, unit: str) -> str:
        """One line for a user: when the target was first reached, and what was kept after."""
        return (
            f"first reached {target:g} at {self.first:,.0f} {unit}; then {self.kept} of "
            f"{self.later} greedy evaluations stayed at or above {self.line:g} "
            f"({self.share:.0%}), the worst {self.worst:.4g}"
        )


def retention(
    curve: Iterable[tuple[float, float]],
    target: float,
    *,
    keep: float = KEEP,
    until: float = math.inf,
) -> Retention | None:
    """What a run kept after its first evaluation at ``target``: ``curve`` holds its
    ``(x, greedy return)`` evaluations in order of x; those after the first at the target and
    at most ``until`` count. ``None`` when the run never reached the target by ``until`` or
    was never evaluated after it did."""
    points = [(float(x), float(value)) for x, value in curve if x <= until]
    first = next((x for x, value in points if value >= target), None)
    if first is None:
        return None
    later = [value for x, value in points if x > first]
    if not later:
        return None
    line = keep_line(target, keep)
    kept = sum(value >= line for value in later)
    return Retention(len(later), kept, min(later), first=first, line=line)


def describe(curve: Iterable[tuple[float, float]], target: float, unit: str) -> str:
    """What a user reads at the end of a run: :meth:`Retention.describe`, or that the run never
    reached ``target`` (its best evaluation), or that it stopped where it first did."""
    points = list(curve)
    if not points:
        return "no greedy evaluation ran"
    kept = retention(points, target)
    if kept is not None:
        return kept.describe(target, unit)
    best = max(value for _, value in points)
    if best < target:
        return f"never reached {target:g} (best greedy evaluation {best:.4g})"
    first = next(x for x, value in points if value >= target)
    return f"first reached {target:g} at {first:,.0f} {unit}, the last evaluation"
