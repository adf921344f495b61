"""Smoke runs of scripts, two at a time in the background, each in a fresh process forked from
one that has imported the heavy libraries once.

A smoke run mostly pays for start-up: Python importing torch, Ray, RLlib, Tianshou and
matplotlib (4-8 s of CPU per script here), Ray starting and stopping, actor processes importing
RLlib. The first cost is paid once: a *zygote* process imports those libraries (and does nothing
else with them: no thread, no Ray session, no torch op), then forks one child per run. The child
is a fresh process for everything the script does (its own ``ray.init``, its own ``sys.argv``,
working directory and environment, stdout and stderr in files); it only starts with the
libraries already imported. Nothing of this project is imported before the fork, so each run
imports the code under test itself.

Two runs at a time on the 2-core CI machine finish the same runs in about three quarters of the
time (measured: two benchmark smokes of 37 s and 38 s took 56 s side by side). A module's
fixture submits every run its selected tests need, in test order, when its first test starts;
each test then waits for its own run and checks it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

#: runs side by side (more than the 2 cores can overlap only makes each run slower: measured,
#: the smoke and README modules took 664 s three at a time against 573 s two at a time)
CONCURRENT_RUNS = 2

#: What the zygote imports before it forks: third-party only (each run imports the project),
#: and only what starts no thread (numpy's BLAS pool excepted: OpenBLAS stops and restarts it
#: around a fork). RLlib and Tianshou are left out: importing them starts native threads.
PRELOAD = ("numpy", "torch", "gymnasium", "ray", "matplotlib.pyplot")

_ZYGOTE = r"""
import importlib, json, os, runpy, select, signal, sys, traceback

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
    os.setsid()  # its own process group: a timeout kills the script and what it started
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


class ZygoteUnavailable(RuntimeError):
    """The zygote did not start (e.g. an import started a thread): runs go without it."""


def _run_plain(key: str, args: Sequence[str], cwd: Path, env: dict, timeout: float) -> Run:
    """``python *args`` in a process of its own (what a run is without the zygote)."""
    try:
        proc = subprocess.run(
            [sys.executable, *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as error:
        out = error.stdout.decode() if isinstance(error.stdout, bytes) else error.stdout or ""
        err = error.stderr.decode() if isinstance(error.stderr, bytes) else error.stderr or ""
        return Run(tuple(args), -1, out, err + f"\n(timed out after {timeout:.0f} s)")
    return Run(tuple(args), proc.returncode, proc.stdout, proc.stderr)


class _Zygote:
    """The forking process and the bookkeeping of its children."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE, json.dumps(PRELOAD)],
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

    def run(self, key: str, args: Sequence[str], cwd: Path, env: dict, timeout: float) -> Run:
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            started: Future[int] = Future()
            request = {
                "key": key,
                "args": list(args),
                "cwd": str(cwd),
                "env": env,
                "stdout": str(out),
                "stderr": str(err),
            }
            with self._lock:
                self._started[key] = started
                self._proc.stdin.write(json.dumps(request) + "\n")
                self._proc.stdin.flush()
            pid = started.result(timeout=60)
            finished: Future[int] = Future()
            with self._lock:
                if pid in self._early:
                    finished.set_result(self._early.pop(pid))
                else:
                    self._finished[pid] = finished
            note = ""
            try:
                returncode = finished.result(timeout=timeout)
            except TimeoutError:
                with self._lock:
                    self._proc.stdin.write(json.dumps({"kill": pid}) + "\n")
                    self._proc.stdin.flush()
                returncode = finished.result(timeout=60)
                note = f"\n(timed out after {timeout:.0f} s)"
            return Run(tuple(args), returncode, out.read_text(), err.read_text() + note)

    def close(self) -> None:
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()


class ScriptPool:
    """``submit(key, args)`` starts ``python *args`` (forked from the zygote) when a slot is
    free; ``output(key)`` waits for it and fails the calling test with the script's output if
    it did not exit with 0."""

    def __init__(self, cwd: Path, workers: int = CONCURRENT_RUNS) -> None:
        self.cwd = cwd
        self._zygote: _Zygote | None = None
        self._run = _run_plain
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="smoke")
        self._runs: dict[str, Future[Run]] = {}
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
        env = {**os.environ, "RAY_ADDRESS": "local"}
        self._runs[key] = self._executor.submit(
            self._run, key, [str(a) for a in args], cwd or self.cwd, env, timeout
        )

    def output(self, key: str) -> str:
        run = self._runs[key].result()
        assert run.returncode == 0, f"{' '.join(run.args)} failed:\n{run.stdout}\n{run.stderr}"
        return run.output

    def close(self) -> None:
        """Drop the runs not yet started, wait for the running ones, stop the zygote."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        if self._zygote is not None:
            self._zygote.close()


def selected_names(request, module) -> list[str]:
    """Names (with parameter ids) of this session's selected tests from ``module``, in order."""
    return [item.name for item in request.session.items if item.module is module]
