"""Every race of the evidence in the order it is run, as one resumable command: it runs each
race's missing runs (a race script skips the runs already in), then rewrites the README's and the
benchmarks page's tables, so the whole set can span several sessions.

    .venv/bin/python benchmarks/run_races.py --plan    # each race: runs in, hours spent and left
    .venv/bin/python benchmarks/run_races.py           # run what is missing, race after race
    .venv/bin/python benchmarks/run_races.py --only rllib_vtrace_vs_appo

The headline races come first; after them the races that chose each arm's layout. Run nothing
else on the machine meanwhile: every run's time is wall-clock. Stopped between runs (kill it),
it loses only the run in progress.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import harness

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Queued:
    """A race as its script runs it: ``script`` with ``--race kind`` (``kind`` None: the script
    has one race) and ``extra`` options; with ``retention``, the race run past its target
    (``<race>_retention``) on ``envs`` (default: the race's) for ``arms`` (default: all) to a
    cap of ``cap_s`` training seconds (default: the race's)."""

    script: str
    kind: str | None = None
    extra: tuple[str, ...] = ()
    retention: bool = False
    arms: tuple[str, ...] = ()
    envs: tuple[str, ...] = ()
    cap_s: float | None = None

    def argv(self) -> list[str]:
        return [
            *(["--race", self.kind] if self.kind else []),
            *(["--retention"] if self.retention else []),
            *(["--arms", *self.arms] if self.arms else []),
            *(["--envs", *self.envs] if self.envs else []),
            *(["--max-seconds", f"{self.cap_s:g}"] if self.cap_s else []),
            *self.extra,
        ]

    def race(self) -> harness.Race:
        """The race as the queued command runs it (its arms, envs and cap)."""
        module = importlib.import_module(self.script.removesuffix(".py"))
        race = module.make_race(self.kind) if self.kind else module.make_race()
        changes: dict = {}
        if self.arms:
            changes["arms"] = tuple(arm for arm in race.arms if arm.name in self.arms)
        if self.envs:
            changes["envs"] = self.envs
        if self.cap_s:
            changes["cap_s"] = self.cap_s
        race = dataclasses.replace(race, **changes)
        return harness.retention_race(race) if self.retention else race


#: the headline races (issue order), then the layout races behind each arm's configuration
QUEUE = (
    # --throughput-actors with no counts: the race only, not the collection-throughput table
    Queued("tianshou_gorila_vs_dqn.py", arms=("GorilaDQN", "DQN"), extra=("--throughput-actors",)),
    Queued("rllib_gorila_vs_dqn.py", "cartpole"),
    Queued("rllib_gorila_vs_dqn.py", "acrobot"),
    Queued(
        "rllib_vtrace_vs_appo.py",
        "cartpole",
        arms=("VTrace central", "VTrace local", "APPO", "IMPALA"),
    ),
    Queued("tianshou_vtrace_vs_ppo.py", "cartpole", arms=("VTrace", "VTrace SEED", "PPO", "A2C")),
    Queued("multi_agent_tictactoe.py", "rllib"),
    Queued("multi_agent_tictactoe.py", "tianshou"),
    Queued("minatar_race.py", "breakout"),
    Queued("rllib_gorila_vs_dqn.py", "lean"),
    Queued("tianshou_vtrace_vs_ppo.py", "slow"),
    Queued("tianshou_vtrace_vs_ppo.py", "slower"),
    Queued("rllib_gorila_vs_dqn.py", "layouts"),
    Queued("rllib_vtrace_vs_appo.py", "layouts"),
    Queued("tianshou_vtrace_vs_ppo.py", "layouts"),
    Queued("minatar_race.py", "all"),
    # issue 33: what each pair keeps after it first reaches the target, to at least 3x the
    # time the slower arm's runs took to reach it
    Queued(
        "tianshou_vtrace_vs_ppo.py",
        "cartpole",
        retention=True,
        arms=(
            "VTrace",
            "PPO",
            "VTrace clip 0.1",
            "VTrace clip 0.1, 2,048 per update",
            "VTrace PPO form, lr 1e-3",
        ),
        envs=("CartPole-v1",),
        cap_s=45.0,
    ),
    Queued("tianshou_vtrace_vs_ppo.py", "ablation"),  # one setting at a time, past the target
    Queued(
        "rllib_vtrace_vs_appo.py",
        "cartpole",
        retention=True,
        arms=(
            "VTrace local",
            "IMPALA",
            "VTrace local clip 0.2",
            "VTrace local clip 0.2, APPO targets",
            "VTrace local, own value layers",
            "VTrace local, PPO form",
            # VTraceConfig() as it is since 2026-12-08: the PPO form's loss on its own defaults
            "VTrace defaults",
        ),
        cap_s=150.0,
    ),
    # GorilaDQN (RLlib) past the target, one setting changed at a time (5 seeds, 120 s)
    Queued("rllib_gorila_vs_dqn.py", "ablation"),
    # GorilaDQN (Tianshou) past the target, one setting changed at a time (5 seeds, 150 s)
    Queued("tianshou_gorila_vs_dqn.py", "ablation", extra=("--throughput-actors",)),
    # the GorilaDQN pairs: their baselines take 3-4 minutes to the target (IQM 213 s and 179 s)
    Queued(
        "rllib_gorila_vs_dqn.py",
        "lean",
        retention=True,
        # the Polyak target (a class default since 2026-12-07) with Huber's loss, the whole run
        # in the replay; the same at half the learning rate (it kept 96 % in the ablation's
        # 120 s runs)
        arms=(
            "GorilaDQN, Polyak target, whole run",
            "DQN",
            "GorilaDQN, Polyak target, whole run, lr 5e-4",
            # the squared TD error in place of Huber's (the class defaults since 2026-12-07):
            # it kept the action gap near a fall
            "GorilaDQN, Polyak target, whole run, MSE loss",
        ),
        cap_s=650.0,
    ),
    Queued(
        "tianshou_gorila_vs_dqn.py",
        extra=("--throughput-actors",),
        retention=True,
        # the candidates: the ablation's whole-run replay; then (2026-12-08) the whole run and
        # the squared TD error, which kept 96 % in the ablation's 150 s runs
        arms=("GorilaDQN, replay 400k", "DQN", "GorilaDQN, replay 1M, MSE loss"),
        envs=("CartPole-v1",),
        cap_s=540.0,
    ),
)


def plan_line(race: harness.Race, results: Path = harness.RESULTS / "races") -> str:
    """``race``'s runs in and wanted, the hours they took, and the hours the rest would take at
    their mean (at the cap plus 60 s of start-up each where none is in yet: the worst case)."""
    records = [
        record
        for by_arm in harness.load_runs(race, results).values()
        for arm_records in by_arm.values()
        for record in arm_records
    ]
    wanted = len(race.envs) * len(race.seeds) * len(race.arms)
    walls = [record["wall_seconds"] for record in records if "wall_seconds" in record]
    spent = sum(walls) / 3600
    if walls:
        left, how = (wanted - len(records)) * statistics.fmean(walls) / 3600, "at their mean"
    else:
        left, how = wanted * (race.cap_s + 60) / 3600, "worst case: cap + 60 s each"
    return (
        f"{race.name:34s} {len(records):3d}/{wanted:<3d} runs  {spent:5.1f} h spent  "
        f"{left:5.1f} h left ({how})"
    )


def main(argv: list[str] | None = None) -> None:
    names = {queued.race().name: queued for queued in QUEUE}
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plan", action="store_true", help="say where each race stands, run none")
    parser.add_argument("--only", nargs="+", choices=sorted(names), help="default: every race")
    args = parser.parse_args(argv)
    queue = [names[name] for name in args.only] if args.only else list(QUEUE)
    for queued in queue:
        if args.plan:
            print(plan_line(queued.race()))
            continue
        command = [sys.executable, str(HERE / queued.script), *queued.argv()]
        print("$", " ".join(command[1:]), flush=True)
        subprocess.run(command, check=True)
        subprocess.run([sys.executable, str(HERE / "race_tables.py")], check=True)


if __name__ == "__main__":
    main()
