"""The one place where ``ray.remote`` is applied to rl-dist-ext's plain classes (the replay
shard, :mod:`rl_dist_ext.replay.distributed.shard_actor`, comes through
:func:`start_restartable_actor`).

Besides the actor starters: :class:`ParameterServerClient` (a parameter server handle with the
plain class's methods, for the Gorila steps), :class:`InferenceCaller` (one actor's or env
runner's requests to the SEED inference server), :class:`InferenceServerHandle` (the learner's
side of that server) and :func:`check_resources_fit` (refuse asks the cluster can never place,
before anything starts).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rl_dist_ext.inference import InferenceReply, InferenceServerUnavailable
from rl_dist_ext.params import ParameterServer, ParameterServerUnavailable, VersionedWeights
from rl_dist_ext.validation import check_real
from rl_dist_ext.weight_compression import check_encoding, decode_weights, encode_weights
from rl_dist_ext.weight_deltas import DEFAULT_TOLERANCE, DeltaReceiver

log = logging.getLogger(__name__)


def _start_keeping_arguments(
    remote_cls: Any, options: dict[str, Any], *args: Any, **kwargs: Any
) -> ray.actor.ActorHandle:
    """``remote_cls.options(**options).remote(*args, **kwargs)``, every argument put in the
    object store first and its reference kept on the returned handle.

    Ray releases an actor's constructor arguments once the actor is up (ray#53727), so the
    restart of an actor started with an argument above Ray's inline limit (100 KiB: a pixel
    policy, a policy factory carrying weights) failed in its creation task and the actor
    stayed dead. Held here, the arguments live as long as the handle the starter returned.
    """
    arg_refs = [ray.put(value) for value in args]
    kwarg_refs = {name: ray.put(value) for name, value in kwargs.items()}
    handle = remote_cls.options(**options).remote(*arg_refs, **kwarg_refs)
    handle._rl_dist_ext_constructor_arguments = (arg_refs, kwarg_refs)
    return handle


def _placement(
    num_cpus: float, placement_group: Any, bundle_index: int, *, strategy: str = "DEFAULT"
) -> dict[str, Any]:
    """Ray options: inside ``placement_group`` if given (its own strategy decides the nodes),
    else Ray's scheduling ``strategy``. Ray restarts an actor whose node died on another node
    that has the resources (in a placement group, once Ray has re-placed the lost bundle)."""
    options: dict[str, Any] = {"num_cpus": num_cpus}
    if placement_group is not None:
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=placement_group, placement_group_bundle_index=bundle_index
        )
    elif strategy != "DEFAULT":
        options["scheduling_strategy"] = strategy
    return options


# Weights are republished by the learner after a restart, so a restarted server needs no state.
RemoteParameterServer = ray.remote(max_restarts=-1, max_task_retries=0)(ParameterServer)


def start_parameter_server(
    *,
    num_cpus: float = 0.0,
    placement_group: Any = None,
    bundle_index: int = -1,
    timeout_s: float = 120.0,
    weights_encoding: str = "fp32",
    delta_tolerance: float = DEFAULT_TOLERANCE,
) -> ParameterServerClient:
    """Start the parameter server actor (it only stores references: no CPU by default);
    ``weights_encoding``: how weights travel, see :mod:`rl_dist_ext.weight_compression`;
    ``delta_tolerance``: the bound of ``"delta"`` pulls (:mod:`rl_dist_ext.weight_deltas`)."""
    check_encoding(weights_encoding)
    server_args = {}
    if weights_encoding == "delta":
        server_args["delta_tolerance"] = check_real(
            "delta_tolerance", delta_tolerance, low=0.0, strict=True
        )
    options = _placement(num_cpus, placement_group, bundle_index)
    return ParameterServerClient(
        RemoteParameterServer.options(**options).remote(**server_args),
        timeout_s=timeout_s,
        weights_encoding=weights_encoding,
    )


class ParameterServerClient:
    """A parameter server actor behind :class:`~rl_dist_ext.params.ParameterServer`'s interface.

    What the Gorila actor and learner steps (``rl_dist_ext.gorila``) talk to; picklable, so it
    travels to env runners and learner actors. ``publish`` waits for the server's answer (a
    version the server refuses raises here, on the learner).

    While the server is down (Ray restarts it, empty) a pull finds nothing newer (the actor
    keeps acting with the weights it holds) and a publish is missed (the next one reaches the
    restarted server); both are logged. A server that has not answered this client for
    ``timeout_s`` makes the next call raise
    :class:`~rl_dist_ext.params.ParameterServerUnavailable`.
    """

    def __init__(
        self,
        handle: ray.actor.ActorHandle,
        *,
        timeout_s: float = 120.0,
        weights_encoding: str = "fp32",
    ) -> None:
        self.handle = handle
        self._timeout_s = timeout_s
        self.weights_encoding = check_encoding(weights_encoding)
        self._down_since: float | None = None  # monotonic time of the first unanswered call
        self._deltas = DeltaReceiver()  # the weights this copy of the client holds ("delta")

    def __getstate__(self) -> dict[str, Any]:
        """Each unpickled copy (an actor's) starts holding no weights: its first pull is full."""
        state = self.__dict__.copy()
        state["_deltas"] = DeltaReceiver()
        return state

    def publish(self, weights: Any, version: int) -> int:
        """Store ``weights`` as ``version`` (encoded as ``weights_encoding``, see
        :mod:`rl_dist_ext.weight_compression`); returns it, also when the server was down and
        missed it."""
        sent = encode_weights(weights, self.weights_encoding)
        answer = self._call(lambda: self.handle.publish.remote(sent, version), f"version {version}")
        return version if answer is None else answer

    def pull_if_newer(self, version: int) -> VersionedWeights | None:
        """The newer weights (decoded to float32), or ``None`` (also while the server is down).

        With ``"delta"`` weights the server sends the change since the weights this client
        last got (in full the first time, and after the server restarted)."""
        if self.weights_encoding == "delta":
            held = self._deltas.held
            pulled = self._call(
                lambda: self.handle.pull_delta_if_newer.remote(version, held), "a pull"
            )
            if pulled is None:
                return None
            return VersionedWeights(self._deltas.apply(pulled), pulled.version)
        latest = self._call(lambda: self.handle.pull_if_newer.remote(version), "a pull")
        if latest is None:
            return None
        return VersionedWeights(decode_weights(latest.weights), latest.version)

    def _call(self, submit: Any, what: str) -> Any:
        """``ray.get(submit())``; ``None`` while the server is down, for up to ``timeout_s``."""
        try:
            answer = ray.get(submit(), timeout=self._timeout_s)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as error:
            now = time.monotonic()
            if self._down_since is None:
                self._down_since = now
            if now - self._down_since >= self._timeout_s:
                raise ParameterServerUnavailable(
                    f"the parameter server has not answered for {now - self._down_since:.0f} s "
                    f"(timeout_s={self._timeout_s:g}): it is down (restarting, or no node has "
                    "room to restart it)"
                ) from error
            log.warning("parameter server is down, %s missed: %s", what, error)
            return None
        self._down_since = None
        return answer

    def close(self) -> None:
        ray.kill(self.handle, no_restart=True)


def cluster_gpus() -> float:
    """GPUs in the running Ray cluster (0 when Ray is not started)."""
    return float(ray.cluster_resources().get("GPU", 0.0)) if ray.is_initialized() else 0.0


def check_resources_fit(
    owner: str, asks: dict[str, float], *, how_to_lower: str, free: bool = False
) -> None:
    """Raise ``ValueError`` if the running cluster can never hold ``asks`` (resource -> amount).

    ``free=True`` compares with what is free now (for actors started outside any placement
    group, next to others already running), else with the cluster's total. Inside a placement
    group (Tune) Ray has already checked the ask, so nothing is checked.
    """
    if not ray.is_initialized() or ray.util.get_current_placement_group() is not None:
        return
    have_now = ray.available_resources() if free else ray.cluster_resources()
    where = "free in the Ray cluster" if free else "in the Ray cluster"
    for resource, wanted in asks.items():
        have = float(have_now.get(resource, 0.0))
        if wanted > have + 1e-9:
            raise ValueError(
                f"{owner} asks for {wanted:g} {resource}s but there are {have:g} {where}; "
                f"{how_to_lower}"
            )


def start_restartable_actor(
    cls: type,
    *args: Any,
    num_cpus: float,
    placement_group: Any = None,
    bundle_index: int = -1,
    strategy: str = "DEFAULT",
    **kwargs: Any,
) -> ray.actor.ActorHandle:
    """Start a plain class as a Ray actor that Ray restarts (same arguments) when its process dies.

    Calls in flight at the death fail (no retries), so the caller sees and counts the loss.
    Placed in ``placement_group`` (bundle ``bundle_index``) if given, else by Ray's scheduling
    ``strategy`` (``"DEFAULT"`` or ``"SPREAD"``).
    """
    remote_cls = ray.remote(max_restarts=-1, max_task_retries=0)(cls)
    options = _placement(num_cpus, placement_group, bundle_index, strategy=strategy)
    return _start_keeping_arguments(remote_cls, options, *args, **kwargs)


def start_inference_server(
    policy_factory: Any,
    config: Any,
    *,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    placement_group: Any = None,
    bundle_index: int = -1,
) -> ray.actor.ActorHandle:
    """Start an :class:`~rl_dist_ext.inference.InferenceServer` as an async Ray actor.

    With ``num_gpus > 0`` the policy is built on ``"cuda"`` (whatever ``config.device`` says).
    A restarted server starts with the factory's initial weights (version -1) until the learner
    sends weights again.
    """
    import dataclasses

    from rl_dist_ext.inference import InferenceServer

    if num_gpus > 0:
        config = dataclasses.replace(config, device="cuda")
    options = _placement(num_cpus, placement_group, bundle_index)
    options["num_gpus"] = num_gpus
    remote_cls = ray.remote(max_restarts=-1, max_task_retries=0)(InferenceServer)
    return _start_keeping_arguments(remote_cls, options, policy_factory, config)


class InferenceCaller:
    """One caller of the inference server (an actor or an env runner), from any process.

    Requests wait out a server restart (Ray restarts it; calls in flight fail) for up to
    ``retry_s``, then raise :class:`~rl_dist_ext.inference.InferenceServerUnavailable`.
    ``versions_used`` collects the weights version of every reply.

    Args:
        server: the inference server actor.
        caller: this caller's id at the server (e.g. ``"actor-3"``).
        retry_s: how long a request waits for a restarting server before raising.
    """

    def __init__(
        self, server: ray.actor.ActorHandle, caller: str, *, retry_s: float = 60.0
    ) -> None:
        self.server = server
        self.caller = caller
        self._retry_s = retry_s
        self.versions_used: list[int] = []

    def register(self) -> int:
        """Announce this caller; returns how often it registered before (restarts)."""
        return self._call(lambda: self.server.register.remote(self.caller))

    def infer(self, obs: Any, module: str = "") -> InferenceReply:
        """The server's outputs for ``obs`` (``[N, ...]``), batched with other callers
        (multi-agent servers: with other requests for ``module``)."""
        obs = np.asarray(obs)
        reply = self._call(lambda: self.server.infer.remote(self.caller, obs, module))
        self.versions_used.append(reply.version)
        return reply

    def _call(self, submit: Any) -> Any:
        """``ray.get(submit())``, sent again while the server is down, for up to ``retry_s``;
        then :class:`~rl_dist_ext.inference.InferenceServerUnavailable`."""
        deadline = time.monotonic() + self._retry_s
        while True:
            try:
                return ray.get(submit(), timeout=max(deadline - time.monotonic(), 0.1))
            except ray.exceptions.RayTaskError as error:  # the server refused this request
                cause = error.cause
                if not isinstance(cause, BaseException) or isinstance(
                    cause, ray.exceptions.RayError
                ):
                    cause = InferenceServerUnavailable(f"the inference server failed: {error}")
                raise cause from None
            except (
                ray.exceptions.RayActorError,
                ray.exceptions.ActorUnavailableError,
                ray.exceptions.GetTimeoutError,
            ) as error:
                if time.monotonic() >= deadline:
                    raise InferenceServerUnavailable(
                        f"the inference server did not answer caller {self.caller!r} within "
                        f"retry_s={self._retry_s} s: it is down (restarting, or no node has "
                        "room to restart it)"
                    ) from error
                time.sleep(0.1)

    def idle(self) -> None:
        """This caller sends nothing until its next request: batches stop waiting for it."""
        self.server.idle.remote(self.caller)

    def take_versions_used(self) -> list[int]:
        """The versions of the replies since the last call, and forget them."""
        used, self.versions_used = self.versions_used, []
        return used


class InferenceServerHandle:
    """The learner's side of the inference server: weights in, metrics out, stop.

    ``push`` is fire and forget (the server ignores versions older than its own). A restarted
    server holds its initial weights (version -1) until the next push: :meth:`needs_weights`
    tells, from the last :meth:`stats`.
    """

    def __init__(self, handle: ray.actor.ActorHandle) -> None:
        self.handle = handle
        self.version = -1  # last version pushed
        self._server_version = -1  # as the last stats() saw it

    def push(self, weights: Any, version: int) -> None:
        self.handle.set_weights.remote(weights, version)
        self.version = version

    def publish(self, weights: Any, version: int) -> int:
        """:meth:`push`, under the parameter server's name (a learner's weights sink)."""
        self.push(weights, version)
        return version

    def stats(self) -> dict[str, float]:
        """The server's metrics (empty, with a warning, when it does not answer)."""
        try:
            stats = ray.get(self.handle.stats.remote(), timeout=30)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as error:
            log.warning("inference server did not answer a stats request: %s", error)
            return {}
        self._server_version = int(stats["version"])
        return stats

    def needs_weights(self) -> bool:
        """Whether the server held older weights than the last push at the last stats()."""
        return self._server_version < self.version

    def close(self) -> None:
        ray.kill(self.handle, no_restart=True)
