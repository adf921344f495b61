"""Weight sync: bytes, pulls/s and greedy-action agreement of fp32, fp16, int8 and delta pulls,
on weights from real DQN training steps.

Three networks: Tianshou's Atari ``DQNet`` (the Nature DQN CNN, 84x84x4 input, 6 Pong actions;
1.7M parameters) and a CartPole MLP (4-256-256-2, ReLU), each trained by DQN updates (Huber
loss on double-free 1-step targets, a target network synced every 500 updates, Adam, batch 32)
on transitions of random play (Pong: ``--frames`` frames; CartPole: 20k steps), agreement taken
on held-out random-play observations; and ``cartpole_trained``: the same MLP first trained
online to a greedy return of 475 (its own transitions then its training data), agreement taken
on the states its greedy policy visits. The weights are recorded every ``--spacing`` updates
after ``--warmup`` updates. Then, for each encoding of
``rl_dist_ext.weight_compression`` / ``rl_dist_ext.weight_deltas``:

- **bytes per pull** (pickle protocol 5, what Ray ships). For ``"delta"``: actors pull every
  ``U`` learner updates (``--updates-between-pulls``), ``--actors`` of them staggered evenly
  (so the server's shadow advances at every actor's pull and a pull composes several advances),
  each actor's first (full) pull left out; for each ``--tolerances`` bound;
- **greedy-action agreement** and the largest |Q difference| of the weights an actor holds
  against the learner's weights of that version, on ``--eval-frames`` held-out observations;
- **pulls/s** through a real parameter server actor: ``--pullers`` Ray actors, rounds of one
  publish (weights ``U`` updates apart) and one pull per actor, the pulls timed (Ray with 2
  CPUs, all on this machine, so the object store is shared memory).

Writes ``benchmarks/results/weight_sync_bench.{json,md}``. Usage::

    .venv/bin/python benchmarks/weight_sync_bench.py [--nets nature mlp] [--pullers 4]
"""

from __future__ import annotations

import argparse
import copy
import os
import pickle
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from results_files import write_results

from rl_dist_ext.weight_compression import decode_weights, encode_weights
from rl_dist_ext.weight_deltas import DeltaReceiver

RESULTS = Path(__file__).parent / "results"
FULL_ENCODINGS = ("fp32", "fp16", "int8")


class Transitions(NamedTuple):
    obs: np.ndarray  # [N + 1, ...]: obs[i + 1] follows obs[i] unless done[i]
    actions: np.ndarray  # int64 [N]
    rewards: np.ndarray  # float32 [N]
    dones: np.ndarray  # float32 [N]: terminated (no bootstrap)
    next_obs: np.ndarray | None = None  # [N, ...] where obs[i + 1] is not always the next one

    def following(self, rows: np.ndarray) -> np.ndarray:
        """The observations that followed ``rows``."""
        return self.obs[rows + 1] if self.next_obs is None else self.next_obs[rows]


class Task(NamedTuple):
    name: str
    net: torch.nn.Module
    train: Transitions
    eval_obs: torch.Tensor  # held-out observations, as the network takes them
    lr: float
    info: dict | None = None  # how the task's network was trained, where that is its own

    def q(self, state: dict, obs: torch.Tensor | None = None) -> torch.Tensor:
        net = copy.deepcopy(self.net)
        net.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
        with torch.no_grad():
            return q_values(net, self.eval_obs if obs is None else obs)


def q_values(net: torch.nn.Module, obs: torch.Tensor) -> torch.Tensor:
    out = net(obs)
    return out[0] if isinstance(out, tuple) else out


def random_play(env, steps: int, seed: int) -> Transitions:
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    all_obs, actions, rewards, dones = [obs], [], [], []
    for _ in range(steps):
        action = int(rng.integers(env.action_space.n))
        obs, reward, terminated, truncated, _ = env.step(action)
        actions.append(action)
        rewards.append(reward)
        dones.append(float(terminated or truncated))
        if terminated or truncated:
            obs, _ = env.reset()
        all_obs.append(obs)
    env.close()
    return Transitions(
        np.stack(all_obs),
        np.asarray(actions, np.int64),
        np.asarray(rewards, np.float32),
        np.asarray(dones, np.float32),
    )


def nature_task(frames: int, eval_frames: int) -> Task:
    from tianshou.env.atari.atari_network import DQNet

    from rl_dist_ext.pixel_envs import make_atari

    play = random_play(make_atari("ALE/Pong-v5"), frames + eval_frames, seed=0)
    train = Transitions(play.obs[: frames + 1], *(x[:frames] for x in play[1:4]))
    eval_obs = torch.as_tensor(play.obs[frames + 1 :] / 255.0, dtype=torch.float32)
    torch.manual_seed(0)
    # lr 1e-4: Tianshou's Atari DQN example (the Nature DQN's RMSProp had 2.5e-4)
    return Task("nature", DQNet(4, 84, 84, 6), train, eval_obs, lr=1e-4)


def mlp_task(eval_frames: int) -> Task:
    import gymnasium as gym

    play = random_play(gym.make("CartPole-v1"), 20_000 + eval_frames, seed=0)
    n = 20_000
    train = Transitions(play.obs[: n + 1], *(x[:n] for x in play[1:4]))
    eval_obs = torch.as_tensor(play.obs[n + 1 :], dtype=torch.float32)
    torch.manual_seed(0)
    net = cartpole_mlp()
    # lr 5e-4: GorilaDQN's CartPole race settings (benchmarks/rllib_gorila_vs_dqn.py)
    return Task("mlp", net, train, eval_obs, lr=5e-4)


def cartpole_mlp() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(4, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 2),
    )


def trained_cartpole_task(eval_frames: int, *, max_steps: int = 150_000) -> Task:
    """The CartPole MLP trained online by DQN (epsilon 1 -> 0.02 over 20k steps, an update of
    32 rows every env step, a target sync every 500 updates, Adam 5e-4; a truncated step
    bootstraps from the state it reached) until 5 greedy
    episodes average at least 475 (checked every 5k env steps, at most ``max_steps``). Its
    transitions are the task's training data (the updates recorded later go on from the
    trained weights on them, as the learner goes on on its replay), and its held-out
    observations are the states its greedy policy visits (``eval_frames`` of them): where the
    actors act, not random play's states."""
    import gymnasium as gym

    torch.manual_seed(0)
    net = cartpole_mlp()
    target = copy.deepcopy(net)
    optim = torch.optim.Adam(net.parameters(), lr=5e-4)
    rng = np.random.default_rng(0)
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    stream, following, actions, rewards, dones = [obs], [], [], [], []
    greedy = float("nan")
    for step in range(1, max_steps + 1):
        epsilon = max(0.02, 1.0 - step / 20_000)
        if rng.random() < epsilon:
            action = int(rng.integers(2))
        else:
            with torch.no_grad():
                action = int(net(torch.as_tensor(obs, dtype=torch.float32)).argmax())
        obs, reward, terminated, truncated, _ = env.step(action)
        actions.append(action)
        rewards.append(reward)
        dones.append(float(terminated))  # a truncation bootstraps, from the state it reached
        following.append(obs)
        if terminated or truncated:
            obs, _ = env.reset()
        stream.append(obs)
        if step >= 1_000:
            rows = rng.integers(len(actions), size=32)
            batch = _batch(stream, following, actions, rewards, dones, rows)
            dqn_update(net, target, optim, *batch)
            if step % 500 == 0:
                target.load_state_dict(net.state_dict())
        if step % 5_000 == 0:
            greedy = float(np.mean([s.shape[0] for s in greedy_episodes(net, 5, seed=step)]))
            if greedy >= 475:
                break
    env.close()
    if step % 5_000:
        greedy = float(np.mean([s.shape[0] for s in greedy_episodes(net, 5, seed=step)]))
    print(f"trained CartPole MLP: greedy return {greedy:.0f} after {step} env steps", flush=True)
    episodes: list[np.ndarray] = []
    while sum(len(states) for states in episodes) < eval_frames:
        episodes += greedy_episodes(net, 1, seed=10_000 + len(episodes))
    visited = np.concatenate(episodes)[:eval_frames]
    train = Transitions(
        np.stack(stream),
        np.asarray(actions, np.int64),
        np.asarray(rewards, np.float32),
        np.asarray(dones, np.float32),
        next_obs=np.stack(following),
    )
    info = {"greedy_return": greedy, "env_steps": step, "eval_states": len(visited)}
    return Task("cartpole_trained", net, train, torch.as_tensor(visited), lr=5e-4, info=info)


def greedy_episodes(net: torch.nn.Module, episodes: int, *, seed: int) -> list[np.ndarray]:
    """The states of ``episodes`` greedy CartPole episodes (float32, one array each)."""
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    runs = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        states, done = [], False
        while not done:
            states.append(obs)
            with torch.no_grad():
                action = int(net(torch.as_tensor(obs, dtype=torch.float32)).argmax())
            obs, _, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
        runs.append(np.asarray(states, np.float32))
    env.close()
    return runs


def _batch(stream, following, actions, rewards, dones, rows):
    obs = torch.as_tensor(np.asarray([stream[i] for i in rows]), dtype=torch.float32)
    next_obs = torch.as_tensor(np.asarray([following[i] for i in rows]), dtype=torch.float32)
    return (
        obs,
        torch.as_tensor([actions[i] for i in rows]),
        torch.as_tensor([rewards[i] for i in rows], dtype=torch.float32),
        torch.as_tensor([dones[i] for i in rows], dtype=torch.float32),
        next_obs,
    )


def dqn_update(net, target, optim, obs, actions, rewards, dones, next_obs) -> None:
    """One DQN step: Huber loss on 1-step targets bootstrapped from ``target``'s max."""
    with torch.no_grad():
        bootstrap = q_values(target, next_obs).max(1).values
    y = rewards + 0.99 * (1 - dones) * bootstrap
    q = q_values(net, obs).gather(1, actions[:, None])
    loss = torch.nn.functional.smooth_l1_loss(q[:, 0], y)
    optim.zero_grad()
    loss.backward()
    optim.step()


def train_snapshots(task: Task, *, warmup: int, updates: int, spacing: int) -> list[dict]:
    """DQN updates on ``task``'s transitions; the weights after ``warmup`` updates and every
    ``spacing`` updates after, ``updates`` in all after the warm-up."""
    net, target = task.net, copy.deepcopy(task.net)
    optim = torch.optim.Adam(net.parameters(), lr=task.lr)
    rng = np.random.default_rng(1)
    scale = 255.0 if task.train.obs.dtype == np.uint8 else 1.0
    snapshots = []
    for update in range(warmup + updates + 1):
        if update >= warmup and (update - warmup) % spacing == 0:
            snapshots.append({k: v.detach().numpy().copy() for k, v in net.state_dict().items()})
        if update == warmup + updates:
            break
        rows = rng.integers(len(task.train.actions), size=32)
        dqn_update(
            net,
            target,
            optim,
            torch.as_tensor(task.train.obs[rows] / scale, dtype=torch.float32),
            torch.as_tensor(task.train.actions[rows]),
            torch.as_tensor(task.train.rewards[rows]),
            torch.as_tensor(task.train.dones[rows]),
            torch.as_tensor(task.train.following(rows) / scale, dtype=torch.float32),
        )
        if (update + 1) % 500 == 0:
            target.load_state_dict(net.state_dict())
    return snapshots


def agreement(exact: torch.Tensor, held: torch.Tensor) -> tuple[float, float]:
    """Share of equal greedy actions, largest |Q difference|."""
    same = float((exact.argmax(1) == held.argmax(1)).float().mean())
    return same, float((exact - held).abs().max())


def full_rows(task: Task, state: dict) -> list[dict]:
    """Payload, encode/decode time and acting error of each full encoding on ``state``."""
    exact = task.q(state)
    rows = []
    for encoding in FULL_ENCODINGS:
        start = time.perf_counter()
        encoded = encode_weights(state, encoding)
        encode_s = time.perf_counter() - start
        start = time.perf_counter()
        decoded = decode_weights(encoded)
        decode_s = time.perf_counter() - start
        same, q_error = agreement(exact, task.q(decoded))
        rows.append(
            {
                "net": task.name,
                "encoding": encoding,
                "payload_bytes": len(pickle.dumps(encoded, protocol=5)),
                "encode_ms": encode_s * 1e3,
                "decode_ms": decode_s * 1e3,
                "greedy_action_agreement": same,
                "max_abs_q_error": q_error,
            }
        )
    return rows


def delta_row(
    task: Task,
    snapshots: list[dict],
    exact_q: list[torch.Tensor],
    *,
    spacing: int,
    updates_between_pulls: int,
    actors: int,
    tolerance: float,
) -> dict:
    """Actors pulling every ``updates_between_pulls`` updates, staggered; the deltas' bytes
    and the held weights' agreement (each actor's first, full, pull left out)."""
    from rl_dist_ext.params import ParameterServer

    every = updates_between_pulls // spacing  # snapshots between an actor's pulls
    stagger = max(every // actors, 1)
    server = ParameterServer(delta_tolerance=tolerance)
    receivers = [DeltaReceiver() for _ in range(actors)]
    sizes, agree, q_errors, full_sizes, stale = [], [], [], [], []
    start = time.perf_counter()
    for index, state in enumerate(snapshots):
        server.publish(state, index + 1)
        for actor, receiver in enumerate(receivers):
            if index < actor * stagger or (index - actor * stagger) % every:
                continue
            pulled = server.pull_delta_if_newer(receiver.version, receiver.held)
            held = receiver.apply(pulled)
            size = len(pickle.dumps(pulled, protocol=5))
            if pulled.is_full:
                full_sizes.append(size)
                continue
            sizes.append(size)
            same, q_error = agreement(exact_q[index], task.q(held))
            agree.append(same)
            q_errors.append(q_error)
            # what the actor acted with until this pull: the learner's weights U updates back
            stale.append(agreement(exact_q[index], exact_q[index - every])[0])
    stats = server.stats()
    return {
        "net": task.name,
        "encoding": "delta",
        "tolerance": tolerance,
        "updates_between_pulls": updates_between_pulls,
        "actors": actors,
        "delta_pulls": len(sizes),
        "full_pulls_after_first": stats["num_full_pulls"] - actors,
        "payload_bytes": float(np.mean(sizes)) if sizes else float("nan"),
        "payload_bytes_max": max(sizes, default=float("nan")),
        "first_full_pull_bytes": float(np.mean(full_sizes)) if full_sizes else float("nan"),
        "greedy_action_agreement": float(np.mean(agree)) if agree else float("nan"),
        "greedy_action_agreement_min": min(agree, default=float("nan")),
        "max_abs_q_error": max(q_errors, default=float("nan")),
        "stale_agreement": float(np.mean(stale)) if stale else float("nan"),
        "seconds": time.perf_counter() - start,
    }


def pulls_per_s(
    encoding: str, snapshots: list[dict], *, step: int, pullers: int, tolerance: float
) -> float:
    """Rounds of a publish (``step`` snapshots apart) and one pull by each of ``pullers`` Ray
    actors through a parameter server actor; pulls per second of pulling."""
    import ray

    from rl_dist_ext.ray_actors import start_parameter_server

    @ray.remote(num_cpus=0.1)
    class Puller:
        def __init__(self, client):
            self.client, self.version = client, -1

        def pull(self) -> None:
            latest = self.client.pull_if_newer(self.version)
            assert latest is not None
            self.version = latest.version

    server = start_parameter_server(
        timeout_s=60, weights_encoding=encoding, delta_tolerance=tolerance
    )
    actors = [Puller.remote(server) for _ in range(pullers)]
    wall = 0.0
    try:
        rounds = list(range(0, len(snapshots), step))
        for version, index in enumerate(rounds, start=1):
            server.publish(snapshots[index], version)
            begin = time.perf_counter()
            ray.get([actor.pull.remote() for actor in actors], timeout=120)
            if version > 1:  # the first round's pulls are full and warm the workers
                wall += time.perf_counter() - begin
        return pullers * (len(rounds) - 1) / wall
    finally:
        for actor in actors:
            ray.kill(actor)
        server.close()


#: the networks, each made from the command line's settings
TASKS = {
    "nature": lambda args: nature_task(args.frames, args.eval_frames),
    "mlp": lambda args: mlp_task(args.eval_frames),
    "cartpole_trained": lambda args: trained_cartpole_task(
        args.trained_eval_states, max_steps=args.trained_max_steps
    ),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nets", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--frames", type=int, default=3_000, help="Pong training frames")
    parser.add_argument("--eval-frames", type=int, default=512)
    parser.add_argument(
        "--trained-eval-states",
        type=int,
        default=4_000,
        help="states of the trained CartPole policy's greedy episodes the agreement is taken on",
    )
    parser.add_argument(
        "--trained-max-steps", type=int, default=150_000, help="env steps to train CartPole at most"
    )
    parser.add_argument("--warmup", type=int, default=200, help="updates before recording")
    parser.add_argument("--updates", type=int, default=1_200, help="updates recorded")
    parser.add_argument("--spacing", type=int, default=25, help="updates between snapshots")
    parser.add_argument(
        "--updates-between-pulls", type=int, nargs="+", default=[25, 100, 400], metavar="U"
    )
    parser.add_argument("--actors", type=int, default=4, help="staggered actors at the largest U")
    parser.add_argument("--tolerances", type=float, nargs="+", default=[0.001, 0.005, 0.02])
    parser.add_argument("--pullers", type=int, default=4)
    parser.add_argument("--pulls-step", type=int, default=100, help="updates between rounds")
    parser.add_argument("--out", type=Path, default=RESULTS / "weight_sync_bench")
    args = parser.parse_args(argv)
    for u in args.updates_between_pulls:
        if u % args.spacing or u // args.spacing < 1:
            parser.error(f"--updates-between-pulls {u} is not a multiple of --spacing")
    import ray

    torch.set_num_threads(2)
    report: dict = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "nets": {},
    }
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        for name in args.nets:
            task = TASKS[name](args)
            start = time.perf_counter()
            snapshots = train_snapshots(
                task, warmup=args.warmup, updates=args.updates, spacing=args.spacing
            )
            train_s = time.perf_counter() - start
            exact_q = [task.q(state) for state in snapshots]
            rows = full_rows(task, snapshots[-1])
            layouts = [(u, 1) for u in args.updates_between_pulls]
            layouts.append((max(args.updates_between_pulls), args.actors))
            for tolerance in args.tolerances:
                for u, actors in layouts:
                    row = delta_row(
                        task,
                        snapshots,
                        exact_q,
                        spacing=args.spacing,
                        updates_between_pulls=u,
                        actors=actors,
                        tolerance=tolerance,
                    )
                    print(row, flush=True)
                    rows.append(row)
            step = max(args.pulls_step // args.spacing, 1)
            for row in rows:
                if row["encoding"] != "delta" or (
                    row["updates_between_pulls"] == args.pulls_step and row["actors"] == 1
                ):
                    row["pulls_per_s"] = pulls_per_s(
                        row["encoding"],
                        snapshots,
                        step=step,
                        pullers=args.pullers,
                        tolerance=row.get("tolerance", 0.02),
                    )
            params = sum(v.size for v in snapshots[0].values())
            report["nets"][name] = {
                "parameters": int(params),
                "training_seconds": train_s,
                "trained": task.info,
                "rows": rows,
            }
    finally:
        ray.shutdown()
    write_results(args.out, report, markdown(report))


def markdown(report: dict) -> list[str]:
    s = report["settings"]
    lines = [
        "# Weight sync: fp32, fp16, int8 and delta pulls on weights from DQN training",
        "",
        f"{report['when']}, {report['cpus']} CPUs, Ray with 2 CPUs. Weights recorded every "
        f"{s['spacing']} DQN updates (batch 32, Adam) after {s['warmup']} warm-up updates, "
        f"{s['updates']} updates in all; Pong: the Nature CNN (lr 1e-4), CartPole: a 256-256 MLP "
        f"(lr 5e-4). Agreement: greedy actions of the weights an actor holds vs the learner's of "
        f"that version on {s['eval_frames']} held-out observations. Delta rows: actors pull every "
        "U updates (several actors: staggered evenly), each actor's first (full) pull left out; "
        "the bound is tolerance x each tensor's RMS; 'weights U updates old agree': the greedy "
        "actions of the learner's weights U updates before each pull against those at the pull "
        "(what an actor acts with until it pulls, whatever the encoding). pulls/s: "
        f"{s['pullers']} Ray actors, one pull each per publish, publishes {s['pulls_step']} "
        "updates apart.",
    ]
    for name, net in report["nets"].items():
        rows = net["rows"]
        int8 = next(r for r in rows if r["encoding"] == "int8")
        lines += ["", f"## {name} ({net['parameters']:,} parameters)", ""]
        if net.get("trained"):
            t = net["trained"]
            lines += [
                f"Trained online to a greedy return of {t['greedy_return']:.0f} (5 episodes) in "
                f"{t['env_steps']:,} env steps; agreement on {t['eval_states']:,} states its "
                "greedy policy visits.",
                "",
            ]
        lines += [
            "| encoding | tolerance | U | actors | bytes per pull | vs int8 full | "
            "greedy agree (min) | max abs Q error | weights U updates old agree | pulls/s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            delta = r["encoding"] == "delta"
            agree = f"{r['greedy_action_agreement']:.4f}"
            if delta:
                agree += f" ({r['greedy_action_agreement_min']:.4f})"
            cells = [
                r["encoding"],
                *([r["tolerance"], r["updates_between_pulls"], r["actors"]] if delta else [""] * 3),
                f"{r['payload_bytes'] / 1e3:,.1f} kB",
                f"{r['payload_bytes'] / int8['payload_bytes']:.3f}x",
                agree,
                f"{r['max_abs_q_error']:.2e}",
                f"{r['stale_agreement']:.4f}" if delta else "",
                f"{r['pulls_per_s']:.0f}" if "pulls_per_s" in r else "",
            ]
            lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    return lines


if __name__ == "__main__":
    main()
