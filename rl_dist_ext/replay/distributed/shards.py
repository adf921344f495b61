"""Routing and health: what one client knows about every shard, and where its calls go.

A client's view of a shard is the newest :class:`~rl_dist_ext.replay.shard.ShardStatus` it got
(every reply carries one) and, after a failed call, until when the shard counts as down. Status
requests go to every shard every ``status_refresh_s`` without waiting (:meth:`ShardSet.poll`),
so the view stays current even for shards this client never calls. Inserts go round-robin to
live shards whose rate limiter takes them; samples to live shards that let them through, by
priority mass. A shard that restarted (new incarnation) is noticed from its next status, and
the rows it lost (inserted after its snapshot) are counted: exactly by the shard itself where
it keeps row counters (a local snapshot location: ``ShardStatus.rows_lost``), else from what
this client saw it acknowledge.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rl_dist_ext.replay.distributed.config import (
    DistributedReplayConfig,
    ReplayTimeout,
    ReplayUnavailable,
)
from rl_dist_ext.replay.shard import ShardStatus

log = logging.getLogger(__name__)

#: Bits of a global key that hold the shard's own key (its insert id: up to ~1.1e12 rows per
#: shard); the bits above number the shard's incarnation (see ShardSet.global_keys).
LOCAL_KEY_BITS = 40
LOCAL_KEY_MASK = (1 << LOCAL_KEY_BITS) - 1


def actor_errors() -> tuple[type[BaseException], ...]:
    """The Ray errors a call to a dead or restarting shard raises."""
    import ray

    return (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)


def shard_error(error: Any, context: str = "") -> BaseException:
    """The exception a shard raised, out of Ray's ``RayTaskError`` wrapper (errors raised to
    the user are the project's own or Python's, never Ray's), with ``context`` added as a note
    (Python 3.11+; shown under its message)."""
    import ray

    cause = getattr(error, "cause", None)
    if not isinstance(cause, BaseException) or isinstance(cause, ray.exceptions.RayError):
        # Ray could not pickle the shard's exception: say what it was, as the project's error
        cause = ReplayUnavailable(f"a replay shard failed: {error}")
    if context and hasattr(cause, "add_note"):
        cause.add_note(context)
    return cause


@dataclass
class ShardView:
    """What one client knows about one shard."""

    status: ShardStatus | None = None
    down_until: float = 0.0
    max_num_inserted_seen: int = 0
    #: rows this client saw lost in the shard's restarts (used where the shard has no counters)
    lost_seen: int = 0


class ShardSet:
    """The shard actors as one client sees them; see the module docstring."""

    def __init__(self, config: DistributedReplayConfig, handles: list) -> None:
        self.config = config
        self.handles = handles
        self.views = [ShardView() for _ in handles]
        self.rng = np.random.default_rng(config.seed)
        self._next_insert = int(self.rng.integers(len(handles)))
        self._status_requests: dict[int, Any] = {}  # shard -> get_status ref in flight
        self._statuses_asked_at = -math.inf
        self.shard_failures = 0
        #: per shard, the incarnations this client drew rows from, in order (see global_keys)
        self._incarnations: list[list[str]] = [[] for _ in handles]

    @property
    def num_shards(self) -> int:
        return len(self.handles)

    @property
    def items_lost(self) -> int:
        """Rows lost with shard restarts: each shard's own count where it keeps one, else what
        this client saw."""
        return sum(
            v.status.rows_lost if v.status is not None and v.status.rows_lost >= 0 else v.lost_seen
            for v in self.views
        )

    # ---- keys ---------------------------------------------------------------------------------
    def global_keys(self, shard: int, local_keys: np.ndarray, incarnation: str) -> np.ndarray:
        """The keys this client hands out for rows ``local_keys`` of ``shard``'s incarnation
        ``incarnation``: ``(generation << LOCAL_KEY_BITS | local key) * num_shards + shard``,
        ``generation`` numbering the shard's incarnations as this client met them, so that a
        priority update can tell the shard which incarnation its keys came from."""
        seen = self._incarnations[shard]
        if incarnation not in seen:
            seen.append(incarnation)
        generation = np.int64(seen.index(incarnation)) << LOCAL_KEY_BITS
        return (generation | local_keys.astype(np.int64)) * self.num_shards + shard

    def split_keys(self, keys: np.ndarray) -> dict[tuple[int, str | None], np.ndarray]:
        """(shard, incarnation) -> a mask over ``keys`` (global keys of :meth:`global_keys`);
        incarnation ``None`` for keys this client did not hand out (another client's: the shard
        takes them unchecked)."""
        shards, rest = keys % self.num_shards, keys // self.num_shards
        generations = rest >> LOCAL_KEY_BITS
        out = {}
        pairs = zip(shards.tolist(), generations.tolist(), strict=True)
        for shard, generation in sorted(set(pairs)):
            seen = self._incarnations[shard]
            incarnation = seen[generation] if generation < len(seen) else None
            mask = (shards == shard) & (generations == generation)
            key = (shard, incarnation)
            out[key] = out[key] | mask if key in out else mask
        return out

    def local_keys(self, keys: np.ndarray) -> np.ndarray:
        """The shard's own keys behind global keys of :meth:`global_keys`."""
        return (keys // self.num_shards) & LOCAL_KEY_MASK

    @property
    def reply_timeout_s(self) -> float:
        # Longer than a shard's own rate-limiter wait, so its RateLimitTimeout arrives first.
        return self.config.timeout_s + max(5.0, 0.5 * self.config.timeout_s)

    def statuses(self) -> list[ShardStatus | None]:
        """The newest status of every shard (``None``: never heard from, or down now)."""
        now = time.monotonic()
        return [v.status if v.down_until <= now else None for v in self.views]

    def all_down(self) -> bool:
        now = time.monotonic()
        return all(v.down_until > now for v in self.views)

    # ---- statuses -----------------------------------------------------------------------------
    def observe(self, shard: int, status: ShardStatus) -> None:
        """Take a status a reply carried (an older one arriving late is ignored)."""
        view = self.views[shard]
        if (
            view.status is not None
            and view.status.incarnation == status.incarnation
            and status.seq < view.status.seq
        ):
            return  # a reply that arrived after a newer one: keep the newer view
        if view.status is not None and view.status.incarnation != status.incarnation:
            lost = max(0, view.max_num_inserted_seen - status.restored_num_inserted)
            view.lost_seen += lost
            if status.rows_lost >= 0 and view.status.rows_lost >= 0:
                lost = status.rows_lost - view.status.rows_lost  # the shard's exact count
            log.warning(
                "replay shard %d restarted with %d rows from its snapshot; %d rows inserted "
                "after the snapshot were lost%s",
                shard,
                status.size,
                lost,
                f" (it skipped {status.snapshots_rejected} damaged snapshot(s))"
                if status.snapshots_rejected
                else "",
            )
            view.max_num_inserted_seen = 0
        view.status = status
        view.down_until = 0.0
        view.max_num_inserted_seen = max(view.max_num_inserted_seen, status.num_inserted)

    def mark_down(self, shard: int, error: BaseException) -> None:
        view = self.views[shard]
        if view.down_until <= time.monotonic():
            self.shard_failures += 1
            log.warning("replay shard %d unavailable (%s); routing around it", shard, error)
        view.down_until = time.monotonic() + self.config.retry_down_shard_after_s

    def note_closed(self, shard: int, *, inserts: bool) -> None:
        """A call to ``shard`` timed out on its rate limiter: route elsewhere until a newer
        status says it is open again."""
        status = self.views[shard].status
        if status is not None:
            closed = {"can_insert": False} if inserts else {"can_sample": False}
            self.views[shard].status = status._replace(**closed)

    def poll(self) -> None:
        """Take the status replies that arrived; ask every shard again every
        ``status_refresh_s`` (never waits)."""
        import ray

        if self._status_requests:
            refs = list(self._status_requests.values())
            done = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
            for shard, ref in list(self._status_requests.items()):
                if ref not in done:
                    continue
                del self._status_requests[shard]
                try:
                    self.observe(shard, ray.get(ref))
                except actor_errors() as error:
                    self.mark_down(shard, error)
        now = time.monotonic()
        if not self._status_requests and now - self._statuses_asked_at >= (
            self.config.status_refresh_s
        ):
            self._statuses_asked_at = now
            self._status_requests = {
                shard: handle.get_status.remote() for shard, handle in enumerate(self.handles)
            }

    def refresh(self, *, timeout_s: float | None = None) -> list[ShardStatus | None]:
        """Ask every shard for its status now and wait (dead shards are marked down)."""
        import ray

        timeout_s = self.config.timeout_s if timeout_s is None else timeout_s
        refs = [h.get_status.remote() for h in self.handles]
        out: list[ShardStatus | None] = []
        for shard, ref in enumerate(refs):
            try:
                status = ray.get(ref, timeout=timeout_s)
            except ray.exceptions.GetTimeoutError:
                raise ReplayTimeout(
                    f"replay shard {shard} did not answer a status request in {timeout_s}s"
                ) from None
            except actor_errors() as error:
                self.mark_down(shard, error)
                out.append(None)
                continue
            self.observe(shard, status)
            out.append(status)
        return out

    def forget(self) -> None:
        """Drop every view and status request in flight (the shards' contents were replaced)."""
        self._status_requests.clear()
        self.views = [ShardView(lost_seen=v.lost_seen) for v in self.views]

    # ---- routing ------------------------------------------------------------------------------
    def pick_insert_shard(self) -> int:
        """Round-robin over live shards, those whose limiter takes inserts first."""
        now = time.monotonic()
        order = [(self._next_insert + i) % self.num_shards for i in range(self.num_shards)]
        live = [i for i in order if self.views[i].down_until <= now]
        if not live:  # every shard failed recently: try the one that comes back soonest
            return min(range(self.num_shards), key=lambda i: self.views[i].down_until)
        open_ = [i for i in live if self.views[i].status is None or self.views[i].status.can_insert]
        shard = (open_ or live)[0]
        self._next_insert = (shard + 1) % self.num_shards
        return shard

    def pick_sample_shard(self) -> int:
        """A shard picked by priority mass, among the live shards whose limiter lets samples
        through if there are any."""
        now = time.monotonic()
        up = [i for i, v in enumerate(self.views) if v.down_until <= now]
        if not up:
            up = [min(range(self.num_shards), key=lambda i: self.views[i].down_until)]
        open_ = [i for i in up if self.views[i].status and self.views[i].status.can_sample]
        up = open_ or up
        mass = np.array(
            [self.views[i].status.total_priority if self.views[i].status else 0.0 for i in up]
        )
        if mass.sum() > 0:
            return up[int(self.rng.choice(len(up), p=mass / mass.sum()))]
        return up[int(self.rng.integers(len(up)))]  # nothing known: the limiter waits for rows

    # ---- waiting ------------------------------------------------------------------------------
    def wait_for(self, ref: Any, shard: int, what: str) -> None:
        """Block until ``ref`` (a call to ``shard``) is done, at most the reply timeout."""
        import ray

        if not ray.wait([ref], timeout=self.reply_timeout_s)[0]:
            raise ReplayTimeout(
                f"{what} to replay shard {shard} got no answer in {self.reply_timeout_s}s"
            )

    def on_every_shard(self, what: str, call: Callable[[int, Any], Any]) -> list[Any]:
        """``call(shard_index, handle)`` on every shard (it returns a Ray ref); the replies in
        shard order.

        A shard that is down (restarting after its process died) is asked again until it
        answers or ``timeout_s`` has passed; then :class:`ReplayUnavailable` names the shard
        and its state; an error the shard raised is raised as it was. Nothing here raises a raw
        Ray exception.
        """
        import ray

        timeout_s = self.config.timeout_s
        deadline = time.monotonic() + timeout_s
        replies: dict[int, Any] = {}
        pending = {shard: call(shard, handle) for shard, handle in enumerate(self.handles)}
        while pending:
            shard, ref = next(iter(pending.items()))
            try:
                replies[shard] = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except ray.exceptions.GetTimeoutError:
                raise ReplayTimeout(
                    f"{what}: replay shard {shard} did not answer within {timeout_s}s"
                ) from None
            except ray.exceptions.RayTaskError as error:  # the shard's own error, unwrapped
                raise shard_error(error) from None
            except actor_errors() as error:
                self.mark_down(shard, error)
                if time.monotonic() >= deadline:
                    state = (
                        "restarting"
                        if isinstance(error, ray.exceptions.ActorUnavailableError)
                        else "dead"
                    )
                    raise ReplayUnavailable(
                        f"{what}: replay shard {shard} is {state} ({type(error).__name__}) and "
                        f"did not come back within {timeout_s}s"
                    ) from None
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
                pending[shard] = call(shard, self.handles[shard])  # ask it again
                continue
            del pending[shard]
        return [replies[shard] for shard in range(self.num_shards)]
