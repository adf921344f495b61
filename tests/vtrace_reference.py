"""A naive V-trace reference written from the paper, one trajectory segment at a time.

Espeholt et al. 2018 (IMPALA), eq. (1), as an explicit double sum over the steps of one segment:

    v_s = V(x_s) + sum_{t=s}^{L-1} gamma^{t-s} (prod_{i=s}^{t-1} c_i) delta_t,
    delta_t = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t)),

and the policy-gradient advantage of section 4.2 with the lambda-return bootstrap (rlax's form):

    A_s = rho^pg_s (r_s + gamma_s q_{s+1} - V(x_s)),
    q_{s+1} = lambda v_{s+1} + (1 - lambda) V(x_{s+1}) inside the segment, q_L = V(x_L).

A segment is a run of real steps of one episode over which one trace runs. It says how it ends:
``"terminated"`` (the episode ended: no bootstrap, gamma_{L-1} = 0), ``"truncated"`` (the env
cut the episode: bootstrap from the value of its final observation) or ``"cut"`` (a rollout
fragment or a learner row ended mid-episode: bootstrap from the value of the next observation).
Nothing here knows about masks, rows or RLlib's extra step: tests lay segments out in those
layouts and compare.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ENDS = ("terminated", "truncated", "cut")


@dataclass(frozen=True)
class Segment:
    rewards: Sequence[float]  # r_s, s = 0..L-1
    values: Sequence[float]  # V(x_s), s = 0..L-1
    log_rhos: Sequence[float]  # log pi(a_s|x_s) / mu(a_s|x_s)
    next_value: float  # V(x_L) (unused when terminated)
    end: str

    def __post_init__(self) -> None:
        assert self.end in ENDS, self.end
        assert len(self.rewards) == len(self.values) == len(self.log_rhos) >= 1


def segment_vtrace(
    segment: Segment,
    *,
    gamma: float,
    clip_rho_threshold: float | None,
    clip_pg_rho_threshold: float | None,
    lambda_: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``(v_s, A_s)`` for s = 0..L-1 of one segment, by the double sum above (float64)."""
    L = len(segment.rewards)
    r = [float(x) for x in segment.rewards]
    ratio = [math.exp(float(x)) for x in segment.log_rhos]
    rho = [x if clip_rho_threshold is None else min(clip_rho_threshold, x) for x in ratio]
    rho_pg = [x if clip_pg_rho_threshold is None else min(clip_pg_rho_threshold, x) for x in ratio]
    c = [lambda_ * min(1.0, x) for x in ratio]
    gam = [gamma] * L
    if segment.end == "terminated":
        gam[L - 1] = 0.0
    V = [float(x) for x in segment.values] + [float(segment.next_value)]

    delta = [rho[t] * (r[t] + gam[t] * V[t + 1] - V[t]) for t in range(L)]
    vs = np.zeros(L)
    for s in range(L):
        total = V[s]
        for t in range(s, L):
            coef = 1.0
            for i in range(s, t):
                coef *= gam[i] * c[i]
            total += coef * delta[t]
        vs[s] = total
    pg = np.zeros(L)
    for s in range(L):
        q_next = V[L] if s == L - 1 else lambda_ * vs[s + 1] + (1.0 - lambda_) * V[s + 1]
        pg[s] = rho_pg[s] * (r[s] + gam[s] * q_next - V[s])
    return vs, pg
