"""The lean gradient bookkeeping (rllib_plugins/lean_gradients.py) against RLlib's own: the
helpers' answers, and a learner step on gradients holding NaN and inf, which must go RLlib's
way (bad values zeroed or capped, then the step) on the lean learner too."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("ray")

from rllib_plugins.lean_gradients import all_finite, fused_adam_supported


def test_fused_adam_is_asked_for_float_parameters_on_one_supported_device_only():
    assert fused_adam_supported([torch.zeros(3), torch.zeros(2, 2)])
    assert not fused_adam_supported([])
    assert not fused_adam_supported([torch.zeros(3, dtype=torch.int64)])
    assert not fused_adam_supported([torch.zeros(3, device="meta")])
    assert not fused_adam_supported([torch.zeros(3), torch.zeros(3, device="meta")])


@pytest.mark.parametrize(
    ("tensors", "expected"),
    [
        ([], True),
        ([torch.ones(4), torch.full((2, 2), -3.0)], True),
        ([torch.ones(4), torch.tensor([0.0, float("nan")])], False),
        ([torch.tensor([float("inf")]), torch.ones(2)], False),
        ([torch.tensor([-float("inf")])], False),
        ([torch.full((4,), 3e38)], False),  # finite, but the norm overflows: the slow check runs
    ],
)
def test_all_finite_answers_with_one_norm(tensors, expected):
    assert all_finite(tensors) is expected


def learners():
    """A GorilaDQN learner (lean step) and one on RLlib's own step, same weights."""
    import gymnasium as gym
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from rllib_plugins import GorilaDQNConfig

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from learner_bench import rllib_step_classes

    config = GorilaDQNConfig().environment("CartPole-v1").learners(num_learners=0)
    config = config.training(lr=1e-2, grad_clip=0.5)
    lean = config.build_learner(env=gym.make("CartPole-v1"))
    learner_class, module_class = rllib_step_classes()
    reference = (
        config.learners(learner_class=learner_class)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=module_class))
        .build_learner(env=gym.make("CartPole-v1"))
    )
    reference.module[DEFAULT_MODULE_ID].set_state(lean.module[DEFAULT_MODULE_ID].get_state())
    return lean, reference


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_gradients_with_nan_or_inf_take_rllibs_path_on_the_lean_learner(bad):
    from ray.rllib.core import DEFAULT_MODULE_ID

    lean, reference = learners()
    try:
        initial = lean.module[DEFAULT_MODULE_ID].get_state()
        results = []
        for learner in (lean, reference):
            generator = torch.Generator().manual_seed(0)
            grads = {
                ref: torch.randn(param.shape, generator=generator)
                for ref, param in learner._params.items()
            }
            first = next(iter(grads))
            grads[first].view(-1)[0] = bad
            learner.apply_gradients(learner.postprocess_gradients(grads))
            results.append(learner.module[DEFAULT_MODULE_ID].get_state())
        lean_state, reference_state = results
        for name, value in reference_state.items():
            torch.testing.assert_close(torch.as_tensor(lean_state[name]), torch.as_tensor(value))
            assert torch.isfinite(torch.as_tensor(value)).all(), name
        changed = any(
            not torch.equal(torch.as_tensor(initial[n]), torch.as_tensor(v))
            for n, v in lean_state.items()
        )
        assert changed  # the step was taken
    finally:
        lean.shutdown()
        reference.shutdown()
