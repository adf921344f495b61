"""The tiers' rules hold: a test's tier comes from its markers and fixtures, fast tests run
first, and a fast test that starts a process fails, naming the marker it lacks (pytester runs
an inner session in this process)."""

from __future__ import annotations

import pytest

INNER = """
import subprocess

import pytest


@pytest.fixture
def ray_session():  # stands for the real one: requesting it puts a test in the ray tier
    return None


@pytest.mark.subprocess
def test_marked_a_script_run():
    pass


def test_asks_for_ray(ray_session):
    pass


def test_starts_a_process_unmarked():
    subprocess.run(["true"], check=False)


def test_plain():
    pass
"""


def test_tiers_come_from_markers_and_fixtures_and_fast_tests_run_first(pytester):
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_inprocess("-p", "tiers", "--collect-only", "-q")
    order = [line.split("::")[1] for line in result.outlines if "::" in line]
    assert order == [
        "test_starts_a_process_unmarked",
        "test_plain",
        "test_marked_a_script_run",
        "test_asks_for_ray",
    ]
    fast = pytester.runpytest_inprocess("-p", "tiers", "--collect-only", "-q", "-m", "fast")
    assert [line for line in fast.outlines if "::" in line] == [
        "test_inner.py::test_starts_a_process_unmarked",
        "test_inner.py::test_plain",
    ]
    ray_tier = pytester.runpytest_inprocess("-p", "tiers", "--collect-only", "-q", "-m", "ray")
    assert [line for line in ray_tier.outlines if "::" in line] == [
        "test_inner.py::test_asks_for_ray"
    ]


def test_a_fast_test_that_starts_a_process_fails_and_names_the_marker_it_lacks(pytester):
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_inprocess("-p", "tiers", "-m", "fast")
    result.assert_outcomes(passed=1, failed=1)
    output = result.stdout.str()
    assert (
        "ProcessStartedInFastTest: test_inner.py::test_starts_a_process_unmarked is a fast test"
        in output
    )
    assert "started a process (subprocess ['true'])" in output
    assert "@pytest.mark.subprocess if it runs a script" in output


def test_learning_seeds_mark_all_but_the_ci_seed_long():
    from tiers import LEARNING_SEEDS, learning_seeds

    for ci in (LEARNING_SEEDS[0], LEARNING_SEEDS[-1]):
        params = learning_seeds(ci=ci)
        assert [p.values[0] for p in params] == list(LEARNING_SEEDS)
        for param in params:
            names = {mark.name for mark in param.marks}
            assert names == ({"learning"} if param.values[0] == ci else {"learning", "long"})
    with pytest.raises(ValueError, match="ci=99"):
        learning_seeds(ci=99)
