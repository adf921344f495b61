"""Tianshou's buffer kernels compiled once per machine, not once per process.

Tianshou's ``ReplayBufferManager`` (behind every ``VectorReplayBuffer``) compiles two numba
kernels, ``_prev_index`` and ``_next_index``, the first time a process builds one, and keeps
them only in that process (they are ``@njit`` without ``cache=True``). Every process this
package starts pays it: each actor runs Tianshou's own ``Collector`` over a
``VectorReplayBuffer``, and so does every trainer's test collector. Measured here: 7.3 s of CPU
for the first ``VectorReplayBuffer`` of a process, 0.9 s once the kernels come from numba's
on-disk cache; an actor was ready after 12.7 s of CPU, 8 s of it this compile.

:func:`cache_tianshou_buffer_kernels` turns numba's on-disk cache on for the two kernels
(``Dispatcher.enable_caching()``, what ``@njit(cache=True)`` does): the first process on a
machine compiles and writes them next to Tianshou's sources (or, where those are read-only,
to numba's per-user cache directory), every later one loads them. The cache is numba's own,
keyed by the kernel's source file and signature, so a new Tianshou version compiles afresh.
``tianshou_plugins`` calls it on import, before any buffer of its own is built.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def cache_tianshou_buffer_kernels() -> bool:
    """Let numba cache Tianshou's ``ReplayBufferManager`` kernels on disk (idempotent).

    Returns whether both kernels now use numba's on-disk cache. Where numba finds no place to
    write one (no writable source directory and no user cache directory), they compile in
    every process as before, and this says so in the log."""
    from tianshou.data.buffer import manager

    cached = True
    for kernel in (manager._prev_index, manager._next_index):
        try:
            kernel.enable_caching()
        except RuntimeError as e:  # numba: "cannot cache function ...: no locator available"
            log.info("Tianshou's %s compiles in every process: %s", kernel.__name__, e)
            cached = False
    return cached
