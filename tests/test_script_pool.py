"""The session's script runs (tests/script_pool.py): low priority, a time limit counted from
when a test waits, one more try in the foreground for a run that failed in the background."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from script_pool import NICE, START_TIMEOUT_S, ScriptPool

pytestmark = pytest.mark.subprocess


def script(tmp_path: Path, name: str, code: str) -> Path:
    path = tmp_path / name
    path.write_text(code)
    return path


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """One pool (one zygote) for the module; each test submits runs of its own."""
    pool = ScriptPool(tmp_path_factory.mktemp("pool"))
    yield pool
    pool.close()


def test_runs_at_low_priority_with_their_own_argv_and_folder(pool, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    code = (
        "import os, sys\n"
        "from rl_dist_ext.validation import start_timeout_s\n"
        "print(os.nice(0), sys.argv[1:], os.getcwd(), start_timeout_s(120.0))\n"
    )
    pool.submit("show", [script(tmp_path, "show.py", code), "--flag", "1"], cwd=folder)
    output = pool.output("show")
    assert int(output.split()[0]) == min(os.nice(0) + NICE, 19)
    assert "['--flag', '1']" in output and str(folder) in output
    # a run's actors may take as long to start as the idle priority makes them
    assert output.split()[-1] == f"{float(START_TIMEOUT_S)}"


def test_the_time_limit_counts_from_when_a_test_waits(pool, tmp_path):
    sleeper = script(tmp_path, "sleep.py", "import time\ntime.sleep(4)\n")
    pool.submit("sleep", [sleeper], timeout=3.0)
    time.sleep(3.5)  # nobody waits yet: the run is not stopped
    pool.output("sleep")  # finishes ~0.5 s after the wait began


def test_a_run_past_its_limit_is_killed_and_fails_its_test(pool, tmp_path):
    sleeper = script(tmp_path, "forever.py", "import time\ntime.sleep(600)\n")
    pool.submit("forever", [sleeper], timeout=1.0)
    started = time.monotonic()
    with (
        pytest.warns(UserWarning, match="failed in the background"),
        pytest.raises(AssertionError, match="timed out 1 s after its test waited"),
    ):
        pool.output("forever")  # both tries time out
    assert time.monotonic() - started < 30


def test_a_background_failure_is_retried_in_the_foreground_and_reported(pool, tmp_path):
    marker = tmp_path / "failed-once"
    code = (
        "import pathlib, sys\n"
        f"marker = pathlib.Path({str(marker)!r})\n"
        "if not marker.exists():\n"
        "    marker.touch()\n"
        "    sys.exit('starved')\n"
        "print('second try')\n"
    )
    pool.submit("flaky", [script(tmp_path, "flaky.py", code)])
    with pytest.warns(UserWarning, match="(?s)failed in the background.*starved"):
        assert "second try" in pool.output("flaky")


def test_a_failure_before_its_test_waits_is_retried_in_the_background(pool, tmp_path):
    tries = tmp_path / "tries"
    code = (
        "import pathlib, sys\n"
        f"tries = pathlib.Path({str(tries)!r})\n"
        "with tries.open('a') as f:\n"
        "    f.write('x')\n"
        "if len(tries.read_text()) == 1:\n"
        "    sys.exit('starved')\n"
        "print('second try')\n"
    )
    pool.submit("flaky-early", [script(tmp_path, "flaky_early.py", code)])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(tries.read_text() if tries.exists() else "") < 2:
        time.sleep(0.1)  # nobody waits yet: the failed run goes again on its own
    with pytest.warns(UserWarning, match="(?s)failed in the background.*again in the background"):
        assert "second try" in pool.output("flaky-early")
    assert tries.read_text() == "xx"  # no foreground try


def test_a_run_that_fails_twice_fails_its_test_with_its_output(pool, tmp_path):
    pool.submit("broken", [script(tmp_path, "broken.py", "raise SystemExit('always broken')\n")])
    with pytest.warns(UserWarning), pytest.raises(AssertionError, match="always broken"):
        pool.output("broken")


def test_a_retry_starts_from_the_output_folder_as_it_was_submitted(pool, tmp_path):
    """A failed try leaves what it wrote in the run's output folder (a timed-out experiment's
    folder, say); the next try must not find it there, or the test checks two runs' output
    (it did: a hl example rerun left two experiment folders). Files that were there when the
    run was submitted (a snippet's own script) stay."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "given.txt").write_text("kept")
    marker = tmp_path / "failed-once"
    code = (
        "import pathlib, sys, uuid\n"
        f"out, marker = pathlib.Path({str(out)!r}), pathlib.Path({str(marker)!r})\n"
        "(out / f'run-{uuid.uuid4().hex}').mkdir()\n"
        "if not marker.exists():\n"
        "    marker.touch()\n"
        "    sys.exit('starved')\n"
        "print('second try')\n"
    )
    pool.submit("leftovers", [script(tmp_path, "leftovers.py", code)], out_dir=out)
    with pytest.warns(UserWarning, match="failed in the background"):
        assert "second try" in pool.output("leftovers")
    runs = sorted(path.name for path in out.iterdir() if path.name.startswith("run-"))
    assert len(runs) == 1, runs
    assert (out / "given.txt").read_text() == "kept"


SESSION_FAST = """
import subprocess
import time
from pathlib import Path

import pytest


def test_a_fast_test_sees_the_run_start_and_may_not_start_one_itself():
    started = Path("started")
    deadline = time.monotonic() + 300
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert started.exists(), "the session's run had not started during the fast tier"
    subprocess.run(["true"], check=False)
"""

SESSION_RUNS = """
from pathlib import Path

import pytest
from script_pool import session_pool


def script_runs(pool, selected, mktemp):
    code = "from pathlib import Path; Path(%r).write_text('yes')" % str(Path("started").resolve())
    (Path.cwd() / "run.py").write_text(code)
    pool.submit("run", ["run.py"], timeout=120)


@pytest.fixture
def pool(request):
    return session_pool(request)


@pytest.mark.subprocess
def test_waits_for_its_run(pool):
    assert pool.output("run") == ""
"""


def test_the_sessions_runs_start_beside_the_fast_tier_whose_own_starts_are_refused(
    pytester, monkeypatch
):
    """The runs are queued before the first test: a fast test sees one finish while it runs
    (the pool's threads may start processes), and still may not start one itself."""
    import script_pool

    monkeypatch.setattr(script_pool, "PRELOAD", ())  # a zygote that starts in a second
    pytester.makepyfile(test_a_fast=SESSION_FAST, test_b_runs=SESSION_RUNS)
    result = pytester.runpytest_inprocess("-p", "tiers", "-p", "script_pool")
    result.assert_outcomes(passed=1, failed=1)
    output = result.stdout.str()
    assert "ProcessStartedInFastTest: test_a_fast.py::test_a_fast_test_sees" in output
    assert "AssertionError" not in output  # the run had started
