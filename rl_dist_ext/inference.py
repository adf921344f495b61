"""SEED-style central inference (Espeholt et al. 2020, "SEED RL", arXiv:1910.06591).

Actors only step environments. Every step each actor sends its observations to one
:class:`InferenceServer`, which queues requests from all actors, runs the current policy once per
batch (up to ``max_batch_size`` observations, or whatever arrived within ``max_wait_ms`` of the
oldest queued request, or at once when every active caller has a request queued: an actor waits
for its reply, so nothing more can arrive), and answers each request with its rows of the
outputs plus the weight version used. A caller is active while it has registered or sent a
request within the last ``active_caller_window_s`` and has not called
:meth:`InferenceServer.idle` since; one that stopped (or died) delays batches by at most
``max_wait_ms`` until then. The learner sends weights to the server only
(:meth:`InferenceServer.set_weights`).

A plain class with ``async`` methods (an asyncio event loop batches concurrent calls); it runs and
is tested without Ray, and ``rl_dist_ext.ray_actors.start_inference_server`` makes it an async
Ray actor. The policy is framework-agnostic: ``policy_factory(device)`` returns an object with
``__call__(obs: np.ndarray) -> dict[str, np.ndarray]`` (batch-major outputs, ``"actions"``
among them), ``set_weights(weights)`` and ``is_recurrent``. Recurrent policies are rejected:
per-(actor, env) state on the server is not implemented.

Several modules (multi-agent runs): the factory returns module id -> policy; every request
names its module (``infer(caller, obs, module=...)``), a batch holds the requests of one module,
and ``set_weights`` takes module id -> weights under one version.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np

from rl_dist_ext.validation import check_int, check_real


class InferenceServerUnavailable(RuntimeError):
    """The inference server did not answer a caller within its retry bound: it is down and
    did not come back in time (restarting, or nowhere to restart because its node is gone)."""


class InferencePolicy(Protocol):
    is_recurrent: bool

    def __call__(self, obs: np.ndarray) -> dict[str, np.ndarray]: ...

    def set_weights(self, weights: Any) -> None: ...


@dataclass(frozen=True, kw_only=True)
class InferenceServerConfig:
    """Batching and placement settings, validated when built.

    ``max_batch_size`` counts observations (rows), not requests; a request larger than it runs
    as its own batch. ``device`` is handed to the policy factory (``"cuda"`` when the server
    actor was given a GPU, else ``"cpu"``).
    """

    max_batch_size: int = 64
    max_wait_ms: float = 2.0
    active_caller_window_s: float = 1.0
    device: str = "cpu"
    latency_window: int = 4096

    def __post_init__(self) -> None:
        check_int("max_batch_size", self.max_batch_size, 1)
        check_real("max_wait_ms", self.max_wait_ms, low=0.0)
        check_real("active_caller_window_s", self.active_caller_window_s, low=0.0)
        check_int("latency_window", self.latency_window, 1)
        if not isinstance(self.device, str) or not self.device:
            raise ValueError(f"device must be a torch device string, got {self.device!r}")


#: ``num_gpus="auto"``: the server's share of a GPU when the cluster has one (SEED's layout of
#: the inference server and the learner sharing one accelerator), else none.
AUTO = "auto"
AUTO_SERVER_GPUS = 0.5


@dataclass(frozen=True, kw_only=True)
class CentralInference:
    """SEED mode's settings, the one definition both adapters build: the server's batching
    (:class:`InferenceServerConfig`'s defaults) and its resources.

    Attributes:
        max_batch_size: observations per server forward pass (at most).
        max_wait_ms: how long the oldest queued request may wait for more, in milliseconds (a
            batch runs at once when every active caller has a request queued).
        num_cpus: Ray CPUs of the server actor (its own placement-group bundle under Tune).
        num_gpus: the server's GPUs (the policy then runs on ``"cuda"``); ``"auto"``: 0.5 of a
            GPU when the Ray cluster has one, else 0.
    """

    max_batch_size: int = InferenceServerConfig.max_batch_size
    max_wait_ms: float = InferenceServerConfig.max_wait_ms
    num_cpus: float = 0.5
    num_gpus: float | str = AUTO

    def __post_init__(self) -> None:
        self.server_config()  # validates the batching settings
        check_real("num_cpus", self.num_cpus, low=0.0)
        if self.num_gpus != AUTO:
            check_real("num_gpus (or 'auto')", self.num_gpus, low=0.0)

    def server_config(self) -> InferenceServerConfig:
        return InferenceServerConfig(
            max_batch_size=self.max_batch_size, max_wait_ms=self.max_wait_ms
        )

    def gpus(self, cluster_gpus: float) -> float:
        """The server's GPUs on a cluster with ``cluster_gpus`` of them (``"auto"`` resolved)."""
        if self.num_gpus == AUTO:
            return min(AUTO_SERVER_GPUS, cluster_gpus)
        return float(self.num_gpus)

    def bundle(self, cluster_gpus: float) -> dict[str, float]:
        """The server's resources, as a Ray bundle."""
        bundle = {"CPU": float(self.num_cpus)}
        gpus = self.gpus(cluster_gpus)
        if gpus > 0:
            bundle["GPU"] = gpus
        return bundle


class InferenceReply(NamedTuple):
    outputs: dict[str, np.ndarray]  # name -> [N, ...] rows of this request, in request order
    version: int  # weight version that computed them (-1 = initial weights)
    queue_ms: float  # time the request waited before its batch ran


#: The module of a single-policy server (and of requests that name none).
SINGLE = ""


@dataclass
class _Request:
    caller: str
    obs: np.ndarray
    future: asyncio.Future
    enqueued: float
    module: str = SINGLE


class InferenceServer:
    """Batches observation requests from many callers; see the module docstring.

    Args:
        policy_factory: ``device -> InferencePolicy``.
        config: an :class:`InferenceServerConfig`.
    """

    def __init__(
        self,
        policy_factory: Callable[[str], InferencePolicy],
        config: InferenceServerConfig | None = None,
    ) -> None:
        self._config = config if config is not None else InferenceServerConfig()
        if not isinstance(self._config, InferenceServerConfig):
            raise TypeError(
                f"config must be an InferenceServerConfig, got {type(self._config).__name__}"
            )
        policy = policy_factory(self._config.device)
        self._policies: dict[str, InferencePolicy] = (
            dict(policy) if isinstance(policy, Mapping) else {SINGLE: policy}
        )
        for module, each in self._policies.items():
            if getattr(each, "is_recurrent", False):
                raise ValueError(
                    "central inference does not support recurrent policies (the server keeps "
                    "no per-(actor, env) state); use local inference for "
                    + (f"module {module!r}" if module else "this module")
                )
        self._version = -1
        self._queue: deque[_Request] = deque()
        self._rows_queued = 0
        self._wake: asyncio.Event | None = None
        self._batcher: asyncio.Task | None = None
        self._callers: dict[str, int] = {}
        self._last_seen: dict[str, float] = {}  # caller -> last register/infer time
        self._queued_by_caller: dict[str, int] = {}
        self._num_early_batches = 0
        self._latencies_ms: deque[float] = deque(maxlen=self._config.latency_window)
        self._started = time.monotonic()
        self._num_requests = 0
        self._num_rows = 0
        self._num_batches = 0
        self._num_caller_restarts = 0
        self._num_stale_weights = 0
        self._weights_set_at = self._started
        #: per module, the row shape and dtype of the first batch the policy took: a request
        #: that does not fit is refused on arrival, to its caller only
        self._obs_specs: dict[str, tuple[tuple[int, ...], np.dtype]] = {}

    # ---- callers ------------------------------------------------------------------------------
    async def register(self, caller: str) -> int:
        """Announce ``caller`` (e.g. ``"runner-3"``); a caller registering again was restarted.

        Returns:
            How many times ``caller`` registered before (0 for a new caller).
        """
        seen = self._callers.get(caller, -1) + 1
        self._callers[caller] = seen
        self._last_seen[caller] = time.monotonic()
        if seen:
            self._num_caller_restarts += 1
        return seen

    async def idle(self, caller: str) -> None:
        """``caller`` stops sending for a while (e.g. between rollouts): batches stop waiting
        for it until its next request."""
        self._last_seen.pop(caller, None)
        if self._wake is not None:
            self._wake.set()  # a batch waiting for this caller may run now

    async def infer(self, caller: str, obs: np.ndarray, module: str = SINGLE) -> InferenceReply:
        """The policy's outputs for ``obs`` (``[N, *obs_shape]``), batched with other callers'
        requests for the same ``module``.

        A module's rows keep the shape and dtype of the first batch its policy took (a request
        whose rows differ, or whose dtype does not cast to it within its kind, is refused with
        a ``ValueError`` to its caller alone); a request the policy fails on fails only its
        own caller: the batch it was in runs again request by request."""
        obs = np.asarray(obs)
        if obs.ndim < 1 or obs.shape[0] < 1:
            raise ValueError(f"obs must be [N, ...] with N >= 1, got shape {obs.shape}")
        if module not in self._policies:
            raise ValueError(
                f"the inference server has no policy for module {module!r}; it serves "
                f"{sorted(self._policies)}"
            )
        spec = self._obs_specs.get(module)
        if spec is not None and (
            obs.shape[1:] != spec[0] or not np.can_cast(obs.dtype, spec[1], casting="same_kind")
        ):
            raise ValueError(
                f"obs rows of shape {obs.shape[1:]} and dtype {obs.dtype} do not fit "
                + (f"module {module!r}" if module else "the policy")
                + f": its requests so far had rows of shape {spec[0]} and dtype {spec[1]}"
            )
        loop = asyncio.get_running_loop()
        if self._wake is None or self._batcher is None or self._batcher.done():
            self._wake = asyncio.Event()
            self._batcher = loop.create_task(self._batch_loop())
        request = _Request(caller, obs, loop.create_future(), time.monotonic(), module)
        self._queue.append(request)
        self._rows_queued += obs.shape[0]
        self._last_seen[caller] = request.enqueued
        self._callers.setdefault(caller, 0)  # known after a server restart without registering
        self._queued_by_caller[caller] = self._queued_by_caller.get(caller, 0) + 1
        self._wake.set()
        return await request.future

    # ---- weights ------------------------------------------------------------------------------
    async def set_weights(self, weights: Any, version: int) -> int:
        """Use ``weights`` from the next batch on; returns the version now held.

        Pushes are fire-and-forget and an async actor may run them out of order, so a version
        that is not newer than the held one is ignored (and counted), never applied. A server of
        several modules takes module id -> weights.
        """
        version = check_int("version", version, 0)
        if version <= self._version:
            self._num_stale_weights += 1
            return self._version
        if set(self._policies) == {SINGLE}:
            self._policies[SINGLE].set_weights(weights)
        else:
            unknown = set(weights) - set(self._policies)
            if unknown:
                raise ValueError(
                    f"weights for modules {sorted(unknown)} the server does not serve "
                    f"({sorted(self._policies)})"
                )
            for module, module_weights in weights.items():
                self._policies[module].set_weights(module_weights)
        self._version = version
        self._weights_set_at = time.monotonic()
        return version

    async def get_version(self) -> int:
        return self._version

    # ---- metrics ------------------------------------------------------------------------------
    async def stats(self) -> dict[str, float]:
        elapsed = max(time.monotonic() - self._started, 1e-9)
        latencies = np.asarray(self._latencies_ms, dtype=float)
        p50, p99 = np.percentile(latencies, [50, 99]) if latencies.size else (0.0, 0.0)
        batches = max(self._num_batches, 1)
        return {
            "version": self._version,
            "requests_per_s": self._num_requests / elapsed,
            "num_requests": self._num_requests,
            "num_batches": self._num_batches,
            "mean_batch_requests": self._num_requests / batches,
            "mean_batch_rows": self._num_rows / batches,
            "early_batches": self._num_early_batches,
            "batch_fill": self._num_rows / batches / self._config.max_batch_size,
            "queue_ms_p50": float(p50),
            "queue_ms_p99": float(p99),
            "num_callers": len(self._callers),
            "caller_restarts": self._num_caller_restarts,
            "stale_weights_ignored": self._num_stale_weights,
            "seconds_since_weights": time.monotonic() - self._weights_set_at,
        }

    # ---- the batching loop --------------------------------------------------------------------
    async def _batch_loop(self) -> None:
        max_rows = self._config.max_batch_size
        max_wait = self._config.max_wait_ms / 1000.0
        while True:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
            deadline = self._queue[0].enqueued + max_wait
            while self._rows_queued < max_rows:
                now = time.monotonic()
                if now >= deadline:
                    break
                next_expiry = self._next_expiry_of_a_caller_not_waiting(now)
                if next_expiry is None:  # every active caller waits: nothing more can come
                    self._num_early_batches += 1
                    break
                self._wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), min(deadline, next_expiry) - now)
            self._run_batch(self._take_batch(max_rows))

    def _next_expiry_of_a_caller_not_waiting(self, now: float) -> float | None:
        """When the first active caller with nothing queued stops being active (None: none)."""
        window = self._config.active_caller_window_s
        ends = [
            seen + window
            for caller, seen in self._last_seen.items()
            if seen + window > now and not self._queued_by_caller.get(caller, 0)
        ]
        return min(ends) if ends else None

    def _take_batch(self, max_rows: int) -> list[_Request]:
        """The oldest request and the next ones of its module that fit in ``max_rows``, in
        arrival order (requests of other modules keep their places)."""
        batch = [self._queue.popleft()]
        rows = batch[0].obs.shape[0]
        left: deque[_Request] = deque()
        while self._queue:
            request = self._queue.popleft()
            if request.module != batch[0].module:
                left.append(request)
                continue
            if rows + request.obs.shape[0] > max_rows:
                left.append(request)
                left.extend(self._queue)
                self._queue.clear()
                break
            rows += request.obs.shape[0]
            batch.append(request)
        self._queue = left
        self._rows_queued -= rows
        for request in batch:
            self._queued_by_caller[request.caller] -= 1
        return batch

    def _run_batch(self, batch: list[_Request]) -> None:
        started = time.monotonic()
        live = [r for r in batch if not r.future.cancelled()]
        if not live:
            return
        try:
            obs = np.concatenate([r.obs for r in live])
            outputs = self._policies[live[0].module](obs)
            rows = obs.shape[0]
            for name, value in outputs.items():
                if np.shape(value)[:1] != (rows,):
                    raise ValueError(
                        f"policy output {name!r} has shape {np.shape(value)}, expected "
                        f"[{rows}, ...] (one row per observation)"
                    )
        except Exception as error:
            if len(live) == 1:  # its caller gets the error; the server goes on
                live[0].future.set_exception(error)
                return
            # One request the policy cannot take must not fail the others batched with it:
            # each runs alone, and only the bad ones' callers get an error.
            for request in live:
                self._run_batch([request])
            return
        first = live[0].obs
        if all(r.obs.shape[1:] == first.shape[1:] and r.obs.dtype == first.dtype for r in live):
            self._obs_specs.setdefault(live[0].module, (first.shape[1:], first.dtype))
        start = 0
        for request in live:
            n = request.obs.shape[0]
            queue_ms = (started - request.enqueued) * 1000.0
            request.future.set_result(
                InferenceReply(
                    {k: np.asarray(v[start : start + n]) for k, v in outputs.items()},
                    self._version,
                    queue_ms,
                )
            )
            self._latencies_ms.append(queue_ms)
            start += n
        self._num_requests += len(live)
        self._num_rows += start
        self._num_batches += 1
