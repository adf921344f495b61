"""GorilaDQN (Ape-X style) on PettingZoo tic-tac-toe with RLlib: a learner against a random
legal opponent, as an RLlib example script.

RLlib's own multi-agent setup: ``PettingZooEnv`` (through a picklable creator), two modules
(``learner``, trained, with its own sharded prioritized replay; ``random``, which plays
uniformly random legal moves), seats alternating per episode, action masks honoured when acting,
in the initial priorities and in the double-DQN target. ``--central-inference`` runs the learner
module on one inference server (SEED).

The success metric is the greedy learner's mean game return against the random player (+1 a
win, -1 a loss, 0 a draw; random against random: about 0), which RLlib's evaluation runner
measures every ``--evaluation-interval`` iterations over ``--evaluation-duration`` games, both
seats: ``--stop-reward 0.8`` is about a 0.85 win rate. The sum over both seats, RLlib's usual
``episode_return_mean``, stays near 0 in a zero-sum game and says nothing. Tune runs the trial
to ``--stop-timesteps`` (``--stop-at-target``: to the first evaluation at ``--stop-reward``);
the script says what the learner kept after it first got there, prints the best trial and
writes a learning curve PNG under ``--out``.

    python examples/rllib_multi_agent_tictactoe.py [--stop-reward 0.8] [--stop-timesteps 100000]
        [--central-inference] [--seed 0] [--stop-at-target] [--as-test] [--checkpoint-at-end]
"""

from __future__ import annotations

from pettingzoo.classic import tictactoe_v3
from ray.tune.registry import register_env
from rllib_script import example_parser, greedy_evaluation, run

from rllib_plugins import GorilaDQNConfig, PettingZooCreator
from rllib_plugins.pettingzoo import against_random_opponent

ENV = "tictactoe"
SEATS = ("player_1", "player_2")
LEARNER_RETURN = "env_runners/module_episode_returns_mean/learner"
GREEDY_LEARNER_RETURN = f"evaluation/{LEARNER_RETURN}"

parser = example_parser(
    algo="GorilaDQN",
    out="rllib_multi_agent",
    default_reward=0.8,
    default_timesteps=100_000,
    num_env_runners=2,
    num_envs_per_env_runner=4,
    evaluation_duration=100,
)
parser.add_argument(
    "--central-inference", action="store_true", help="the learner acts on one inference server"
)


def build_config(args) -> GorilaDQNConfig:
    # GorilaDQN's default module for the learner: RLlib's DQN module reading the masks
    config = against_random_opponent(GorilaDQNConfig().environment(ENV), SEATS)
    config = (
        config.env_runners(num_cpus_per_env_runner=0.2)
        .learners(num_learners=0)
        # one-step targets at gamma 0.9: a game lasts at most 9 moves
        .training(n_step=1, gamma=0.9, updates_per_iteration=32, env_steps_per_request=64)
        .replay(num_shards=2, capacity=20_000, min_size_to_sample=500)
        .reporting(min_sample_timesteps_per_iteration=500)
    )
    if args.central_inference:
        config = config.central_inference(enabled=True, num_cpus=0.2)
    return greedy_evaluation(config)


COLUMNS = {
    LEARNER_RETURN: "learner return",
    "gorila/env_steps_per_s": "steps/s",
    "gorila/replay_size": "replay",
    "gorila/policy_lag_mean": "policy lag",
}


def main(argv: list[str] | None = None, *, keep_ray_up: bool = False):
    args = parser.parse_args(argv)
    register_env(ENV, PettingZooCreator(tictactoe_v3.env))
    metric = GREEDY_LEARNER_RETURN if args.evaluation_interval > 0 else LEARNER_RETURN
    return run(
        build_config(args),
        args,
        columns=COLUMNS,
        metric=metric,
        title="GorilaDQN on tic-tac-toe against a random player (RLlib, rl-dist-ext)",
        keep_ray_up=keep_ray_up,
    )


if __name__ == "__main__":
    main()
