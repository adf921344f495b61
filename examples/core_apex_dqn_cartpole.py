"""Ape-X-style double DQN on CartPole-v1 in one process, from rl-dist-ext's core pieces only.

No Ray and no framework: this example runs the same Gorila steps the RLlib and Tianshou adapters
run, in one process: the actor step (``rl_dist_ext.gorila.ActorStep``: act with a vector of
environments where env ``i`` explores with its own Ape-X epsilon, fold n-step transitions,
initial priorities, push), the prioritized replay shard (``rl_dist_ext.replay.PrioritizedReplay``)
and the learner step (``rl_dist_ext.gorila.GorilaLearner``: sample, the importance-weighted
double-DQN loss of ``rl_dist_ext.ops.dqn``, priorities back, target every C gradient updates).

It logs progress, prints the final greedy evaluation return, and writes a checkpoint (network,
optimizer and the replay's contents) and a learning-curve PNG under ``runs/core_apex_dqn/``.

    .venv/bin/python examples/core_apex_dqn_cartpole.py [--env-steps 60000] [--seed 0]
"""

from __future__ import annotations

import argparse
import copy
import logging
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rl_dist_ext.exploration import apex_epsilons
from rl_dist_ext.gorila import ActorStep, GorilaLearner, Rollout
from rl_dist_ext.ops.dqn import double_dqn_loss
from rl_dist_ext.replay import PrioritizedReplay

log = logging.getLogger("demo")


def q_network(obs_dim: int, num_actions: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(obs_dim, 128),
        nn.ReLU(),
        nn.Linear(128, 128),
        nn.ReLU(),
        nn.Linear(128, num_actions),
    )


def dqn_loss(online: nn.Module, target: nn.Module, batch: dict[str, torch.Tensor], weights=None):
    with torch.no_grad():
        q_online_tp1 = online(batch["next_obs"])
        q_target_tp1 = target(batch["next_obs"])
    return double_dqn_loss(
        q_online_t=online(batch["obs"]),
        actions=batch["action"],
        rewards=batch["reward"],
        discounts=batch["discount"],
        q_online_tp1=q_online_tp1,
        q_target_tp1=q_target_tp1,
        weights=weights,
    )


def collect_rollout(envs, obs, online, epsilons, steps, rng):
    """Step every env ``steps`` times with its own epsilon; return time-major arrays."""
    num_envs = len(epsilons)
    cols = {k: [] for k in ("obs", "actions", "rewards", "next_obs", "terminated", "truncated")}
    finished_returns = []
    for _ in range(steps):
        with torch.no_grad():
            greedy = online(torch.as_tensor(obs)).argmax(dim=1).numpy()
        explore = rng.random(num_envs) < epsilons
        actions = np.where(explore, rng.integers(0, envs.single_action_space.n, num_envs), greedy)
        next_obs, rewards, terminated, truncated, infos = envs.step(actions)
        true_next = next_obs.copy()
        done = terminated | truncated
        if done.any():  # SAME_STEP autoreset: the real last observation is in infos
            true_next[done] = np.stack(infos["final_obs"][done])
            finished_returns += [float(r) for r in infos["final_info"]["episode"]["r"][done]]
        for key, value in zip(
            cols, (obs, actions, rewards, true_next, terminated, truncated), strict=True
        ):
            cols[key].append(value)
        obs = next_obs
    return obs, {k: np.stack(v) for k, v in cols.items()}, finished_returns


def evaluate(online: nn.Module, env_id: str, episodes: int, seed: int) -> float:
    env = gym.make(env_id)
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done, total = False, 0.0
        while not done:
            with torch.no_grad():
                action = int(online(torch.as_tensor(obs)).argmax())
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def plot_curve(curve: list[tuple[int, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    if curve:
        steps, values = zip(*curve, strict=True)
        ax.plot(steps, values)
    ax.set_xlabel("env steps")
    ax.set_ylabel("greedy evaluation return")
    ax.set_title("Ape-X-style double DQN on CartPole-v1 (rl-dist-ext core)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--env-steps", type=int, default=60_000)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--rollout", type=int, default=8, help="steps per env per rollout")
    parser.add_argument("--n-step", type=int, default=3)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--updates-per-rollout", type=int, default=16)
    parser.add_argument("--target-every", type=int, default=250, help="gradient updates")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--capacity", type=int, default=50_000)
    parser.add_argument("--learning-starts", type=int, default=1_000)
    parser.add_argument("--eval-every", type=int, default=5_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/core_apex_dqn"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)

    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.wrappers.RecordEpisodeStatistics(gym.make(args.env))] * args.num_envs,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    if not isinstance(envs.single_action_space, gym.spaces.Discrete):
        raise ValueError(f"--env {args.env!r} must have a Discrete action space for DQN")
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    online = q_network(obs_dim, int(envs.single_action_space.n))
    target = copy.deepcopy(online)
    optimizer = torch.optim.Adam(online.parameters(), lr=args.lr)
    replay = PrioritizedReplay(args.capacity, alpha=0.6, seed=args.seed)
    epsilons = apex_epsilons(args.num_envs)
    log.info("per-env Ape-X epsilons: %s", np.array2string(epsilons, precision=4))

    actor = ActorStep(replay=replay, gamma=args.gamma, n_step=args.n_step, name="core example")
    learner = GorilaLearner(
        replay=replay,
        batch_size=args.batch_size,
        prioritized=True,
        target_update_every=args.target_every,
        publish_every=1,  # one process: the actor acts with the online network itself
        sync_target=lambda: target.load_state_dict(online.state_dict()),
        export_weights=online.state_dict,
    )
    recent: list[float] = []
    obs = envs.reset(seed=args.seed)[0]

    def act() -> Rollout:
        nonlocal obs
        obs, columns, finished = collect_rollout(envs, obs, online, epsilons, args.rollout, rng)
        recent.extend(finished)
        del recent[:-20]
        return Rollout(columns)

    def gradient_step(sample) -> torch.Tensor:
        batch = {k: torch.as_tensor(v) for k, v in sample.batch.items()}
        loss = dqn_loss(online, target, batch, torch.as_tensor(sample.weights))
        optimizer.zero_grad()
        loss.loss.backward()
        nn.utils.clip_grad_norm_(online.parameters(), 10.0)
        optimizer.step()
        learner.after_gradient_step()
        return loss.td_error

    curve: list[tuple[int, float]] = []
    start = time.perf_counter()
    next_eval = args.eval_every
    while actor.env_steps < args.env_steps:
        actor.run(act=act, q_values=online, load_weights=online.load_state_dict)
        env_steps = actor.env_steps
        if len(replay) >= args.learning_starts:
            beta = 0.4 + 0.6 * min(1.0, env_steps / args.env_steps)
            learner.update(args.updates_per_rollout, beta=beta, gradient_step=gradient_step)

        if env_steps >= next_eval or env_steps >= args.env_steps:
            next_eval += args.eval_every
            greedy = evaluate(online, args.env, episodes=5, seed=10_000 + env_steps)
            curve.append((env_steps, greedy))
            log.info(
                "env steps %6d | updates %5d | %5.0f steps/s | replay %6d | "
                "train return (last 20) %6.1f | greedy eval %6.1f",
                env_steps,
                learner.num_gradient_updates,
                env_steps / (time.perf_counter() - start),
                len(replay),
                np.mean(recent) if recent else float("nan"),
                greedy,
            )
    envs.close()

    final = evaluate(online, args.env, episodes=10, seed=123_456)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "model": online.state_dict(),
            "target": target.state_dict(),
            "optimizer": optimizer.state_dict(),
            "replay": replay.state_dict(),
            "env_steps": actor.env_steps,
            "learner": learner.state_dict(),
        },
        args.out / "checkpoint.pt",
    )
    plot_curve(curve, args.out / "learning_curve.png")
    log.info(
        "checkpoint: %s  learning curve: %s",
        args.out / "checkpoint.pt",
        args.out / "learning_curve.png",
    )
    print(f"final greedy evaluation return (10 episodes): {final:.1f}")


if __name__ == "__main__":
    main()
