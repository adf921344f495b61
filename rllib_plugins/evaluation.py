"""Greedy evaluation of an RLlib module (Q-module or policy) outside RLlib's evaluation runners."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch


def greedy_return(
    module,
    env_id: str | Callable[[], gym.Env],
    *,
    episodes: int,
    seed: int,
    max_steps: int | None = None,
) -> float:
    """Mean return of ``module``'s greedy (``forward_inference``) policy over ``episodes``.

    Args:
        module: an RLlib RLModule over a Discrete action space whose ``forward_inference``
            returns ``"actions"`` (Q-modules: GorilaDQN, DQN) or ``"action_dist_inputs"``
            (policy modules: VTrace, APPO, IMPALA; the most likely action is taken).
        env_id: a gymnasium env id, or a function that makes the env (for example
            ``PixelEnvCreator("minatar:breakout")``: observations as the runners see them).
        episodes: number of episodes; episode ``i`` is reset with ``seed + i``.
        max_steps: an episode ends after this many steps (None: when the env ends it).
    """
    env = gym.make(env_id) if isinstance(env_id, str) else env_id()
    returns = []
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            done, total, steps = False, 0.0, 0
            while not done and (max_steps is None or steps < max_steps):
                with torch.no_grad():
                    out = module.forward_inference({"obs": torch.as_tensor(obs[None])})
                if "actions" in out:
                    action = int(out["actions"][0])
                else:
                    action = int(out["action_dist_inputs"][0].argmax())
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                steps += 1
                done = terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return float(np.mean(returns))
