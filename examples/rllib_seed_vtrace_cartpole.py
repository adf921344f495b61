"""VTrace (IMPALA with the shared V-trace learner) in SEED mode on CartPole-v1 with RLlib, as
an RLlib example script.

Env runners only step their envs: every step they send the observations to one central inference
server, which batches the requests of all runners, samples the actions from the current policy and
returns them with their log-probs. The learner computes V-trace targets and sends its weights to
the server only. ``--local`` turns central inference off (IMPALA mode: runners infer with their
own copy of the policy), for comparison.

Tune runs the trial; the progress table shows the server's requests/s, rows per batch, queueing
latency and the policy lag beside the returns. RLlib's evaluation runner plays the greedy policy
every ``--evaluation-interval`` iterations; the run trains to ``--stop-timesteps`` and then
says what it kept after its first greedy evaluation at ``--stop-reward``; ``--stop-at-target``
stops there instead (``--as-test``: and fails if it never gets there within
``--stop-timesteps``). It prints the best trial and writes a learning curve PNG under
``--out``.

    python examples/rllib_seed_vtrace_cartpole.py [--stop-reward 450] [--local]
        [--num-env-runners 4] [--num-envs-per-env-runner 4] [--seed 0] [--stop-at-target]
        [--as-test]
"""

from __future__ import annotations

from rllib_script import example_parser, greedy_evaluation, run

from rllib_plugins import VTraceConfig

parser = example_parser(
    algo="VTrace",
    out="rllib_seed_vtrace",
    default_reward=450.0,
    default_timesteps=300_000,
    num_env_runners=4,
    num_envs_per_env_runner=4,
)
parser.add_argument(
    "--local",
    action="store_true",
    help="IMPALA mode: each runner infers with its own copy of the policy (default: SEED)",
)
parser.add_argument("--max-batch-size", type=int, default=64, help="observations per batch")
parser.add_argument("--max-wait-ms", type=float, default=1.0, help="batching wait")


def build_config(args) -> VTraceConfig:
    config = (
        VTraceConfig()
        .environment("CartPole-v1")
        .env_runners(num_cpus_per_env_runner=0.2)
        .learners(num_learners=0)
        .training(lr=5e-4, train_batch_size_per_learner=500, entropy_coeff=0.01)
        .central_inference(
            enabled=not args.local,
            max_batch_size=args.max_batch_size,
            max_wait_ms=args.max_wait_ms,
            num_cpus=0.2,
        )
        .reporting(min_time_s_per_iteration=1)
    )
    return greedy_evaluation(config)


COLUMNS = {
    "central_inference/requests_per_s": "server req/s",
    "central_inference/mean_batch_rows": "rows/batch",
    "central_inference/queue_ms_p50": "queue p50 ms",
    "central_inference/policy_lag": "policy lag",
}


def main(argv: list[str] | None = None, *, keep_ray_up: bool = False):
    args = parser.parse_args(argv)
    mode = "local" if args.local else "central"
    return run(
        build_config(args),
        args,
        columns=COLUMNS,
        title=f"VTrace ({mode} inference) on CartPole-v1 (RLlib, rl-dist-ext)",
        keep_ray_up=keep_ray_up,
    )


if __name__ == "__main__":
    main()
