"""Multi-agent GorilaDQN for Tianshou: PettingZoo envs, one distributed replay per learning module.

- :class:`MultiAgentGorilaDQN`: Tianshou's ``MultiAgentOffPolicyAlgorithm`` (its
  ``MARLDispatcher`` routes acting by ``obs.agent_id`` to each agent's policy) whose learning
  agents are :class:`~tianshou_plugins.GorilaDQN`. The same ``GorilaDQN`` object given for
  several agents is one shared module (parameter sharing); other algorithms (e.g. Tianshou's
  ``MARLRandomDiscreteMaskedOffPolicyAlgorithm`` as the opponent) act but do not learn here.
  Modules are named by their first agent (``"player_2"``, or ``"agent_0"`` for one shared
  by ``agent_0`` and ``agent_1``).
- :class:`MultiAgentDistributedReplayBuffer`: one
  :class:`~tianshou_plugins.DistributedPrioritizedReplayBuffer` per module (its own shards,
  priorities and rate limiter), started by the collector once it knows the modules.

One update runs through Tianshou's template (``OffPolicyAlgorithm.update``): the buffer samples
a batch from every module's replay, and each module's ``GorilaDQN`` takes its own
``_preprocess_batch`` -> ``_update_with_batch`` -> ``_postprocess_batch`` (its gradient step,
its target period, its priorities back to its own replay). The weights version counts these
joint updates (one per ``update``), the unit of the collector's policy lag.

The actors (:class:`~tianshou_plugins.actor.MultiAgentGorilaActor`) run Tianshou's collector
over ``PettingZooEnv`` envs and rebuild each agent's own transitions from the env's turns
(:mod:`rl_dist_ext.gorila.turns`): its observation, action, the rewards it got until its next
turn, its next observation and the legal actions there (PettingZoo's action masks are honoured
when acting, in the initial priorities and in the double-DQN target).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tianshou.algorithm.algorithm_base import OffPolicyAlgorithm
from tianshou.algorithm.multiagent.marl import MapTrainingStats, MultiAgentOffPolicyAlgorithm
from tianshou.data import Batch, ReplayBuffer

from rl_dist_ext.gorila import GorilaLearner, GorilaLearnerCounters
from rl_dist_ext.replay.distributed import DistributedReplayConfig
from tianshou_plugins.actor_collector import check_env_factory
from tianshou_plugins.buffer import DistributedPrioritizedReplayBuffer
from tianshou_plugins.gorila_dqn import GorilaDQN
from tianshou_plugins.weights import cpu_state_dict


class MultiAgentGorilaDQN(GorilaLearnerCounters, MultiAgentOffPolicyAlgorithm):
    """Gorila / Ape-X DQN over a PettingZoo env; see the module docstring.

    Args:
        algorithms: one per agent of ``env.agents``, in that order; ``GorilaDQN`` for agents
            that learn (the same object for agents that share a module), any Tianshou
            off-policy algorithm for the others.
        env: the ``tianshou.env.PettingZooEnv`` the agents act in (its agent ids and order).
    """

    def __init__(self, *, algorithms: list[OffPolicyAlgorithm], env: Any) -> None:
        agents = list(env.agents)
        if len(algorithms) != len(agents):
            raise ValueError(
                f"algorithms must hold one algorithm per agent of the env {agents}, got "
                f"{len(algorithms)}"
            )
        modules: dict[str, GorilaDQN] = {}
        module_of: dict[str, str] = {}
        for agent, algorithm in zip(agents, algorithms, strict=True):
            if not isinstance(algorithm, GorilaDQN):
                continue
            name = next((m for m, a in modules.items() if a is algorithm), agent)
            modules.setdefault(name, algorithm)
            module_of[agent] = name
        if not modules:
            raise ValueError(
                "MultiAgentGorilaDQN needs at least one GorilaDQN among the algorithms (the "
                f"agents' algorithms are {[type(a).__name__ for a in algorithms]})"
            )
        gammas = {m: (a.gamma, a.n_step) for m, a in modules.items()}
        if len(set(gammas.values())) > 1:
            raise ValueError(
                "the learning modules must share gamma and the n-step horizon (the actors fold "
                f"every agent's steps with one setting), got {gammas}"
            )
        super().__init__(algorithms=algorithms, env=env)
        self.learning_modules = modules
        self.module_of_agent = module_of
        self.agents = agents
        self.gamma, self.n_step = next(iter(gammas.values()))
        # Publishes the whole multi-agent policy and counts the joint updates (the per-module
        # GorilaDQNs keep their own target periods and priorities).
        self.gorila = GorilaLearner(
            replay=None,
            batch_size=None,
            prioritized=True,
            target_update_every=1,
            publish_every=1,
            sync_target=lambda: None,
            export_weights=lambda: cpu_state_dict(self.policy),
        )

    # ---- Tianshou's update template, per module -----------------------------------------------
    def update(self, buffer: ReplayBuffer, sample_size: int | None) -> MapTrainingStats:
        if not isinstance(buffer, MultiAgentDistributedReplayBuffer):
            raise TypeError(
                "MultiAgentGorilaDQN learns from one replay per module: buffer must be a "
                f"MultiAgentDistributedReplayBuffer, got {type(buffer).__name__}"
            )
        return super().update(buffer, sample_size)

    def _preprocess_batch(self, batch: Batch, buffer: Any, indices: Any) -> Batch:  # type: ignore[override]
        for module, algorithm in self.learning_modules.items():
            batch[module] = algorithm._preprocess_batch(
                batch[module], buffer.buffer(module), indices[module]
            )
        return batch

    def _update_with_batch(self, batch: Batch) -> MapTrainingStats:  # type: ignore[override]
        stats = {m: a._update_with_batch(batch[m]) for m, a in self.learning_modules.items()}
        self.gorila.after_gradient_step()  # one joint update: one version
        return MapTrainingStats(stats)

    def _postprocess_batch(self, batch: Batch, buffer: Any, indices: Any) -> None:  # type: ignore[override]
        for module, algorithm in self.learning_modules.items():
            algorithm._postprocess_batch(batch[module], buffer.buffer(module), indices[module])

    # ---- counters travel with state_dict() ----------------------------------------------------
    def get_extra_state(self) -> dict[str, Any]:
        return self.gorila.state_dict()

    def set_extra_state(self, state: dict[str, Any]) -> None:
        """Restore the joint update count; the version moves past every one published."""
        self.gorila.load_state_dict(state)


class MultiAgentDistributedReplayBuffer:
    """One :class:`~tianshou_plugins.DistributedPrioritizedReplayBuffer` per learning module,
    each with the settings given here, as :class:`DistributedPrioritizedReplayBuffer` takes
    them (``capacity`` and ``min_size_to_sample`` per module; module ``i`` seeds its shards
    with ``seed + 1000 * i``).

    ``sample(n)`` returns ``(Batch(module -> batch of n rows), module -> keys)``, what
    :class:`MultiAgentGorilaDQN`'s update hands to each module. The per-module buffers start
    when :meth:`start` is given the modules (``GorilaCollector`` does it).

    Args:
        capacity: rows of each module's replay (``DistributedReplayConfig.capacity``).
        config: the settings of each module's replay (default ``DistributedReplayConfig()``);
            keyword settings replace its fields.
    """

    def __init__(
        self,
        capacity: int | None = None,
        *,
        config: DistributedReplayConfig | None = None,
        **settings: Any,
    ) -> None:
        # Built here so that bad settings raise before anything starts.
        self._template = DistributedPrioritizedReplayBuffer(capacity, config=config, **settings)
        self._buffers: dict[str, DistributedPrioritizedReplayBuffer] = {}

    @property
    def config(self) -> DistributedReplayConfig:
        """The settings of each module's replay."""
        return self._template.config

    @property
    def modules(self) -> list[str]:
        return list(self._buffers)

    @property
    def started(self) -> bool:
        return bool(self._buffers) and all(b.started for b in self._buffers.values())

    def start(self, modules: list[str], *, wait: bool = True) -> dict[str, Any]:
        """Start each module's shards (once); return module -> the client actors push to
        (``wait``: as in :meth:`DistributedPrioritizedReplayBuffer.start`)."""
        if self._buffers and list(self._buffers) != list(modules):
            raise ValueError(
                f"this buffer holds the modules {list(self._buffers)}, not {list(modules)}"
            )
        template = self._template.config
        for index, module in enumerate(modules):
            if module not in self._buffers:
                seed = None if template.seed is None else template.seed + 1000 * index
                self._buffers[module] = DistributedPrioritizedReplayBuffer(
                    config=template, seed=seed
                )
                self._buffers[module].set_beta(self._template.beta)
        return {module: buffer.start(wait=wait) for module, buffer in self._buffers.items()}

    def buffer(self, module: str) -> DistributedPrioritizedReplayBuffer:
        try:
            return self._buffers[module]
        except KeyError:
            raise KeyError(
                f"no replay for module {module!r}; the modules are {list(self._buffers)}"
            ) from None

    def close(self) -> None:
        for buffer in self._buffers.values():
            buffer.close()

    def __reduce__(self):
        raise TypeError(
            "MultiAgentDistributedReplayBuffer holds live Ray actors and cannot be pickled; "
            "checkpoint it with save(path) and load it with restore(path)"
        )

    # ---- Tianshou's buffer API ----------------------------------------------------------------
    def __len__(self) -> int:
        return sum(len(b) for b in self._buffers.values())

    def set_beta(self, beta: float) -> None:
        self._template.set_beta(beta)
        for buffer in self._buffers.values():
            buffer.set_beta(beta)

    def sample(self, batch_size: int) -> tuple[Batch, dict[str, np.ndarray]]:
        """``batch_size`` rows from every module's replay (see the class docstring)."""
        batches, keys = {}, {}
        for module, buffer in self._buffers.items():
            batches[module], keys[module] = buffer.sample(batch_size)
        return Batch(batches), keys

    def hasnull(self) -> bool:
        """Always False: actors reject non-finite rows before they are pushed."""
        return False

    def reset(self, keep_statistics: bool = False) -> None:
        for buffer in self._buffers.values():
            buffer.reset(keep_statistics)

    # ---- checkpoints and metrics --------------------------------------------------------------
    def save(self, path: str) -> None:
        """Each module's replay under ``path/<module>``."""
        for module, buffer in self._buffers.items():
            buffer.save(f"{str(path).rstrip('/')}/{module}")

    def restore(self, path: str, modules: list[str] | None = None) -> None:
        """Load :meth:`save` output (starting the shards of ``modules`` if needed)."""
        if modules is not None:
            self.start(modules)
        for module, buffer in self._buffers.items():
            buffer.restore(f"{str(path).rstrip('/')}/{module}")

    def stats(self, *, wait: bool = False) -> dict[str, dict[str, Any]]:
        """Module -> its replay's stats (``DistributedPrioritizedReplayBuffer.stats``)."""
        return {module: buffer.stats(wait=wait) for module, buffer in self._buffers.items()}


def check_multi_agent_env_factory(env_factory: Any, algorithm: MultiAgentGorilaDQN) -> None:
    """Build one env here, before any actor starts: a ``tianshou.env.PettingZooEnv`` with the
    algorithm's agents and Discrete actions for the learning ones; the factory must pickle."""
    import gymnasium as gym
    from tianshou.env import PettingZooEnv

    def check_env(env: PettingZooEnv) -> None:
        if list(env.agents) != algorithm.agents:
            raise ValueError(
                f"the env's agents {list(env.agents)} differ from the algorithm's "
                f"{algorithm.agents}"
            )
        for agent in algorithm.module_of_agent:
            space = env.env.action_space(agent)
            if not isinstance(space, gym.spaces.Discrete):
                raise TypeError(
                    f"GorilaDQN needs a Discrete action space; agent {agent!r} has {space!r}"
                )

    check_env_factory(
        env_factory,
        owner="MultiAgentGorilaDQN",
        check_env=check_env,
        env_type=PettingZooEnv,
        env_kind=(
            "a tianshou.env.PettingZooEnv (wrap Parallel envs with "
            "pettingzoo.utils.parallel_to_aec, or use PettingZooFactory(..., parallel=True))"
        ),
    )


def greedy_act(policy: Any) -> Any:
    """``observation -> action`` of a Tianshou Q-learning policy on one PettingZoo observation
    (``{"observation", "action_mask"}``: the greedy legal action), for
    :func:`rl_dist_ext.games.play_against_random`."""
    import torch

    def act(observation: Any) -> int:
        obs = Batch(
            obs=np.asarray(observation["observation"], dtype=np.float32)[None],
            mask=np.asarray(observation["action_mask"], dtype=bool)[None],
        )
        was_training = policy.training
        policy.eval()
        try:
            with torch.no_grad():
                return int(policy(Batch(obs=obs, info={})).act[0])
        finally:
            policy.train(was_training)

    return act


class PettingZooFactory:
    """A picklable ``() -> tianshou.env.PettingZooEnv(env_fn(**kwargs))`` for the actors
    (``parallel=True``: a Parallel env, through ``pettingzoo.utils.parallel_to_aec``)."""

    def __init__(self, env_fn: Any, *, parallel: bool = False, **kwargs: Any) -> None:
        self.env_fn = env_fn
        self.parallel = parallel
        self.kwargs = kwargs

    def __call__(self) -> Any:
        from tianshou.env import PettingZooEnv

        env = self.env_fn(**self.kwargs)
        if self.parallel:
            from pettingzoo.utils.conversions import parallel_to_aec

            env = parallel_to_aec(env)
        return PettingZooEnv(env)

    def raw(self) -> Any:
        """The PettingZoo AEC env itself (for evaluation through its own API)."""
        env = self.env_fn(**self.kwargs)
        if self.parallel:
            from pettingzoo.utils.conversions import parallel_to_aec

            env = parallel_to_aec(env)
        return env
