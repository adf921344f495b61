"""Tianshou (2.0.x) adapters for rl-dist-ext: GorilaDQN, its Ray collector and the distributed
prioritized replay buffer will live here; today it exposes nothing yet."""

__all__: list[str] = []
