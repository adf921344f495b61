"""The pure core (rl_dist_ext) must not pull in Ray, RLlib or Tianshou; packages ship py.typed."""

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

CORE_MODULES = [
    "rl_dist_ext",
    "rl_dist_ext.ops.vtrace",
    "rl_dist_ext.ops.nstep",
    "rl_dist_ext.ops.priorities",
    "rl_dist_ext.exploration",
    "rl_dist_ext.replay",
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


def test_ops_files_found():
    names = {p.name for p in OPS_FILES}
    assert {"__init__.py", "vtrace.py", "nstep.py", "priorities.py"} <= names


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
