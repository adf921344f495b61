"""The package as users install it: the wheel, not this checkout, in a fresh virtualenv per extra.

``make test-long`` only (each virtualenv installs its extra's dependencies: minutes each). The
wheel is built from this checkout once; every virtualenv gets torch first (as the Makefile and the
README's install say: the plain ``torch`` requirement could pull a CUDA build), then
``rl_dist_ext-<version>-py3-none-any.whl[<extra>]``, not editable, and runs a tiny job of that
extra from a folder outside the checkout, so that nothing is imported from the source tree.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TORCH_SPEC = os.environ.get("TORCH_SPEC", "torch==2.13.0")

pytestmark = [pytest.mark.long, pytest.mark.subprocess, pytest.mark.timeout(1800)]

#: extra -> a tiny job that needs only what the extra installs
JOBS = {
    # the framework-free core (numpy, torch, numba): the replay, no Ray, no framework
    "": """
        import numpy as np
        import rl_dist_ext
        from rl_dist_ext.replay import PrioritizedReplay

        replay = PrioritizedReplay(100, alpha=0.6)
        replay.add({"obs": np.zeros((10, 4), np.float32), "action": np.arange(10)}, np.ones(10))
        sample = replay.sample(4, beta=0.4)
        assert sample.batch["obs"].shape == (4, 4)
        print("ok core", rl_dist_ext.__version__)
    """,
    "rllib": """
        import ray
        from rllib_plugins import GorilaDQNConfig

        ray.init(num_cpus=2, include_dashboard=False)
        config = (
            GorilaDQNConfig()
            .environment("CartPole-v1")
            .env_runners(num_env_runners=1)
            .training(updates_per_iteration=4)
            .replay(capacity=5_000, min_size_to_sample=128)
            .reporting(min_sample_timesteps_per_iteration=256)
        )
        algo = config.build_algo()
        result = algo.train()
        algo.stop()
        ray.shutdown()
        assert result["env_runners"]["num_env_steps_sampled_lifetime"] > 0
        print("ok rllib", result["gorila"]["replay_size"])
    """,
    "tianshou": """
        import gymnasium as gym
        import ray
        from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
        from tianshou.algorithm.optim import AdamOptimizerFactory
        from tianshou.utils.net.common import Net
        from tianshou_plugins import DistributedPrioritizedReplayBuffer, GorilaCollector, GorilaDQN

        def make_env():
            return gym.make("CartPole-v1")

        ray.init(num_cpus=2, include_dashboard=False)
        env = make_env()
        net = Net(state_shape=env.observation_space.shape, action_shape=env.action_space.n)
        policy = DiscreteQLearningPolicy(model=net, action_space=env.action_space)
        algorithm = GorilaDQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3))
        buffer = DistributedPrioritizedReplayBuffer(5_000, num_shards=1, min_size_to_sample=64)
        collector = GorilaCollector(algorithm, env_factory=make_env, buffer=buffer, num_actors=1)
        stats = collector.collect(n_step=256)
        collector.close()
        buffer.close()
        ray.shutdown()
        assert stats.n_collected_steps >= 256
        print("ok tianshou", len(buffer))
    """,
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of this checkout (``pip wheel``, build isolation as a user's pip does it)."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(ROOT)],
        check=True,
        timeout=600,
    )
    (built,) = out.glob("rl_dist_ext-*.whl")
    return built


@pytest.mark.parametrize("extra", list(JOBS), ids=[e or "core" for e in JOBS])
def test_the_wheel_installs_with_its_extra_and_runs_a_tiny_job(wheel, tmp_path, extra):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, TORCH_SPEC], check=True, timeout=900)  # the core needs it too
    requirement = f"{wheel}[{extra}]" if extra else str(wheel)
    subprocess.run([*pip, requirement], check=True, timeout=1200)
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(JOBS[extra]))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")}
    done = subprocess.run(
        [str(python), str(job)],
        cwd=tmp_path,  # outside the checkout: the installed package, not the source tree
        env={**env, "RAY_ADDRESS": "local"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"ok {extra or 'core'}" in done.stdout
    where = subprocess.run(
        [str(python), "-c", "import rl_dist_ext; print(rl_dist_ext.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(venv) in where and str(ROOT) not in where, where
