"""VTrace on RLlib: the learner's loss, config errors, the inference server actor, SEED mode.

The loss tests build the learner in-process (``config.build_learner``, no Ray actors). The Ray
tests share the session's ``ray.init(num_cpus=2)``; one module-scoped algorithm in SEED mode
serves the metrics, weights, checkpoint and fault tests.
"""

from __future__ import annotations

import copy
import itertools
import math
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import alive_actor_ids
from metrics_keys import documented_keys

ray = pytest.importorskip("ray")

from ray.rllib.core import DEFAULT_MODULE_ID  # noqa: E402
from ray.rllib.core.columns import Columns  # noqa: E402
from vtrace_reference import Segment, segment_vtrace  # noqa: E402

# ---- the learner's loss (no Ray) ---------------------------------------------------------------

FRAGMENT = 6  # rollout_fragment_length: the row length T of the learner's time-major tensors
GAMMA = 0.95
VF_LOSS_COEFF = 0.7
ENTROPY_COEFF = 0.03
CLIP_RHO = 1.5
CLIP_PG_RHO = 1.0


def loss_settings(
    config,
    *,
    vtrace_lambda: float | None,
    clip_rho=CLIP_RHO,
    clip_pg=CLIP_PG_RHO,
    clip_param: float | None = None,
    targets_for: str = "current",
):
    training = {
        "gamma": GAMMA,
        "vf_loss_coeff": VF_LOSS_COEFF,
        "entropy_coeff": ENTROPY_COEFF,
        "vtrace_clip_rho_threshold": clip_rho,
        "vtrace_clip_pg_rho_threshold": clip_pg,
    }
    if vtrace_lambda is not None:
        training["vtrace_lambda"] = vtrace_lambda
    if hasattr(config, "targets_for"):  # VTrace's own settings (RLlib's IMPALA has none)
        training["clip_param"] = clip_param
        training["targets_for"] = targets_for
    return (
        # RLlib IMPALA's module (shared layers) in both: the tests compare them weight for weight
        config.rl_module(model_config={"vf_share_layers": True})
        .environment("CartPole-v1")
        .framework("torch")
        .env_runners(rollout_fragment_length=FRAGMENT)
        .training(**training)
        .debugging(seed=0)
    )


@pytest.fixture
def make_learner():
    """Build learners in-process; stop their learner threads afterwards."""
    learners = []

    def build(config):
        learner = config.build_learner(env=gym.make("CartPole-v1"))
        learners.append(learner)
        return learner

    yield build
    for learner in learners:
        learner.shutdown()


IMPALA_LAYOUT_CHUNKS = [(4, True), (7, False), (4, True), (5, False), (2, False)]


def impala_layout_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """A flat batch as IMPALA's learner connector lays it out.

    Episode chunks are laid end to end, each followed by the artificial bootstrap step that
    ``AddOneTsToEpisodesAndTruncate`` appends (``LOSS_MASK`` False, reward 0, not terminated);
    the learner cuts the flat batch into rows of ``FRAGMENT`` steps regardless of where chunks
    end (the last row zero-padded). Chunk lengths are chosen so that rows end on a real step
    followed by a real step, on a real step followed by its bootstrap step, and on a bootstrap
    step; one terminal step lies inside a row.
    """
    rng = np.random.default_rng(seed)
    obs, actions, rewards, terminated, mask, behaviour_logp = [], [], [], [], [], []
    for length, is_terminated in IMPALA_LAYOUT_CHUNKS:
        steps = length + 1
        obs.append(rng.normal(size=(steps, 4)))
        actions.append(rng.integers(0, 2, size=steps))
        rewards.append(np.r_[rng.normal(1.0, 0.5, size=length), 0.0])
        terminated.append(np.r_[np.zeros(length - 1, bool), is_terminated, False])
        mask.append(np.r_[np.ones(length, bool), False])
        # Behaviour probabilities of the taken actions far from the initial policy's ~0.5,
        # so that rho = pi / mu is clipped at some steps (mu small) and not at others.
        behaviour_logp.append(np.log(rng.choice([0.08, 0.3, 0.6, 0.95], size=steps)))
    batch = {
        Columns.OBS: torch.as_tensor(np.concatenate(obs), dtype=torch.float32),
        Columns.ACTIONS: torch.as_tensor(np.concatenate(actions), dtype=torch.int64),
        Columns.REWARDS: torch.as_tensor(np.concatenate(rewards), dtype=torch.float32),
        Columns.TERMINATEDS: torch.as_tensor(np.concatenate(terminated)),
        Columns.LOSS_MASK: torch.as_tensor(np.concatenate(mask)),
        Columns.ACTION_LOGP: torch.as_tensor(np.concatenate(behaviour_logp), dtype=torch.float32),
    }
    size = len(batch[Columns.OBS])
    assert size == 27 and size % FRAGMENT != 0  # 5 rows, the last one padded
    real = batch[Columns.LOSS_MASK].numpy()
    row_ends = np.arange(FRAGMENT - 1, size - 1, FRAGMENT)
    assert (real[row_ends] & real[row_ends + 1]).any()  # real step, next row continues it
    assert (real[row_ends] & ~real[row_ends + 1]).any()  # real step, next row bootstraps it
    assert (~real[row_ends]).any()  # a row ending on a bootstrap step
    terminal_rows = np.flatnonzero(batch[Columns.TERMINATEDS].numpy()) % FRAGMENT
    assert (terminal_rows < FRAGMENT - 1).any()  # a terminal step inside a row
    return batch


def impala_layout_pieces() -> list[tuple[int, int, str]]:
    """``(flat start, real steps, end)`` of each piece of :func:`impala_layout_batch`."""
    pieces, start = [], 0
    for length, is_terminated in IMPALA_LAYOUT_CHUNKS:
        pieces.append((start, length, "terminated" if is_terminated else "truncated"))
        start += length + 1
    return pieces


def learner_loss(learner, batch) -> torch.Tensor:
    module = learner.module[DEFAULT_MODULE_ID]
    fwd_out = module.forward_train(batch)
    return learner.compute_loss_for_module(
        module_id=DEFAULT_MODULE_ID, config=learner.config, batch=batch, fwd_out=fwd_out
    )


def reference_loss(
    module,
    batch,
    pieces,
    *,
    vtrace_lambda: float,
    clip_rho=CLIP_RHO,
    clip_pg=CLIP_PG_RHO,
    clip_param: float | None = None,
    targets_for: str = "current",
) -> tuple[torch.Tensor, dict]:
    """The V-trace loss from the episode structure, with the paper's per-segment double sum
    (tests/vtrace_reference.py), knowing nothing of masks or of RLlib's extra step.

    ``pieces``: ``(flat start, real steps, end)`` per episode piece, ``end`` "terminated" or
    "truncated" (by the env or at a rollout-fragment cut); the piece's final observation sits
    right after its last real step. The learner cuts the flat batch into rows of ``FRAGMENT``
    steps: a row end inside a piece cuts its trace there, bootstrapping from the next step.
    With ``clip_param``, each step's policy term is PPO's min(r A, clip(r) A), r = pi / mu;
    ``targets_for="old"`` computes the targets for mu itself (every log-rho 0: no trace cut).
    """
    with torch.no_grad():
        logits = module.forward_train(batch)[Columns.ACTION_DIST_INPUTS]
        values = module.compute_values(batch).double()
    log_pi = torch.log_softmax(logits, dim=-1)
    target_logp = log_pi.gather(1, batch[Columns.ACTIONS][:, None])[:, 0]
    entropy = -(log_pi.exp() * log_pi).sum(-1)
    log_rhos = (target_logp.detach() - batch[Columns.ACTION_LOGP]).double()
    rewards = batch[Columns.REWARDS].double()
    pg_terms, vf_terms, ent_terms, rhos = [], [], [], []
    for start, length, end in pieces:
        stop = start + length
        bounds = [start, *(k for k in range(start + 1, stop) if k % FRAGMENT == 0), stop]
        for a, b in itertools.pairwise(bounds):
            segment = Segment(
                rewards=rewards[a:b].numpy(),
                values=values[a:b].numpy(),
                log_rhos=(log_rhos[a:b] if targets_for == "current" else 0 * log_rhos[a:b]).numpy(),
                next_value=float(values[b]),
                end=end if b == stop else "cut",
            )
            vs, pg = segment_vtrace(
                segment,
                gamma=GAMMA,
                clip_rho_threshold=clip_rho,
                clip_pg_rho_threshold=clip_pg,
                lambda_=vtrace_lambda,
            )
            advantage = torch.from_numpy(pg)
            if clip_param is None:
                pg_terms.append(-(target_logp[a:b].double() * advantage).sum())
            else:
                ratio = (target_logp[a:b] - batch[Columns.ACTION_LOGP][a:b]).double().exp()
                bounded = ratio.clamp(1 - clip_param, 1 + clip_param)
                pg_terms.append(-torch.minimum(ratio * advantage, bounded * advantage).sum())
            vf_terms.append(0.5 * ((values[a:b] - torch.from_numpy(vs)) ** 2).sum())
        ent_terms.append(entropy[start:stop].sum())
        rhos.append(log_rhos[start:stop].exp())
    num_real = sum(length for _, length, _ in pieces)
    assert num_real == int(batch[Columns.LOSS_MASK].sum())
    pg = torch.stack(pg_terms).sum() / num_real
    vf = torch.stack(vf_terms).sum() / num_real
    ent = torch.stack(ent_terms).sum() / num_real
    total = pg + VF_LOSS_COEFF * vf - ENTROPY_COEFF * ent
    return total.float(), {"pg": pg, "vf": vf, "entropy": ent, "rhos": torch.cat(rhos)}


def test_learner_loss_equals_the_per_segment_reference_with_lambda(make_learner):
    from rllib_plugins import VTraceConfig

    torch.manual_seed(0)
    learner = make_learner(loss_settings(VTraceConfig(), vtrace_lambda=0.9))
    assert learner.config.vtrace_lambda == 0.9
    assert learner.config.get_rollout_fragment_length() == FRAGMENT
    batch = impala_layout_batch()
    module = learner.module[DEFAULT_MODULE_ID]

    loss = learner_loss(learner, batch)
    expected, parts = reference_loss(module, batch, impala_layout_pieces(), vtrace_lambda=0.9)

    # The batch exercises both clips: rho above each threshold at some steps, below at others.
    rhos = parts["rhos"]
    assert (rhos > CLIP_RHO).any() and ((rhos > CLIP_PG_RHO) & (rhos < CLIP_RHO)).any()
    assert (rhos < CLIP_PG_RHO).any()
    assert loss.shape == ()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    # Each part is logged as computed (no sign or coefficient slipped between them).
    for key, part in (("mean_pi_loss", "pg"), ("mean_vf_loss", "vf"), ("entropy", "entropy")):
        logged = float(torch.as_tensor(learner.metrics.peek((DEFAULT_MODULE_ID, key))).detach())
        assert logged == pytest.approx(float(parts[part]), rel=1e-5, abs=1e-6), key
    # lambda reaches the core: with lambda = 1 the loss is different.
    reference_lambda_1 = reference_loss(module, batch, impala_layout_pieces(), vtrace_lambda=1.0)
    assert not torch.allclose(loss, reference_lambda_1[0])
    # The loss is differentiable and its gradient reaches both the policy and the value head.
    loss.backward()
    grads = [p.grad for p in module.parameters() if p.requires_grad]
    assert all(g is not None for g in grads)
    assert all(g.abs().sum() > 0 for g in grads)


def test_clip_thresholds_of_none_mean_no_clipping(make_learner):
    from rllib_plugins import VTraceConfig

    torch.manual_seed(0)
    config = loss_settings(VTraceConfig(), vtrace_lambda=0.9, clip_rho=None, clip_pg=None)
    learner = make_learner(config)
    batch = impala_layout_batch()
    module = learner.module[DEFAULT_MODULE_ID]
    pieces = impala_layout_pieces()
    loss = learner_loss(learner, batch)
    unclipped, parts = reference_loss(
        module, batch, pieces, vtrace_lambda=0.9, clip_rho=None, clip_pg=None
    )
    assert (parts["rhos"] > CLIP_RHO).any()  # clipping would change the loss
    torch.testing.assert_close(loss, unclipped, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(loss, reference_loss(module, batch, pieces, vtrace_lambda=0.9)[0])


@pytest.mark.parametrize("targets_for", ["current", "old"])
def test_clip_param_bounds_the_policy_term_around_the_behaviour_policy(make_learner, targets_for):
    """With ``clip_param`` the loss is the reference's with PPO's clipped surrogate, ratios
    pi/mu to the behaviour log-probs the runners recorded (the batch's ratios fall on both
    sides of the band); without it, the plain term. ``targets_for="old"``: the targets are the
    behaviour policy's (APPO's form around mu), and differ from the learner's."""
    from rllib_plugins import VTraceConfig

    torch.manual_seed(0)
    config = loss_settings(
        VTraceConfig(), vtrace_lambda=0.9, clip_param=0.1, targets_for=targets_for
    )
    learner = make_learner(config)
    assert (learner.config.clip_param, learner.config.targets_for) == (0.1, targets_for)
    batch = impala_layout_batch()
    module = learner.module[DEFAULT_MODULE_ID]
    pieces = impala_layout_pieces()
    loss = learner_loss(learner, batch)
    expected, parts = reference_loss(
        module, batch, pieces, vtrace_lambda=0.9, clip_param=0.1, targets_for=targets_for
    )
    other = "old" if targets_for == "current" else "current"
    other_loss, _ = reference_loss(
        module, batch, pieces, vtrace_lambda=0.9, clip_param=0.1, targets_for=other
    )
    assert not torch.allclose(loss, other_loss)
    assert (parts["rhos"] > 1.1).any() and (parts["rhos"] < 0.9).any()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    plain = reference_loss(module, batch, pieces, vtrace_lambda=0.9)[0]
    assert not torch.allclose(loss, plain)


@pytest.mark.parametrize(("clip_param", "resolved"), [(0.1, "old"), (None, "current")])
def test_targets_for_left_unset_follows_the_clip(make_learner, clip_param, resolved):
    """``targets_for=None`` (the default): V-trace's targets for the behaviour policy with a
    clip (APPO's form, the default loss), for the learner's without (IMPALA's)."""
    from rllib_plugins import VTraceConfig

    torch.manual_seed(0)
    learner = make_learner(
        loss_settings(VTraceConfig(), vtrace_lambda=0.9, clip_param=clip_param, targets_for=None)
    )
    assert learner.config.targets_for is None
    batch = impala_layout_batch()
    module = learner.module[DEFAULT_MODULE_ID]
    expected, _ = reference_loss(
        module,
        batch,
        impala_layout_pieces(),
        vtrace_lambda=0.9,
        clip_param=clip_param,
        targets_for=resolved,
    )
    torch.testing.assert_close(learner_loss(learner, batch), expected, rtol=1e-5, atol=1e-6)


def test_defaults_are_the_ppo_form_and_impala_loss_restores_impalas():
    """``VTraceConfig()`` trains the form that kept CartPole's target in the retention race
    (clip 0.1 around the behaviour policy, 4 passes, the value head on layers of its own);
    ``IMPALA_LOSS`` is IMPALA's, shared layers included, and a user's model config decides the
    layers."""
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    from rllib_plugins import VTraceConfig
    from rllib_plugins.vtrace import IMPALA_LOSS

    config = VTraceConfig()
    assert (config.clip_param, config.targets_for, config.num_epochs) == (0.1, None, 4)
    assert config.model_config["vf_share_layers"] is False
    own = VTraceConfig().rl_module(model_config={"fcnet_hiddens": [32]}).model_config
    assert own["vf_share_layers"] is False and own["fcnet_hiddens"] == [32]
    # a DefaultModelConfig brings its own default (shared layers), as it does for RLlib's PPO
    dataclass = DefaultModelConfig(fcnet_hiddens=[32])
    assert VTraceConfig().rl_module(model_config=dataclass).model_config["vf_share_layers"]
    # IMPALA's loss shares the layers too (as VTrace checkpoints from before the change hold
    # them), unless the model config says otherwise
    impala = VTraceConfig().training(**IMPALA_LOSS)
    assert (impala.clip_param, impala.targets_for, impala.num_epochs) == (None, "current", 1)
    assert impala.model_config["vf_share_layers"] is True
    impala.environment("CartPole-v1").validate()
    apart = impala.rl_module(model_config={"vf_share_layers": False}).model_config
    assert apart["vf_share_layers"] is False


def updated_weights(
    learner, batch, updates: list[dict], env_steps: int | None = None
) -> dict[str, torch.Tensor]:
    """``learner``'s module weights after one ``Learner.update`` per entry of ``updates`` (its
    keywords: ``num_epochs``, ``shuffle_batch_per_epoch``) on ``batch``, the call IMPALA's
    learner thread makes with the keywords ``training_step`` passes; the batch counts
    ``env_steps`` (default: its rows)."""
    from ray.rllib.core.learner.learner import Learner
    from ray.rllib.core.learner.training_data import TrainingData
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    for keywords in updates:
        rows = SampleBatch({key: value.clone() for key, value in batch.items()})
        training_data = TrainingData(
            batch=MultiAgentBatch({DEFAULT_MODULE_ID: rows}, env_steps=env_steps or len(rows))
        )
        Learner.update(
            learner, training_data=training_data, timesteps={}, minibatch_size=None, **keywords
        )
    state = learner.module[DEFAULT_MODULE_ID].state_dict()
    return {name: value.detach().clone() for name, value in state.items()}


@pytest.mark.parametrize("env_steps", [None, 22], ids=["rows", "env-steps-without-extra-steps"])
def test_num_epochs_passes_each_train_on_the_whole_batch_in_its_order(make_learner, env_steps):
    """``num_epochs=2`` (the default's 4 passes, fewer here) is two updates on the whole batch,
    its rows in order: the same weights and versions as two single-pass updates, also where the
    batch counts
    fewer env steps than it has rows (22 of 27: its 5 extra steps left out, as a batch from
    aggregator actors counts them; RLlib's own passes of 22 rows wrap around the batch).
    RLlib shuffles the flat batch's steps between passes when ``shuffle_batch_per_epoch`` is
    set, which would cut every row (refused by validate(); the learner ignores it)."""
    from rllib_plugins import VTraceConfig

    config = loss_settings(
        VTraceConfig(), vtrace_lambda=0.9, clip_param=0.1, targets_for="old"
    ).training(lr=1e-2)
    learners = [make_learner(config) for _ in range(3)]
    start = learners[0].module[DEFAULT_MODULE_ID].get_state()
    for learner in learners[1:]:
        learner.module[DEFAULT_MODULE_ID].set_state(start)
    before = updated_weights(learners[0], impala_layout_batch(), [])
    batch = impala_layout_batch()
    two_passes = updated_weights(learners[0], batch, [{"num_epochs": 2}], env_steps)
    one_and_one = updated_weights(learners[1], batch, [{"num_epochs": 1}] * 2, env_steps)
    shuffled = updated_weights(
        learners[2], batch, [{"num_epochs": 2, "shuffle_batch_per_epoch": True}], env_steps
    )
    assert any(not torch.allclose(two_passes[n], before[n]) for n in two_passes)  # it trained
    # versions count gradient steps, not calls: two passes in one update move them by 2
    for learner in learners:
        clock = learner.weights_clock
        assert (clock.num_gradient_updates, clock.version) == (2, 2)
    for name, value in two_passes.items():
        torch.testing.assert_close(value, one_and_one[name], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(value, shuffled[name], rtol=1e-5, atol=1e-6)


def test_rllib_impala_drops_the_bootstrap_at_piece_ends_and_vtrace_does_not(make_learner):
    """RLlib 2.60's IMPALA lets the extra step's error -V(x_L) into the last real step, so every
    truncated or cut piece is learned as if the episode ended there: its loss differs from the
    paper's. (Kept to show why VTrace does not compare itself with RLlib's loss.)"""
    from ray.rllib.algorithms.impala import IMPALAConfig

    from rllib_plugins import VTraceConfig

    torch.manual_seed(0)
    ours = make_learner(loss_settings(VTraceConfig(), vtrace_lambda=1.0))
    theirs = make_learner(loss_settings(IMPALAConfig(), vtrace_lambda=None))
    theirs.module[DEFAULT_MODULE_ID].set_state(ours.module[DEFAULT_MODULE_ID].get_state())
    batch = impala_layout_batch(seed=1)
    reference, _ = reference_loss(
        ours.module[DEFAULT_MODULE_ID], batch, impala_layout_pieces(), vtrace_lambda=1.0
    )
    torch.testing.assert_close(learner_loss(ours, batch), reference, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(learner_loss(theirs, batch), reference, rtol=1e-3, atol=1e-4)


def test_learner_loss_on_a_real_rllib_batch_equals_the_per_segment_reference(make_learner):
    """Episodes sampled by RLlib's env runner (terminations, env truncations at 12 steps, pieces
    cut by the sample's end), turned into a batch by VTrace's own learner connector."""
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    from rllib_plugins import VTraceConfig

    torch.manual_seed(0)
    config = (
        loss_settings(VTraceConfig(), vtrace_lambda=0.9)
        .environment("CartPole-v1", env_config={"max_episode_steps": 12})
        .env_runners(num_envs_per_env_runner=2)
        .central_inference(enabled=False)
    )
    learner = make_learner(config)
    runner = SingleAgentEnvRunner(config=config)
    try:
        episodes = runner.sample(num_timesteps=70, explore=True)
    finally:
        runner.stop()
    ends = [
        "terminated" if e.is_terminated else "truncated" if e.is_truncated else "cut"
        for e in episodes
    ]
    assert {"terminated", "truncated", "cut"} <= set(ends), ends
    pieces, start, observations = [], 0, []
    for episode, end in zip(episodes, ends, strict=True):
        observations.append(np.asarray(episode.get_observations()))  # L + 1 (final) obs
        pieces.append((start, len(episode), "terminated" if end == "terminated" else "truncated"))
        start += len(episode) + 1

    connector = config.build_learner_connector(
        input_observation_space=runner.env.single_observation_space,
        input_action_space=runner.env.single_action_space,
    )
    batch = connector(
        rl_module=learner.module, batch={}, episodes=episodes, shared_data={}, metrics=None
    )[DEFAULT_MODULE_ID]
    # The layout the reference assumes: pieces end to end, each followed by its final obs.
    np.testing.assert_array_equal(batch[Columns.OBS].numpy(), np.concatenate(observations))
    assert len(batch[Columns.OBS]) % FRAGMENT != 0  # rows cut pieces; the last row is padded

    loss = learner_loss(learner, batch)
    module = learner.module[DEFAULT_MODULE_ID]
    expected, _ = reference_loss(module, batch, pieces, vtrace_lambda=0.9)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)


# ---- config validation and registration --------------------------------------------------------


def small_config(*, central: bool = True, **training):
    """CartPole, 2 env runners x 4 envs, the learner in the driver, small CPU asks (2-CPU box);
    unseeded, as :func:`test_rllib_gorila.small_config` says why."""
    from rllib_plugins import VTraceConfig

    settings = {
        "lr": 5e-4,
        "train_batch_size_per_learner": 500,
        "entropy_coeff": 0.01,
        "vf_loss_coeff": 0.5,
    }
    settings.update(training)
    return (
        VTraceConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=2, num_envs_per_env_runner=4, num_cpus_per_env_runner=0.2)
        .learners(num_learners=0, num_cpus_per_learner=0.2)
        .resources(num_cpus_for_main_process=0.3)
        .training(**settings)
        .central_inference(enabled=central, num_cpus=0.1, max_batch_size=64, max_wait_ms=1.0)
        .reporting(min_time_s_per_iteration=1)
    )


def alive_actors() -> int:
    from conftest import alive_actor_count

    return alive_actor_count()


def alive_actor_classes() -> dict[str, str]:
    """Alive actors by id -> class name (counts alone can hide a leak behind another death)."""
    from ray._private import state

    return {
        actor_id: info["ActorClassName"]
        for actor_id, info in state.actors().items()
        if info["State"] == "ALIVE"
    }


def server_restarts(handle) -> int:
    from ray._private import state

    return int(state.actors()[handle._actor_id.hex()]["NumRestarts"])


def actors_left_since(before: dict[str, str], timeout_s: float = 60.0) -> list[str]:
    """Class names of actors alive now that were not alive in ``before``; deaths reach the GCS
    asynchronously, so this polls for up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = sorted(name for i, name in alive_actor_classes().items() if i not in before)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def test_central_inference_auto_turns_on_only_with_a_gpu_for_the_server(monkeypatch):
    from rllib_plugins import VTraceConfig, central_inference

    config = VTraceConfig().environment("CartPole-v1").env_runners(num_env_runners=2)
    assert config.central_inference_enabled == "auto"
    monkeypatch.setattr(central_inference, "cluster_gpus", lambda: 0.0)
    assert not config.uses_central_inference()  # CPU only: the runners infer locally
    assert config.central_inference_gpus() == 0.0
    monkeypatch.setattr(central_inference, "cluster_gpus", lambda: 1.0)
    assert config.uses_central_inference()
    assert config.central_inference_gpus() == 0.5  # shares the GPU with the learner
    assert config.inference_server_bundle() == {"CPU": 0.5, "GPU": 0.5}
    no_remote_runners = config.copy(copy_frozen=False).env_runners(num_env_runners=0)
    assert not no_remote_runners.uses_central_inference()
    assert (
        not config.copy(copy_frozen=False).central_inference(enabled=False).uses_central_inference()
    )
    pinned = config.copy(copy_frozen=False).central_inference(num_gpus=0)
    assert pinned.central_inference_gpus() == 0.0
    assert pinned.inference_server_bundle() == {"CPU": 0.5}


def test_registered_with_tune_and_rllib():
    from ray.rllib.algorithms import registry
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
    from ray.tune.registry import get_trainable_cls

    import rllib_plugins

    assert get_trainable_cls("VTrace") is rllib_plugins.VTrace
    assert "VTrace" in registry.ALGORITHMS
    config = AlgorithmConfig(algo_class="VTrace")
    assert get_trainable_cls(config.algo_class) is rllib_plugins.VTrace
    default = rllib_plugins.VTrace.get_default_config()
    assert isinstance(default, rllib_plugins.VTraceConfig)
    assert default.central_inference_enabled == "auto"  # SEED mode where a GPU serves it
    assert default.get_default_learner_class() is rllib_plugins.VTraceTorchLearner


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda c: c.training(vtrace_lambda=-0.1), "vtrace_lambda"),
        (lambda c: c.training(vtrace_lambda=1.5), "vtrace_lambda"),
        (lambda c: c.training(vtrace_clip_rho_threshold=0.0), "vtrace_clip_rho_threshold"),
        (lambda c: c.training(vtrace_clip_rho_threshold=-1.0), "vtrace_clip_rho_threshold"),
        (lambda c: c.training(vtrace_clip_pg_rho_threshold=0.0), "vtrace_clip_pg_rho_threshold"),
        (lambda c: c.training(vtrace_clip_pg_rho_threshold=-2), "vtrace_clip_pg_rho_threshold"),
        (lambda c: c.training(clip_param=0.0), "clip_param"),
        (lambda c: c.training(clip_param=float("nan")), "clip_param"),
        (lambda c: c.training(clip_param=0.2, targets_for="new"), "targets_for must be"),
        (
            lambda c: c.training(clip_param=None, targets_for="old"),
            "targets_for='old' .* set clip_param",
        ),
        (
            lambda c: c.training(num_epochs=2, shuffle_batch_per_epoch=True),
            r"shuffle_batch_per_epoch=True .* num_epochs=2",
        ),
        (lambda c: c.training(minibatch_size=100), r"minibatch_size=100: .* leave it None"),
        (lambda c: c.central_inference(max_batch_size=0), "max_batch_size"),
        (lambda c: c.central_inference(max_batch_size=2.5), "max_batch_size"),
        (lambda c: c.central_inference(max_wait_ms=-1.0), "max_wait_ms"),
        (lambda c: c.central_inference(num_cpus=-0.1), "num_cpus"),
        (lambda c: c.central_inference(num_gpus=-1), "num_gpus"),
        (lambda c: c.central_inference(enabled="yes"), "enabled"),
        (lambda c: c.env_runners(num_env_runners=0), "num_env_runners"),
        # One runner, "auto" fragments: one sample list of 4 x 250 steps per batch, 2 learners.
        (
            lambda c: c.learners(num_learners=2).env_runners(
                num_env_runners=1, rollout_fragment_length="auto"
            ),
            r"num_learners=2 .* holds 1 list\(s\) of num_envs_per_env_runner=4 x "
            r"rollout_fragment_length=250 steps",
        ),
        (
            lambda c: c.learners(num_learners=3).env_runners(rollout_fragment_length=200),
            r"total_train_batch_size=1500 holds 2 list\(s\).* at most 500 steps",
        ),
    ],
)
def test_bad_config_values_raise_on_validate(change, match):
    config = change(small_config())
    with pytest.raises(ValueError, match=match):
        config.validate()


def test_valid_edge_values_pass_validation():
    small_config().training(vtrace_lambda=0.0).central_inference(max_wait_ms=0.0).validate()
    small_config().training(vtrace_lambda=1.0).validate()
    # Local inference needs no remote env runner.
    small_config(central=False).env_runners(num_env_runners=0).validate()
    # Two learners, two runners, "auto" fragments: two sample lists per batch, one each.
    small_config().learners(num_learners=2).env_runners(rollout_fragment_length="auto").validate()


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda c: c.environment("Pendulum-v1"), "Discrete action spaces only"),
        (lambda c: c.training(vtrace_lambda=2.0), "vtrace_lambda"),
        (lambda c: c.central_inference(max_batch_size=0), "max_batch_size"),
    ],
)
def test_bad_configs_raise_before_any_actor_starts(ray_session, change, match):
    before = alive_actor_ids()
    with pytest.raises(ValueError, match=match):
        change(small_config()).build_algo()
    assert alive_actor_ids() <= before  # none started and left (one dying before may be gone)


# ---- the inference server as a Ray actor -------------------------------------------------------


def test_inference_server_actor_batches_callers_versions_and_restarts(ray_session):
    from rl_dist_ext.inference import InferenceServerConfig
    from rl_dist_ext.ray_actors import start_inference_server

    class OffsetPolicy:  # defined here so that Ray ships it to the actor by value
        is_recurrent = False

        def __init__(self, device: str) -> None:
            self.offset = 0.0

        def __call__(self, obs: np.ndarray) -> dict[str, np.ndarray]:
            return {"actions": np.zeros(len(obs), dtype=np.int64), "echo": obs + self.offset}

        def set_weights(self, weights) -> None:
            self.offset = float(weights)

    @ray.remote(num_cpus=0)
    def caller(server, caller_id: int, num_requests: int):
        rng = np.random.default_rng(caller_id)
        requests = []
        for k in range(num_requests):
            rows = int(rng.integers(1, 4))
            # Every row is unique: (caller, request, row).
            requests.append(np.array([[caller_id, k, r] for r in range(rows)], dtype=np.float64))
        # All of this caller's requests are in flight at once, next to the other callers'.
        replies = ray.get([server.infer.remote(f"caller-{caller_id}", obs) for obs in requests])
        return [
            (obs, reply.outputs["echo"], reply.version)
            for obs, reply in zip(requests, replies, strict=True)
        ]

    server = start_inference_server(
        OffsetPolicy, InferenceServerConfig(max_batch_size=32, max_wait_ms=20.0), num_cpus=0.05
    )
    try:
        for i in range(6):
            assert ray.get(server.register.remote(f"caller-{i}"), timeout=120) == 0
        num_callers, num_requests = 6, 15
        results = ray.get(
            [caller.remote(server, i, num_requests) for i in range(num_callers)], timeout=300
        )
        echoed = []
        for per_caller in results:
            assert len(per_caller) == num_requests
            for obs, echo, version in per_caller:
                np.testing.assert_array_equal(echo, obs)  # its own rows, in order
                assert version == -1
                echoed.extend(map(tuple, echo))
        total_rows = len(echoed)
        assert len(set(echoed)) == total_rows  # no row twice
        stats = ray.get(server.stats.remote())
        assert stats["num_requests"] == num_callers * num_requests  # none lost
        assert stats["mean_batch_rows"] * stats["num_batches"] == pytest.approx(total_rows)
        assert stats["mean_batch_requests"] > 1.0  # concurrent requests were batched
        assert stats["num_callers"] == num_callers
        assert stats["caller_restarts"] == 0

        # Weights: a newer version reaches the next replies; an older one is ignored.
        assert ray.get(server.set_weights.remote(100.0, 3)) == 3
        reply = ray.get(server.infer.remote("caller-0", np.ones((2, 3))))
        assert reply.version == 3
        np.testing.assert_array_equal(reply.outputs["echo"], np.full((2, 3), 101.0))
        assert ray.get(server.set_weights.remote(5.0, 2)) == 3
        reply = ray.get(server.infer.remote("caller-0", np.ones((1, 3))))
        assert reply.version == 3 and reply.outputs["echo"][0, 0] == 101.0
        assert ray.get(server.stats.remote())["stale_weights_ignored"] == 1
        assert ray.get(server.register.remote("caller-0")) == 1  # a restarted caller

        # Killed: Ray restarts it with the factory's initial weights (version -1).
        ray.kill(server, no_restart=False)
        deadline = time.monotonic() + 120
        while True:
            try:
                reply = ray.get(server.infer.remote("caller-0", np.ones((1, 3))), timeout=30)
                break
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert reply.version == -1
        np.testing.assert_array_equal(reply.outputs["echo"], np.ones((1, 3)))
        assert ray.get(server.get_version.remote()) == -1
        stats = ray.get(server.stats.remote())
        assert stats["num_requests"] == 1  # a fresh instance
        assert stats["num_callers"] == 1  # the caller that sent since is known again
        assert ray.get(server.set_weights.remote(7.0, 1)) == 1  # it takes weights again
        reply = ray.get(server.infer.remote("caller-0", np.ones((1, 3))))
        assert reply.version == 1 and reply.outputs["echo"][0, 0] == 8.0
    finally:
        ray.kill(server, no_restart=True)


# ---- one algorithm in SEED mode ----------------------------------------------------------------

METRIC_KEYS = (
    "requests_per_s",
    "mean_batch_rows",
    "mean_batch_requests",
    "batch_fill",
    "queue_ms_p50",
    "queue_ms_p99",
    "version",
    "num_callers",
    "caller_restarts",
    "policy_lag",
)


def state_of(module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def runner_states(algorithm) -> list[dict[str, torch.Tensor]]:
    return algorithm.env_runner_group.foreach_env_runner(
        lambda runner: {
            k: v.detach().cpu().clone() for k, v in runner.module.unwrapped().state_dict().items()
        },
        local_env_runner=False,
    )


def learner_module(algorithm):
    return algorithm.learner_group._learner.module[DEFAULT_MODULE_ID]


def same_weights(a: dict, b: dict) -> bool:
    common = a.keys() & b.keys()
    assert common, "no parameter in common"
    return all(torch.equal(a[k], b[k]) for k in common)


def server_logits(algorithm, obs: np.ndarray) -> tuple[int, np.ndarray]:
    """The server's logits for ``obs``, once it holds the version the algorithm last pushed."""
    handle, version = algorithm._inference.handle, algorithm._inference.version
    deadline = time.monotonic() + 30
    while ray.get(handle.get_version.remote()) < version and time.monotonic() < deadline:
        time.sleep(0.1)  # pushes are fire and forget
    reply = ray.get(handle.infer.remote("test-probe", obs))
    return reply.version, reply.outputs["action_dist_inputs"]


def module_logits(module, obs: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = module.forward_inference({Columns.OBS: torch.as_tensor(obs)})
    return out[Columns.ACTION_DIST_INPUTS].numpy()


def env_steps_trained(result: dict) -> float:
    return (
        result.get("learners", {})
        .get("__all_modules__", {})
        .get("num_env_steps_trained_lifetime", 0)
    )


def train_until_learned(algorithm, *, max_iterations: int = 30) -> dict:
    """Train until this call has seen at least one learner update (the first iteration's
    samples may still be on their way: the runners start slowly on a busy machine)."""
    trained_before = None
    for _ in range(max_iterations):
        result = algorithm.train()
        trained = env_steps_trained(result)
        if trained_before is None:
            trained_before = trained
        elif trained > trained_before:
            return result
    raise AssertionError(f"no learner update within {max_iterations} iterations")


def probe_obs() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)


@pytest.fixture(scope="module")
def seed_algo(ray_session):
    """A VTrace algorithm in SEED mode plus its learner's and runners' weights at build time."""
    algorithm = small_config().build_algo()
    initial = {
        "learner": state_of(learner_module(algorithm)),
        "runners": runner_states(algorithm),
    }
    yield algorithm, initial
    algorithm.stop()


def test_seed_mode_reports_server_metrics_and_policy_lag(seed_algo):
    algorithm, _ = seed_algo
    history = []
    for _ in range(30):  # until the learner has made >= 6 gradient updates
        pushed_before = algorithm._inference.version
        result = algorithm.train()
        metrics = result["central_inference"]
        history.append((metrics["version"], metrics["policy_lag"]))
        if metrics["version"] >= 6 and len(history) >= 4:
            break
    for key in METRIC_KEYS:
        assert key in metrics, key
    # docs/metrics.md lists exactly the server's keys and VTrace's health keys
    documented = documented_keys("InferenceServer.stats()")
    assert set(metrics) == documented
    assert set(result["vtrace"]) == documented_keys("RLlib VTrace health")
    runner_keys = documented_keys("RLlib VTrace env runners")
    assert runner_keys <= set(result["env_runners"])
    assert metrics["requests_per_s"] > 0
    # A runner's request carries the observations of its 4 envs.
    assert metrics["mean_batch_rows"] >= 4
    assert 0 < metrics["batch_fill"] <= 1
    assert metrics["version"] >= 6, history
    # The push is fire-and-forget: the stats may be read just before the latest one lands,
    # but the server holds at least the version pushed in the iteration before.
    pushed = algorithm._inference.version
    assert pushed_before <= metrics["version"] <= pushed, (pushed_before, metrics, pushed)
    deadline = time.monotonic() + 30
    while ray.get(algorithm._inference.handle.get_version.remote()) != pushed:
        assert time.monotonic() < deadline, "the server never got the latest weights"
        time.sleep(0.05)
    assert metrics["num_callers"] == 2
    assert metrics["caller_restarts"] == 0
    assert result["learners"]["__all_modules__"]["num_env_steps_trained_lifetime"] > 0
    lag = metrics["policy_lag"]
    assert math.isfinite(lag) and lag >= 0, history
    # The runners act with recent versions: the lag does not grow with the version count.
    assert lag <= metrics["version"] / 2, history


def sampled_steps(algorithm, num_timesteps: int) -> list[tuple[np.ndarray, ...]]:
    """``(obs, actions, action_logp, action_dist_inputs)`` of every runner's new episode steps."""

    def sample(runner):
        out = []
        for episode in runner.sample(num_timesteps=num_timesteps, explore=True):
            if len(episode) == 0:
                continue
            out.append(
                (
                    np.asarray(episode.get_observations())[:-1],
                    np.asarray(episode.get_actions()),
                    np.asarray(episode.get_extra_model_outputs(Columns.ACTION_LOGP)),
                    np.asarray(episode.get_extra_model_outputs(Columns.ACTION_DIST_INPUTS)),
                )
            )
        return out

    per_runner = algorithm.env_runner_group.foreach_env_runner(sample, local_env_runner=False)
    return [steps for runner in per_runner for steps in runner]


def test_seed_mode_records_the_logp_of_the_weights_version_that_acted(seed_algo):
    """The ``action_logp`` V-trace reads as mu(a|x) is log_softmax(logits)[a] of the weights the
    server held when it chose the action, checked for two versions in a row."""
    algorithm, _ = seed_algo
    obs_probe = probe_obs()
    previous = None
    for _ in range(2):
        train_until_learned(algorithm)  # a new learner version goes to the server
        version, _ = server_logits(algorithm, obs_probe)  # waits until the server holds it
        module = learner_module(algorithm)
        steps = sampled_steps(algorithm, num_timesteps=24)
        assert sum(len(actions) for _, actions, _, _ in steps) >= 48
        assert ray.get(algorithm._inference.handle.get_version.remote()) == version
        for obs, actions, logp, logits in steps:
            expected_logits = module_logits(module, obs.astype(np.float32))
            np.testing.assert_allclose(logits, expected_logits, atol=1e-5)
            log_pi = torch.log_softmax(torch.as_tensor(expected_logits), dim=-1).numpy()
            np.testing.assert_allclose(logp, log_pi[np.arange(len(actions)), actions], atol=1e-5)
        if previous is not None:  # the versions differ, so the check above tells them apart
            obs = steps[0][0].astype(np.float32)
            assert not np.allclose(module_logits(previous, obs), module_logits(module, obs))
        previous = copy.deepcopy(module)


def test_runners_never_hold_learner_weights_and_the_server_does(seed_algo):
    algorithm, initial = seed_algo
    train_until_learned(algorithm)
    learner_now = state_of(learner_module(algorithm))
    assert not same_weights(learner_now, initial["learner"])  # the learner trained
    for before, now in zip(initial["runners"], runner_states(algorithm), strict=True):
        assert same_weights(now, before)  # still the weights they were built with
        assert not same_weights(now, learner_now)
    # The server computes with the learner's latest weights.
    obs = probe_obs()
    version, logits = server_logits(algorithm, obs)
    assert version == algorithm._inference.version >= 1
    np.testing.assert_allclose(logits, module_logits(learner_module(algorithm), obs), atol=1e-5)
    # The driver's module (what users evaluate) follows the learner too.
    np.testing.assert_allclose(
        module_logits(algorithm.get_module(), obs), logits, atol=1e-5, rtol=0
    )


def test_seed_runners_infer_through_an_rlmodule_without_patched_methods(seed_algo):
    """SEED goes through RLlib's public hooks: the runner's module is a ServerInferenceRLModule
    (whose unwrapped() is RLlib's own module); no method is replaced on a module instance."""
    algorithm, _ = seed_algo

    def inspect(runner):
        from rllib_plugins.central_inference import ServerInferenceRLModule

        module = runner.module
        patched = [
            name
            for name in ("forward_exploration", "forward_inference", "forward_train")
            if name in vars(module) or name in vars(module.unwrapped())
        ]
        return (
            type(module) is ServerInferenceRLModule,
            type(module.unwrapped()).__name__,
            # RLlib's public forward methods stay RLlib's; only its _forward_* hooks are ours
            not {"forward_exploration", "forward_inference"} & set(vars(type(module))),
            patched,
            module.get_state().keys() == module.unwrapped().get_state().keys(),
        )

    for (
        wrapped,
        inner,
        public_forward,
        patched,
        same_state,
    ) in algorithm.env_runner_group.foreach_env_runner(inspect, local_env_runner=False):
        assert wrapped and inner != "ServerInferenceRLModule"
        assert public_forward
        assert patched == []
        assert same_state


def test_restoring_an_older_checkpoint_into_the_running_algorithm_reaches_the_server(
    seed_algo, tmp_path
):
    algorithm, _ = seed_algo
    train_until_learned(algorithm)
    path = algorithm.save_to_path(str(tmp_path / "old"))
    obs = probe_obs()
    saved_logits = module_logits(learner_module(algorithm), obs)
    train_until_learned(algorithm)
    version_before, logits_before = server_logits(algorithm, obs)
    assert not np.allclose(logits_before, saved_logits, atol=1e-5)

    algorithm.restore_from_path(path)

    version, logits = server_logits(algorithm, obs)
    assert version > version_before
    np.testing.assert_allclose(logits, saved_logits, atol=1e-5)
    train_until_learned(algorithm)  # training goes on


def test_checkpoint_restores_into_a_fresh_algorithm_and_training_continues(seed_algo, tmp_path):
    algorithm, _ = seed_algo
    train_until_learned(algorithm)
    path = algorithm.save_to_path(str(tmp_path / "ckpt"))
    saved = state_of(learner_module(algorithm))
    obs = probe_obs()
    saved_logits = module_logits(learner_module(algorithm), obs)

    restored = small_config().build_algo()
    try:
        assert not same_weights(state_of(learner_module(restored)), saved)
        restored.restore_from_path(path)
        assert same_weights(state_of(learner_module(restored)), saved)
        # The restored weights went to the fresh algorithm's server.
        _, logits = server_logits(restored, obs)
        np.testing.assert_allclose(logits, saved_logits, atol=1e-5)
        np.testing.assert_allclose(
            module_logits(restored.get_module(), obs), saved_logits, atol=1e-5
        )
        result = train_until_learned(restored)
        assert result["central_inference"]["requests_per_s"] > 0
        assert result["central_inference"]["version"] >= 2  # restored weights, then new ones
        assert not same_weights(state_of(learner_module(restored)), saved)  # it learned on
    finally:
        restored.stop()


# ---- faults and shutdown (an algorithm of their own) ---------------------------------------------


# make test-long: in make test, tests/test_multi_node.py restarts a VTrace SEED runner and its
# server on a new node (reconnected, weights pushed again, training on), and the GorilaDQN chaos
# run kills runners and the same inference server
@pytest.mark.long
def test_killed_runner_and_inference_server_restart_and_stop_leaves_no_actors(ray_session):
    """One algorithm, two faults in turn. A killed runner is restarted by RLlib and registers
    with the server again under its old name. A killed server is restarted by Ray with initial
    weights; the runners wait out the restart and the next push brings the learner's weights
    back, so training goes on. stop() then leaves no actor behind."""
    before = alive_actor_classes()
    algorithm = small_config().build_algo()
    try:
        started = [name for i, name in alive_actor_classes().items() if i not in before]
        assert started.count("InferenceServer") == 1
        # the runners hold no weights: no IMPALA EnvRunnerStateServer to carry them
        assert "EnvRunnerStateServer" not in started, started
        for _ in range(10):
            result = algorithm.train()
            if result["central_inference"]["num_requests"] > 0:
                break
        requests_before = result["central_inference"]["num_requests"]
        ray.kill(algorithm.env_runner_group._worker_manager._actors[1], no_restart=False)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            result = algorithm.train()
            metrics = result["central_inference"]
            healthy = algorithm.env_runner_group.num_healthy_remote_workers()
            if (
                healthy == 2
                and metrics["caller_restarts"] >= 1
                and metrics["num_requests"] > requests_before + 200
            ):
                break
        assert healthy == 2
        assert metrics["caller_restarts"] >= 1  # runner 1 registered again
        assert metrics["num_callers"] == 2  # under its old name, no new caller
        assert metrics["num_requests"] > requests_before + 200  # requests kept flowing
        connected = dict(
            algorithm.env_runner_group.foreach_env_runner(
                lambda r: (r.worker_index, r._inference_server is not None),
                local_env_runner=False,
            )
        )
        assert connected == {1: True, 2: True}
        # The restarted runner samples through the server again.
        sampled = dict(
            algorithm.env_runner_group.foreach_env_runner(
                lambda r: (r.worker_index, len(r.sample(num_timesteps=8, explore=True)) > 0),
                local_env_runner=False,
            )
        )
        assert sampled == {1: True, 2: True}

        train_until_learned(algorithm)
        pushed_before = algorithm._inference.version
        ray.kill(algorithm._inference.handle, no_restart=False)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            metrics = algorithm.train().get("central_inference", {})
            # A fresh server instance counts from zero: these requests came after the restart.
            if metrics.get("num_requests", 0) > 200 and metrics.get("version", -1) > pushed_before:
                break
        assert metrics["num_requests"] > 200, metrics
        assert metrics["version"] > pushed_before, metrics  # learned weights after the restart
        assert metrics["num_callers"] == 2  # both runners, known again from their requests
        assert server_restarts(algorithm._inference.handle) >= 1
        assert algorithm.env_runner_group.num_healthy_remote_workers() == 2
        obs = probe_obs()
        _, logits = server_logits(algorithm, obs)
        np.testing.assert_allclose(logits, module_logits(learner_module(algorithm), obs), atol=1e-5)
    finally:
        algorithm.stop()
    assert actors_left_since(before) == []
