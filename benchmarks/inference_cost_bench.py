"""Where an env step's CPU time goes with local and with central (SEED) inference, on Pong frames.

SEED's central inference pays when batching saves more forward-pass time than the round trip
to the server costs. This measures both sides on this machine, with one torch thread per
process (as every Ray actor here runs):

- the Nature CNN's forward pass (Tianshou's ``DQNet``: 84x84x4 uint8 frames scaled to [0, 1],
  6 Pong actions) at batch sizes 1 to 64: milliseconds per batch and per observation;
- one ALE Pong env step with the standard preprocessing (``rl_dist_ext.pixel_envs.make_atari``);
- the round trip of one request (one 84x84x4 uint8 observation) to a real
  :class:`~rl_dist_ext.inference.InferenceServer` actor whose policy does no work, from one
  caller actor: wall time, and CPU time in the caller and in the server (``/proc`` of each).

From these, a bound for CPU-only machines, where every core is busy either way: env steps per
CPU-second with local inference, ``1 / (env + forward(1))``, and with central inference,
``1 / (env + round trip CPU + forward(B) / B)``, for each batch size B the server could reach;
their ratio is the most central inference can gain over local inference here. A runner with E
envs sends one request for all of them (the round trip per env step is divided by E) but then
also runs its local forward pass at batch E: the second table gives that bound for E = 1, 4, 8
at the best server batch.

Writes ``benchmarks/results/inference_cost_bench.{json,md}``::

    .venv/bin/python benchmarks/inference_cost_bench.py [--requests 2000]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np
import ray
import torch
from results_files import write_results

RESULTS = Path(__file__).parent / "results"
BATCHES = (1, 2, 4, 8, 16, 32, 64)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pong_frames(num: int) -> np.ndarray:
    from rl_dist_ext.pixel_envs import make_atari

    env = make_atari("ALE/Pong-v5")
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    frames = []
    while len(frames) < num:
        obs, _, terminated, truncated, _ = env.step(int(rng.integers(6)))
        frames.append(obs)
        if terminated or truncated:
            env.reset()
    env.close()
    return np.stack(frames)


def env_step_ms(steps: int) -> float:
    from rl_dist_ext.pixel_envs import make_atari

    env = make_atari("ALE/Pong-v5")
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    started = time.process_time()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(int(rng.integers(6)))
        if terminated or truncated:
            env.reset()
    elapsed = time.process_time() - started
    env.close()
    return 1000.0 * elapsed / steps


def forward_ms(frames: np.ndarray, repeats: int) -> dict[int, float]:
    """Milliseconds of CPU per forward pass of the Nature CNN, by batch size."""
    from tianshou.env.atari.atari_network import DQNet

    torch.manual_seed(0)
    net = DQNet(4, 84, 84, 6).eval()
    out = {}
    with torch.no_grad():
        for batch in BATCHES:
            x = frames[:batch]
            for _ in range(3):  # warm-up
                net(torch.as_tensor(x, dtype=torch.float32) / 255.0)
            started = time.process_time()
            for _ in range(repeats):
                net(torch.as_tensor(x, dtype=torch.float32) / 255.0)
            out[batch] = 1000.0 * (time.process_time() - started) / repeats
    return out


class NoWorkPolicy:
    """Returns an action per observation and does nothing else: the server's cost is transport."""

    is_recurrent = False

    def __call__(self, obs: np.ndarray) -> dict[str, np.ndarray]:
        return {"actions": np.zeros(len(obs), dtype=np.int64)}

    def set_weights(self, weights) -> None:
        pass


def no_work_policy(device: str) -> NoWorkPolicy:
    return NoWorkPolicy()


@ray.remote(num_cpus=0.5)
class Caller:
    """One SEED caller: sends ``requests`` single-observation requests back to back."""

    def run(self, server, obs: np.ndarray, requests: int) -> dict[str, float]:
        from rl_dist_ext.ray_actors import InferenceCaller

        torch.set_num_threads(1)
        caller = InferenceCaller(server, "caller-0")
        caller.register()
        for _ in range(50):  # warm-up
            caller.infer(obs)
        cpu0, wall0 = cpu_seconds(os.getpid()), time.perf_counter()
        for _ in range(requests):
            caller.infer(obs)
        return {
            "wall_ms": 1000.0 * (time.perf_counter() - wall0) / requests,
            "caller_cpu_ms": 1000.0 * (cpu_seconds(os.getpid()) - cpu0) / requests,
        }


def round_trip(obs: np.ndarray, requests: int) -> dict[str, float]:
    from rl_dist_ext.inference import InferenceServerConfig
    from rl_dist_ext.ray_actors import start_inference_server

    server = start_inference_server(
        no_work_policy, InferenceServerConfig(max_batch_size=64, max_wait_ms=0.0), num_cpus=0.5
    )
    pid = ray.get(server.__ray_call__.remote(lambda self: os.getpid()))
    caller = Caller.remote()
    ray.get(caller.run.remote(server, obs, 10))  # caller and server started and warm
    server_cpu0 = cpu_seconds(pid)
    result = ray.get(caller.run.remote(server, obs, requests))
    # the server's CPU over the whole second call: its 50 warm-up requests included
    result["server_cpu_ms"] = 1000.0 * (cpu_seconds(pid) - server_cpu0) / (requests + 50)
    ray.kill(caller)
    ray.kill(server, no_restart=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--forward-repeats", type=int, default=200)
    parser.add_argument("--env-steps", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    torch.set_num_threads(1)
    frames = pong_frames(64)
    forward = forward_ms(frames, args.forward_repeats)
    env_ms = env_step_ms(args.env_steps)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        trip = round_trip(frames[:1], args.requests)
    finally:
        ray.shutdown()

    trip_cpu = trip["caller_cpu_ms"] + trip["server_cpu_ms"]
    local_ms = env_ms + forward[1]
    bounds = {batch: local_ms / (env_ms + trip_cpu + forward[batch] / batch) for batch in BATCHES}
    by_envs = {
        envs: (env_ms + forward[envs] / envs)
        / (env_ms + trip_cpu / envs + min(forward[b] / b for b in BATCHES if b >= envs))
        for envs in (1, 4, 8)
    }
    report = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "forward_ms": forward,
        "forward_ms_per_obs": {b: forward[b] / b for b in BATCHES},
        "env_step_ms": env_ms,
        "round_trip": trip,
        "round_trip_cpu_ms": trip_cpu,
        "local_cpu_ms_per_step": local_ms,
        "central_over_local_bound": bounds,
        "central_over_local_bound_by_envs_per_runner": by_envs,
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    lines = [
        "# CPU cost of an env step: local vs central (SEED) inference, Nature CNN on Pong",
        "",
        f"One torch thread per process, {os.cpu_count()} CPUs, no GPU, one run "
        f"({report['date']}). Forward: Tianshou's `DQNet` (Nature CNN), uint8 84x84x4 frames "
        "scaled in the pass. Round trip: one observation per request to an `InferenceServer` "
        "actor whose policy does no work, from one caller actor.",
        "",
        "| batch | forward ms | forward ms per obs | central / local bound |",
        "|---:|---:|---:|---:|",
    ]
    for batch in BATCHES:
        lines.append(
            f"| {batch} | {forward[batch]:.2f} | {forward[batch] / batch:.3f} | "
            f"{bounds[batch]:.2f} |"
        )
    lines += [
        "",
        f"- Pong env step (preprocessed, frame skip 4): {env_ms:.2f} ms of CPU",
        f"- Round trip of one request: {trip['wall_ms']:.2f} ms wall, "
        f"{trip['caller_cpu_ms']:.2f} ms CPU in the caller + {trip['server_cpu_ms']:.2f} ms "
        f"in the server = {trip_cpu:.2f} ms",
        f"- Local inference: {local_ms:.2f} ms of CPU per env step (env + forward at batch 1)",
        "- Bound: central / local env steps per CPU-second when every core is busy, "
        "local (env + forward(1)) over central (env + round trip CPU + forward(B) / B). "
        "Above 1, batching pays for the round trip; the pixel issue's target is 1.5.",
        "",
        "| envs per runner E | local CPU ms per env step | central / local bound |",
        "|---:|---:|---:|",
    ]
    for envs, bound in by_envs.items():
        lines.append(f"| {envs} | {env_ms + forward[envs] / envs:.2f} | {bound:.2f} |")
    write_results(args.out / "inference_cost_bench", report, lines)


if __name__ == "__main__":
    main()
