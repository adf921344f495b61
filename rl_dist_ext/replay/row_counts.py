"""Row counters that outlive the process keeping them: a few int64 slots in a small local file.

A replay shard keeps, beside its snapshots, how many rows it acknowledged and what became of
them (:class:`ShardRowCounts`); a replay client given a ``row_ledger_dir`` keeps how many rows it
sent and how many were acknowledged (:mod:`rl_dist_ext.replay.distributed.ledger`). Every change
is one ``pwrite`` of all slots, in place: a process killed at any point leaves its last write in
the kernel's page cache, which the next reader sees. (There is no ``fsync``: a machine that
loses power can lose the latest counts, as it loses the latest rows.)
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np


class RowCounts:
    """Named int64 counters in the file ``path``; ``fresh`` starts them at 0, else they are
    read back (0 where the file is missing or was cut short)."""

    def __init__(self, path: str, names: Sequence[str], *, fresh: bool) -> None:
        self.names = tuple(names)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        found = None if fresh else read_counts(path, self.names)
        self._values = np.zeros(len(self.names), np.int64)
        if found is not None:
            self._values[:] = [found[name] for name in self.names]
        self._write()

    def __getitem__(self, name: str) -> int:
        return int(self._values[self.names.index(name)])

    def set(self, **values: int) -> None:
        for name, value in values.items():
            self._values[self.names.index(name)] = value
        self._write()

    def add(self, **deltas: int) -> None:
        for name, delta in deltas.items():
            self._values[self.names.index(name)] += delta
        self._write()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()

    def _write(self) -> None:
        os.pwrite(self._fd, self._values.tobytes(), 0)


def read_counts(path: str, names: Sequence[str]) -> dict[str, int] | None:
    """The counters a :class:`RowCounts` left in ``path``; ``None`` if the file is missing or
    does not hold them all."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return None
    if len(data) != 8 * len(names):
        return None
    return dict(zip(names, np.frombuffer(data, np.int64).tolist(), strict=True))


class ShardRowCounts:
    """What a replay shard did with the rows it acknowledged, across its restarts.

    Kept in the file ``rows.counts`` at the shard's (local) snapshot location and written on
    every add before the reply, so that an incarnation restarted after its process died knows
    exactly how many rows died with the last one, whichever client sent them. At any time::

        acknowledged == size + evicted + lost

    ``acknowledged``: rows every add of every incarnation took; ``lost``: rows that an
    incarnation held when it died and the next one did not restore (added after the snapshot it
    restarted from); ``evicted``: rows the ring overwrote (:meth:`evicted`).
    """

    FILE = "rows.counts"
    # num_inserted and size: the replay's, after the last add (what an incarnation held when
    # it died); evicted_carried: rows evicted in ended incarnations that the current one's own
    # count (num_inserted - size) does not include
    NAMES = ("acknowledged", "lost", "num_inserted", "size", "evicted_carried")

    def __init__(self, path: str, *, restarted: bool) -> None:
        previous = read_counts(path, self.NAMES) if restarted else None
        #: False after a restart that found no counts to carry on (exact losses are unknown)
        self.exact = previous is not None or not restarted
        # a restarted one keeps the dead one's counts in the file until it took over from them
        # (restarted_with): dying again before that loses nothing
        self._counts = RowCounts(path, self.NAMES, fresh=not restarted)
        self._previous = previous

    def restarted_with(self, num_inserted: int, size: int) -> int:
        """Take over from the incarnation that died, now holding what it restored
        (``num_inserted``, ``size``); returns the rows lost with it."""
        dead = self._previous
        self._previous = None
        if dead is None:
            self.reset(num_inserted, size)
            return 0
        # The dead one held its last ``size`` inserts; the restored state, a prefix of them.
        lost = dead["num_inserted"] - max(dead["num_inserted"] - dead["size"], num_inserted)
        lost = max(0, lost)
        evicted_dead = dead["num_inserted"] - dead["size"]
        self._counts.set(
            acknowledged=dead["acknowledged"],
            lost=dead["lost"] + lost,
            num_inserted=num_inserted,
            size=size,
            evicted_carried=dead["evicted_carried"] + max(0, evicted_dead - num_inserted),
        )
        return lost

    def added(self, rows: int, num_inserted: int, size: int) -> None:
        self._counts.set(
            acknowledged=self.acknowledged + rows, num_inserted=num_inserted, size=size
        )

    def reset(self, num_inserted: int, size: int) -> None:
        """Contents replaced by the user (a checkpoint restored, or cleared): the rows they
        hold count as acknowledged; the rows lost so far stay counted."""
        self._counts.set(
            acknowledged=num_inserted + self.lost,
            num_inserted=num_inserted,
            size=size,
            evicted_carried=0,
        )

    @property
    def acknowledged(self) -> int:
        return self._counts["acknowledged"]

    @property
    def lost(self) -> int:
        return self._counts["lost"]

    def evicted(self, num_inserted: int, size: int) -> int:
        return self._counts["evicted_carried"] + num_inserted - size

    def close(self) -> None:
        self._counts.close()
