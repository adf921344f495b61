"""Subprocess smoke runs of every example and benchmark script with tiny budgets.

The runs go two at a time in the background of the whole session, at low CPU priority
(``script_pool``); each test waits for its own run and checks what it wrote.

The race benchmarks (a framework's own algorithm against ours, several arms each in its own Ray
session: 35-100 s apiece here) and the measurements that train whole algorithms (central vs
local inference, the pixel pipeline, the soak) run in ``make test-long``; every example and the
other measurement benchmarks run in ``make test``.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from script_pool import session_pool

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.subprocess

#: test -> (script and its arguments, ``{out}`` standing for the test's output folder;
#: timeout in s)
SCRIPTS: dict[str, tuple[str, float]] = {
    "test_core_example_trains_and_writes_checkpoint_and_curve": (
        (
            "examples/core_apex_dqn_cartpole.py --env-steps 1500 --eval-every 500 "
            "--learning-starts 200 --out {out}"
        ),
        240,
    ),
    "test_distributed_replay_bench_writes_json_and_table": (
        (
            "benchmarks/distributed_replay_bench.py --seconds 1 --shards 1 --capacity 30000 "
            "--out {out}"
        ),
        240,
    ),
    "test_replay_bench_writes_json_and_table": (
        (
            "benchmarks/replay_bench.py --size 3000 --cycles 20 --insert-chunk 500 "
            "--profile-calls 50 --out {out}"
        ),
        240,
    ),
    "test_tianshou_gorila_example_trains_and_writes_checkpoint_and_curve": (
        (
            "examples/tianshou_gorila_cartpole.py --env-steps 1500 --epoch-steps 750 "
            "--num-actors 1 --envs-per-actor 2 --target-return 0 --out {out}"
        ),
        240,
    ),
    "test_tianshou_gorila_hl_example_runs_an_experiment_and_watches_it": (
        (
            "examples/tianshou_gorila_cartpole_hl.py --max_epochs 1 --epoch_num_steps 500 "
            "--learning_starts 200 --buffer_size 2000 --num_actors 1 --envs_per_actor 2 "
            "--num_test_envs 2 --watch_num_episodes 1 --persistence_base_dir {out}"
        ),
        240,
    ),
    "test_tianshou_vtrace_example_trains_and_writes_checkpoint_and_curve": (
        (
            "examples/tianshou_vtrace_cartpole.py --env-steps 2048 --epoch-steps 1024 "
            "--num-actors 2 --envs-per-actor 2 --steps-per-env 16 --collect-steps 128 "
            "--batch-size 64 --out {out}"
        ),
        240,
    ),
    "test_tianshou_vtrace_vs_ppo_bench_writes_json_and_table": (
        (
            "benchmarks/tianshou_vtrace_vs_ppo.py --seeds 0 --envs CartPole-v1 --arms "
            "'VTrace SEED' A2C --max-seconds 1.5 --epoch-steps 1000 --out {out}"
        ),
        400,  # two runs in processes of their own, each importing Tianshou and torch
    ),
    "test_tianshou_vtrace_throughput_bench_writes_json_and_table": (
        (
            "benchmarks/tianshou_vtrace_vs_ppo.py --throughput --throughput-layouts 1x2 "
            "--throughput-stepping sequential threads --throughput-seconds 3 "
            "--throughput-warmup-seconds 0.5 --out {out}"
        ),
        240,
    ),
    "test_tianshou_gorila_vs_dqn_bench_writes_json_and_table": (
        (
            "benchmarks/tianshou_gorila_vs_dqn.py --seeds 0 --envs CartPole-v1 --arms GorilaDQN "
            "DQN --max-seconds 3 --epoch-steps 1000 --gorila actors=1 envs_per_actor=2 "
            "--throughput-actors 1 "
            "--throughput-seconds 2 --throughput-warmup-seconds 1 --out {out}"
        ),
        400,  # two runs in processes of their own, each importing Tianshou and torch
    ),
    "test_rllib_gorila_vs_dqn_bench_writes_json_and_table": (
        (
            "benchmarks/rllib_gorila_vs_dqn.py --seeds 0 --envs SlowCartPole-v1 --max-seconds "
            "4 --eval-every-s 2 --retention --out {out}"
        ),
        400,  # two runs in processes of their own, each importing RLlib and torch
    ),
    "test_gorila_adapters_env_steps_bench_writes_json_and_table": (
        (
            "benchmarks/gorila_adapters_env_steps.py --seeds 0 --max-env-steps 1200 --actors "
            "1 --envs-per-actor 2 --test-every 1200 --test-episodes 2 --out {out}"
        ),
        240,
    ),
    "test_rllib_vtrace_vs_appo_bench_writes_json_and_table": (
        (
            "benchmarks/rllib_vtrace_vs_appo.py --seeds 0 --arms 'VTrace central' IMPALA "
            "--max-seconds 5 --eval-every-s 1 --out {out}"
        ),
        400,  # two runs in processes of their own, each importing RLlib and torch
    ),
    "test_central_inference_bench_writes_json_and_table": (
        (
            "benchmarks/central_inference_bench.py --algo gorila --envs minatar:breakout "
            "--runners 1 --envs-per-runner 2 --seconds 1 --out {out}"
        ),
        280,
    ),
    "test_pixel_replay_bench_writes_json_and_table": (
        (
            "benchmarks/pixel_replay_bench.py --frames 200 --capacity 400 "
            "--throughput-capacity 300 --cycles 10 --codecs lz4 zstd --out {out}/pixel"
        ),
        240,
    ),
    "test_inference_cost_bench_writes_json_and_table": (
        (
            "benchmarks/inference_cost_bench.py --requests 50 --forward-repeats 2 "
            "--env-steps 50 --out {out}"
        ),
        240,
    ),
    "test_weight_sync_bench_writes_json_and_table": (
        (
            "benchmarks/weight_sync_bench.py --frames 64 --eval-frames 32 --warmup 10"
            " --updates 100 --spacing 10 --updates-between-pulls 10 50 --actors 2"
            " --tolerances 0.05 --pullers 1 --pulls-step 50 --trained-max-steps 1500"
            " --trained-eval-states 64 --out {out}/weights"
        ),
        240,
    ),
    "test_tianshou_multi_agent_example_trains_and_writes_checkpoint_and_curve": (
        (
            "examples/tianshou_multi_agent_tictactoe.py --env-steps 2000 --epoch-steps 1000 "
            "--out {out}"
        ),
        240,
    ),
    "test_multi_agent_tictactoe_bench_writes_json_and_table": (
        (
            "benchmarks/multi_agent_tictactoe.py --race tianshou --seeds 0 "
            "--arms GorilaDQN 'DQN (example)' "
            "--max-seconds 1.5 --eval-every-s 0.5 --out {out}"
        ),
        400,  # two runs in processes of their own
    ),
    "test_multi_agent_tictactoe_rllib_race_runs_gorila_on_both_seats": (
        (
            "benchmarks/multi_agent_tictactoe.py --race rllib --seeds 0 --arms GorilaDQN "
            "--max-seconds 1.5 --eval-every-s 0.5 --out {out}"
        ),
        300,
    ),
    "test_pixel_pipeline_bench_writes_json_and_table": (
        (
            "benchmarks/pixel_pipeline_bench.py --env minatar:breakout --actors 2 --seconds 1 "
            "--out {out}/pipeline"
        ),
        240,
    ),
    "test_soak_bench_writes_json_table_and_plot": (
        (
            "benchmarks/soak.py --frameworks tianshou --minutes 0.1 --sample-every-s 2 "
            "--warmup-min 0 --capacity 2000 --out {out}"
        ),
        240,
    ),
    "test_minatar_race_bench_writes_json_table_and_curves": (
        (
            "benchmarks/minatar_race.py --race all --seeds 0 --max-seconds 2 --eval-every-s 1 "
            "--epoch-steps 500 --eval-max-steps 50 --learning-starts 200 --out {out}"
        ),
        600,  # four runs in processes of their own
    ),
}


#: The Tianshou MinAtar example twice in one process, as a user restores and continues: one
#: epoch, then ``--resume_path`` to the run's folder for a second (``{out}``: the test's folder)
MINATAR_TRAIN_THEN_RESUME = """
import glob, runpy, sys
sys.path.insert(0, {examples!r})  # the example's own imports (ray_cluster, tianshou_progress)
example = {examples!r} + "/tianshou_gorila_minatar.py"
common = ["--epoch_num_steps", "300", "--learning_starts", "100", "--buffer_size", "2000",
          "--num_actors", "1", "--envs_per_actor", "2", "--num_test_envs", "2",
          "--show_progress", "false", "--persistence_base_dir", {out!r}]
sys.argv = [example, "--epoch", "1", *common]
runpy.run_path(example, run_name="__main__")
(run,) = glob.glob({out!r} + "/breakout/gorila/0/*")
sys.argv = [example, "--epoch", "2", "--resume_path", run, *common]
runpy.run_path(example, run_name="__main__")
sys.argv = [example, "--watch", "true", "--resume_path", run, "--num_test_envs", "2"]
runpy.run_path(example, run_name="__main__")
"""
MINATAR_TEST = "test_tianshou_minatar_example_trains_resumes_and_watches"


def script_runs(pool, selected: list[str], mktemp) -> None:
    """Queue the runs of this module's ``selected`` tests (``script_pool``: before the session's
    first test)."""
    for name in selected:
        if name in SCRIPTS:
            args, timeout = SCRIPTS[name]
            out = mktemp(name)
            pool.submit(name, shlex.split(args.replace("{out}", str(out))), timeout, out_dir=out)
    if MINATAR_TEST in selected:
        out = mktemp(MINATAR_TEST)
        driver = out / "train_then_resume.py"
        examples = str(ROOT / "examples")
        driver.write_text(MINATAR_TRAIN_THEN_RESUME.format(examples=examples, out=str(out)))
        pool.submit(MINATAR_TEST, [driver], 280, out_dir=out)  # three runs, two Ray sessions


@pytest.fixture
def smoke(request):
    """The session's script runs (output folders in ``dirs``)."""
    return session_pool(request)


@pytest.fixture
def output(request, smoke) -> str:
    """The calling test's run, waited for: stdout + stderr (the test fails with them unless
    the script exited with 0)."""
    return smoke.output(request.node.name)


@pytest.fixture
def out_dir(request, smoke, output) -> Path:
    """Where the calling test's run wrote, once it finished."""
    return smoke.dirs[request.node.name]


def test_core_example_trains_and_writes_checkpoint_and_curve(output, out_dir):
    assert "final greedy evaluation return (10 episodes):" in output
    assert "greedy eval" in output  # progress lines
    assert (out_dir / "checkpoint.pt").stat().st_size > 0
    assert (out_dir / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    import torch

    from rl_dist_ext.replay import PrioritizedReplay

    checkpoint = torch.load(out_dir / "checkpoint.pt", weights_only=False)
    replay = PrioritizedReplay(50_000, alpha=0.6)
    replay.load_state_dict(checkpoint["replay"])
    assert len(replay) == checkpoint["env_steps"]


def test_distributed_replay_bench_writes_json_and_table(out_dir):
    result = json.loads((out_dir / "distributed_replay_bench.json").read_text())
    assert set(result["results"]) == {"in-process PrioritizedReplay", "DistributedReplay, 1 shard"}
    for row in result["results"].values():
        assert row["SGD"]["cycles_per_s"] > 0


def test_replay_bench_writes_json_and_table(out_dir):
    result = json.loads((out_dir / "replay_bench.json").read_text())
    rows = result["results"]
    assert set(rows) == {
        "rl-dist-ext PrioritizedReplay",
        "tianshou PrioritizedReplayBuffer",
        "rllib PrioritizedEpisodeReplayBuffer",
    }
    for row in rows.values():
        assert row["stored"] == 3000
        assert row["sample_update_cycles_per_s"] > 0
    table = (out_dir / "replay_bench.md").read_text()
    assert "| rl-dist-ext PrioritizedReplay |" in table
    # the cycle's profile: the stages timed alone, the two calls whole, the Python around them
    profile = result["profile_us"]
    stages = [stage for stage in profile if stage != "Python around the stages"]
    assert {"sum-tree descent (stratified)", "sum-tree leaf update", "sample()"} <= set(stages)
    assert len(stages) == 9 and all(profile[stage] > 0 for stage in stages)
    assert "| sum-tree descent (stratified) |" in table


def test_tianshou_gorila_example_trains_and_writes_checkpoint_and_curve(output, out_dir):
    """A target of 0, reached at the first test: the run goes on to its budget (no
    ``--stop-at-target``) and says what it kept after its first test at the target."""
    assert "final greedy evaluation return (10 episodes):" in output
    assert re.search(r"first reached 0 at [\d,]+ env steps; then (\d+) of \1 greedy", output)
    assert re.search(r"after 1[5-9]\d\d env steps", output)  # the budget, not the target
    assert "policy lag" in output  # progress lines
    assert (out_dir / "checkpoint" / "algorithm.pt").stat().st_size > 0
    assert (out_dir / "checkpoint" / "replay" / "manifest.json").exists()
    assert list((out_dir / "tb").glob("events.out.tfevents.*"))
    assert (out_dir / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    import torch

    state = torch.load(out_dir / "checkpoint" / "algorithm.pt", weights_only=False)
    assert state["_extra_state"]["num_gradient_updates"] > 0


def test_tianshou_gorila_hl_example_runs_an_experiment_and_watches_it(output, out_dir):
    """Tianshou's ExperimentBuilder with GorilaDQN: trained, tested, logged, watched. (Its
    policy file is written at a test that beats the first one: not within one tiny epoch.)"""
    assert "Best test return" in output and "Watched episodes" in output
    (experiment,) = (out_dir / "CartPole-v1").glob("GorilaDQNExperiment_*/exp_seed=0")
    assert "Epoch #1: test_reward" in (experiment / "log.txt").read_text()
    assert list(experiment.glob("events.out.tfevents.*"))


def test_tianshou_minatar_example_trains_resumes_and_watches(output, out_dir):
    """The pixel example in Tianshou's style: an epoch with its checkpoint (algorithm and the
    compressed replay), a second epoch resumed from it (weights, replay rows, the trainer's
    epoch and env-step counters), then ``--watch`` of the checkpoint."""
    (run,) = (out_dir / "breakout" / "gorila" / "0").iterdir()
    assert "Checkpoint of epoch 1" in output
    assert "Loaded the algorithm from" in output and "replay rows from" in output
    assert "Epoch #2:" in output and "Checkpoint of epoch 2" in output
    assert "Epoch #1:" not in output.split("replay rows from")[1]  # resumed after epoch 1
    assert (run / "checkpoint" / "replay" / "manifest.json").exists()
    assert (run / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    import torch

    state = torch.load(run / "checkpoint" / "algorithm.pt", weights_only=False)
    assert state["_extra_state"]["num_gradient_updates"] > 0


def test_tianshou_vtrace_example_trains_and_writes_checkpoint_and_curve(output, out_dir):
    assert "final greedy evaluation return (10 episodes):" in output
    assert "greedy tests: never reached 475 (best greedy evaluation " in output
    assert "policy lag" in output and "queue fill" in output  # progress lines
    assert list((out_dir / "tb").glob("events.out.tfevents.*"))
    assert (out_dir / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    import torch

    state = torch.load(out_dir / "checkpoint" / "algorithm.pt", weights_only=False)
    assert state["_extra_state"]["num_gradient_updates"] > 0


@pytest.mark.long  # a race: several arms, each its own Ray session (see module doc)
def test_tianshou_vtrace_vs_ppo_bench_writes_json_and_table(out_dir):
    """Two of the race's arms, one seed each on the harness: VTrace in SEED mode (Ray actors and
    an inference server) and A2C in its CartPole layout; the report leaves out what did not run
    and has no ratio without its baseline (PPO)."""
    report = json.loads((out_dir / "races" / "tianshou_vtrace_vs_ppo.json").read_text())
    runs = report["runs"]["CartPole-v1"]
    assert {arm for arm, records in runs.items() if records} == {"VTrace SEED", "A2C"}
    for arm in ("VTrace SEED", "A2C"):
        (run,) = runs[arm]
        assert run["env_steps"] > 0 and run["curve"], run
        assert all(point[0] <= run["trained_seconds"] + 1e-6 for point in run["curve"])
    assert runs["A2C"][0]["layout"] == "8 DummyVectorEnv envs"
    assert runs["VTrace SEED"][0]["layout"] == "2 actors x 8 envs, sequential"
    summary = report["summary"]["CartPole-v1"]
    assert set(summary) == {"VTrace SEED", "A2C"}
    assert not any("ratio_to_baseline" in arm for arm in summary.values())
    table = (out_dir / "races" / "tianshou_vtrace_vs_ppo.md").read_text()
    (a2c_row,) = [line for line in table.splitlines() if line.startswith("| A2C | ")]
    assert "| n/a |" in a2c_row  # not labelled the baseline


def test_tianshou_vtrace_throughput_bench_writes_json_and_table(out_dir):
    """The collection throughput, one layout stepped both ways, and no race run."""
    report = json.loads((out_dir / "tianshou_vtrace_throughput.json").read_text())
    rows = report["rows"]
    assert [(r["stepping"], r["actors"], r["envs_per_actor"]) for r in rows] == [
        ("sequential", 1, 2),
        ("threads", 1, 2),
    ]
    # every collect delivered at least a trajectory of each actor's 2 envs (32 steps each)
    assert all(r["collects"] > 0 and r["fewest_steps_per_collect"] >= 64 for r in rows)
    assert "| threads | 1 x 2 |" in (out_dir / "tianshou_vtrace_throughput.md").read_text()
    assert not (out_dir / "races").exists()


@pytest.mark.long  # a race: several arms, each its own Ray session (see module doc)
def test_tianshou_gorila_vs_dqn_bench_writes_json_and_table(out_dir):
    """The race on the harness, one seed of each arm, each run a process of its own: every
    run's curve is kept and the report has each arm's IQM and GorilaDQN's ratio to DQN."""
    report = json.loads((out_dir / "races" / "tianshou_gorila_vs_dqn.json").read_text())
    runs = report["runs"]["CartPole-v1"]
    for arm in ("GorilaDQN", "DQN"):
        (run,) = runs[arm]
        assert run["env_steps"] > 0 and run["curve"], run
        assert all(point[0] <= run["trained_seconds"] + 1e-6 for point in run["curve"])
    assert runs["GorilaDQN"][0]["arm_settings"]["actors"] == 1
    summary = report["summary"]["CartPole-v1"]
    assert summary["GorilaDQN"]["runs"] == summary["DQN"]["runs"] == 1
    assert summary["GorilaDQN"]["ratio_interval"][0] <= summary["GorilaDQN"]["ratio_to_baseline"]
    table = (out_dir / "races" / "tianshou_gorila_vs_dqn.md").read_text()
    assert "| GorilaDQN | " in table and "| DQN | " in table
    assert (out_dir / "races" / "tianshou_gorila_vs_dqn.png").stat().st_size > 10_000
    throughput = json.loads((out_dir / "tianshou_gorila_throughput.json").read_text())
    assert [row["num_actors"] for row in throughput["throughput"]] == [1]
    assert throughput["throughput"][0]["env_steps_per_s"] > 0
    assert throughput["throughput"][0]["efficiency"] == 1.0


@pytest.mark.long  # a race: several arms, each its own Ray session (see module doc)
def test_rllib_gorila_vs_dqn_bench_writes_json_and_table(out_dir):
    """The race run past its target (``--retention``), one seed of each arm on the 2 ms CartPole
    (GorilaDQN in its slow env layout, its Ray actors fed SlowCartPole by value): every run goes
    on to its cap with 10-episode evaluations on plain CartPole-v1, and the report has GorilaDQN's
    ratio to DQN and each arm's retention."""
    report = json.loads((out_dir / "races" / "rllib_gorila_vs_dqn_retention.json").read_text())
    assert report["retention"] and not (out_dir / "races" / "rllib_gorila_vs_dqn.json").exists()
    runs = report["runs"]["SlowCartPole-v1"]
    for arm in ("GorilaDQN", "DQN"):
        (run,) = runs[arm]
        assert run["env_steps"] > 0 and run["curve"], run
        assert all(point[0] <= run["trained_seconds"] + 1e-6 for point in run["curve"])
        assert run["trained_seconds"] >= 4.0  # not stopped at a target
        assert run["machine_pace_s"] > 0
    assert runs["GorilaDQN"][0]["arm_settings"]["slow_runners"] == 4
    summary = report["summary"]["SlowCartPole-v1"]
    assert summary["GorilaDQN"]["runs"] == summary["DQN"]["runs"] == 1
    assert "ratio_interval" in summary["GorilaDQN"]
    assert summary["GorilaDQN"]["retention"]["keep_line"] == 360.0
    table = (out_dir / "races" / "rllib_gorila_vs_dqn_retention.md").read_text()
    assert "| GorilaDQN | " in table and "After the target" in table


@pytest.mark.long  # a race: several arms, each its own Ray session (see module doc)
def test_gorila_adapters_env_steps_bench_writes_json_and_table(out_dir):
    result = json.loads((out_dir / "gorila_adapters_env_steps.json").read_text())
    for adapter in ("RLlib", "Tianshou"):
        (run,) = result["runs"][adapter]
        assert run["env_steps"] >= 1200
        assert run["env_steps_to_target"] is None or run["env_steps_to_target"] <= run["env_steps"]
    assert result["summary"]["ratio"] > 0
    assert "| 0 |" in (out_dir / "gorila_adapters_env_steps.md").read_text()


@pytest.mark.long  # a race: several arms, each its own Ray session (see module doc)
def test_rllib_vtrace_vs_appo_bench_writes_json_and_table(out_dir):
    """Two of the race's arms, one seed each on the harness: each run's curve of the learner's
    greedy returns is kept, the report has VTrace's ratio to IMPALA and leaves out what did not
    run."""
    report = json.loads((out_dir / "races" / "rllib_vtrace_vs_appo.json").read_text())
    runs = report["runs"]["CartPole-v1"]
    assert {arm for arm, records in runs.items() if records} == {"VTrace central", "IMPALA"}
    for arm in ("VTrace central", "IMPALA"):
        (run,) = runs[arm]
        assert run["env_steps"] > 0 and run["curve"], run
        assert all(point[0] <= run["trained_seconds"] + 1e-6 for point in run["curve"])
    assert runs["IMPALA"][0]["arm_settings"]["runners"] == 2
    summary = report["summary"]["CartPole-v1"]
    assert set(summary) == {"VTrace central", "IMPALA"}
    assert "ratio_interval" in summary["VTrace central"]
    assert "| VTrace central | " in (out_dir / "races" / "rllib_vtrace_vs_appo.md").read_text()


@pytest.mark.long  # a measurement that trains whole algorithms (see module doc)
def test_central_inference_bench_writes_json_and_table(out_dir):
    # GorilaDQN on MinAtar: the pixel path (uint8 frames, compressed replay, the whole actor
    # step per request); VTrace's runners differ only in what one request runs.
    result = json.loads((out_dir / "central_inference_bench.json").read_text())
    assert result["params"]["algo"] == "gorila"
    modes = {"local", "central"}
    modes |= {"central-gpu"} if result["machine"]["gpu"] else set()
    rows = result["results"]
    assert {(r["runners"], r["mode"]) for r in rows} == {(1, m) for m in modes}
    for row in rows:
        assert row["env_steps_per_s"] > 0
        assert (row["server"] is None) == (row["mode"] == "local")
        if row["server"] is not None:
            assert row["server"]["mean_batch_requests"] >= 1.0
            # an acting request carries both envs of its runner; a priority request (Q-values
            # of a pushed rollout's transitions) carries more
            assert row["server"]["mean_batch_rows"] >= 2 * row["server"]["mean_batch_requests"]
    assert {(r["runners"], r["mode"]) for r in result["ratios"]} == {
        (1, m) for m in modes - {"local"}
    }
    assert set(result["targets"]["met"]) == {
        f"minatar:breakout, 2 env(s) per runner, {m}" for m in modes - {"local"}
    }
    table = (out_dir / "central_inference_bench.md").read_text()
    assert "| minatar:breakout | 2 | 1 | central |" in table


def test_pixel_replay_bench_writes_json_and_table(out_dir):
    result = json.loads((out_dir / "pixel.json").read_text())
    assert [c["codec"] for c in result["codecs"]] == ["lz4", "zstd"]
    assert [t["storage"] for t in result["throughput"]] == ["raw uint8", "lz4", "zstd"]
    for m in result["memory"]:
        assert 0 < m["bytes_per_row"] < m["raw_row_bytes"] / 20
    assert "| raw uint8 (ColumnarStorage) |" in (out_dir / "pixel.md").read_text()


def test_inference_cost_bench_writes_json_and_table(out_dir):
    result = json.loads((out_dir / "inference_cost_bench.json").read_text())
    assert set(result["forward_ms"]) == {"1", "2", "4", "8", "16", "32", "64"}
    trip = result["round_trip"]
    assert trip["wall_ms"] > 0 and trip["caller_cpu_ms"] >= 0 and trip["server_cpu_ms"] >= 0
    assert set(result["central_over_local_bound_by_envs_per_runner"]) == {"1", "4", "8"}
    assert "| envs per runner E |" in (out_dir / "inference_cost_bench.md").read_text()


def test_weight_sync_bench_writes_json_and_table(out_dir):
    """The three networks trained, every encoding measured: fp32 exact, int8 a quarter, delta
    pulls (3 layouts: U = 10, 50, and 50 with 2 staggered actors) smaller than int8's full
    pull; the CartPole policy trained online (1,500 env steps here) says how far it got and on
    how many of its own states agreement was taken."""
    nets = json.loads((out_dir / "weights.json").read_text())["nets"]
    assert set(nets) == {"nature", "mlp", "cartpole_trained"}
    trained = nets["cartpole_trained"]["trained"]
    assert trained["env_steps"] == 1_500 and trained["eval_states"] == 64
    for net in nets.values():
        rows = net["rows"]
        assert [r["encoding"] for r in rows] == ["fp32", "fp16", "int8", *["delta"] * 3]
        assert rows[0]["max_abs_q_error"] == 0.0 and rows[0]["greedy_action_agreement"] == 1.0
        assert rows[2]["payload_bytes"] < rows[0]["payload_bytes"] / 3.5
        deltas = rows[3:]
        assert [(r["updates_between_pulls"], r["actors"]) for r in deltas] == [
            (10, 1),
            (50, 1),
            (50, 2),
        ]
        assert all(r["delta_pulls"] > 0 and r["full_pulls_after_first"] == 0 for r in deltas)
        assert all(r["payload_bytes"] < rows[2]["payload_bytes"] for r in deltas)
        assert all(r["pulls_per_s"] > 0 for r in rows[:3]) and deltas[1]["pulls_per_s"] > 0
    assert "| delta | 0.05 | 50 | 2 |" in (out_dir / "weights.md").read_text()


def test_tianshou_multi_agent_example_trains_and_writes_checkpoint_and_curve(output, out_dir):
    assert "final win rate against a random player" in output
    assert (out_dir / "checkpoint" / "replay" / "player_2" / "manifest.json").exists()
    assert list((out_dir / "tb").glob("events.out.tfevents.*"))
    assert (out_dir / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    import torch

    state = torch.load(out_dir / "checkpoint" / "algorithm.pt", weights_only=False)
    assert state["_extra_state"]["num_gradient_updates"] > 0


@pytest.mark.long  # a race: several arms, each its own Ray session (see module doc)
def test_multi_agent_tictactoe_bench_writes_json_and_table(out_dir):
    """Tianshou's race, GorilaDQN (Ray actors) against Tianshou's DQN with its example's
    settings (no Ray, the race's baseline), one seed each: each curve holds win rates against
    random, the report GorilaDQN's ratio to that DQN."""
    report = json.loads((out_dir / "races" / "tictactoe_tianshou.json").read_text())
    runs = report["runs"]["tictactoe_v3"]
    assert {arm for arm, records in runs.items() if records} == {"GorilaDQN", "DQN (example)"}
    for arm in ("GorilaDQN", "DQN (example)"):
        (run,) = runs[arm]
        assert run["env_steps"] > 0 and run["curve"], run
        assert all(0.0 <= point[2] <= 1.0 for point in run["curve"])
    assert "ratio_interval" in report["summary"]["tictactoe_v3"]["GorilaDQN"]
    assert "win rate against random" in (out_dir / "races" / "tictactoe_tianshou.md").read_text()


@pytest.mark.long  # a race (see module doc)
def test_multi_agent_tictactoe_rllib_race_runs_gorila_on_both_seats(out_dir):
    report = json.loads((out_dir / "races" / "tictactoe_rllib.json").read_text())
    (run,) = report["runs"]["tictactoe_v3"]["GorilaDQN"]
    assert run["env_steps"] > 0 and run["curve"], run
    assert all(0.0 <= point[2] <= 1.0 for point in run["curve"])


@pytest.mark.long  # a measurement that trains whole algorithms (see module doc)
def test_pixel_pipeline_bench_writes_json_and_table(out_dir):
    (row,) = json.loads((out_dir / "pipeline.json").read_text())["rows"]
    assert row["actors"] == 2 and row["env_steps_per_s"] > 0 and row["updates_per_s"] > 0
    assert row["compression_ratio"] > 1
    assert "| 2 |" in (out_dir / "pipeline.md").read_text()


@pytest.mark.long  # a measurement that trains whole algorithms (see module doc)
def test_soak_bench_writes_json_table_and_plot(out_dir):
    result = json.loads((out_dir / "soak.json").read_text())
    samples = result["runs"]["tianshou"]
    assert len(samples) >= 2
    last = samples[-1]
    assert last["env_steps"] > 0 and last["driver_rss_mb"] > 0
    names = set(last["actors_rss_mb"])
    assert {"shard_0", "shard_1", "weights_server"} <= names
    assert len(names) == 5  # and the two env runners / actors
    assert all(v > 0 for v in last["actors_rss_mb"].values())
    assert last["object_store_mb"] >= 0
    assert "slope_per_h" in result["trends"]["tianshou"]["driver_rss_mb"]
    assert "| tianshou | driver_rss_mb |" in (out_dir / "soak.md").read_text()
    assert (out_dir / "soak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.long  # a race: several arms, each its own Ray session (see module doc)
def test_minatar_race_bench_writes_json_table_and_curves(out_dir):
    """Every arm of the MinAtar race, one seed each, on the pixel path: each curve is kept, the
    report rates each arm against Tianshou's DQN and plots the curves."""
    report = json.loads((out_dir / "races" / "minatar_breakout_all.json").read_text())
    runs = report["runs"]["minatar:breakout"]
    assert set(runs) == {
        "GorilaDQN (RLlib)",
        "DQN (RLlib)",
        "GorilaDQN (Tianshou)",
        "DQN (Tianshou)",
    }
    for name, (run,) in runs.items():
        assert run["env_steps"] > 0, name
        assert run["curve"] and all(len(point) == 3 for point in run["curve"]), name
        assert run["arm_settings"]["learning_starts"] == 200
    summary = report["summary"]["minatar:breakout"]
    assert "ratio_interval" in summary["GorilaDQN (RLlib)"]
    assert (
        "| GorilaDQN (Tianshou) | " in (out_dir / "races" / "minatar_breakout_all.md").read_text()
    )
    assert (out_dir / "races" / "minatar_breakout_all.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
