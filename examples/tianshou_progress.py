"""What the Tianshou examples share: a progress-logging TensorBoard logger that keeps the
learning curve, the curve's PNG, a greedy test collector, checkpoints of an algorithm with its
replay, the command line of the scripts written in Tianshou's example style, and what a run
kept after it reached its target.

The examples train to their budget: a run that reaches the target and then forgets it shows
that in its curve and in :func:`report_retention`'s line; ``--stop-at-target`` (the trainer's
``stop_fn``, :func:`stop_at`) stops at the first test at the target instead."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import torch
from tianshou.algorithm.algorithm_base import Policy
from tianshou.data import Collector
from tianshou.env import DummyVectorEnv
from tianshou.utils import TensorboardLogger
from torch.utils.tensorboard import SummaryWriter

from rl_dist_ext.retention import describe, draw_target

log = logging.getLogger("tianshou_progress")

#: A GorilaCollector's fields in each progress line: label -> logged key
GORILA_PROGRESS_FIELDS = {
    "actors steps/s": "env_steps_per_s",
    "replay": "replay/size",
    "samples/insert": "replay/samples_per_insert",
    "policy lag": "policy_lag_mean",
}


class CurveLogger(TensorboardLogger):
    """Tianshou's TensorBoard logger that also keeps the learning curve and logs progress.

    ``test_curve`` holds ``(env steps, mean test return)`` per test step; ``training_curve``
    holds ``(env steps, mean episode return of the exploring actors)`` per training log (when
    episodes finished in that collect step). Each training log also prints one progress line:
    ``progress_fields`` maps a label to the logged key (e.g. ``"policy lag": "policy_lag_mean"``).
    """

    def __init__(
        self, writer: SummaryWriter, *, progress_fields: dict[str, str], **kwargs: int | None
    ) -> None:
        super().__init__(writer, **kwargs)
        self.progress_fields = progress_fields
        self.test_curve: list[tuple[int, float]] = []
        self.training_curve: list[tuple[int, float]] = []

    def log_training_data(self, log_data: dict, step: int) -> None:
        super().log_training_data(log_data, step)
        if self.last_log_training_step != step:  # within the training interval: not logged
            return
        data = self.prepare_dict_for_logging(log_data)
        episode_return = float(data.get("returns_stat/mean", math.nan))
        if not math.isnan(episode_return):
            self.training_curve.append((step, episode_return))
        fields = " | ".join(
            f"{label} {float(data.get(key, math.nan)):7.2f}"
            for label, key in self.progress_fields.items()
        )
        log.info("env steps %7d | %s | episode return %6.1f", step, fields, episode_return)

    def log_test_data(self, log_data: dict, step: int) -> None:
        super().log_test_data(log_data, step)
        self.test_curve.append((step, float(log_data["returns_stat"]["mean"])))


def stop_at(target: float, stop_at_target: bool) -> Callable[[float], bool] | None:
    """The trainer's ``stop_fn``: stop at the first test whose mean return reaches ``target``
    when ``stop_at_target``; ``None`` (train to the budget) otherwise."""
    if not stop_at_target:
        return None
    return lambda mean_return: mean_return >= target


def report_retention(logger: CurveLogger, target: float) -> str:
    """Log (and return) what the run kept after its first greedy test at ``target``: how many
    later tests stayed at or above 80 % of it, and the worst (``rl_dist_ext.retention``)."""
    line = describe(logger.test_curve, target, "env steps")
    log.info("greedy tests: %s", line)
    return line


def plot_curve(logger: CurveLogger, path: Path, title: str, target: float | None = None) -> None:
    """The exploring actors' and the greedy tests' returns by env steps; with ``target``, the
    target and the keep line (80 % of it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    if logger.training_curve:
        steps, returns = zip(*logger.training_curve, strict=True)
        ax.plot(steps, returns, label="episode return (exploring actors)", alpha=0.7)
    if logger.test_curve:
        steps, returns = zip(*logger.test_curve, strict=True)
        ax.plot(steps, returns, label="greedy test return (10 episodes)", marker="o")
    if target is not None:
        draw_target(ax, target)
    ax.set_xlabel("env steps")
    ax.set_ylabel("return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def greedy_collector(
    policy: Policy, env_factory: Callable[[], gym.Env], episodes: int, seed: int
) -> Collector:
    """A Tianshou collector over ``episodes`` envs: one greedy episode per env per collect."""
    envs = DummyVectorEnv([env_factory] * episodes)
    envs.seed([seed + i for i in range(episodes)])
    return Collector(policy, envs)


def final_greedy_return(
    policy: Policy, env_factory: Callable[[], gym.Env], *, episodes: int = 10, seed: int = 123_456
) -> float:
    """Mean return of ``episodes`` greedy episodes on fresh envs (seeded from ``seed``)."""
    collector = greedy_collector(policy, env_factory, episodes, seed)
    try:
        collector.reset()
        return float(collector.collect(n_episode=episodes).returns_stat.mean)
    finally:
        collector.close()


def save_checkpoint(algorithm, buffer, folder: Path) -> None:
    """The algorithm's state (policy, optimizer, counters) as ``folder/algorithm.pt`` and the
    replay (a distributed replay's shards, each saving its own rows) under ``folder/replay``."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(algorithm.state_dict(), folder / "algorithm.pt")
    buffer.save(str(folder / "replay"))


def load_checkpoint(algorithm, buffer, folder: Path) -> None:
    """Load what :func:`save_checkpoint` wrote into ``algorithm`` and ``buffer`` (``buffer``
    None: the algorithm only, e.g. to watch its policy)."""
    algorithm.load_state_dict(torch.load(folder / "algorithm.pt", weights_only=False))
    if buffer is not None:
        buffer.restore(str(folder / "replay"))


def log_outputs(out: Path, checkpoint: str) -> None:
    """Say where the run left its checkpoint, TensorBoard logs and learning curve."""
    log.info("checkpoint: %s", checkpoint)
    log.info("tensorboard logs: %s", out / "tb")
    log.info("learning curve: %s", out / "learning_curve.png")


def run_cli(main: Callable) -> None:
    """Run ``main`` with its keyword arguments as the command line (``--task``, ``--seed``,
    ...; ``--help`` lists them with the docstring's descriptions), as Tianshou's examples do
    with ``sensai``'s ``run_cli``, which parses with the same library (jsonargparse) but logs an
    exception and exits with 0: here an exception ends the script with its traceback and a
    non-zero status."""
    from jsonargparse import CLI

    logging.basicConfig(
        level=logging.INFO, format="%(levelname)-5s %(asctime)s %(name)s - %(message)s"
    )
    CLI(main, as_positional=False)
