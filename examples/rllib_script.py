"""What the RLlib example scripts share: RLlib's own example-script conventions.

Each script builds its config and hands it to RLlib's ``run_rllib_example_script_experiment``,
so the flags are RLlib's (``--stop-reward``, ``--stop-timesteps``, ``--stop-iters``,
``--as-test``, ``--num-samples``, ``--checkpoint-freq``, ``--checkpoint-at-end``,
``--num-env-runners``, ``--evaluation-interval``, ``--no-tune``, ``--wandb-key``; see
``--help``), plus ``--seed``, ``--out`` (where the learning-curve PNG goes) and
``--restore-from`` (go on from a checkpoint, replay included).

The success metric is a greedy one: RLlib's own evaluation runners act with ``explore=False``
every ``--evaluation-interval`` iterations, and ``--stop-reward`` is the target for their mean
return (``evaluation/env_runners/episode_return_mean``, or the learning module's return in a
game against a fixed opponent). The exploring runners' return understates a greedy DQN policy,
and in a zero-sum game the two seats' returns sum to about 0.

A run trains to its budget (``--stop-timesteps``, ``--stop-iters``) and its curve shows whether
the policy kept the target once it reached it; at the end the script says what it kept: of the
greedy evaluations after the first at ``--stop-reward``, how many stayed at or above 80 % of
it, and the worst. ``--stop-at-target`` (and ``--as-test``, RLlib's "reach ``--stop-reward``
within the budget") stops the run at the first evaluation at the target instead.

Ray starts on this machine with all its cores (``--num-cpus`` to say how many); with
``RAY_ADDRESS`` set (``auto``, or ``ray://<head>:10001``) the script joins that cluster.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

EVAL_RETURN = "evaluation/env_runners/episode_return_mean"
ENV_STEPS = "env_runners/num_env_steps_sampled_lifetime"
TRAIN_RETURN = "env_runners/episode_return_mean"


def example_parser(
    *,
    algo: str,
    out: str,
    default_reward: float,
    default_timesteps: int,
    **defaults,
) -> argparse.ArgumentParser:
    """RLlib's example-script parser with this script's defaults, ``--seed`` and ``--out``.

    Greedy evaluation is on by default (every 2 iterations, 10 episodes, in the driver's own
    env runner): ``--evaluation-interval 0`` turns it off (and with it the greedy success
    metric: ``--as-test`` then reads the exploring runners' return)."""
    from ray.rllib.examples.utils import add_rllib_example_script_args

    parser = add_rllib_example_script_args(
        default_reward=default_reward, default_timesteps=default_timesteps, default_iters=100_000
    )
    parser.add_argument("--seed", type=int, default=0, help="RLlib's seed (.debugging(seed=))")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("runs") / out,
        help="folder for the learning curve PNG (Tune's results and checkpoints go to "
        "~/ray_results as usual)",
    )
    parser.add_argument(
        "--restore-from",
        type=Path,
        default=None,
        help="a checkpoint folder (a trial's checkpoint_000000, or algo.save_to_path's) to go "
        "on from: its weights, optimizer, counters and (GorilaDQN) replay",
    )
    parser.add_argument(
        "--stop-at-target",
        action="store_true",
        help="stop at the first greedy evaluation at --stop-reward (--as-test does too); "
        "without it the run trains to --stop-timesteps or --stop-iters",
    )
    settings = {"evaluation_interval": 2, "evaluation_duration": 10, "verbose": 1}
    parser.set_defaults(algo=algo, **(settings | defaults))
    return parser


def greedy_evaluation(config):
    """RLlib's evaluation, acting greedily (``explore=False``); the script's arguments set its
    interval and duration."""
    return config.evaluation(evaluation_config={"explore": False})


def restore_at_start(config, checkpoint: Path):
    """``config`` whose algorithm restores ``checkpoint`` as soon as it is built (RLlib's
    ``on_algorithm_init`` callback, as RLlib's own continue-from-checkpoint example does): every
    trial starts from the checkpoint's state, its counters (iterations, env steps) included, so
    ``--stop-iters`` and ``--stop-timesteps`` count on from the checkpoint's."""
    path = str(Path(checkpoint).resolve())
    if not Path(path, "rllib_checkpoint.json").exists():
        raise ValueError(f"--restore-from {checkpoint}: not an RLlib checkpoint folder")
    # a lambda: Tune pickles it by value into the trial's process (which lacks examples/)
    return config.callbacks(
        on_algorithm_init=lambda algorithm, **_: algorithm.restore_from_path(path)
    )


def run(
    config,
    args: argparse.Namespace,
    *,
    columns: dict[str, str],
    title: str,
    metric: str = EVAL_RETURN,
    keep_ray_up: bool = False,
):
    """Run ``config`` with RLlib's example-script helper to ``--stop-timesteps`` env steps or
    ``--stop-iters`` iterations (:func:`stop_criteria`); ``--as-test`` raises unless a trial
    reached ``--stop-reward`` on ``metric`` (the greedy evaluation return unless evaluation is
    off). The progress table shows ``columns`` beside the returns. Afterwards each trial's
    retention is printed (:func:`report_retention`), then the best trial's config and return,
    and every trial's curve is plotted to ``<--out>/learning_curve.png`` with the target and
    the keep line. ``keep_ray_up`` leaves Ray running (tests share one)."""
    from ray import tune
    from ray.rllib.examples.utils import run_rllib_example_script_experiment

    if args.restore_from is not None:
        config = restore_at_start(config, args.restore_from)
    if args.evaluation_interval <= 0 and metric == EVAL_RETURN:
        metric = TRAIN_RETURN
    stop = stop_criteria(args, metric)
    reporter = tune.CLIReporter(
        metric_columns={
            "training_iteration": "iter",
            "time_total_s": "s",
            ENV_STEPS: "env steps",
            TRAIN_RETURN: "return",
            metric: "greedy" if metric != TRAIN_RETURN else "return",
            **columns,
        },
        max_report_frequency=args.tune_max_report_freq,
    )
    results = run_rllib_example_script_experiment(
        config.debugging(seed=args.seed),
        args,
        stop=stop,
        success_metric={metric: args.stop_reward},
        progress_reporter=reporter,
        keep_ray_up=keep_ray_up,
    )
    if args.no_tune:
        return results
    report_retention(results, metric, args)
    best = results.get_best_result(metric=metric, mode="max", scope="all")
    print(f"best trial: {metric} {_best_value(best.metrics_dataframe, metric):.2f}")
    print(f"best trial's config: {_searched(best.config, args)}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "learning_curve.png"
    plot_trials(results, metric, path, title, args.evaluation_interval, args.stop_reward)
    print(f"learning curve: {args.out / 'learning_curve.png'}")
    return results


def stop_criteria(args: argparse.Namespace, metric: str) -> dict[str, float]:
    """Tune's stop criteria: the budget (``--stop-timesteps`` env steps, ``--stop-iters``
    iterations), and ``--stop-reward`` on ``metric`` only with ``--stop-at-target`` or
    ``--as-test``."""
    stop = {ENV_STEPS: args.stop_timesteps, "training_iteration": args.stop_iters}
    if args.stop_at_target or args.as_test or args.as_release_test:
        stop[metric] = args.stop_reward
    return stop


def report_retention(results, metric: str, args: argparse.Namespace) -> None:
    """Print, for each trial, what it kept after its first greedy evaluation at
    ``--stop-reward`` (``rl_dist_ext.retention``)."""
    from rl_dist_ext.retention import describe

    for index, result in enumerate(results):
        frame = result.metrics_dataframe
        if frame is None or metric not in frame or ENV_STEPS not in frame:
            continue
        rows = evaluations(frame, metric, args.evaluation_interval)
        curve = zip(rows[ENV_STEPS], rows[metric], strict=True)
        print(f"trial {index}: {describe(curve, args.stop_reward, 'env steps')}")


def _best_value(frame, metric: str) -> float:
    values = [v for v in frame.get(metric, []) if not (isinstance(v, float) and math.isnan(v))]
    return max(values, default=float("nan"))


def _searched(config: dict, args: argparse.Namespace) -> dict:
    """The settings a user is likely to sweep, from a trial's config."""
    keys = ("lr", "gamma", "n_step", "train_batch_size_per_learner", "entropy_coeff")
    return {key: config[key] for key in keys if key in config} | {"seed": args.seed}


def evaluations(frame, metric: str, interval: int):
    """The rows of a trial's results where RLlib evaluated (every ``interval`` iterations;
    the results between repeat the last evaluation): (env steps, ``metric``)."""
    rows = frame if interval <= 0 else frame[frame["training_iteration"] % interval == 0]
    return rows[[ENV_STEPS, metric]].dropna()


def plot_trials(
    results, metric: str, path: Path, title: str, interval: int, target: float | None = None
) -> None:
    """Each trial's ``metric`` (at each evaluation) by env steps, and its exploring return
    when there are at most two trials; with ``target``, the target and the keep line (80 % of
    it)."""
    import matplotlib

    from rl_dist_ext.retention import draw_target

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for index, result in enumerate(results):
        frame = result.metrics_dataframe
        if frame is None or ENV_STEPS not in frame:
            continue
        label = f"trial {index}: " if len(results) > 1 else ""
        if TRAIN_RETURN in frame and metric != TRAIN_RETURN and len(results) <= 2:
            ax.plot(frame[ENV_STEPS], frame[TRAIN_RETURN], alpha=0.5, label=f"{label}exploring")
        if metric in frame:
            greedy = evaluations(frame, metric, interval)
            name = "greedy" if metric.startswith("evaluation/") else "return"
            ax.plot(greedy[ENV_STEPS], greedy[metric], marker=".", label=f"{label}{name}")
    if target is not None:
        draw_target(ax, target)
    ax.set_xlabel("env steps")
    ax.set_ylabel(metric.replace("env_runners/", ""), fontsize=8)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", fontsize=7, ncol=2 if len(results) > 2 else 1)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
