"""GorilaDQN (Ape-X style) on CartPole-v1 with RLlib, as an RLlib example script.

Env runners act with their own Ape-X epsilons and push prioritized n-step transitions to a
sharded replay; one learner trains double DQN and publishes weights the runners pull. Tune runs
the trial; the progress table shows env steps/s, the replay's size and samples per insert and
the policy lag beside the returns. RLlib's evaluation runner plays the greedy policy every
``--evaluation-interval`` iterations; the run trains to ``--stop-timesteps`` and then says
what it kept after its first greedy evaluation at ``--stop-reward`` (how many later ones stayed
at or above 80 % of it); ``--stop-at-target`` stops there instead (``--as-test``: and fails if it
never gets there within ``--stop-timesteps``). It prints the best trial and writes a learning
curve PNG under ``--out``; ``--checkpoint-at-end``
(or ``--checkpoint-freq N``) writes checkpoints, the replay included. This is what
``make demo`` runs.

    python examples/rllib_gorila_cartpole.py [--stop-reward 475] [--stop-timesteps 150000]
        [--num-env-runners 4] [--seed 0] [--stop-at-target] [--as-test] [--num-samples 2]
        [--checkpoint-at-end]
"""

from __future__ import annotations

from rllib_script import example_parser, greedy_evaluation, run

from rllib_plugins import GorilaDQNConfig

parser = example_parser(
    algo="GorilaDQN",
    out="rllib_gorila",
    default_reward=475.0,
    default_timesteps=150_000,
    num_env_runners=4,
    num_envs_per_env_runner=4,
)


#: the replay's rows: the default run's 150k env steps and RLlib's overshoot of its last
#: iterations; a longer run keeps its last 200k
REPLAY_ROWS = 200_000


def build_config(args) -> GorilaDQNConfig:
    """GorilaDQNConfig's defaults (lr 1e-3, batch 128, n-step 3, a Polyak target moved 0.008
    of the way after every gradient update, 16 samples per insert held by the rate limiter)
    plus the layout, and a replay of :data:`REPLAY_ROWS` that keeps the whole of the default
    run: one that drops the early falls lets a learned policy forget (docs/benchmarks.md,
    "Retention after the target"). One size whatever the budget, so that ``--restore-from``
    a checkpoint of a shorter run restores its replay."""
    config = (
        GorilaDQNConfig()
        .environment("CartPole-v1")
        .env_runners(num_cpus_per_env_runner=0.2)
        .learners(num_learners=0)
        .replay(num_shards=2, capacity=REPLAY_ROWS)
        .reporting(min_sample_timesteps_per_iteration=1_000)
    )
    return greedy_evaluation(config)


COLUMNS = {
    "gorila/env_steps_per_s": "steps/s",
    "gorila/replay_size": "replay",
    "gorila/replay_samples_per_insert": "samples/insert",
    "gorila/policy_lag_mean": "policy lag",
}


def main(argv: list[str] | None = None, *, keep_ray_up: bool = False):
    args = parser.parse_args(argv)
    return run(
        build_config(args),
        args,
        columns=COLUMNS,
        title="GorilaDQN on CartPole-v1 (RLlib, rl-dist-ext)",
        keep_ray_up=keep_ray_up,
    )


if __name__ == "__main__":
    main()
