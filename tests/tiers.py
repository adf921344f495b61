"""The three test tiers, marked per test, and the guard that keeps the fast tier honest.

- ``fast`` (``make test-fast``): no process starts (no Ray, no subprocess, no multiprocessing);
  importing Ray is fine. Every test that carries none of the markers below is fast.
- ``ray``: starts Ray (actors, an algorithm, a cluster); ``subprocess``: runs a script or an
  interpreter. Both run in ``make test`` (what CI runs) together with the fast tier.
- ``long``: outside CI (``make test-long``): learning tests over several seeds, long smoke runs.
  ``make test-long`` also runs the CI seed of every learning test (marked ``learning``), so that
  it shows each learning test over all of :data:`LEARNING_SEEDS`. A learning test records its
  checks in the ``learning_curve`` fixture; the session's summary lists them with each outcome.

A test that requests a fixture that starts Ray (``ray_session``, ``ray_nodes``, or any fixture
built on them) is marked ``ray`` without saying so. Fast tests run first in every session, while
no Ray is up; a fast test that starts a process there fails and says which marker it lacks.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import platform
import subprocess
import threading
from collections.abc import Iterator

import pytest

TIER_MARKERS = ("ray", "subprocess", "long")
#: Threads whose process starts the fast tier's guard lets through: the session's script runs
#: (tests/script_pool.py), which start beside the fast tier
BACKGROUND_THREAD_PREFIX = "script-runs"
#: Fixtures whose users start Ray (directly or through a fixture built on them).
RAY_FIXTURES = frozenset({"ray_session", "ray_nodes"})


class ProcessStartedInFastTest(BaseException):
    """A test of the fast tier started a process: it belongs in another tier. A
    ``BaseException``, so that no ``except Exception`` (or ``pytest.raises``) swallows it."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "fast: no process starts (the default; set by tiers.py)")
    config.addinivalue_line("markers", "ray: starts Ray (actors, an algorithm or a cluster)")
    config.addinivalue_line("markers", "subprocess: runs a script or interpreter of its own")
    config.addinivalue_line(
        "markers", "long: outside CI (make test-long): several seeds, long budgets"
    )
    config.addinivalue_line(
        "markers", "learning: a learning test (make test-long runs all its seeds)"
    )
    # The platform module asks `uname -p` the first time anything wants the processor's name
    # (e.g. an import in a fast test): ask now, so that no fast test is blamed for that process.
    platform.processor()


def is_fast(item: pytest.Item) -> bool:
    return not any(item.get_closest_marker(name) for name in TIER_MARKERS)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test's tier and run the fast tier first (stable order otherwise)."""
    for item in items:
        if item.get_closest_marker("learning") and "learning_curve" not in item.fixturenames:
            raise pytest.UsageError(
                f"{item.nodeid}: a learning test records its checks in the "
                "learning_curve fixture (the session's summary lists them)"
            )
        if RAY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.ray)
        if is_fast(item):
            item.add_marker(pytest.mark.fast)
    items.sort(key=lambda item: not is_fast(item))


@contextlib.contextmanager
def _no_process_starts(nodeid: str) -> Iterator[None]:
    def refuse(what: str) -> None:
        if threading.current_thread().name.startswith(BACKGROUND_THREAD_PREFIX):
            return
        raise ProcessStartedInFastTest(
            f"{nodeid} is a fast test (it carries none of the markers {TIER_MARKERS}) but "
            f"started a process ({what}). Mark it @pytest.mark.ray if it starts Ray (or request "
            "the ray_session fixture), @pytest.mark.subprocess if it runs a script"
        )

    saved = subprocess.Popen._execute_child, multiprocessing.process.BaseProcess.start

    def popen_child(self, args, *rest, **kwargs):
        refuse(f"subprocess {args!r}"[:200])
        return saved[0](self, args, *rest, **kwargs)

    def process_start(self):
        refuse(f"multiprocessing {type(self).__name__}")
        return saved[1](self)

    subprocess.Popen._execute_child = popen_child  # type: ignore[method-assign]
    multiprocessing.process.BaseProcess.start = process_start  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen._execute_child, multiprocessing.process.BaseProcess.start = saved


def _guarded(item: pytest.Item):
    """A fast test's setup or call runs with process starts refused; other tests' as they are."""
    with _no_process_starts(item.nodeid) if is_fast(item) else contextlib.nullcontext():
        yield


pytest_runtest_setup = pytest.hookimpl(hookwrapper=True)(_guarded)
pytest_runtest_call = pytest.hookimpl(hookwrapper=True)(_guarded)


#: Seeds of every learning test: the first runs in ``make test`` (CI); ``make test-long``
#: (``-m "long or learning"``) runs all five.
LEARNING_SEEDS = (0, 1, 2, 3, 4)


def learning_seeds(ci: int = LEARNING_SEEDS[0]) -> list:
    """``@pytest.mark.parametrize("seed", learning_seeds())`` on a learning test: every seed is
    marked ``learning``, all but the ``ci`` seed (the one ``make test`` runs; the first by
    default) ``long``."""
    if ci not in LEARNING_SEEDS:
        raise ValueError(f"ci={ci!r} is not one of LEARNING_SEEDS {LEARNING_SEEDS}")
    return [
        pytest.param(
            seed,
            id=f"seed{seed}",
            marks=pytest.mark.learning if seed == ci else [pytest.mark.learning, pytest.mark.long],
        )
        for seed in LEARNING_SEEDS
    ]


_CURVE = pytest.StashKey[list]()
_OUTCOME = pytest.StashKey[str]()


@pytest.fixture
def learning_curve(request: pytest.FixtureRequest) -> list:
    """The checks a learning test made (e.g. ``(env steps, greedy return)``), in order: the
    test extends this list, and the session's summary lists every learning test's checks with
    its outcome (what ``make test-long`` reports per seed)."""
    checks: list = []
    request.node.stash[_CURVE] = checks
    return checks


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if _CURVE in item.stash and (report.when == "call" or report.failed):
        item.stash[_OUTCOME] = report.outcome.upper()
        item.config.stash.setdefault(_CURVE, []).append(item)


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    items = config.stash.get(_CURVE, [])
    if not items:
        return
    terminalreporter.section("learning tests: outcome and checks")
    for item in dict.fromkeys(items):  # once each (a failed setup and call report twice)
        terminalreporter.write_line(f"{item.stash[_OUTCOME]} {item.nodeid}: {item.stash[_CURVE]}")
