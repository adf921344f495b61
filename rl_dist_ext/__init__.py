"""rl-dist-ext core: framework-free pieces of the classic distributed deep-RL architectures.

``rl_dist_ext.ops`` holds the math (V-trace, n-step folding, priorities and the double-DQN loss),
``rl_dist_ext.exploration`` the Ape-X epsilon ladder and ``rl_dist_ext.replay`` the prioritized
replay shard. Nothing here imports Ray, RLlib or Tianshou; the adapters live in ``rllib_plugins``
and ``tianshou_plugins``.
"""

__version__ = "0.1.0"
