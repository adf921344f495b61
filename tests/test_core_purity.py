"""The core (rl_dist_ext) imports Ray only in its named Ray modules, never Tianshou, and gymnasium
only in its pixel env makers; ops/ imports numpy, torch and the standard library only; packages
ship py.typed."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
OPS_DIR = REPO_ROOT / "rl_dist_ext" / "ops"

CORE_DIR = REPO_ROOT / "rl_dist_ext"
CORE_FILES = sorted(CORE_DIR.rglob("*.py"))
#: The only core modules that may import Ray: the actor starters (where ``ray.remote`` is
#: applied), the actor pool and the parts of the distributed replay client that talk to shards.
RAY_MODULES = {
    "rl_dist_ext/ray_actors.py",
    "rl_dist_ext/actor_pool.py",
    "rl_dist_ext/replay/distributed/client.py",
    "rl_dist_ext/replay/distributed/shard_actor.py",
    "rl_dist_ext/replay/distributed/shards.py",
    "rl_dist_ext/replay/distributed/inserts.py",
    "rl_dist_ext/replay/distributed/sampling.py",
}
NEVER_IN_CORE = {"ray", "tianshou", "gymnasium", "gym"}
#: The one core module that may import gymnasium: the pixel env makers both adapters share
#: (Atari/MinAtar wrappers); no other core module imports it.
GYMNASIUM_MODULES = {"rl_dist_ext/pixel_envs.py"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


CORE_MODULES = [
    _module_name(p) for p in CORE_FILES if str(p.relative_to(REPO_ROOT)) not in RAY_MODULES
]
FORBIDDEN_TOP_LEVEL = ("ray", "tianshou")

ALLOWED_OPS_IMPORTS = {
    "numpy",
    "torch",
    "typing",
    "__future__",
    "collections",
    "dataclasses",
    "math",
    "numbers",
    "functools",
    "rl_dist_ext",
}
NEVER_IN_OPS = {"ray", "tianshou", "gymnasium", "gym", "numba"}

_PROBE = """
import importlib, json, sys
for name in {modules!r}:
    importlib.import_module(name)
forbidden = {forbidden!r}
bad = sorted(
    m for m in sys.modules
    if any(m == f or m.startswith(f + ".") for f in forbidden)
)
print(json.dumps(bad))
"""


@pytest.mark.subprocess  # a fresh interpreter: this one has loaded Ray already
def test_core_import_does_not_load_ray_or_tianshou():
    code = _PROBE.format(modules=CORE_MODULES, forbidden=FORBIDDEN_TOP_LEVEL)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    bad = json.loads(proc.stdout.strip().splitlines()[-1])
    assert bad == [], f"core import pulled in forbidden modules: {bad}"


def _top_level_imports(path: Path) -> list[tuple[int, str]]:
    """(lineno, top-level module) for every absolute import in the file, at any nesting."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name.split(".")[0]) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: inside rl_dist_ext by construction
                continue
            assert node.module is not None
            found.append((node.lineno, node.module.split(".")[0]))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", None))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value.split(".")[0]))
    return found


OPS_FILES = sorted(OPS_DIR.rglob("*.py"))


def test_no_core_module_imports_the_pixel_env_makers():
    for path in CORE_FILES:
        if str(path.relative_to(REPO_ROOT)) not in GYMNASIUM_MODULES:
            assert "pixel_envs" not in path.read_text(encoding="utf-8"), path


def test_ray_modules_exist_and_every_other_core_module_is_probed():
    for name in RAY_MODULES | GYMNASIUM_MODULES:
        assert (REPO_ROOT / name).is_file(), name
    assert "rl_dist_ext.gorila.learner" in CORE_MODULES
    assert "rl_dist_ext.inference" in CORE_MODULES
    assert len(CORE_MODULES) + len(RAY_MODULES) == len(CORE_FILES)


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_core_imports_ray_only_in_its_ray_modules(path):
    name = str(path.relative_to(REPO_ROOT))
    allowed_here = {"ray"} if name in RAY_MODULES else set()
    if name in GYMNASIUM_MODULES:
        allowed_here |= {"gymnasium"}
    offenders = [
        f"line {lineno}: {top}"
        for lineno, top in _top_level_imports(path)
        if top in NEVER_IN_CORE - allowed_here
    ]
    assert not offenders, f"{name} imports " + "; ".join(offenders)


def test_ops_files_found():
    names = {p.name for p in OPS_FILES}
    assert {"__init__.py", "vtrace.py", "nstep.py", "priorities.py", "dqn.py"} <= names


@pytest.mark.parametrize("path", OPS_FILES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_ops_imports_are_pure(path):
    stdlib = set(sys.stdlib_module_names)
    offenders = []
    for lineno, top in _top_level_imports(path):
        if top in NEVER_IN_OPS:
            offenders.append(f"line {lineno}: {top} (forbidden in ops)")
        elif top not in ALLOWED_OPS_IMPORTS and top not in stdlib:
            offenders.append(f"line {lineno}: {top} (not numpy/torch/stdlib/rl_dist_ext)")
    assert not offenders, f"{path.relative_to(REPO_ROOT)}: " + "; ".join(offenders)


def test_import_scanner_sees_forbidden_imports(tmp_path):
    """Guard the guard: the AST scan does catch the imports it is meant to forbid."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import ray\n"
        "from tianshou.data import Batch\n"
        "def f():\n"
        "    import numba\n"
        "    import importlib\n"
        "    return importlib.import_module('gymnasium.spaces')\n"
        "from . import sibling\n",
        encoding="utf-8",
    )
    tops = {top for _, top in _top_level_imports(probe)}
    assert {"ray", "tianshou", "numba", "gymnasium"} <= tops


@pytest.mark.parametrize("package", ["rl_dist_ext", "rllib_plugins", "tianshou_plugins"])
def test_package_imports_and_ships_py_typed(package):
    mod = importlib.import_module(package)
    init = Path(mod.__file__)
    assert init.name == "__init__.py"
    marker = init.parent / "py.typed"
    assert marker.is_file(), f"{package} lacks py.typed next to {init}"


def test_pyproject_packages_py_typed():
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools_cfg = config["tool"]["setuptools"]
    package_data = setuptools_cfg["package-data"]
    shipped = {key for key, files in package_data.items() if "py.typed" in files}
    assert shipped & {"*", "rl_dist_ext", "rllib_plugins", "tianshou_plugins"}
    if "*" not in shipped:
        assert {"rl_dist_ext", "rllib_plugins", "tianshou_plugins"} <= shipped
    include = setuptools_cfg["packages"]["find"]["include"]
    for pkg in ("rl_dist_ext", "rllib_plugins", "tianshou_plugins"):
        assert any(pattern.startswith(pkg) for pattern in include), pkg


# ---- Python 3.10 (the declared minimum) ---------------------------------------------------
PACKAGE_FILES = sorted(
    path
    for package in ("rl_dist_ext", "rllib_plugins", "tianshou_plugins")
    for path in (REPO_ROOT / package).rglob("*.py")
)
#: typing names added after Python 3.10: import them from typing_extensions on 3.10.
TYPING_AFTER_310 = {
    "Self", "Never", "LiteralString", "TypeVarTuple", "Unpack", "Required", "NotRequired",
    "assert_never", "assert_type", "reveal_type", "dataclass_transform", "override",
    "TypeAliasType", "get_overloads", "clear_overloads", "ReadOnly", "TypeIs",
}  # fmt: skip


def _typing_imports_outside_import_error_guard(tree: ast.AST) -> list[tuple[int, str]]:
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
            for h in node.handlers
        ):
            guarded.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return [
        (node.lineno, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "typing" and id(node) not in guarded
        for alias in node.names
        if alias.name in TYPING_AFTER_310
    ]


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_package_parses_as_python_310_and_takes_newer_typing_names_guarded(path):
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path), feature_version=(3, 10))
    offenders = _typing_imports_outside_import_error_guard(tree)
    assert not offenders, f"{path.relative_to(REPO_ROOT)}: typing names newer than 3.10 {offenders}"


def test_python_310_guard_sees_an_unguarded_self():
    bad = ast.parse("from typing import Any, Self\n")
    good = ast.parse(
        "try:\n    from typing import Self\nexcept ImportError:\n"
        "    from typing_extensions import Self\n"
    )
    assert _typing_imports_outside_import_error_guard(bad) == [(1, "Self")]
    assert _typing_imports_outside_import_error_guard(good) == []
