"""rl-dist-ext core: framework-free pieces of the classic distributed deep-RL architectures.

``rl_dist_ext.ops`` holds the math (V-trace, n-step folding, priorities and the double-DQN loss),
``rl_dist_ext.exploration`` the Ape-X epsilon ladder, ``rl_dist_ext.gorila`` the actor and
learner steps, ``rl_dist_ext.replay`` the prioritized replay shard and its distributed client,
``rl_dist_ext.params`` versioned weights and ``rl_dist_ext.inference`` the SEED inference
server. Nothing here imports RLlib or Tianshou (the adapters live in ``rllib_plugins`` and
``tianshou_plugins``). Ray is imported only by the modules that start or call actors:
``ray_actors`` (where ``ray.remote`` is applied), ``actor_pool`` and the distributed replay's
client modules; the plain classes behind the actors run and are tested without Ray
(``tests/test_core_purity.py`` checks both rules).
"""

__version__ = "0.1.0"
