"""Where every row of a run went: each client's row ledger, and the account of all of them.

With ``DistributedReplayConfig.row_ledger_dir`` set, every client that adds rows (each actor's
copy of the replay) keeps three counters in its own file there, written before each send and
after each acknowledgement, so that they outlive a killed actor (see
:mod:`rl_dist_ext.replay.row_counts`):

- ``sent``: rows it handed to a shard (each add once);
- ``acknowledged``: rows a shard answered for;
- ``resent``: rows it sent again after their shard failed (the dead shard may have taken them
  before it died: then two shards hold them).

:func:`account_rows` adds the ledgers up with the shards' own counts (``stats()``): rows sent
and never acknowledged were dropped in transit (their actor died, or the run stopped, first);
every row a shard acknowledged is stored, evicted or lost with a shard.
"""

from __future__ import annotations

import glob
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rl_dist_ext.replay.row_counts import RowCounts, read_counts

NAMES = ("sent", "acknowledged", "resent")
SUFFIX = ".rows"


class ClientLedger:
    """One client's counters, in a file of its own under ``directory`` (made at the first
    add, so that clients that only sample leave none)."""

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self._counts: RowCounts | None = None

    def sent(self, rows: int) -> None:
        self._file().add(sent=rows)

    def acknowledged(self, rows: int) -> None:
        self._file().add(acknowledged=rows)

    def resent(self, rows: int) -> None:
        self._file().add(resent=rows)

    def _file(self) -> RowCounts:
        if self._counts is None:
            name = f"client-{os.getpid()}-{uuid.uuid4().hex[:12]}{SUFFIX}"
            self._counts = RowCounts(os.path.join(self._directory, name), NAMES, fresh=True)
        return self._counts


def read_ledgers(directory: str) -> dict[str, int]:
    """The counters of every client ledger under ``directory``, added up, and ``clients``."""
    total = dict.fromkeys(NAMES, 0)
    files = sorted(glob.glob(os.path.join(directory, f"*{SUFFIX}")))
    for path in files:
        counts = read_counts(path, NAMES)
        if counts is None:
            raise ValueError(f"{path} is not a row ledger of {len(NAMES)} counters")
        for name in NAMES:
            total[name] += counts[name]
    return {**total, "clients": len(files)}


@dataclass(frozen=True)
class RowAccount:
    """Every row of a run: from the clients' ledgers (``sent`` = ``acknowledged_by_clients`` +
    ``dropped_in_transit``) and the shards' counts (``acknowledged_by_shards`` = ``stored`` +
    ``evicted`` + ``lost_with_shards``). The shards acknowledge at least what the clients saw
    acknowledged, and at most that plus what was dropped in transit or resent (a shard that
    took rows and died, or whose sender died, before its answer arrived)."""

    sent: int
    acknowledged_by_clients: int
    dropped_in_transit: int
    resent: int
    acknowledged_by_shards: int
    stored: int
    evicted: int
    lost_with_shards: int

    @property
    def shards_balance(self) -> bool:
        return self.acknowledged_by_shards == self.stored + self.evicted + self.lost_with_shards

    @property
    def clients_within_shards(self) -> bool:
        return (
            self.acknowledged_by_clients
            <= self.acknowledged_by_shards
            <= self.acknowledged_by_clients + self.dropped_in_transit + self.resent
        )


def account_rows(directory: str, stats: Mapping[str, Any]) -> RowAccount:
    """The :class:`RowAccount` of the ledgers under ``directory`` and a replay's
    ``stats(wait=True)`` (every shard alive; their row counts need local snapshot locations)."""
    if stats["rows_acknowledged"] < 0:
        raise ValueError(
            "the replay's shards keep no row counts (they need a local snapshot_dir), or one "
            "is down: account_rows needs stats(wait=True) with every shard alive"
        )
    clients = read_ledgers(directory)
    return RowAccount(
        sent=clients["sent"],
        acknowledged_by_clients=clients["acknowledged"],
        dropped_in_transit=clients["sent"] - clients["acknowledged"],
        resent=clients["resent"],
        acknowledged_by_shards=stats["rows_acknowledged"],
        stored=stats["size"],
        evicted=stats["rows_evicted"],
        lost_with_shards=stats["items_lost"],
    )
