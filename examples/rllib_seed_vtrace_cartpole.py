"""VTrace (IMPALA with the shared V-trace learner) in SEED mode on CartPole-v1 with RLlib, as
an RLlib example script.

Env runners only step their envs: every step they send the observations to one central inference
server, which batches the requests of all runners, samples the actions from the current policy and
returns them with their log-probs. The learner computes V-trace targets and sends its weights to
the server only. ``--local`` turns central inference off (IMPALA mode: runners infer with their
own copy of the policy), for comparison.

The learner trains RLlib IMPALA's tuned CartPole settings with ``VTraceConfig``'s default loss,
the one that kept the target in the retention race (``docs/benchmarks.md``; raced with
``--local``): PPO's clipped surrogate around the runners' behaviour policy with V-trace's
targets computed for it (``clip_param=0.1``, APPO's form), 4 passes over each batch and the
value head on layers of its own. ``--clip-param 0`` trains IMPALA's loss instead
(``rllib_plugins.vtrace.IMPALA_LOSS``: one pass, shared layers), whose V-trace weights then
correct for the policy lag.

Tune runs the trial; the progress table shows the server's requests/s, rows per batch, queueing
latency and the policy lag beside the returns. RLlib's evaluation runner plays the greedy policy
every ``--evaluation-interval`` iterations; the run trains to ``--stop-timesteps`` and then
says what it kept after its first greedy evaluation at ``--stop-reward``; ``--stop-at-target``
stops there instead (``--as-test``: and fails if it never gets there within
``--stop-timesteps``). It prints the best trial and writes a learning curve PNG under
``--out``.

    python examples/rllib_seed_vtrace_cartpole.py [--stop-reward 450] [--local]
        [--clip-param 0.1] [--num-env-runners 4] [--num-envs-per-env-runner 4] [--seed 0]
        [--stop-at-target] [--as-test]
"""

from __future__ import annotations

from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from rllib_script import example_parser, greedy_evaluation, run

from rllib_plugins import VTraceConfig
from rllib_plugins.vtrace import IMPALA_LOSS

#: RLlib IMPALA's tuned CartPole settings, which the loss's race arms share
IMPALA_TUNED = {
    "lr": 5e-4,
    "train_batch_size_per_learner": 500,
    "grad_clip": 40.0,
    "grad_clip_by": "global_norm",
    "vf_loss_coeff": 0.05,
    "entropy_coeff": 0.0,
}

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
parser.add_argument(
    "--clip-param",
    type=float,
    default=0.1,
    help="PPO's clip around the behaviour policy, APPO's targets, 4 passes (0: IMPALA's loss)",
)
parser.add_argument("--max-batch-size", type=int, default=64, help="observations per batch")
parser.add_argument("--max-wait-ms", type=float, default=1.0, help="batching wait")


def build_config(args) -> VTraceConfig:
    if args.clip_param < 0:
        raise ValueError(f"--clip-param {args.clip_param}: give 0 (IMPALA's loss) or more")
    ppo_form = args.clip_param > 0
    # VTraceConfig's default loss is the PPO form; --clip-param 0 restores IMPALA's
    loss = {"clip_param": args.clip_param} if ppo_form else IMPALA_LOSS
    config = (
        VTraceConfig()
        .environment("CartPole-v1")
        .env_runners(num_cpus_per_env_runner=0.2)
        .learners(num_learners=0)
        .training(**IMPALA_TUNED, **loss)
        .rl_module(model_config=DefaultModelConfig(vf_share_layers=not ppo_form))
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
    mode = "local" if args.local else "SEED"
    loss = f"APPO's form, clip {args.clip_param:g}" if args.clip_param else "IMPALA's loss"
    return run(
        build_config(args),
        args,
        columns=COLUMNS,
        title=f"VTrace on CartPole-v1 (RLlib): {mode}, {loss}",
        keep_ray_up=keep_ray_up,
    )


if __name__ == "__main__":
    main()
