"""Tianshou algorithms under Ray Tune: a function trainable's footprint and its reporting.

Tianshou has no Tune trainable of its own; a Tune trial is a function that builds the
algorithm, its collector and its replay and calls ``algorithm.run_training(...)``. Two pieces
make that a Tune citizen:

- :func:`trial_resources`: the trial's placement group, a bundle for the function (the
  learner) and one for its actors, replay shards and inference server, for
  ``tune.with_resources``.
  Tune starts the function inside that group and every actor the collector and the replay
  start lands in it (Tune's trials capture their child actors), so a trial never takes more
  than it declared and Tune runs as many trials at once as the cluster holds.
- :class:`TuneReporter`: a Tianshou logger that reports each epoch to Tune (``tune.report``)
  after the epoch's test: the test return, the last training and update stats (the collector's
  throughput, policy lag and replay fields included) and the trainer's counters, with a
  checkpoint when given a ``save`` function (the algorithm and its replay). With
  ``resume_from_log=True`` in the trainer's params, a trial that Tune restarts (``max_failures``)
  or PBT exploits resumes from that checkpoint: :meth:`TuneReporter.restore_data` loads it and
  returns the epoch, env step and update step the trainer goes on from.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tianshou.utils.logger.logger_base import BaseLogger

_COUNTERS = "trainer_counters.json"


def trial_resources(
    *,
    num_actors: int,
    num_cpus_per_actor: float,
    num_shards: int = 0,
    num_cpus_per_shard: float = 0.0,
    num_cpus_for_learner: float = 1.0,
    num_cpus_for_server: float = 0.0,
):
    """The placement group of a Tianshou trial: a bundle for the learner (the trial's
    function) and one for its actors, replay shards and (``num_cpus_for_server > 0``) SEED
    inference server together, on one node.

    Args:
        num_actors: the collector's actors (``GorilaCollector``/``VTraceCollector``
            ``num_actors``).
        num_cpus_per_actor: their ``num_cpus_per_actor``.
        num_shards: the replay's shards (``DistributedPrioritizedReplayBuffer`` ``num_shards``;
            0 for VTrace, which has no replay).
        num_cpus_per_shard: their ``num_cpus_per_shard``.
        num_cpus_for_learner: the trial's function, where the learner trains.
        num_cpus_for_server: the inference server's ``num_cpus`` (0: none).
    """
    from ray import tune

    for name, value in {"num_actors": num_actors, "num_shards": num_shards}.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    if num_actors < 1:
        raise ValueError(f"num_actors must be >= 1, got {num_actors}")
    cpus = {
        "num_cpus_per_actor": num_cpus_per_actor,
        "num_cpus_per_shard": num_cpus_per_shard,
        "num_cpus_for_learner": num_cpus_for_learner,
        "num_cpus_for_server": num_cpus_for_server,
    }
    for name, value in cpus.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    # One bundle for every actor the trial starts: Ray puts a captured child actor in any bundle
    # with room, so with a bundle per actor a shard could take an actor's larger bundle first
    # and leave the actor none that fits (a trial here waited out the collector's start timeout)
    children = num_actors * num_cpus_per_actor + num_shards * num_cpus_per_shard
    children += num_cpus_for_server
    return tune.PlacementGroupFactory(
        [{"CPU": float(num_cpus_for_learner)}, {"CPU": float(children)}]
    )


class TuneReporter(BaseLogger):
    """A Tianshou logger that reports each epoch to Ray Tune (see the module docstring).

    Args:
        save: ``save(folder)`` writes what a checkpoint holds (e.g. ``torch.save`` of the
            algorithm's ``state_dict`` and ``buffer.save(folder / "replay")``); None: reports
            carry no checkpoint.
        load: ``load(folder)`` reads it back, for :meth:`restore_data`.
    """

    def __init__(
        self,
        *,
        save: Callable[[Path], None] | None = None,
        load: Callable[[Path], None] | None = None,
    ) -> None:
        super().__init__(training_interval=1, test_interval=1, update_interval=1)
        self._save, self._load = save, load
        self._latest: dict[str, dict[str, Any]] = {}
        self._counters = (0, 0, 0)

    def prepare_dict_for_logging(self, log_data: dict) -> dict[str, Any]:
        """Nested dicts flattened with ``/``; only numbers kept (no arrays, no None)."""
        flat: dict[str, Any] = {}

        def walk(prefix: str, value: Any) -> None:
            if isinstance(value, dict):
                for key, inner in value.items():
                    walk(f"{prefix}/{key}" if prefix else str(key), inner)
            elif isinstance(value, int | float) and not isinstance(value, bool):
                flat[prefix] = float(value)
            elif hasattr(value, "item") and getattr(value, "size", 0) == 1:
                flat[prefix] = float(value.item())

        walk("", log_data)
        return flat

    def write(self, step_type: str, step: int, data: dict[str, Any]) -> None:
        """Keep the latest data per scope (``training``, ``test``, ``update``, ``info``)."""
        self._latest[step_type.split("/")[0]] = data

    def save_data(
        self,
        epoch: int,
        env_step: int,
        update_step: int,
        save_checkpoint_fn: Callable[[int, int, int], str] | None = None,
    ) -> None:
        """The trainer's counters at the end of an epoch's training (before its test)."""
        self._counters = (epoch, env_step, update_step)

    def log_info_data(self, log_data: dict, step: int) -> None:
        """The end of an epoch (after its test): one report to Tune."""
        from ray import tune

        super().log_info_data(log_data, step)
        epoch, env_step, update_step = self._counters
        metrics: dict[str, Any] = {"epoch": epoch, "env_step": env_step, "update_step": update_step}
        for scope, data in self._latest.items():
            metrics.update({f"{scope}/{key}": value for key, value in data.items()})
        if self._save is None:
            tune.report(metrics)
            return
        with tempfile.TemporaryDirectory(prefix="tianshou-checkpoint-") as folder:
            self._save(Path(folder))
            (Path(folder) / _COUNTERS).write_text(json.dumps(list(self._counters)))
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))

    def restore_data(self) -> tuple[int, int, int]:
        """Load the trial's latest checkpoint (a restarted trial, a PBT exploit) through
        ``load`` and return its (epoch, env step, update step); (0, 0, 0) without one."""
        from ray import tune

        checkpoint = tune.get_checkpoint()
        if checkpoint is None:
            return 0, 0, 0
        if self._load is None:
            raise ValueError(
                "TuneReporter(load=None) cannot restore the trial's checkpoint: pass load=, "
                "or leave resume_from_log off"
            )
        with checkpoint.as_directory() as folder:
            self._load(Path(folder))
            epoch, env_step, update_step = json.loads((Path(folder) / _COUNTERS).read_text())
        self._counters = (epoch, env_step, update_step)
        return epoch, env_step, update_step

    @staticmethod
    def restore_logged_data(log_path: str) -> dict:
        """Tune keeps the logged results (``Result.metrics_dataframe``): nothing to read."""
        return {}

    def finalize(self) -> None:
        """Nothing to close: Tune owns the results."""
