"""RLlib (2.60, new API stack) adapters for rl-dist-ext.

Importing this package will register the algorithms (``"GorilaDQN"``, ``"VTrace"``) with Tune and
RLlib's algorithm registry once they exist; today it exposes nothing yet.
"""

__all__: list[str] = []
