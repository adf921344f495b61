"""Write ``docs/configuration.md``, the configuration reference, from the code.

Every table comes from the config classes themselves: the settings and their defaults from the
signatures, dataclass fields and default config objects, the descriptions from the docstrings'
``Args:`` / ``Attributes:`` sections. ``make docs`` runs this first; a test
(``tests/test_docs.py``) checks that the committed page is what this writes and that every
setting has a description.

Usage: ``python docs/gen_configuration.py [--check]`` (``--check``: exit 1 if the page is out
of date, write nothing).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import re
import sys
from pathlib import Path
from typing import Any

PAGE = Path(__file__).resolve().parent / "configuration.md"

HEADER = """# Configuration reference

Generated from the code by `docs/gen_configuration.py` (`make docs`); a test fails when this
page and the code disagree. Every setting is checked when its object is built (RLlib: when the
algorithm is built, so Tune search spaces work), and a bad value raises a `ValueError` or
`TypeError` naming the setting, the value and what is allowed, before any actor starts.

Settings live in one object per concern, shared by both frameworks: the replay's in
`DistributedReplayConfig`, SEED mode's in `CentralInference`, a Tianshou collector's actors in
`ActorFleet`. The RLlib configs and the Tianshou classes take their fields; where an adapter
sets another default, its table says so.
"""


def docstring_items(*objects: Any) -> dict[str, str]:
    """Name -> description from the ``Args:`` / ``Attributes:`` sections of the objects'
    docstrings (Google style, parsed by griffe as the API reference parses them)."""
    import griffe

    logging.getLogger("griffe").setLevel(logging.ERROR)
    items: dict[str, str] = {}
    for obj in objects:
        text = inspect.getdoc(obj) or ""
        for section in griffe.Docstring(text).parse("google"):
            if section.kind.value in ("parameters", "attributes"):
                for item in section.value:
                    items.setdefault(item.name, markdown(" ".join(item.description.split())))
    return items


def markdown(text: str) -> str:
    """Docstring markup (reStructuredText roles and literals) as Markdown."""
    text = re.sub(r":[a-z]+:`~?([^`]*?)`", lambda m: f"`{m.group(1).split('.')[-1]}`", text)
    return text.replace("``", "`")


def show(value: Any) -> str:
    """A default as a reader would write it."""
    if value is inspect.Parameter.empty:
        return "required"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed = {
            f.name: getattr(value, f.name)
            for f in dataclasses.fields(value)
            if getattr(value, f.name) != default_of(f)
        }
        inner = ", ".join(f"{k}={v!r}" for k, v in changed.items())
        return f"`{type(value).__name__}({inner})`"
    if isinstance(value, type):
        return f"`{value.__name__}`"
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1000:
        return f"`{int(value):_}.0`"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10_000:
        return f"`{value:_}`"
    return f"`{value!r}`"


def default_of(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return inspect.Parameter.empty


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(rows: list[tuple[str, Any, str]], *, where: str) -> str:
    missing = [name for name, _, description in rows if not description]
    if missing:
        raise ValueError(f"{where}: no description for {missing} in the docstring")
    lines = ["| setting | default | description |", "|---|---|---|"]
    lines += [f"| `{name}` | {show(value)} | {cell(text)} |" for name, value, text in rows]
    return "\n".join(lines) + "\n"


def dataclass_rows(cls: type, *, defaults: dict[str, Any] | None = None, own_only: bool = False):
    items = docstring_items(cls)
    fields = dataclasses.fields(cls)
    if own_only:
        fields = [f for f in fields if f.name in cls.__annotations__]
    defaults = defaults or {}
    return [(f.name, defaults.get(f.name, default_of(f)), items.get(f.name, "")) for f in fields]


def signature_rows(func: Any, *, config: Any = None):
    """A class's constructor or a config method's settings; ``config``: the default config
    object whose attributes are a method's defaults (RLlib's methods default to NotProvided)."""
    target = func.__init__ if inspect.isclass(func) else func
    items = docstring_items(func, target)
    rows = []
    for name, param in inspect.signature(target).parameters.items():
        if name == "self" or param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
            continue
        default = getattr(config, name) if config is not None else param.default
        rows.append((name, default, items.get(name, "")))
    return rows


def changed_defaults(ours: Any, theirs: Any, names: list[str]) -> str:
    """The framework settings whose default this adapter changes."""
    lines = ["| setting | here | the framework's |", "|---|---|---|"]
    for name in names:
        lines.append(f"| `{name}` | {show(getattr(ours, name))} | {show(getattr(theirs, name))} |")
    # the module's settings: RLlib's DefaultModelConfig under each algorithm's auto includes
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    base = dataclasses.asdict(DefaultModelConfig())
    ours_model, theirs_model = base | ours.model_config, base | theirs.model_config
    for key in sorted(set(ours_model) | set(theirs_model)):
        if ours_model.get(key) != theirs_model.get(key):
            here, framework = show(ours_model.get(key)), show(theirs_model.get(key))
            lines.append(f"| `model_config[{key!r}]` | {here} | {framework} |")
    return "\n".join(lines) + "\n"


def differing(ours: Any, theirs: Any, skip: set[str]) -> list[str]:
    names = []
    for attribute in vars(ours):
        name = attribute.lstrip("_")  # RLlib keeps some settings behind properties
        if name in skip or not hasattr(theirs, name) or not hasattr(ours, name):
            continue
        value = getattr(ours, name)
        plain = isinstance(value, (int, float, str, bool, type(None)))
        if plain and value != getattr(theirs, name):
            names.append(name)
    return sorted(set(names))


def rllib_sections() -> list[str]:
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.impala import IMPALAConfig

    from rl_dist_ext.inference import CentralInference
    from rl_dist_ext.replay.distributed import DistributedReplayConfig
    from rllib_plugins import GorilaDQNConfig, VTraceConfig
    from rllib_plugins.gorila import REPLAY_DEFAULTS, REPLAY_SETTINGS

    gorila, vtrace = GorilaDQNConfig(), VTraceConfig()
    replay_rows = [
        row
        for row in dataclass_rows(DistributedReplayConfig, defaults=REPLAY_DEFAULTS)
        if row[0] in REPLAY_SETTINGS
    ]
    replay_rows += [
        ("prioritized", gorila.replay_prioritized, "`False`: uniform replay (`alpha = beta = 0`)."),
        ("checkpoint", gorila.checkpoint_replay, "`False` leaves the replay out of checkpoints."),
    ]
    enabled = docstring_items(GorilaDQNConfig.central_inference)["enabled"]

    def seed_rows(config: Any) -> list[tuple[str, Any, str]]:
        return [
            ("enabled", config.central_inference_enabled, enabled),
            *dataclass_rows(CentralInference),
        ]

    skip = {"env_runner_cls", "algo_class", "target_network_update_freq"}
    return [
        "## RLlib: `GorilaDQNConfig`\n",
        "An RLlib `DQNConfig` (every DQN setting applies, except those noted in the "
        "[RLlib guide](rllib.md)); the Gorila settings are in `.training(...)`, the replay's in "
        "`.replay(...)` and SEED mode's in `.central_inference(...)`.\n",
        "### `.training(...)`: the Gorila settings\n",
        table(
            signature_rows(GorilaDQNConfig.training, config=gorila),
            where="GorilaDQNConfig.training",
        ),
        "### RLlib settings with other defaults here\n",
        changed_defaults(gorila, DQNConfig(), differing(gorila, DQNConfig(), skip)),
        "### `.replay(...)`\n",
        "The fields of `DistributedReplayConfig` (below), with this default where it differs: "
        + ", ".join(f"`{k}={v!r}`" for k, v in REPLAY_DEFAULTS.items())
        + ". `placement_group`, `bundle_indices` and `seed` are the algorithm's (its placement "
        "group, `debugging(seed=...)`).\n",
        table(replay_rows, where="GorilaDQNConfig.replay"),
        "### `.central_inference(...)`\n",
        table(seed_rows(gorila), where="GorilaDQNConfig.central_inference"),
        "## RLlib: `VTraceConfig`\n",
        "An RLlib `IMPALAConfig` (RLlib's V-trace settings `vtrace_clip_rho_threshold` and "
        "`vtrace_clip_pg_rho_threshold` apply).\n",
        "### `.training(...)`\n",
        table(signature_rows(VTraceConfig.training, config=vtrace), where="VTraceConfig.training"),
        "### RLlib settings with other defaults here\n",
        changed_defaults(vtrace, IMPALAConfig(), differing(vtrace, IMPALAConfig(), skip)),
        "### `.central_inference(...)`\n",
        table(seed_rows(vtrace), where="VTraceConfig.central_inference"),
    ]


def tianshou_sections() -> list[str]:
    from tianshou_plugins import (
        VTRACE_FLEET,
        DistributedPrioritizedReplayBuffer,
        GorilaCollector,
        GorilaDQN,
        MultiAgentDistributedReplayBuffer,
        VTrace,
        VTraceCollector,
    )

    out = ["## Tianshou\n"]
    for cls, note in (
        (GorilaDQN, "A Tianshou off-policy algorithm."),
        (GorilaCollector, "Its actors take the fields of `ActorFleet` (below) as keywords."),
        (
            DistributedPrioritizedReplayBuffer,
            "Takes the fields of `DistributedReplayConfig` (below) as keywords.",
        ),
        (
            MultiAgentDistributedReplayBuffer,
            "Takes the fields of `DistributedReplayConfig` (below) as keywords.",
        ),
        (VTrace, "A Tianshou on-policy algorithm."),
        (
            VTraceCollector,
            "Its actors take the fields of `ActorFleet` (below) as keywords; its defaults are "
            "V-trace's: "
            + ", ".join(
                f"`{f.name}={getattr(VTRACE_FLEET, f.name)!r}`"
                for f in dataclasses.fields(VTRACE_FLEET)
                if getattr(VTRACE_FLEET, f.name) != default_of(f)
            )
            + ".",
        ),
    ):
        rows = signature_rows(cls)
        out += [f"### `{cls.__name__}`\n", note + "\n", table(rows, where=cls.__name__)]
    return out


def settings_sections() -> list[str]:
    from rl_dist_ext.inference import CentralInference
    from rl_dist_ext.replay import ObsCompression
    from rl_dist_ext.replay.distributed import DistributedReplayConfig
    from tianshou_plugins import ActorFleet
    from tianshou_plugins.highlevel import (
        GorilaDQNParams,
        GorilaParams,
        VTraceActorParams,
        VTraceParams,
    )

    out = ["## Settings objects\n"]
    for cls, own_only, note in (
        (DistributedReplayConfig, False, "`rl_dist_ext.replay.distributed`: the replay."),
        (ObsCompression, False, "`rl_dist_ext.replay`: compressed pixel observations."),
        (CentralInference, False, "`rl_dist_ext.inference`: SEED mode's server."),
        (ActorFleet, False, "`tianshou_plugins`: a Tianshou collector's actors."),
        (
            GorilaDQNParams,
            True,
            "`tianshou_plugins.highlevel`: `GorilaDQNExperimentBuilder`'s algorithm settings, "
            "besides Tianshou's `DQNParams` ones.",
        ),
        (GorilaParams, False, "`tianshou_plugins.highlevel`: `GorilaDQNExperimentBuilder`."),
        (
            VTraceParams,
            True,
            "`tianshou_plugins.highlevel`: `VTraceExperimentBuilder`'s algorithm settings, "
            "besides Tianshou's `A2CParams` ones.",
        ),
        (VTraceActorParams, False, "`tianshou_plugins.highlevel`: `VTraceExperimentBuilder`."),
    ):
        rows = dataclass_rows(cls, own_only=own_only)
        out += [f"### `{cls.__name__}`\n", note + "\n", table(rows, where=cls.__name__)]
    return out


def render() -> str:
    parts = [HEADER, *rllib_sections(), *tianshou_sections(), *settings_sections()]
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if PAGE.read_text() != text:
            print(f"{PAGE} is out of date: run python docs/gen_configuration.py")
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
