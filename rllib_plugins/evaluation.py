"""Greedy evaluation of an RLlib Q-module outside RLlib's evaluation runners."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch


def greedy_return(module, env_id: str, *, episodes: int, seed: int) -> float:
    """Mean return of ``module``'s greedy (``forward_inference``) policy over ``episodes``.

    Args:
        module: an RLlib RLModule whose ``forward_inference`` returns ``"actions"``, e.g.
            ``algo.get_module()`` of a GorilaDQN or DQN algorithm.
        env_id: a gymnasium env id.
        episodes: number of episodes; episode ``i`` is reset with ``seed + i``.
    """
    env = gym.make(env_id)
    returns = []
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            done, total = False, 0.0
            while not done:
                with torch.no_grad():
                    out = module.forward_inference({"obs": torch.as_tensor(obs[None])})
                obs, reward, terminated, truncated, _ = env.step(int(out["actions"][0]))
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return float(np.mean(returns))
