"""Smoke runs of scripts in subprocesses, two at a time in the background.

A smoke run mostly waits: on Python and torch imports, on Ray starting and stopping, on actor
processes importing RLlib, on benchmark timers. Two at a time on the 2-core CI machine finish
the same runs in about three quarters of the time (measured: two benchmark smokes of 37 s and
38 s took 56 s side by side). A module's fixture submits every run its selected tests need, in
test order, when its first test starts; each test then waits for its own run and checks it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

#: runs side by side (more than the 2 cores can overlap only makes each run slower: measured,
#: the smoke and README modules took 664 s three at a time against 573 s two at a time)
CONCURRENT_RUNS = 2


@dataclass(frozen=True)
class Run:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def _run(args: Sequence[str], cwd: Path, timeout: float) -> Run:
    # RAY_ADDRESS=local: a script's ray.init() starts its own Ray even if a test's
    # ray.cluster_utils.Cluster runs meanwhile (it registers itself as this machine's cluster,
    # and a plain ray.init() would join it)
    env = {**os.environ, "RAY_ADDRESS": "local"}
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


class ScriptPool:
    """``submit(key, args)`` starts ``python *args`` when a slot is free; ``output(key)`` waits
    for it and fails the calling test with the script's output if it did not exit with 0."""

    def __init__(self, cwd: Path, workers: int = CONCURRENT_RUNS) -> None:
        self.cwd = cwd
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
        if out_dir is not None:
            self.dirs[key] = out_dir
        args = [str(a) for a in args]
        self._runs[key] = self._executor.submit(_run, args, cwd or self.cwd, timeout)

    def output(self, key: str) -> str:
        run = self._runs[key].result()
        assert run.returncode == 0, f"{' '.join(run.args)} failed:\n{run.stdout}\n{run.stderr}"
        return run.output

    def close(self) -> None:
        """Drop the runs not yet started and wait for the running ones."""
        self._executor.shutdown(wait=True, cancel_futures=True)


def selected_names(request, module) -> list[str]:
    """Names (with parameter ids) of this session's selected tests from ``module``, in order."""
    return [item.name for item in request.session.items if item.module is module]
