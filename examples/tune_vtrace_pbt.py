"""A Tune sweep of RLlib VTrace on CartPole-v1 with Population Based Training (PBT).

Four trials start from random learning rates and entropy weights. Every
``--perturbation-env-steps`` env steps PBT ranks them by their greedy evaluation return
(RLlib's evaluation, 5 episodes every iteration); a trial in the bottom quarter copies a
top-quarter trial's checkpoint (weights and optimizer state) and goes on with its
hyperparameters perturbed (lr x0.8 or x1.2, or resampled; entropy weight resampled from
``--entropy``). Each trial asks 0.8 CPU (the driver and its learner 0.5, one env runner with 8
envs 0.3; local inference, as central inference pays off only on an accelerator), so a 2-core
laptop runs 2 at once and PBT pauses and resumes the others; the script prints the count for
your cluster. At the end it prints the best trial's final hyperparameters and greedy return and
plots every trial's greedy curve to ``<--out>/learning_curve.png``.

    python examples/tune_vtrace_pbt.py [--num-trials 4] [--max-env-steps 200000]
        [--storage-path ~/ray_results]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import ray
from ray import tune
from ray.tune.schedulers import PopulationBasedTraining
from rllib_script import EVAL_RETURN, plot_trials
from sweep_footprint import print_footprint

from rllib_plugins import VTrace, VTraceConfig

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--num-trials", type=int, default=4)
parser.add_argument("--lr-range", type=float, nargs=2, default=[1e-4, 3e-3])
parser.add_argument("--entropy", type=float, nargs="+", default=[0.0, 0.005, 0.01, 0.02])
parser.add_argument("--max-env-steps", type=int, default=200_000)
parser.add_argument("--perturbation-env-steps", type=int, default=20_000)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--storage-path", default=None, help="Tune's storage (default ~/ray_results)")
parser.add_argument("--out", type=Path, default=Path("runs/tune_vtrace_pbt"))


# RLlib's top-level counter: IMPALA samples asynchronously, so a first iteration can end before
# any env runner reported (no env_runners/... keys yet), and PBT needs its time_attr every time
ENV_STEPS = "num_env_steps_sampled_lifetime"


def trial_config(args) -> VTraceConfig:
    """One trial, before the search spaces: VTrace's defaults in a 0.8-CPU footprint."""
    return (
        VTraceConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=1, num_envs_per_env_runner=8, num_cpus_per_env_runner=0.3)
        .learners(num_learners=0, num_cpus_per_learner=0.5)
        .resources(num_cpus_for_main_process=0.5)
        .central_inference(enabled=False)
        .training(train_batch_size_per_learner=500)
        .reporting(min_time_s_per_iteration=1)
        .evaluation(
            evaluation_interval=1,  # PBT reads the greedy return at every result
            evaluation_duration=5,
            evaluation_config={"explore": False},
        )
        .debugging(seed=args.seed)
    )


def main(argv: list[str] | None = None):
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the progress table below, as RLlib does
    if not ray.is_initialized():
        ray.init()
    config = trial_config(args)
    print_footprint(VTrace.default_resource_request(config).bundles, args.num_trials)
    low, high = args.lr_range
    scheduler = PopulationBasedTraining(
        time_attr=ENV_STEPS,
        perturbation_interval=args.perturbation_env_steps,
        hyperparam_mutations={
            "lr": tune.loguniform(low, high),
            "entropy_coeff": args.entropy,
        },
    )
    tuner = tune.Tuner(
        "VTrace",
        param_space=config.training(
            lr=tune.loguniform(low, high), entropy_coeff=tune.choice(args.entropy)
        ),
        tune_config=tune.TuneConfig(
            metric=EVAL_RETURN, mode="max", scheduler=scheduler, num_samples=args.num_trials
        ),
        run_config=tune.RunConfig(
            name="tune_vtrace_pbt",
            storage_path=args.storage_path,
            stop={ENV_STEPS: args.max_env_steps},
            # more than 2: a trial that exploits another restores the checkpoint PBT chose,
            # which must outlive the newer ones that trial saves meanwhile (Tune warns at 2)
            checkpoint_config=tune.CheckpointConfig(num_to_keep=4),
            verbose=1,
            progress_reporter=tune.CLIReporter(
                metric_columns={ENV_STEPS: "env steps", EVAL_RETURN: "greedy"},
                parameter_columns={"lr": "lr", "entropy_coeff": "entropy"},
                max_report_frequency=30,
            ),
        ),
    )
    results = tuner.fit()
    best = results.get_best_result(scope="all")
    final = {"lr": best.config["lr"], "entropy_coeff": best.config["entropy_coeff"]}
    print(
        f"best trial: greedy return {best.metrics_dataframe[EVAL_RETURN].max():.1f}, "
        f"its final hyperparameters {final}"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    plot_trials(results, EVAL_RETURN, args.out / "learning_curve.png", "VTrace PBT sweep", 1)
    print(f"learning curves: {args.out / 'learning_curve.png'}")
    return results


if __name__ == "__main__":
    main()
