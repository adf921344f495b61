"""Wall-clock to greedy return 450 on CartPole: VTrace (SEED, local) vs RLlib APPO and IMPALA.

For each env, seed and algorithm, the clock runs from the first ``train()`` call until the greedy
policy averages >= 450 over 10 episodes, or until ``--max-seconds``. Greedy evaluations (a
2-episode screen, then 10 episodes when it passes) run every ``--eval-every-s`` seconds of
training and are not counted in the clock. Every run gets a fresh
``ray.init(num_cpus=2)``; all algorithms use the same env runners (``--runners`` x
``--envs-per-runner``), learn in the driver (``num_learners=0``) and report at most once a second.

- ``vtrace-central``: VTrace in SEED mode (one batching inference server acts for all runners).
- ``vtrace-local``: VTrace with ``central_inference(enabled=False)`` (runners infer locally).
  Both use IMPALA's tuned CartPole settings below (V-trace lambda 1), so the differences come
  from the inference placement and the learner, not from hyper-parameters.
- ``appo``: RLlib APPO with RLlib's tuned CartPole settings (``tuned_examples/appo/
  cartpole_appo.py``: vf_loss_coeff 0.05, entropy 0, lambda 0.95, 2 passes per batch, shared
  value layers), lr 5e-4 and batch 500.
- ``impala``: RLlib IMPALA with RLlib's tuned CartPole settings (``tuned_examples/impala/
  cartpole_impala.py``: lr 5e-4, batch 500, grad clip 40, vf_loss_coeff 0.05, entropy 0,
  shared value layers).

APPO's and IMPALA's layouts on this machine were raced with ``--algos appo impala --runners R
--envs-per-runner E --name rllib_appo_impala_RxE`` (4 x 4, 2 x 8, 1 x 16); the whole race runs in
4 x 4 (``rllib_vtrace_vs_appo``) and 1 x 16 (``rllib_vtrace_vs_appo_1x16``).

Writes ``benchmarks/results/<--name>.{json,md}``::

    .venv/bin/python benchmarks/rllib_vtrace_vs_appo.py [--seeds 0 1 2] [--max-seconds 300] \
        [--runners 4 --envs-per-runner 4] [--name rllib_vtrace_vs_appo]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import gymnasium as gym
import ray
import torch
from race import TARGET, median_or_none, race_each_in_fresh_ray, rllib_time_to_target
from race import fmt_seconds as fmt
from slow_env import SlowStep

RESULTS = Path(__file__).parent / "results"
ALGOS = {
    "vtrace-central": "VTrace central",
    "vtrace-local": "VTrace local",
    "appo": "RLlib APPO",
    "impala": "RLlib IMPALA",
}
VTRACE = ("vtrace-central", "vtrace-local")
# RLlib's tuned_examples/impala/cartpole_impala.py (VTrace and IMPALA share them; vf layers shared)
IMPALA_TUNED = {
    "lr": 5e-4,
    "train_batch_size_per_learner": 500,
    "grad_clip": 40.0,
    "grad_clip_by": "global_norm",
    "vf_loss_coeff": 0.05,
    "entropy_coeff": 0.0,
}
BASELINES = ("appo", "impala")


def vtrace_config(central: bool):
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    from rllib_plugins import VTraceConfig

    return (
        VTraceConfig()
        .training(**IMPALA_TUNED)
        .rl_module(model_config=DefaultModelConfig(vf_share_layers=True))
        .central_inference(enabled=central, num_cpus=0.2, max_batch_size=64, max_wait_ms=1.0)
    )


def appo_config():
    from ray.rllib.algorithms.appo import APPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    return (
        APPOConfig()
        .training(
            lr=5e-4,
            train_batch_size_per_learner=500,
            circular_buffer_iterations_per_batch=2,
            vf_loss_coeff=0.05,
            entropy_coeff=0.0,
            lambda_=0.95,
        )
        .rl_module(model_config=DefaultModelConfig(vf_share_layers=True))
    )


def impala_config():
    from ray.rllib.algorithms.impala import IMPALAConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    return (
        IMPALAConfig()
        .training(**IMPALA_TUNED)
        .rl_module(model_config=DefaultModelConfig(vf_share_layers=True))
    )


def build_config(algo: str, env: str, seed: int, runners: int, envs_per_runner: int):
    base = {
        "vtrace-central": lambda: vtrace_config(central=True),
        "vtrace-local": lambda: vtrace_config(central=False),
        "appo": appo_config,
        "impala": impala_config,
    }[algo]()
    return (
        base.environment(env)
        .env_runners(
            num_env_runners=runners,
            num_envs_per_env_runner=envs_per_runner,
            num_cpus_per_env_runner=0.2,
        )
        .learners(num_learners=0)
        .reporting(min_time_s_per_iteration=1)
        .debugging(seed=seed)
    )


def greedy_module(algo):
    """The driver's module with the learner's current weights.

    IMPALA and APPO never send weights to the driver's env runner (whose module ``get_module``
    returns), so it is brought up to the learner's weights before every evaluation.
    """
    from ray.rllib.core import DEFAULT_MODULE_ID

    module = algo.get_module()
    module.set_state(
        algo.learner_group.get_weights(module_ids=[DEFAULT_MODULE_ID])[DEFAULT_MODULE_ID]
    )
    return module


def wait_for_state_server(algo) -> None:
    """Block until IMPALA's ``EnvRunnerStateServer`` actor is up (all four algorithms have one).

    It starts in a new worker process that is not awaited in ``setup``; the runners' first
    ``sample()`` waits for it instead (seconds on a busy 2-CPU machine). VTrace in SEED mode
    awaits its inference server in ``setup``, which hides that start-up: without this wait the
    other three algorithms would pay it inside the clock and VTrace central would not.
    """
    server = getattr(algo, "_env_runner_state_server", None)
    if server is not None:
        ray.get(server.get_version.remote(), timeout=120)


def time_to_target(algo_name, env, seed, args) -> dict:
    from ray.tune.registry import register_env

    import rllib_plugins  # noqa: F401  (registers VTrace)

    register_env("SlowCartPole-v1", lambda _cfg: SlowStep(gym.make("CartPole-v1")))
    config = build_config(algo_name, env, seed, args.runners, args.envs_per_runner)
    algo = config.build_algo()
    wait_for_state_server(algo)
    return rllib_time_to_target(
        algo,
        seed=seed,
        max_seconds=args.max_seconds,
        eval_every_s=args.eval_every_s,
        greedy_module=greedy_module,
    )


def best_of(medians: dict[str, float | None], names: tuple[str, ...]) -> tuple[str, float | None]:
    """The fastest of ``names`` (by median) among those that ran; ("", None) if none ran."""
    ran = [name for name in names if name in medians]
    if not ran:
        return "", None
    name = min(ran, key=lambda n: float("inf") if medians[n] is None else medians[n])
    return name, medians[name]


def summarize(by_algo: dict[str, list[dict]], max_seconds: float) -> dict:
    medians = {
        name: median_or_none([r["seconds_to_target"] for r in runs])
        for name, runs in by_algo.items()
    }
    vtrace_name, vtrace = best_of(medians, VTRACE)
    baseline_name, baseline = best_of(medians, BASELINES)
    if not vtrace_name or not baseline_name:
        ratio, bound = None, "n/a"  # one side did not run (--algos)
    elif vtrace is not None and baseline is not None:
        ratio, bound = vtrace / baseline, "="
    elif vtrace is not None:  # the baselines did not get there: the ratio is below this bound
        ratio, bound = vtrace / max_seconds, "<"
    elif baseline is not None:  # VTrace did not get there: the ratio is above this bound
        ratio, bound = max_seconds / baseline, ">"
    else:
        ratio, bound = None, "n/a"
    return {
        "median_s": medians,
        "best_vtrace": vtrace_name or None,
        "best_baseline": baseline_name or None,
        "ratio": ratio,
        "ratio_bound": bound,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1"])
    parser.add_argument("--algos", nargs="+", choices=list(ALGOS), default=list(ALGOS))
    parser.add_argument("--runners", type=int, default=4)
    parser.add_argument("--envs-per-runner", type=int, default=4)
    parser.add_argument("--max-seconds", type=float, default=300.0)
    parser.add_argument("--eval-every-s", type=float, default=5.0)
    parser.add_argument("--name", default="rllib_vtrace_vs_appo", help="results file name")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)

    runs = race_each_in_fresh_ray(
        args.envs,
        args.seeds,
        args.algos,
        lambda algo_name, env, seed: time_to_target(algo_name, env, seed, args),
    )

    summary = {env: summarize(by_algo, args.max_seconds) for env, by_algo in runs.items()}
    result = {
        "benchmark": args.name,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "gpu": torch.cuda.is_available(),
        },
        "params": vars(args) | {"out": str(args.out), "target_return": TARGET},
        "algorithms": {name: ALGOS[name] for name in args.algos},
        "runs": runs,
        "summary": summary,
        "targets": {"ratio": 0.5},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")

    names = [ALGOS[name] for name in args.algos]
    lines = [
        "# VTrace (SEED / local inference) vs RLlib APPO and IMPALA: wall-clock to greedy "
        "return >= 450 (10 episodes)",
        "",
        f"Seeds {args.seeds}, {args.runners} env runners x {args.envs_per_runner} envs each, "
        f"learner in the driver, cap {args.max_seconds:.0f} s of training per run (evaluation "
        f"time excluded), {result['machine']['cpus']} CPUs, GPU: "
        f"{'yes' if result['machine']['gpu'] else 'no'}, one run ({result['date']} UTC).",
        "",
        "| env | seed | " + " | ".join(f"{n} | env steps" for n in names) + " |",
        "|---|---:|" + "---:|---:|" * len(names),
    ]
    for env, by_algo in runs.items():
        for i, seed in enumerate(args.seeds):
            cells = [
                f"{fmt(by_algo[name][i]['seconds_to_target'])} | {by_algo[name][i]['env_steps']:,}"
                for name in args.algos
            ]
            lines.append(f"| {env} | {seed} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| env | " + " | ".join(f"{n} median" for n in names) + " | best VTrace / best "
        "baseline | target |",
        "|---|" + "---:|" * len(names) + "---:|---:|",
    ]
    for env, s in summary.items():
        ratio = "n/a" if s["ratio"] is None else f"{s['ratio_bound']} {s['ratio']:.2f}"
        if s["ratio"] is not None:
            ratio += f" ({ALGOS[s['best_vtrace']]} / {ALGOS[s['best_baseline']]})"
        medians = " | ".join(fmt(s["median_s"][name]) for name in args.algos)
        lines.append(f"| {env} | {medians} | {ratio} | <= {result['targets']['ratio']} |")
    lines += [
        "",
        "A median counts runs that never reached 450 as infinitely slow. The ratio compares the "
        "faster VTrace mode with the faster of APPO and IMPALA; when one side's median is 'not "
        "reached', it is bounded using the cap.",
    ]
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
