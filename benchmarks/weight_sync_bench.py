"""Weight sync with the Nature CNN: bytes, time and Q-value error of fp32 vs fp16 vs int8 weights.

The network: Tianshou's Atari ``DQNet`` (the Nature DQN CNN, 84x84x4 input, 6 Pong actions;
1.7M parameters), weights perturbed from their initialisation by a few Adam steps on random
targets so they are not at the initialiser's scale only. For each encoding of
``rl_dist_ext.weight_compression``:

- payload bytes (pickle protocol 5, what Ray ships), encode and decode time;
- through a real parameter server actor (``rl_dist_ext.ray_actors.start_parameter_server``):
  pulls/s of ``--pullers`` Ray actors each pulling the full weights ``--pulls`` times (Ray with
  2 CPUs, all on this machine, so the object store is shared memory);
- effect on acting: on ``--frames`` Pong observations, the largest |Q_decoded - Q_exact| and the
  fraction of greedy actions that agree.

Writes ``benchmarks/results/weight_sync_bench.{json,md}``. Usage::

    .venv/bin/python benchmarks/weight_sync_bench.py [--pullers 4] [--pulls 30]
"""

from __future__ import annotations

import argparse
import os
import pickle
import time
from pathlib import Path

import numpy as np
import torch
from results_files import write_results

RESULTS = Path(__file__).parent / "results"
ENCODINGS = ("fp32", "fp16", "int8")


def pong_frames(num: int) -> np.ndarray:
    from rl_dist_ext.pixel_envs import make_atari

    env = make_atari("ALE/Pong-v5")
    obs, _ = env.reset(seed=0)
    frames = []
    rng = np.random.default_rng(0)
    while len(frames) < num:
        obs, _, terminated, truncated, _ = env.step(int(rng.integers(6)))
        frames.append(obs)
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    return np.stack(frames)


def nature_net(frames: np.ndarray) -> torch.nn.Module:
    from tianshou.env.atari.atari_network import DQNet

    torch.manual_seed(0)
    net = DQNet(4, 84, 84, 6)
    optim = torch.optim.Adam(net.parameters(), lr=1e-3)
    x = torch.as_tensor(frames[:64] / 255.0, dtype=torch.float32)
    for _ in range(20):
        loss = (net(x)[0] - torch.randn(len(x), 6)).pow(2).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
    return net


def measure(encoding: str, state: dict, net, frames, pullers: int, pulls: int) -> dict:
    import ray

    from rl_dist_ext.ray_actors import start_parameter_server
    from rl_dist_ext.weight_compression import decode_weights, encode_weights

    start = time.perf_counter()
    encoded = encode_weights(state, encoding)
    encode_s = time.perf_counter() - start
    payload = len(pickle.dumps(encoded, protocol=5))
    start = time.perf_counter()
    decoded = decode_weights(encoded)
    decode_s = time.perf_counter() - start

    x = torch.as_tensor(frames / 255.0, dtype=torch.float32)
    with torch.no_grad():
        exact = net(x)[0]
        copy = type(net)(4, 84, 84, 6)
        copy.load_state_dict({k: torch.as_tensor(v) for k, v in decoded.items()})
        approx = copy(x)[0]
    q_error = float((approx - exact).abs().max())
    agree = float((approx.argmax(1) == exact.argmax(1)).float().mean())

    server = start_parameter_server(timeout_s=60, weights_encoding=encoding)

    @ray.remote(num_cpus=0.1)
    def pull_many(client, n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            weights = client.pull_if_newer(-1).weights
            assert weights is not None
        return time.perf_counter() - start

    try:
        server.publish(state, 1)
        ray.get(pull_many.remote(server, 1))  # warm the worker
        start = time.perf_counter()
        ray.get([pull_many.remote(server, pulls) for _ in range(pullers)])
        wall = time.perf_counter() - start
    finally:
        server.close()
    result = {
        "encoding": encoding,
        "payload_bytes": payload,
        "encode_ms": encode_s * 1e3,
        "decode_ms": decode_s * 1e3,
        "pulls_per_s": pullers * pulls / wall,
        "max_abs_q_error": q_error,
        "greedy_action_agreement": agree,
    }
    print(result, flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pullers", type=int, default=4)
    parser.add_argument("--pulls", type=int, default=30)
    parser.add_argument("--frames", type=int, default=512)
    parser.add_argument("--out", type=Path, default=RESULTS / "weight_sync_bench")
    args = parser.parse_args()
    import ray

    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False)
    frames = pong_frames(args.frames)
    net = nature_net(frames)
    state = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
    params = sum(v.size for v in state.values())
    rows = [measure(e, state, net, frames, args.pullers, args.pulls) for e in ENCODINGS]
    ray.shutdown()
    fp32 = rows[0]
    report = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "parameters": int(params),
        "pullers": args.pullers,
        "pulls_per_puller": args.pulls,
        "rows": rows,
    }
    lines = [
        "# Weight sync with the Nature CNN: fp32 vs fp16 vs int8",
        "",
        f"Tianshou's Atari DQNet (Nature CNN, {params:,} parameters), {args.pullers} Ray actors "
        f"each pulling the full weights {args.pulls} times from one parameter server actor; Q "
        f"errors on {args.frames} Pong observations; {report['cpus']} CPUs, Ray with 2 CPUs, "
        f"one run ({report['when']}).",
        "",
        "| encoding | payload | vs fp32 | encode ms | decode ms | pulls/s | vs fp32 | "
        "max abs Q error | greedy actions agree |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['encoding']} | {r['payload_bytes'] / 1e6:.2f} MB | "
            f"{r['payload_bytes'] / fp32['payload_bytes']:.2f}x | {r['encode_ms']:.1f} | "
            f"{r['decode_ms']:.1f} | {r['pulls_per_s']:.0f} | "
            f"{r['pulls_per_s'] / fp32['pulls_per_s']:.2f}x | {r['max_abs_q_error']:.2e} | "
            f"{r['greedy_action_agreement']:.3f} |"
        )
    write_results(args.out, report, lines)


if __name__ == "__main__":
    main()
