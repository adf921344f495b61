"""Tianshou's numba kernels compiled once per machine, not once per process.

Two Tianshou constructors compile numba kernels (``@njit`` without ``cache=True``), so every
process compiles them afresh, and every process this package starts pays it:

- ``Policy.__init__`` compiles ``_gae`` and ``_nstep_return`` (``tianshou.algorithm.
  algorithm_base``): 4.9 s of CPU here; every trainer builds policies, and so does every SEED
  actor (its ``ServerPolicy``) and every inference server;
- ``ReplayBufferManager.__init__`` (behind every ``VectorReplayBuffer``) compiles
  ``_prev_index`` and ``_next_index`` (``tianshou.data.buffer.manager``): 7.3 s; every actor
  runs Tianshou's own ``Collector`` over a ``VectorReplayBuffer``, and so does every trainer's
  test collector.

An actor was ready after 12.7 s of CPU, 8 s of it compiling. :func:`cache_tianshou_kernels`
turns numba's on-disk cache on for these four kernels (``Dispatcher.enable_caching()``, what
``@njit(cache=True)`` does): the first process on a machine compiles them and writes them next
to Tianshou's sources (or, where those are read-only, to numba's per-user cache directory);
every later one loads them (0.8-0.9 s each group). The cache is numba's own, keyed by the
kernel's source file and signature, so a new Tianshou version compiles afresh.
``tianshou_plugins`` calls it on import, before any policy or buffer of its own is built.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def cache_tianshou_kernels() -> bool:
    """Let numba cache the Tianshou kernels that ``Policy`` and ``ReplayBufferManager``
    compile on construction (idempotent).

    Returns whether all of them now use numba's on-disk cache. Where numba finds no place to
    write one (no writable source directory and no user cache directory), or a Tianshou
    version no longer has the kernel, it is left as it is (compiled in every process), and the
    log says so: a speed-up only, never a reason to fail."""
    from tianshou.algorithm import algorithm_base
    from tianshou.data.buffer import manager

    cached = True
    for module, name in (
        (algorithm_base, "_gae"),
        (algorithm_base, "_nstep_return"),
        (manager, "_prev_index"),
        (manager, "_next_index"),
    ):
        label = f"{module.__name__.rsplit('.', 1)[-1]}.{name}"
        kernel = getattr(module, name, None)
        if not hasattr(kernel, "enable_caching"):  # not there, or not numba's, in this version
            log.info("Tianshou has no numba kernel %s: nothing to cache", label)
            cached = False
            continue
        try:
            kernel.enable_caching()
        except RuntimeError as e:  # numba: "cannot cache function ...: no locator available"
            log.info("Tianshou's %s compiles in every process: %s", label, e)
            cached = False
    return cached
