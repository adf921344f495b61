"""Script runs (example smokes, the code blocks of the README and the docs) in the background
of the whole test session, at low CPU priority, each in a fresh process forked from one that
has imported the heavy libraries once.

A script run mostly pays for start-up: Python importing torch, Ray, RLlib, Tianshou and
matplotlib (4-8 s of CPU per script here), Ray starting and stopping, actor processes importing
RLlib. The first cost is paid once: a *zygote* process imports those libraries (and does nothing
else with them: no thread, no Ray session, no torch op), then forks one child per run. The child
is a fresh process for everything the script does (its own ``ray.init``, its own ``sys.argv``,
working directory and environment, stdout and stderr in files); it only starts with the
libraries already imported. Nothing of this project is imported before the fork, so each run
imports the code under test itself.

The fast tier keeps one of the 2 cores busy and leaves the other idle (about 2 minutes of a
session), and the Ray tests leave idle moments (they wait on actors, restarts, timeouts). So the
runs do not wait for their tests: before the session's first test, every selected run is
queued, two at a time, at the lowest CPU priority (nice 19 and Linux's idle scheduling class,
in the tests' own session: a session of its own would be a scheduling group of its own, ranked
as an equal), where they take the CPU the tests leave idle and little else; the modules whose
tests wait for runs go last. A test waits for its own run and checks it; a run's time limit counts
from when its test starts waiting. A run that fails in the background (where a starved process
may miss one of the code's own wall-clock timeouts) runs again at once if its test is not
waiting yet, and again in the foreground, with nothing beside it, if that fails too or its test
already waits; its test fails if the foreground try fails as well. Every failed try is reported
as a warning.

Modules take part with a ``script_runs(pool, selected, mktemp)`` function that submits the runs
of their ``selected`` test names (``mktemp(name)``: a fresh folder), and a fixture that returns
:func:`session_pool`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from tiers import BACKGROUND_THREAD_PREFIX

#: runs side by side (more than the 2 cores can overlap only makes each run slower: measured,
#: the smoke and README modules took 664 s three at a time against 573 s two at a time)
CONCURRENT_RUNS = 2

#: What the zygote imports before it forks: third-party only (each run imports the project),
#: and only what starts no thread (numpy's BLAS pool excepted: OpenBLAS stops and restarts it
#: around a fork). RLlib and Tianshou are left out: importing them starts native threads.
PRELOAD = ("numpy", "torch", "gymnasium", "ray", "matplotlib.pyplot")

#: Tries a run gets before its test waits for it (a README snippet whose actors were starved
#: past their 120 s start timeout in a busy stretch cost its test a 35 s foreground rerun)
BACKGROUND_TRIES = 2

#: How long a run's code waits for its Ray actors to start (``rl_dist_ext``'s floor under every
#: such wait, ``RL_DIST_EXT_START_TIMEOUT_S``): a run in the background starts its actors at the
#: idle priority, where a busy stretch of the session starved them past the code's own 120 s in
#: 5 runs of one CI session, each then run again; the run's own time limit still bounds it once
#: its test waits
START_TIMEOUT_S = 1800

#: The runs' niceness (19: the lowest priority; a nice-0 process gets ~68x the CPU of one)
NICE = 19

_ZYGOTE = r"""
import importlib, json, os, runpy, select, signal, sys, traceback

os.nice(int(sys.argv[2]))  # every run it forks inherits the low priority,
if hasattr(os, "SCHED_IDLE"):  # and below even nice 19 (Ray runs its workers at nice 15)
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
import numpy  # its BLAS thread pool is the one set of threads a fork may copy

def threads():
    return len(os.listdir("/proc/self/task"))

with_numpy = threads()
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
if threads() != with_numpy:  # a thread that may hold a lock when the zygote forks
    raise SystemExit(f"zygote: the imports started {threads() - with_numpy} thread(s)")

def reply(message):
    os.write(1, (json.dumps(message) + "\n").encode())

def run_child(request):
    # Its own process group (a timeout kills the script and what it started), in the session
    # of the tests: a new session would be a scheduling group of its own (Linux autogroups),
    # and niceness only ranks processes inside one group.
    os.setpgrp()
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.stdin = open(0, closefd=False)
    sys.stdout = sys.__stdout__ = open(1, "w", buffering=1, closefd=False)
    sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    script = os.path.abspath(request["args"][0])
    sys.argv = [script, *request["args"][1:]]
    sys.path[0] = os.path.dirname(script)
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        import atexit
        atexit._run_exitfuncs()  # e.g. Ray's shutdown of what the script started
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

# One thread only, so that every fork copies a process no other thread holds a lock in: wait
# on stdin (requests) and reap finished children in turn.
reply({"ready": True})
pending = b""
while True:
    readable, _, _ = select.select([0], [], [], 0.2)
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        reply({"pid": pid, "returncode": os.waitstatus_to_exitcode(status)})
    if not readable:
        continue
    chunk = os.read(0, 65536)
    if not chunk:
        break
    pending += chunk
    *lines, pending = pending.split(b"\n")
    for line in lines:
        request = json.loads(line)
        if "kill" in request:
            try:
                os.killpg(request["kill"], signal.SIGKILL)
            except ProcessLookupError:
                pass
            continue
        pid = os.fork()
        if pid == 0:
            run_child(request)
        reply({"key": request["key"], "pid": pid})
while True:  # stdin closed: wait for the children still running
    try:
        pid, status = os.wait()
    except ChildProcessError:
        break
    reply({"pid": pid, "returncode": os.waitstatus_to_exitcode(status)})
"""


@dataclass(frozen=True)
class Run:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class Deadline:
    """A run's time limit, counted from when a test starts waiting for it (before that, a run
    in the background may wait for the CPU as long as the Ray tests keep it busy)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._at: float | None = None

    def start(self) -> None:
        if self._at is None:
            self._at = time.monotonic() + self.seconds

    def passed(self) -> bool:
        return self._at is not None and time.monotonic() > self._at

    @property
    def started(self) -> bool:
        """Whether a test waits for the run."""
        return self._at is not None


def _warn_failed(run: Run, then: str) -> None:
    warnings.warn(
        f"{' '.join(run.args)} failed in the background (exit {run.returncode}); {then}. "
        f"Its output ended:\n{run.output[-3000:]}",
        stacklevel=3,
    )


class ZygoteUnavailable(RuntimeError):
    """The zygote did not start (e.g. an import started a thread): runs go without it."""


def _finish(wait: Callable[[float], int | None], kill: Callable[[], None], deadline: Deadline):
    """Wait for a run's return code until ``deadline`` has passed; then kill it. Returns the
    return code and a note for stderr."""
    while True:
        returncode = wait(1.0)
        if returncode is not None:
            return returncode, ""
        if deadline.passed():
            kill()
            returncode = wait(60.0)
            return returncode, f"\n(timed out {deadline.seconds:.0f} s after its test waited)"


def _lowest_priority() -> None:
    """Nice 19 and, where Linux has it, the idle scheduling class: Ray runs its workers at
    nice 15, against which nice 19 alone still takes ~30 % of a core."""
    os.nice(NICE)
    if hasattr(os, "SCHED_IDLE"):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _run_plain(key: str, args: Sequence[str], cwd: Path, env: dict, deadline: Deadline) -> Run:
    """``python *args`` in a process of its own, at low priority (a run without the zygote)."""
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        with out.open("w") as stdout, err.open("w") as stderr:
            proc = subprocess.Popen(
                [sys.executable, *args],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                process_group=0,  # a timeout kills the script and what it started
                preexec_fn=_lowest_priority,
            )

        def wait(seconds: float) -> int | None:
            try:
                return proc.wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                return None

        def kill() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

        returncode, note = _finish(wait, kill, deadline)
        return Run(tuple(args), returncode, out.read_text(), err.read_text() + note)


class _Zygote:
    """The forking process and the bookkeeping of its children."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE, json.dumps(PRELOAD), str(NICE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._lock = threading.Lock()
        self._started: dict[str, Future[int]] = {}  # key -> pid
        self._finished: dict[int, Future[int]] = {}  # pid -> returncode
        self._early: dict[int, int] = {}  # returncodes of pids not yet known to a run
        ready = self._proc.stdout.readline()
        if not ready:
            raise ZygoteUnavailable(f"the script zygote exited with {self._proc.wait()}")
        threading.Thread(target=self._read_replies, daemon=True).start()

    def _read_replies(self) -> None:
        for line in self._proc.stdout:
            message = json.loads(line)
            with self._lock:
                if "key" in message:
                    self._started.pop(message["key"]).set_result(message["pid"])
                elif message["pid"] in self._finished:
                    self._finished.pop(message["pid"]).set_result(message["returncode"])
                else:
                    self._early[message["pid"]] = message["returncode"]

    def _send(self, request: dict) -> None:
        with self._lock:
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()

    def run(self, key: str, args: Sequence[str], cwd: Path, env: dict, deadline: Deadline) -> Run:
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            started: Future[int] = Future()
            with self._lock:
                self._started[key] = started
            self._send(
                {
                    "key": key,
                    "args": list(args),
                    "cwd": str(cwd),
                    "env": env,
                    "stdout": str(out),
                    "stderr": str(err),
                }
            )
            pid = started.result(timeout=600)  # the zygote forks at once, if it gets the CPU
            finished: Future[int] = Future()
            with self._lock:
                if pid in self._early:
                    finished.set_result(self._early.pop(pid))
                else:
                    self._finished[pid] = finished

            def wait(seconds: float) -> int | None:
                try:
                    return finished.result(timeout=seconds)
                except TimeoutError:
                    return None

            returncode, note = _finish(wait, lambda: self._send({"kill": pid}), deadline)
            return Run(tuple(args), returncode, out.read_text(), err.read_text() + note)

    def close(self) -> None:
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()


@dataclass
class _Submitted:
    args: list[str]
    cwd: Path
    env: dict
    deadline: Deadline
    future: Future[tuple[Run, list[Run]]]  # the last run, and the failed ones before it
    fresh: Callable[[], None]  # puts the run's output folder back as it was at submission


def _restorer(out_dir: Path | None) -> Callable[[], None]:
    """A function that removes from ``out_dir`` what was not in it now: a retry starts from
    the folder as its run was submitted (a failed try's half-written output gone, the files a
    test put there before, such as a snippet's script, kept)."""
    if out_dir is None:
        return lambda: None
    given = {path.name for path in out_dir.iterdir()} if out_dir.exists() else set()

    def restore() -> None:
        if not out_dir.exists():
            return
        for path in out_dir.iterdir():
            if path.name in given:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    return restore


class ScriptPool:
    """``submit(key, args)`` queues ``python *args`` (forked from the zygote, at the lowest
    priority) for a free slot; ``output(key)`` waits for it and fails the calling test with the
    script's output if it did not exit with 0 (after one more try in the foreground where the
    background run failed)."""

    def __init__(self, cwd: Path, workers: int = CONCURRENT_RUNS) -> None:
        self.cwd = cwd
        self._zygote: _Zygote | None = None
        self._run = _run_plain
        self._executor = ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix=BACKGROUND_THREAD_PREFIX
        )
        self._runs: dict[str, _Submitted] = {}
        self.dirs: dict[str, Path] = {}  # a run's output folder, where its test gave one

    def submit(
        self,
        key: str,
        args: Sequence[str],
        timeout: float = 280.0,
        out_dir: Path | None = None,
        cwd: Path | None = None,
    ) -> None:
        if self._zygote is None and self._run is _run_plain:
            try:
                self._zygote = _Zygote()
                self._run = self._zygote.run
            except ZygoteUnavailable as error:
                warnings.warn(f"{error}; scripts run in plain processes", stacklevel=2)
        if out_dir is not None:
            self.dirs[key] = out_dir
        # RAY_ADDRESS=local: a script's ray.init() starts its own Ray even if a test's
        # ray.cluster_utils.Cluster runs meanwhile (it registers itself as this machine's
        # cluster, and a plain ray.init() would join it)
        env = {
            **os.environ,
            "RAY_ADDRESS": "local",
            "RL_DIST_EXT_START_TIMEOUT_S": str(START_TIMEOUT_S),
        }
        args = [str(a) for a in args]
        cwd = cwd or self.cwd
        deadline = Deadline(timeout)
        fresh = _restorer(out_dir)
        future = self._executor.submit(self._in_background, key, args, cwd, env, deadline, fresh)
        self._runs[key] = _Submitted(args, cwd, env, deadline, future, fresh)

    def _in_background(
        self,
        key: str,
        args: list[str],
        cwd: Path,
        env: dict,
        deadline: Deadline,
        fresh: Callable[[], None],
    ) -> tuple[Run, list[Run]]:
        """Runs ``args``; a run that fails before its test waits for it (starved by a busy
        stretch of the session, say) runs again at once, still in the background, up to
        ``BACKGROUND_TRIES`` times: a try that succeeds there costs the test no wait."""
        failed: list[Run] = []
        run = self._run(key, args, cwd, env, deadline)
        for _ in range(BACKGROUND_TRIES - 1):
            if run.returncode == 0 or deadline.started:
                break
            failed.append(run)
            fresh()
            run = self._run(key, args, cwd, env, deadline)
        return run, failed

    def output(self, key: str) -> str:
        submitted = self._runs[key]
        submitted.deadline.start()
        run, failed = submitted.future.result()
        for earlier in failed:
            _warn_failed(earlier, "it ran again in the background")
        if run.returncode != 0:
            _warn_failed(run, "running it again in the foreground")
            deadline = Deadline(submitted.deadline.seconds)
            deadline.start()
            submitted.fresh()
            run = self._run(key, submitted.args, submitted.cwd, submitted.env, deadline)
        assert run.returncode == 0, f"{' '.join(run.args)} failed:\n{run.stdout}\n{run.stderr}"
        return run.output

    def close(self) -> None:
        """Drop the runs not yet started, end the running ones within their time limits, stop
        the zygote."""
        for submitted in self._runs.values():
            submitted.deadline.start()
        self._executor.shutdown(wait=True, cancel_futures=True)
        if self._zygote is not None:
            self._zygote.close()


# ---- the session's pool (a pytest plugin: tests/conftest.py loads it) -----------------------

_POOL_KEY = pytest.StashKey["_SessionRuns"]()


class _SessionRuns:
    def __init__(self, root: Path) -> None:
        self.pool = ScriptPool(root)
        self.folders = Path(tempfile.mkdtemp(prefix="script-runs-"))

    def mktemp(self, name: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{name[:40]}-", dir=self.folders))

    def close(self) -> None:
        self.pool.close()
        shutil.rmtree(self.folders, ignore_errors=True)


def _waits_for_runs(item: pytest.Item) -> bool:
    return hasattr(getattr(item, "module", None), "script_runs")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that wait for script runs go last: their runs have the whole session."""
    items.sort(key=_waits_for_runs)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtestloop(session: pytest.Session):
    """Before the first test, queue the run of every selected test that waits for one: the runs
    start beside the fast tier, which keeps one of the two cores busy and leaves the other idle
    (its guard refuses process starts only in the test's own thread, not in the pool's)."""
    modules = []
    for test in session.items:
        if _waits_for_runs(test) and test.module not in modules:
            modules.append(test.module)
    if modules and not session.config.option.collectonly:
        runs = session.stash[_POOL_KEY] = _SessionRuns(Path(str(session.config.rootpath)))
        for module in modules:
            selected = [test.name for test in session.items if test.module is module]
            module.script_runs(runs.pool, selected, runs.mktemp)
    yield


def pytest_sessionfinish(session: pytest.Session) -> None:
    runs = session.stash.get(_POOL_KEY, None)
    if runs is not None:
        runs.close()


def session_pool(request: pytest.FixtureRequest) -> ScriptPool:
    """The session's pool, whose runs were queued when the first non-fast test started."""
    return request.session.stash[_POOL_KEY].pool
