"""A Tune sweep of RLlib GorilaDQN on CartPole-v1: ASHA over lr x samples_per_insert x n_step.

Eight trials by default (2 x 2 x 2). Each trial declares its whole footprint through
``GorilaDQN.default_resource_request``: a placement group with the main process and its
learner (0.5 CPU), one env runner (0.3 CPU, 4 envs) and one replay shard (0.2 CPU), 1 CPU in
all, so a 2-core laptop runs 2 trials at once (the script prints the count for your cluster).
Every actor of a trial (env runner, replay shard, parameter server) runs inside its placement
group. A sweep that cannot run (a trial asking more CPUs than the cluster has, a key GorilaDQN
does not know, a value it refuses) fails with a clear error before any trial starts.

ASHA (asynchronous successive halving) compares trials by their greedy evaluation return
(RLlib's evaluation, 5 episodes every iteration) at 10k, 20k and 40k env steps and stops the
worse half at each rung; the rest go on to ``--max-env-steps``. Trials checkpoint every
``--checkpoint-freq`` iterations (the replay included) and a trial that fails restarts from
its last checkpoint (``--max-failures``). At the end the script prints the best trial's
config and greedy return and plots every trial's curve to ``<--out>/learning_curve.png``.

    python examples/tune_gorila_asha.py [--lr 5e-4 1e-3] [--samples-per-insert 8 16]
        [--n-step 1 3] [--max-env-steps 80000] [--storage-path ~/ray_results]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler
from rllib_script import ENV_STEPS, EVAL_RETURN, plot_trials
from sweep_footprint import print_footprint

from rllib_plugins import GorilaDQN, GorilaDQNConfig

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--lr", type=float, nargs="+", default=[5e-4, 1e-3])
parser.add_argument("--samples-per-insert", type=float, nargs="+", default=[8.0, 16.0])
parser.add_argument("--n-step", type=int, nargs="+", default=[1, 3])
parser.add_argument("--num-samples", type=int, default=1, help="repeats of the grid")
parser.add_argument("--max-env-steps", type=int, default=80_000, help="ASHA's max_t")
parser.add_argument("--grace-env-steps", type=int, default=10_000, help="ASHA's first rung")
parser.add_argument("--checkpoint-freq", type=int, default=10, help="iterations (0: never)")
parser.add_argument("--max-failures", type=int, default=2, help="restarts of a failed trial")
parser.add_argument("--num-env-runners", type=int, default=1, help="per trial")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--storage-path", default=None, help="Tune's storage (default ~/ray_results)")
parser.add_argument("--out", type=Path, default=Path("runs/tune_gorila_asha"))


def trial_config(args) -> GorilaDQNConfig:
    """One trial, before the search spaces: GorilaDQN's defaults in a 1-CPU footprint."""
    return (
        GorilaDQNConfig()
        .environment("CartPole-v1")
        .env_runners(
            num_env_runners=args.num_env_runners,
            num_envs_per_env_runner=4,
            num_cpus_per_env_runner=0.3,
        )
        .learners(num_learners=0, num_cpus_per_learner=0.5)
        .resources(num_cpus_for_main_process=0.5)
        .replay(num_shards=1, num_cpus_per_shard=0.2, capacity=50_000)
        .reporting(min_sample_timesteps_per_iteration=1_000)
        .evaluation(
            evaluation_interval=1,  # ASHA reads the greedy return at every result
            evaluation_duration=5,
            evaluation_config={"explore": False},
        )
        .debugging(seed=args.seed)
    )


def search_space(config: GorilaDQNConfig, args) -> GorilaDQNConfig:
    return config.training(
        lr=tune.grid_search(args.lr), n_step=tune.grid_search(args.n_step)
    ).replay(samples_per_insert=tune.grid_search(args.samples_per_insert))


def main(argv: list[str] | None = None):
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the progress table below, as RLlib does
    if not ray.is_initialized():
        ray.init()
    config = trial_config(args)
    print_footprint(
        GorilaDQN.default_resource_request(config).bundles,
        len(args.lr) * len(args.n_step) * len(args.samples_per_insert) * args.num_samples,
    )
    scheduler = ASHAScheduler(
        time_attr=ENV_STEPS,
        max_t=args.max_env_steps,
        grace_period=args.grace_env_steps,
        reduction_factor=2,
    )
    tuner = tune.Tuner(
        "GorilaDQN",
        param_space=search_space(config, args),
        tune_config=tune.TuneConfig(
            metric=EVAL_RETURN, mode="max", scheduler=scheduler, num_samples=args.num_samples
        ),
        run_config=tune.RunConfig(
            name="tune_gorila_asha",
            storage_path=args.storage_path,
            stop={ENV_STEPS: args.max_env_steps},
            checkpoint_config=tune.CheckpointConfig(
                checkpoint_frequency=args.checkpoint_freq, num_to_keep=1
            ),
            failure_config=tune.FailureConfig(max_failures=args.max_failures),
            verbose=1,
            progress_reporter=tune.CLIReporter(
                metric_columns={
                    ENV_STEPS: "env steps",
                    EVAL_RETURN: "greedy",
                    "gorila/env_steps_per_s": "steps/s",
                    "gorila/replay_samples_per_insert": "samples/insert now",
                },
                parameter_columns={
                    "lr": "lr",
                    "n_step": "n-step",
                    "replay_settings/samples_per_insert": "samples/insert",
                },
                max_report_frequency=30,
            ),
        ),
    )
    results = tuner.fit()
    best = results.get_best_result(scope="all")
    frame = best.metrics_dataframe
    swept = {
        "lr": best.config["lr"],
        "n_step": best.config["n_step"],
        "samples_per_insert": best.config["replay_settings"]["samples_per_insert"],
    }
    print(f"best trial: greedy return {frame[EVAL_RETURN].max():.1f} with {swept}")
    args.out.mkdir(parents=True, exist_ok=True)
    plot_trials(results, EVAL_RETURN, args.out / "learning_curve.png", "GorilaDQN ASHA sweep", 1)
    print(f"learning curves: {args.out / 'learning_curve.png'}")
    return results


if __name__ == "__main__":
    main()
