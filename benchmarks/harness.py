"""One harness for the races: a race is data, one runner runs it, one report reads it.

A :class:`Race` names its envs, its target (a greedy return), its time cap and its arms; each
:class:`Arm` is one algorithm in one configuration (the best found for this machine, with a
note of how that was chosen) as a function ``run(env, seed, cap_s, target) -> dict`` that
trains until its greedy evaluations reach ``target`` or ``cap_s`` seconds of training pass, and
returns the run's curve, ``{"curve": [[training seconds, env steps, greedy return], ...]}``
(training seconds exclude evaluation time).

:func:`run_race` runs every (env, seed, arm) in a process of its own (``spawn``: a fresh
interpreter, and a fresh ``ray.init(num_cpus=...)`` for arms that use Ray), the arms
interleaved within each seed so that a slow stretch of the machine hits them alike, and keeps
each finished run as ``<results>/<race>/<env>/<arm>/seed<k>.json``: a race stopped halfway goes
on where it stopped when run again (finished runs are skipped), so a long race can span several
sessions. :func:`summarize` reads them back (times to target, IQMs with intervals, each arm's
ratio to the baseline and its probability of improvement: :mod:`evidence`), and
:func:`write_report` writes the JSON, a markdown table and the plots.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing
import os
import platform
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import evidence
import numpy as np

#: where the committed reports live: ``<RESULTS>/races/<race>.{json,md,png}`` and the runs
RESULTS = Path(__file__).parent / "results"
#: a run's process gets this long beyond its cap (start-up, evaluations, shutdown) before it
#: is killed and recorded as failed
GRACE_S = 300.0
#: iterations of the pace loop (0.08-0.16 s here on a slow day, with other work beside it)
PACE_LOOP = 1_000_000


def machine_pace_s() -> float:
    """Seconds this machine takes for a fixed pure-Python loop, measured in a run's process
    before it starts: kept with each run, so that runs made on a slower day can be told apart
    (the arms of one seed run back to back, so their pace is alike)."""
    started = time.perf_counter()
    total = 0
    for i in range(PACE_LOOP):
        total += i
    return round(time.perf_counter() - started, 4)


@dataclass(frozen=True)
class Arm:
    """One algorithm in one configuration.

    Args:
        name: the arm's label in tables and plots (also its results folder).
        run: ``run(env, seed, cap_s, target)``: train until ``target`` or ``cap_s`` training seconds
            and return ``{"curve": [[training s, env steps, greedy return], ...]}`` (more keys
            are kept as they are). A module-level function: it is pickled by reference into
            the run's process.
        note: how this configuration was chosen (which others were tried, which won).
        uses_ray: start ``ray.init(num_cpus=ray_cpus)`` in the run's process first.
    """

    name: str
    run: Callable[[str, int, float, float], dict]
    note: str
    uses_ray: bool = True


@dataclass(frozen=True)
class Race:
    """What a race is: ``arms`` on each of ``envs``, ``seeds`` each, to ``target`` within
    ``cap_s`` training seconds; ratios are against ``baseline`` (an arm's name).

    With ``retention``, every run goes on past the target to its cap (its arm is given an
    unreachable target) and the report adds what each arm kept after it first reached the
    target (:func:`evidence.retention`): a race of its own (see :func:`retention_race`)."""

    name: str
    title: str
    envs: tuple[str, ...]
    target: float
    cap_s: float
    arms: tuple[Arm, ...]
    baseline: str
    seeds: tuple[int, ...] = tuple(range(10))
    metric: str = "greedy return (10 episodes)"
    ray_cpus: int = 2
    notes: tuple[str, ...] = field(default_factory=tuple)
    retention: bool = False

    def __post_init__(self) -> None:
        names = [arm.name for arm in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"race {self.name!r}: two arms share a name: {names}")
        if self.baseline not in names:
            raise ValueError(
                f"race {self.name!r}: baseline {self.baseline!r} is not an arm {names}"
            )
        if not self.envs or not self.seeds:
            raise ValueError(f"race {self.name!r}: envs and seeds must not be empty")
        if not (self.cap_s > 0):
            raise ValueError(f"race {self.name!r}: cap_s must be > 0, got {self.cap_s!r}")

    @property
    def stop_at(self) -> float:
        """The target the arms are given: the race's, or none they can reach (``retention``)."""
        return math.inf if self.retention else self.target

    def arm(self, name: str) -> Arm:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise ValueError(f"race {self.name!r} has no arm {name!r}: {[a.name for a in self.arms]}")


def retention_race(race: Race) -> Race:
    """``race`` run past its target to the cap, reporting retention: its runs and report under
    ``<race>_retention`` (the runs of the race itself stop at the target)."""
    if race.retention:
        return race
    return dataclasses.replace(race, name=f"{race.name}_retention", retention=True)


def changed_arms(
    run: Callable[..., dict], note: str, changes: Sequence[tuple[str, dict, str]]
) -> tuple[Arm, ...]:
    """An arm per ``(arm name, keyword changes to run, why)`` in ``changes``: ``run`` with the
    changes, noted ``"<note>; <why>"``."""
    return tuple(
        Arm(arm_name, partial(run, **change), f"{note}; {why}") for arm_name, change, why in changes
    )


def ablation_race(
    name: str,
    title: str,
    run: Callable[..., dict],
    note: str,
    ablations: tuple[tuple[str, dict, str], ...],
    *,
    envs: tuple[str, ...],
    target: float,
    cap_s: float,
    notes: tuple[str, ...],
) -> Race:
    """One setting changed at a time, every run past the target to its cap: an arm per
    ``(arm name, keyword changes to run, why the change is a suspect)`` in ``ablations``, the
    first of them the baseline, 5 seeds each, with retention reported."""
    if not ablations:
        raise ValueError(f"race {name!r}: ablations must name at least the baseline's arm")
    return Race(
        name=name,
        title=title,
        envs=envs,
        target=target,
        cap_s=cap_s,
        arms=changed_arms(run, note, ablations),
        baseline=ablations[0][0],
        seeds=(0, 1, 2, 3, 4),
        notes=notes,
        retention=True,
    )


def run_path(results: Path, race: Race, env: str, arm: str, seed: int) -> Path:
    return results / race.name / env.replace("/", "_") / arm / f"seed{seed}.json"


def arm_settings(arm: Arm) -> dict:
    """The keyword arguments an arm's ``run`` carries (a ``functools.partial``'s), as JSON
    writes them: kept with each run, so that runs of other settings are never mixed."""
    return json.loads(json.dumps(getattr(arm.run, "keywords", {}), default=repr))


def _pickle_benchmark_code_by_value() -> None:
    """Ray's workers lack ``benchmarks/`` on their path: the functions an arm hands them (an env
    factory, say) travel by value, as they would from a script's ``__main__``."""
    import sys

    import ray.cloudpickle

    here = Path(__file__).resolve().parent
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if path and Path(path).resolve().parent == here and name != __name__:
            ray.cloudpickle.register_pickle_by_value(module)


def _child(
    arm: Arm, env: str, seed: int, cap_s: float, target: float, ray_cpus: int, out: str
) -> None:
    """The run's process: (Ray,) the arm, and its record written next to ``out``."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    record: dict[str, Any]
    pace_s = machine_pace_s()
    try:
        if arm.uses_ray:
            import ray

            # address="local": a Ray of its own even where another runs on this machine
            ray.init(
                address="local", num_cpus=ray_cpus, include_dashboard=False, log_to_driver=False
            )
            _pickle_benchmark_code_by_value()
        started = time.perf_counter()
        record = dict(arm.run(env, seed, cap_s, target))
        record["wall_seconds"] = round(time.perf_counter() - started, 2)
        record["machine_pace_s"] = pace_s
        if "curve" not in record:
            raise ValueError(f"arm {arm.name!r} returned no 'curve': {sorted(record)}")
    except BaseException:  # recorded, so that the runner reports it and the race goes on
        record = {"error": traceback.format_exc()}
    finally:
        if arm.uses_ray:
            import ray

            ray.shutdown()
    Path(out).write_text(json.dumps(record))


def run_one(race: Race, arm: Arm, env: str, seed: int, cap_s: float, path: Path) -> dict:
    """One run in a fresh process; its record is saved at ``path`` only when it succeeded
    (a failed or killed run is tried again the next time the race runs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_suffix(".running")
    scratch.unlink(missing_ok=True)
    process = multiprocessing.get_context("spawn").Process(
        target=_child,
        args=(arm, env, seed, cap_s, race.stop_at, race.ray_cpus, str(scratch)),
        daemon=False,
    )
    process.start()
    process.join(cap_s + GRACE_S)
    if process.is_alive():
        process.kill()
        process.join()
        return {"error": f"killed after {cap_s + GRACE_S:.0f} s"}
    if not scratch.exists():
        return {"error": f"the run's process exited with {process.exitcode} and wrote nothing"}
    record = json.loads(scratch.read_text())
    scratch.unlink()
    if "error" in record:
        return record
    record.update(race=race.name, env=env, arm=arm.name, seed=seed, cap_s=cap_s)
    record["arm_settings"] = arm_settings(arm)
    record["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform()}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)  # a finished run appears whole or not at all
    return record


def run_race(
    race: Race,
    results: Path,
    *,
    seeds: Sequence[int] | None = None,
    envs: Sequence[str] | None = None,
    arms: Sequence[str] | None = None,
    cap_s: float | None = None,
    log: Callable[[str], None] = print,
) -> list[dict]:
    """Every (env, seed, arm) not finished yet under ``results``; the arms interleaved within
    a seed. Returns the records of the runs it ran (failed ones with an ``error``)."""
    seeds = list(race.seeds if seeds is None else seeds)
    envs = list(race.envs if envs is None else envs)
    chosen = [race.arm(name) for name in (arms or [a.name for a in race.arms])]
    cap = race.cap_s if cap_s is None else cap_s
    done = []
    for env in envs:
        for seed in seeds:
            for arm in chosen:
                path = run_path(results, race, env, arm.name, seed)
                if path.exists():
                    _check_same_settings(arm, path)
                    continue
                started = time.perf_counter()
                record = run_one(race, arm, env, seed, cap, path)
                took = time.perf_counter() - started
                if "error" in record:
                    log(f"{race.name} {env} {arm.name} seed {seed}: FAILED after {took:.0f} s")
                    log(record["error"])
                else:
                    reached = evidence.time_to_target(_curve(record), race.target, cap)
                    log(
                        f"{race.name} {env} {arm.name} seed {seed}: "
                        f"{_fmt_time(*reached)} ({took:.0f} s wall)"
                    )
                done.append(record)
    return done


def _check_same_settings(arm: Arm, path: Path) -> None:
    kept = json.loads(path.read_text()).get("arm_settings", {})
    if kept != arm_settings(arm):
        raise ValueError(
            f"{path} was run with other settings of arm {arm.name!r} ({kept}) than now "
            f"({arm_settings(arm)}): give the race another results folder, or remove that "
            "arm's runs to run them again"
        )


def _curve(record: dict) -> list[tuple[float, float]]:
    return [(float(point[0]), float(point[2])) for point in record["curve"]]


def _seconds(value: float) -> str:
    """Seconds to 3 significant digits (whole seconds from 100 s)."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def _fmt_time(seconds: float, reached: bool) -> str:
    return f"{_seconds(seconds)} s" if reached else f"not reached ({_seconds(seconds)} s cap)"


def load_runs(race: Race, results: Path) -> dict[str, dict[str, list[dict]]]:
    """env -> arm -> the finished runs' records (by seed)."""
    runs: dict[str, dict[str, list[dict]]] = {}
    for env in race.envs:
        runs[env] = {}
        for arm in race.arms:
            folder = run_path(results, race, env, arm.name, 0).parent
            paths = sorted(folder.glob("seed*.json"), key=lambda p: int(p.stem[4:]))
            runs[env][arm.name] = [json.loads(p.read_text()) for p in paths]
    return runs


def summarize(race: Race, runs: dict[str, dict[str, list[dict]]]) -> dict:
    """Per env: each arm's times to target (training seconds; unreached runs at the cap), their
    IQM with its 95 % interval, the runs that reached; each arm's ratio IQM(arm)/IQM(baseline)
    with its interval, whether "faster" holds (the interval's upper end below 1) and the
    probability that a run of the arm reaches the target sooner than one of the baseline;
    ``runs`` as :func:`load_runs` gives them."""
    summary: dict[str, Any] = {}
    for env, by_arm in runs.items():
        arms: dict[str, Any] = {}
        times: dict[str, list[float]] = {}
        for name, records in by_arm.items():
            if not records:
                continue
            cap = min(float(r["cap_s"]) for r in records)
            outcomes = [evidence.time_to_target(_curve(r), race.target, cap) for r in records]
            times[name] = [t for t, _ in outcomes]
            estimate = evidence.iqm_interval(times[name])
            arms[name] = {
                "runs": len(records),
                "reached": sum(hit for _, hit in outcomes),
                "reached_runs": [hit for _, hit in outcomes],
                "cap_s": cap,
                "times_s": [round(t, 2) for t in times[name]],
                "iqm_s": estimate.value,
                "iqm_interval_s": [estimate.low, estimate.high],
            }
            if race.retention:
                arms[name]["retention"] = _retention(records, race.target, cap)
        for name in arms:
            if name == race.baseline or race.baseline not in times:
                continue
            ratio = evidence.ratio_interval(times[name], times[race.baseline])
            arms[name]["ratio_to_baseline"] = ratio.value
            arms[name]["ratio_interval"] = [ratio.low, ratio.high]
            arms[name]["faster"] = ratio.high < 1.0
            arms[name]["probability_of_improvement"] = evidence.probability_of_improvement(
                times[name], times[race.baseline]
            )
        summary[env] = arms
    return summary


def _retention(records: list[dict], target: float, cap: float) -> dict:
    """What an arm's runs kept after they first reached the target, pooled over the runs: the
    share of their later evaluations at or above the keep line, and the worst of them."""
    kept = [evidence.retention(_curve(r), target, cap) for r in records]
    kept = [k for k in kept if k is not None]
    later = sum(k.later for k in kept)
    return {
        "runs": len(kept),
        "later_evaluations": later,
        "kept": sum(k.kept for k in kept),
        "share": sum(k.kept for k in kept) / later if later else None,
        "worst": min((k.worst for k in kept), default=None),
        "keep_line": evidence.keep_line(target),
    }


def retention_table(arms: dict) -> list[str]:
    """The markdown table of one env's retention (a ``retention`` race's summary)."""
    lines = [
        "| arm | runs that reached | evaluations after the target | kept (>= 80 % of the "
        "target) | worst |",
        "|---|---|---|---|---|",
    ]
    for name, arm in arms.items():
        kept = arm["retention"]
        share = "n/a" if kept["share"] is None else f"{kept['share']:.0%}"
        worst = "n/a" if kept["worst"] is None else f"{kept['worst']:.3g}"
        lines.append(
            f"| {name} | {kept['runs']}/{arm['runs']} | {kept['later_evaluations']} | {share} "
            f"| {worst} |"
        )
    return lines


def not_run_line(not_run: Sequence[str]) -> list[str]:
    """The arms' list's last line where some of the race's arms have no run yet."""
    return [f"- Not run yet: {'; '.join(f'**{name}**' for name in not_run)}."] if not_run else []


def markdown(race: Race, summary: dict, not_run: Sequence[str] = ()) -> str:
    lines = [
        f"# {race.title}",
        "",
        f"Training seconds to a {race.metric} of at least {race.target:g} (evaluation time not "
        "counted); a run that never got there counts at its cap, so an arm with unreached "
        "runs is slower than its IQM says. IQM: the mean of the middle half of the runs, with "
        f"its 95 % bootstrap interval. Ratio: IQM(arm) / IQM({race.baseline}), its 95 % "
        'interval from resampling each arm on its own; "faster" only where the interval\'s '
        'upper end is below 1 and every seed of both arms is in ("pending" until then). '
        "P(better): the chance a run of the arm reaches the target "
        f"sooner than one of {race.baseline} (ties count half).",
        "",
    ]
    for env, arms in summary.items():
        if not arms:
            lines += [f"## {env}", "", "No runs yet.", ""]
            continue
        lines += [f"## {env}", "", *env_table(arms, race.baseline, len(race.seeds)), ""]
        if race.retention:
            lines += [
                "After the target (every run went on to its cap): the evaluations after each "
                "run's first at the target, pooled over the runs.",
                "",
                *retention_table(arms),
                "",
            ]
    lines += ["## Arms", ""]
    for arm in race.arms:
        settings = arm_settings(arm)
        given = f" Settings: `{json.dumps(settings)}`." if settings else ""
        lines.append(f"- **{arm.name}**: {arm.note}.{given}")
    lines += not_run_line(not_run)
    lines += [f"- {note}" for note in race.notes]
    return "\n".join(lines) + "\n"


def faster_cell(arm: dict, base: dict, seeds: int) -> str:
    """ "yes" where the ratio's interval lies below 1, "not shown" where it does not, "pending"
    while the arm or the baseline has fewer than the race's ``seeds`` runs."""
    if min(arm["runs"], base["runs"]) < seeds:
        return "pending"
    return "yes" if arm["faster"] else "not shown"


def env_table(arms: dict, baseline: str, seeds: int) -> list[str]:
    """The markdown table of one env's summary (:func:`summarize`): per arm the runs that
    reached the target, the IQM with its interval, the ratio to ``baseline`` with its interval,
    whether "faster" holds and the probability of improvement. "Faster" is "pending" until
    the arm and the baseline each have all ``seeds`` runs in."""
    lines = [
        "| arm | runs reached | IQM s [95 % interval] | ratio [95 % interval] | faster | "
        "P(better) |",
        "|---|---|---|---|---|---|",
    ]
    for name, arm in arms.items():
        low, high = arm["iqm_interval_s"]
        if "ratio_to_baseline" in arm:
            r_low, r_high = arm["ratio_interval"]
            ratio = f"{arm['ratio_to_baseline']:.2f} [{r_low:.2f}, {r_high:.2f}]"
            faster = faster_cell(arm, arms[baseline], seeds)
            better = f"{arm['probability_of_improvement']:.2f}"
        elif name == baseline:
            ratio, faster, better = "baseline", "", ""
        else:  # the baseline has no runs here
            ratio, faster, better = "n/a", "", ""
        lines.append(
            f"| {name} | {arm['reached']}/{arm['runs']} | {_seconds(arm['iqm_s'])} "
            f"[{_seconds(low)}, {_seconds(high)}] | {ratio} | {faster} | {better} |"
        )
    return lines


def _iqm_band(grid: np.ndarray, curves: list[list[tuple[float, float]]]):
    """The IQM over runs of each run's last value at or before each grid point, with its
    95 % interval (a run holds its last value to the end of the grid)."""
    values = np.empty((len(curves), grid.size))
    for i, curve in enumerate(curves):
        xs = np.asarray([x for x, _ in curve] or [0.0])
        ys = np.asarray([y for _, y in curve] or [np.nan])
        index = np.searchsorted(xs, grid, side="right") - 1
        values[i] = np.where(index >= 0, ys[np.clip(index, 0, None)], np.nan)
    mid, low, high = (np.full(grid.size, np.nan) for _ in range(3))
    for j in range(grid.size):
        column = values[:, j][np.isfinite(values[:, j])]
        if column.size:
            estimate = evidence.iqm_interval(column, reps=500)
            mid[j], low[j], high[j] = estimate.value, estimate.low, estimate.high
    return mid, low, high


def plot(race: Race, runs: dict[str, dict[str, list[dict]]], summary: dict, path: Path) -> None:
    """Per env: greedy return against training seconds and against env steps (IQM over seeds
    with its interval as a band), and the share of runs not yet at the target against training
    seconds (the survival curve; it ends above 0 where runs never got there)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    fig, axes = plt.subplots(len(runs), 3, figsize=(14, 3.6 * len(runs)), squeeze=False)
    for row, (env, by_arm) in enumerate(runs.items()):
        for name, records in by_arm.items():
            if not records:
                continue
            for col, x in ((0, 0), (1, 1)):
                curves = [[(p[x], p[2]) for p in r["curve"]] for r in records]
                end = max((c[-1][0] for c in curves if c), default=1.0)
                grid = np.linspace(0.0, end, 60)
                mid, low, high = _iqm_band(grid, curves)
                (line,) = axes[row][col].plot(grid, mid, label=name)
                axes[row][col].fill_between(grid, low, high, alpha=0.2, color=line.get_color())
            arm = summary[env][name]
            hits = arm["reached_runs"]
            t, share = evidence.survival_curve(arm["times_s"], hits, arm["cap_s"])
            axes[row][2].step(t, share, where="post", label=f"{name} ({sum(hits)}/{len(hits)})")
        axes[row][0].set_xlabel("training seconds")
        axes[row][1].set_xlabel("env steps")
        # 200k, 1M rather than 200000, 1000000: a long run's steps otherwise overlap
        axes[row][1].xaxis.set_major_formatter(EngFormatter(sep=""))
        axes[row][2].set_xlabel("training seconds")
        for col in (0, 1):
            axes[row][col].axhline(race.target, color="grey", lw=0.8, ls="--")
            axes[row][col].set_ylabel(race.metric)
        axes[row][2].set_ylabel("share of runs not at the target")
        axes[row][2].set_ylim(-0.02, 1.02)
        for ax in axes[row]:
            ax.set_title(env if summary[env] else f"{env}: no runs yet", fontsize=9)
            ax.grid(alpha=0.3)
            if summary[env]:
                ax.legend(fontsize=7)
    fig.suptitle(race.title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def arms_that_ran(
    race: Race, runs: dict[str, dict[str, list[dict]]]
) -> tuple[Race, dict[str, dict[str, list[dict]]], list[str]]:
    """``race`` and its ``runs`` (:func:`load_runs`) cut to the baseline and the arms with a
    finished run on some env, and the names of the arms with none (the baseline among them
    where it has none): a report speaks for the arms that ran, whatever ``--arms`` a pass
    chose (an arm defined for another pass, or queued, is named as not run, not counted as a
    race's missing runs)."""
    ran = {name for by_arm in runs.values() for name, records in by_arm.items() if records}
    kept = tuple(arm for arm in race.arms if arm.name in ran or arm.name == race.baseline)
    not_run = [arm.name for arm in race.arms if arm.name not in ran]
    kept_runs = {env: {arm.name: by_arm[arm.name] for arm in kept} for env, by_arm in runs.items()}
    return dataclasses.replace(race, arms=kept), kept_runs, not_run


def write_report(race: Race, results: Path) -> dict:
    """``<results>/<race>.json`` (the summary and every run's record), ``<race>.md`` and
    ``<race>.png``, for the arms that ran (:func:`arms_that_ran`; the others are named as not
    run); returns the summary."""
    race, runs, not_run = arms_that_ran(race, load_runs(race, results))
    summary = summarize(race, runs)
    report = {
        "race": race.name,
        "title": race.title,
        "target": race.target,
        "metric": race.metric,
        "baseline": race.baseline,
        "envs": list(race.envs),
        "seeds": list(race.seeds),
        "cap_s": race.cap_s,
        "retention": race.retention,
        "notes": list(race.notes),
        "arms": {arm.name: arm.note for arm in race.arms},
        "arm_settings": {arm.name: arm_settings(arm) for arm in race.arms},
        "not_run": not_run,
        "summary": summary,
        "runs": runs,
    }
    results.mkdir(parents=True, exist_ok=True)  # --report-only into a fresh --out
    (results / f"{race.name}.json").write_text(json.dumps(report, indent=1))
    (results / f"{race.name}.md").write_text(markdown(race, summary, not_run))
    plot(race, runs, summary, results / f"{race.name}.png")
    return summary


def add_race_arguments(
    parser: argparse.ArgumentParser, *, cap_s: float | None, envs: Sequence[str] | None = None
) -> None:
    """The options every race script takes: ``--seeds``, ``--envs`` (one of ``envs`` where
    given), ``--arms``, ``--max-seconds`` (the cap, ``cap_s`` by default; ``None``: each race's
    own), ``--report-only``,
    ``--retention`` (the race run past its target: :func:`retention_race`), ``--out``."""
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: the race's")
    parser.add_argument("--arms", nargs="+", default=None, help="default: all the race's")
    parser.add_argument("--envs", nargs="+", choices=envs, default=None, help="default: the race's")
    parser.add_argument("--max-seconds", type=float, default=cap_s, help="cap, training s")
    parser.add_argument("--report-only", action="store_true", help="write the report, run none")
    parser.add_argument(
        "--retention",
        action="store_true",
        help="run past the target to the cap and report what each arm kept (race <name>_retention)",
    )
    parser.add_argument(
        "--out", type=Path, default=RESULTS, help="runs and reports go to OUT/races"
    )


def run_and_report(race: Race, args: argparse.Namespace) -> dict:
    """What a race script does with the options of :func:`add_race_arguments`: the runs not
    finished yet (none with ``--report-only``), then the report, printed; returns the summary."""
    results = args.out / "races"
    if args.retention:
        race = retention_race(race)
    if not args.report_only:
        run_race(race, results, seeds=args.seeds, arms=args.arms)
    summary = write_report(race, results)
    print((results / f"{race.name}.md").read_text())
    return summary
