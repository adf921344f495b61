"""GorilaDQN on MinAtar Breakout with RLlib, as an RLlib example script: pixel observations
(10x10x4 uint8 channels) to a compressed replay.

The recipe of the MinAtar race in ``benchmarks/`` (docs: Benchmarks): the MinAtar paper's
network (16 3x3 filters, 128 units), lr 5e-4, batch 32, 3-step double-DQN targets, a target
update every 1,000 gradient updates, Huber's loss (RLlib DQN's; GorilaDQN's default is the
squared TD error since 2026-12-07), 8 sampled rows per inserted row held by the rate limiter,
one replay shard of 100k rows whose observations are LZ4-compressed by the env runners. There it
reached a greedy mean return of 10 in 342-441 s of training on 2 CPU cores (seeds 0-2).

RLlib's evaluation runner plays the greedy policy every ``--evaluation-interval`` iterations;
the run trains to ``--stop-timesteps`` and then says what it kept after its first greedy
evaluation at ``--stop-reward``; ``--stop-at-target`` stops there instead (``--as-test``: and
fails if it never gets there within ``--stop-timesteps``). It prints the best trial and writes a
learning curve PNG under ``--out``; ``--checkpoint-at-end`` writes a checkpoint with the
(compressed) replay.

    python examples/rllib_gorila_minatar.py [--stop-reward 10] [--stop-timesteps 1000000]
        [--num-env-runners 2] [--seed 0] [--stop-at-target] [--as-test] [--checkpoint-at-end]
"""

from __future__ import annotations

from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from rllib_script import example_parser, greedy_evaluation, run

from rl_dist_ext.replay import ObsCompression
from rllib_plugins import GorilaDQNConfig
from rllib_plugins.pixels import pixel_env

parser = example_parser(
    algo="GorilaDQN",
    out="rllib_gorila_minatar",
    default_reward=10.0,
    default_timesteps=1_000_000,
    num_env_runners=2,
    num_envs_per_env_runner=4,
    evaluation_interval=10,
)
parser.add_argument("--game", default="breakout", help="a MinAtar game")
parser.add_argument("--learning-starts", type=int, default=5_000, help="replay rows")


def build_config(args) -> GorilaDQNConfig:
    config = (
        GorilaDQNConfig()
        .environment(pixel_env(f"minatar:{args.game}"))
        .env_runners(num_cpus_per_env_runner=0.2)
        .learners(num_learners=0)
        .training(
            lr=5e-4,
            gamma=0.99,
            n_step=3,
            train_batch_size_per_learner=32,
            double_q=True,
            dueling=False,
            target_update_every_n_updates=1_000,
            td_error_loss_fn="huber",
        )
        .replay(
            num_shards=1,
            capacity=100_000,
            min_size_to_sample=args.learning_starts,
            samples_per_insert=8,
            compression=ObsCompression(),
        )
        .rl_module(
            model_config=DefaultModelConfig(
                conv_filters=[[16, 3, 1, "valid"]], head_fcnet_hiddens=[128]
            )
        )
        .reporting(min_sample_timesteps_per_iteration=1_000)
    )
    return greedy_evaluation(config)


COLUMNS = {
    "gorila/env_steps_per_s": "steps/s",
    "gorila/replay_size": "replay",
    "gorila/replay_bytes_per_transition": "bytes/row",
    "gorila/policy_lag_mean": "policy lag",
}


def main(argv: list[str] | None = None, *, keep_ray_up: bool = False):
    args = parser.parse_args(argv)
    return run(
        build_config(args),
        args,
        columns=COLUMNS,
        title=f"GorilaDQN on MinAtar {args.game} (RLlib, rl-dist-ext)",
        keep_ray_up=keep_ray_up,
    )


if __name__ == "__main__":
    main()
