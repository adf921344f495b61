"""Every settings object's fields against hostile values, property-based: each field in turn gets
a value of the wrong type, out of range, NaN or infinite, empty or huge. Construction either
works (the value is one the field allows) or raises ``ValueError``/``TypeError`` whose message
names the field; never another exception, never one that leaves the reader guessing which field.
Nothing starts here: these objects are checked where they are built, before any actor."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl_dist_ext.inference import CentralInference, InferenceServerConfig
from rl_dist_ext.replay.compression import ObsCompression
from rl_dist_ext.replay.distributed import DistributedReplayConfig
from rl_dist_ext.replay.rate_limiter import RateLimit
from rllib_plugins.gorila import REPLAY_SETTINGS
from tianshou_plugins.actor_collector import ActorFleet
from tianshou_plugins.highlevel import GorilaParams, VTraceActorParams

CONFIGS = [
    DistributedReplayConfig,
    RateLimit,
    ObsCompression,
    InferenceServerConfig,
    CentralInference,
    ActorFleet,
    GorilaParams,
    VTraceActorParams,
]

HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 2**63, float("nan"), float("inf"), -float("inf"), 0.0, -0.5]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.sampled_from(["", "s3://", "auto", "SPREAD", "lz4", "cuda", "fp16"]),
    st.lists(st.integers(-2, 3), max_size=3),
    st.tuples(st.text(max_size=3)),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.builds(object),
)

FIELDS = [(cls, f.name) for cls in CONFIGS for f in dataclasses.fields(cls) if f.init]


def mentions(message: str, name: str) -> bool:
    """The field's name, or its words (``max_batch_size`` as "max batch size")."""
    return name in message or name.replace("_", " ") in message


@pytest.mark.parametrize(
    "cls, name", FIELDS, ids=[f"{cls.__name__}.{name}" for cls, name in FIELDS]
)
@given(value=HOSTILE)
def test_a_hostile_field_value_is_taken_or_refused_by_name(cls, name, value):
    try:
        cls(**{name: value})
    except (ValueError, TypeError) as error:
        assert mentions(str(error), name), f"{cls.__name__}({name}={value!r}) raised {error!r}"


# ---- the RLlib configs: their own fields, checked by validate() (config.build_algo() runs it) --

GORILA_TRAINING = (
    "target_update_every_n_updates",
    "weight_sync_every_n_steps",
    "updates_per_iteration",
    "updates_per_learner_call",
    "env_steps_per_request",
    "publish_every_n_updates",
    "epsilon_base",
    "epsilon_alpha",
    "weights_encoding",
    "weights_delta_tolerance",
    "tau",  # DQN's, checked by GorilaDQN (None: picked from the target period)
    "adam_epsilon",  # DQN's, used by GorilaDQN's learner
)
RLLIB_FIELDS = [("replay", name) for name in sorted(REPLAY_SETTINGS)] + [
    ("training", name) for name in GORILA_TRAINING
]


@pytest.mark.parametrize("method, name", RLLIB_FIELDS, ids=[n for _, n in RLLIB_FIELDS])
@given(value=HOSTILE)
def test_a_hostile_gorila_setting_is_taken_or_refused_by_name_on_validate(method, name, value):
    from rllib_plugins import GorilaDQNConfig

    config = GorilaDQNConfig().environment("CartPole-v1")
    try:
        getattr(config, method)(**{name: value}).validate()
    except (ValueError, TypeError) as error:
        assert mentions(str(error), name), f"{method}({name}={value!r}) raised {error!r}"


@pytest.mark.parametrize(
    "name", ["vtrace_lambda", "vtrace_clip_rho_threshold", "vtrace_clip_pg_rho_threshold"]
)
@given(value=HOSTILE)
def test_a_hostile_vtrace_setting_is_taken_or_refused_by_name_on_validate(name, value):
    from rllib_plugins import VTraceConfig

    config = VTraceConfig().environment("CartPole-v1")
    try:
        config.training(**{name: value}).validate()
    except (ValueError, TypeError) as error:
        assert mentions(str(error), name), f"training({name}={value!r}) raised {error!r}"


def test_the_environment_can_only_lengthen_the_wait_for_actors_to_start(monkeypatch):
    from rl_dist_ext.validation import START_TIMEOUT_ENV, start_timeout_s

    monkeypatch.delenv(START_TIMEOUT_ENV, raising=False)
    assert start_timeout_s(120.0) == 120.0
    monkeypatch.setenv(START_TIMEOUT_ENV, "600")
    assert start_timeout_s(120.0) == 600.0
    assert start_timeout_s(900.0) == 900.0  # a floor: a longer configured wait stands
    monkeypatch.setenv(START_TIMEOUT_ENV, " ")
    assert start_timeout_s(120.0) == 120.0
    for bad in ("soon", "0", "-5", "nan", "inf"):
        monkeypatch.setenv(START_TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=rf"RL_DIST_EXT_START_TIMEOUT_S='{bad}': give a"):
            start_timeout_s(120.0)


@pytest.mark.fast
@pytest.mark.parametrize("value", ["Huber", "", None, 1, ["huber"], {"huber": 1}, b"huber"])
def test_a_choice_outside_the_allowed_strings_is_refused_by_name(value):
    from rl_dist_ext.validation import check_choice

    with pytest.raises(ValueError, match=r"loss_type must be one of \['huber', 'mse'\], got "):
        check_choice("loss_type", value, ("huber", "mse"))
    assert check_choice("loss_type", "mse", ("huber", "mse")) == "mse"
