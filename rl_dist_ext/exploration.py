"""Ape-X per-actor exploration (Horgan et al. 2018, arXiv:1803.00933, section 4.1).

Actor ``i`` of ``N`` acts epsilon-greedily with ``eps_i = base ** (1 + i / (N - 1) * alpha)``;
with ``N = 1`` the single actor uses ``base``.
"""

from __future__ import annotations

import numpy as np

from rl_dist_ext.validation import check_int, check_real

#: The paper's ladder: ``eps = 0.4``, ``alpha = 7`` (the defaults of both adapters).
EPSILON_BASE = 0.4
EPSILON_ALPHA = 7.0


def apex_epsilons(
    num_actors: int, base: float = EPSILON_BASE, alpha: float = EPSILON_ALPHA
) -> np.ndarray:
    """The ``[num_actors]`` float64 epsilon ladder, ``base`` down to ``base ** (1 + alpha)``.

    Raises:
        ValueError: ``num_actors`` is not an int >= 1, ``base`` is outside ``[0, 1]`` or
            ``alpha`` is negative.
    """
    num_actors = check_int("num_actors", num_actors, 1)
    check_real("base", base, low=0.0, high=1.0)
    check_real("alpha", alpha, low=0.0)
    if num_actors == 1:
        return np.array([base], dtype=np.float64)
    exponents = 1.0 + np.arange(num_actors, dtype=np.float64) / (num_actors - 1) * alpha
    return np.power(base, exponents)
