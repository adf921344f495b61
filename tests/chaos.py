"""Chaos runs: kill a run's components at seeded random times while it trains.

A :class:`Chaos` holds, per kind of component (``"shard"``, ``"runner"``, ...), a function that
returns that kind's live Ray actor handles. :meth:`Chaos.step` is called between training
steps; when the next kill is due it kills one actor of the next kind, as a crash would
(``ray.kill(no_restart=False)``: Ray restarts what is restartable). The kinds come in a seeded
shuffled order, each once per round, with seeded random gaps, so that every kind dies within
``rounds`` rounds and the run is the same on every seed's rerun (as far as timing allows).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Kill:
    at_s: float  # since the chaos began
    kind: str
    index: int


@dataclass
class Chaos:
    targets: dict[str, Callable[[], list]]
    seed: int
    rounds: int = 1
    gap_s: tuple[float, float] = (1.0, 4.0)
    kills: list[Kill] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)
        kinds = sorted(self.targets)
        self._plan = [kind for _ in range(self.rounds) for kind in self._rng.permutation(kinds)]
        self._started = time.monotonic()
        self._next_at = self._gap()

    @property
    def done(self) -> bool:
        return len(self.kills) == len(self._plan)

    def step(self) -> Kill | None:
        """Kill the next component if its time has come; the kill, or ``None``."""
        import ray

        now = time.monotonic() - self._started
        if self.done or now < self._next_at:
            return None
        kind = str(self._plan[len(self.kills)])
        handles = self.targets[kind]()
        index = int(self._rng.integers(len(handles)))
        ray.kill(handles[index], no_restart=False)
        kill = Kill(round(now, 2), kind, index)
        print("KILL", kill, flush=True)
        self.kills.append(kill)
        self._next_at = now + self._gap()
        return kill

    def _gap(self) -> float:
        return float(self._rng.uniform(*self.gap_s))


def assert_every_row_accounted_for(ledger_dir: str, replay) -> dict:
    """Wait until no add is still landing (the shards' count stops moving), then check the
    account of :func:`~rl_dist_ext.replay.distributed.account_rows`; returns it as a dict."""
    from rl_dist_ext.replay.distributed import account_rows

    deadline = time.monotonic() + 60
    previous = None
    while True:
        stats = replay.stats(wait=True)
        settled = stats["rows_acknowledged"] if stats["shards_alive"] == replay.num_shards else None
        if settled is not None and settled == previous:
            break
        previous = settled
        assert time.monotonic() < deadline, "the shards' row counts never settled"
        time.sleep(0.5)
    account = account_rows(ledger_dir, stats)
    assert account.sent > 0
    assert account.shards_balance, account
    assert account.clients_within_shards, account
    assert account.sent == account.acknowledged_by_clients + account.dropped_in_transit
    print("ACCOUNT", vars(account), flush=True)
    return vars(account)
