"""The RLlib example scripts, run as a user runs them with ``--as-test`` (in this process, on the
session's Ray: ``main(argv, keep_ray_up=True)``; Tune runs each trial in its own actor).

These runs are the RLlib learning tests for their setting: the script's own success check
(RLlib's ``run_rllib_example_script_experiment``: a trial reached ``--stop-reward`` on the
greedy evaluation metric within ``--stop-timesteps``) is what passes or fails, and the untrained
module, built from the script's config with the same seed, is shown below that reward first.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
from tiers import learning_seeds

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def examples(monkeypatch, tmp_path):
    """Imports an example script by name; Tune's results go under ``tmp_path``."""
    import ray.train.constants

    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setattr(ray.train.constants, "DEFAULT_STORAGE_PATH", str(tmp_path / "results"))

    def load(name: str):
        sys.modules.pop(name, None)
        return importlib.import_module(name)

    return load


def untrained_module(config, env, seed: int, module_id: str | None = None):
    """The RLModule the script's config builds before any training, seeded as the run is."""
    import gymnasium as gym
    import torch

    torch.manual_seed(seed)
    if module_id is None:
        made = gym.make(env) if isinstance(env, str) else env()
        try:
            return config.get_rl_module_spec(env=made).build()
        finally:
            made.close()
    made = env({})  # an RLlib env creator (env_config)
    try:
        return config.get_multi_rl_module_spec(env=made).build()[module_id]
    finally:
        made.close()


def greedy_checks(results, metric: str, interval: int) -> list[tuple[int, float]]:
    """(env steps, greedy metric) of every evaluation the trials ran (every ``interval``
    iterations)."""
    from rllib_script import ENV_STEPS, evaluations

    checks = []
    for result in results:
        rows = evaluations(result.metrics_dataframe, metric, interval)
        checks += [(int(n), float(v)) for n, v in zip(rows[ENV_STEPS], rows[metric], strict=True)]
    return checks


def test_a_run_stops_at_its_reward_only_when_asked(examples):
    """The scripts train to their budget; ``--stop-at-target`` and ``--as-test`` add the
    reward to Tune's stop criteria."""
    from rllib_script import ENV_STEPS, EVAL_RETURN, stop_criteria

    parser = examples("rllib_gorila_cartpole").parser
    budget = {ENV_STEPS: 150_000, "training_iteration": 100_000}
    assert stop_criteria(parser.parse_args([]), EVAL_RETURN) == budget
    for flag in ("--stop-at-target", "--as-test"):
        stop = stop_criteria(parser.parse_args([flag, "--stop-reward=200"]), EVAL_RETURN)
        assert stop == budget | {EVAL_RETURN: 200.0}


# CI runs seed 3. With the Polyak target (the default since 2026-12-07) seeds 0-4 reached 150 at
# 9.9k-19.6k, 16.1k-33.5k, 10.3k, 9.8k and 9.3k env steps (seeds 0 and 1 over 3 runs each); one
# run of seed 1 of 4 did not within 50k, so the budget is 75k. With the copy every 250 updates:
# 9.3k-13.5k (2026-12-05)
@pytest.mark.parametrize("seed", learning_seeds(ci=3))
def test_gorila_cartpole_example_reaches_its_greedy_reward_as_test(
    ray_session, examples, tmp_path, seed, learning_curve, capsys
):
    """GorilaDQN on CartPole: the greedy evaluation return reaches 150 within 75k env steps;
    then ``--restore-from`` the trial's checkpoint goes on from its state, to its budget past a
    reward it reaches at once, and prints what it kept."""
    from rllib_plugins.evaluation import greedy_return

    example = examples("rllib_gorila_cartpole")
    argv = [
        "--as-test",
        "--stop-reward=150",
        "--stop-timesteps=75000",
        "--num-env-runners=2",
        "--evaluation-interval=3",
        "--evaluation-duration=5",
        "--checkpoint-at-end",
        f"--seed={seed}",
        f"--out={tmp_path}",
    ]
    config = example.build_config(example.parser.parse_args(argv))
    module = untrained_module(config, "CartPole-v1", seed)
    untrained = greedy_return(module, "CartPole-v1", episodes=5, seed=seed)
    assert untrained < 150, f"the untrained policy already passes: {untrained}"

    results = example.main(argv, keep_ray_up=True)  # raises unless a trial reached 150
    learning_curve.extend(greedy_checks(results, "evaluation/env_runners/episode_return_mean", 3))
    assert not results.errors
    assert (tmp_path / "learning_curve.png").stat().st_size > 10_000
    checkpoint = Path(results[0].checkpoint.path)
    assert (checkpoint / "replay" / "manifest.json").exists()
    saved = results[0].metrics
    assert saved["gorila"]["replay_size"] > 0 and saved["gorila"]["env_steps_per_s"] > 0

    # Restore and continue, as the script's --restore-from does: two more iterations, which
    # start from the checkpoint's counters, weights and replay; without --stop-at-target the
    # run goes on past a reward its first evaluation reaches, and says what it kept.
    capsys.readouterr()
    argv = [f"--stop-iters={saved['training_iteration'] + 2}", "--num-env-runners=1"]
    argv += ["--evaluation-interval=1", "--evaluation-duration=2", "--stop-reward=0"]
    argv.append(f"--restore-from={checkpoint}")
    (result,) = example.main([*argv, f"--out={tmp_path / 'continued'}"], keep_ray_up=True)
    assert result.metrics["training_iteration"] == saved["training_iteration"] + 2
    printed = capsys.readouterr().out
    assert "trial 0: first reached 0 at " in printed
    assert "then 1 of 1 greedy evaluations stayed at or above 0 (100%)" in printed
    lifetime = "num_env_steps_sampled_lifetime"
    assert result.metrics["env_runners"][lifetime] > saved["env_runners"][lifetime]
    assert result.metrics["gorila"]["replay_size"] >= saved["gorila"]["replay_size"]
    assert (
        result.metrics["gorila"]["learner_weights_version"]
        > saved["gorila"]["learner_weights_version"]
    )


def test_seed_vtrace_example_trains_the_settings_its_race_arm_measured(examples, monkeypatch):
    """The example's default loss is the retention race's "VTrace local, PPO form" arm on RLlib
    IMPALA's tuned settings (the figures its docs quote); --clip-param 0 is IMPALA's loss."""
    monkeypatch.syspath_prepend(str(EXAMPLES.parent / "benchmarks"))
    race = importlib.import_module("rllib_vtrace_vs_appo")

    from rl_dist_ext.ops.vtrace_loss import resolve_targets_for

    example = examples("rllib_seed_vtrace_cartpole")
    assert example.IMPALA_TUNED == race.IMPALA_TUNED
    arm = dict(race.VARIANTS["VTrace local, PPO form"])
    config = example.build_config(example.parser.parse_args(["--local"]))
    assert config.model_config["vf_share_layers"] == arm.pop("vf_share_layers")
    # the example leaves targets_for to VTraceConfig's default, which follows the clip
    assert resolve_targets_for(config.targets_for, config.clip_param) == arm.pop("targets_for")
    for key, value in {**race.IMPALA_TUNED, **arm}.items():
        assert getattr(config, key) == value, key
    impala = example.build_config(example.parser.parse_args(["--clip-param", "0"]))
    assert (impala.clip_param, impala.targets_for, impala.num_epochs) == (None, "current", 1)
    assert impala.model_config["vf_share_layers"]


# CI runs seed 3: with the example's APPO form (2026-12-06) seeds 0-4 passed 150 after 12.9k,
# 12.1k, 12.1k, 6.5k and 13.8k env steps, at their second check (seed 3 at its first); on
# IMPALA's loss, the example's earlier default, after 42k, 37k, 25k, 38k and 40k
@pytest.mark.parametrize("seed", learning_seeds(ci=3))
def test_seed_vtrace_cartpole_example_reaches_its_greedy_reward_as_test(
    ray_session, examples, tmp_path, seed, learning_curve
):
    """VTrace in SEED mode on CartPole: the greedy evaluation return reaches 150 within 150k
    env steps. One runner with 16 envs (a process fewer than two, and a server request carries
    16 observations)."""
    from rllib_plugins.evaluation import greedy_return

    example = examples("rllib_seed_vtrace_cartpole")
    argv = [
        "--as-test",
        "--stop-reward=150",
        "--stop-timesteps=150000",
        "--num-env-runners=1",
        "--num-envs-per-env-runner=16",
        "--evaluation-interval=3",
        "--evaluation-duration=5",
        f"--seed={seed}",
        f"--out={tmp_path}",
    ]
    config = example.build_config(example.parser.parse_args(argv))
    module = untrained_module(config, "CartPole-v1", seed)
    untrained = greedy_return(module, "CartPole-v1", episodes=5, seed=seed)
    assert untrained < 150, f"the untrained policy already passes: {untrained}"

    results = example.main(argv, keep_ray_up=True)  # raises unless a trial reached 150
    learning_curve.extend(greedy_checks(results, "evaluation/env_runners/episode_return_mean", 3))
    assert not results.errors
    assert (tmp_path / "learning_curve.png").stat().st_size > 10_000
    server = results[0].metrics["central_inference"]
    assert server["version"] > 1 and server["num_callers"] == 1  # the server got learned weights


# CI runs seed 2: seeds 0-4 reached 0.5 after 9.6k, 9.3k, 4.1k, 2.5k and 8.8k env steps in one
# make test-long (2026-12-04); seed 0 took 34-47 s of CI's time, where the suite is tight
@pytest.mark.parametrize("seed", learning_seeds(ci=2))
def test_tictactoe_example_beats_a_random_player_as_test(
    ray_session, examples, tmp_path, seed, learning_curve
):
    """GorilaDQN's learner against a random legal player: its greedy mean game return (RLlib's
    evaluation, 60 games a check, both seats) reaches 0.5 within 30k env steps (about a 0.7
    win rate; random against random is about 0)."""
    from pettingzoo.classic import tictactoe_v3

    from rl_dist_ext.games import play_against_random
    from rllib_plugins import PettingZooCreator
    from rllib_plugins.pettingzoo import greedy_act

    example = examples("rllib_multi_agent_tictactoe")
    argv = [
        "--as-test",
        "--stop-reward=0.5",
        "--stop-timesteps=30000",
        "--evaluation-interval=3",
        "--evaluation-duration=60",
        f"--seed={seed}",
        f"--out={tmp_path}",
    ]
    config = example.build_config(example.parser.parse_args(argv))
    module = untrained_module(config, PettingZooCreator(tictactoe_v3.env), seed, "learner")
    games = play_against_random(tictactoe_v3.env, greedy_act(module), games=200, seed=123)
    untrained = games.win_rate - games.loss_rate
    assert untrained < 0.5, f"the untrained learner already passes: {untrained}"

    results = example.main(argv, keep_ray_up=True)  # raises unless a trial reached 0.5
    learning_curve.extend(greedy_checks(results, example.GREEDY_LEARNER_RETURN, 3))
    assert not results.errors
    assert (tmp_path / "learning_curve.png").stat().st_size > 10_000
    assert results[0].metrics["gorila"]["replay_size"] > 0


MINATAR_SCRIPTS = ("rllib_gorila_minatar", "rllib_vtrace_minatar")


@pytest.mark.parametrize("script", MINATAR_SCRIPTS)
def test_minatar_example_runs_an_iteration_with_a_greedy_evaluation(
    ray_session, examples, tmp_path, script
):
    """A tiny budget (1,000 env steps) through Tune, RLlib's greedy evaluation included, the
    curve written: the pixel path (uint8 frames, the CNN, GorilaDQN's LZ4-compressed replay,
    VTrace's pixel actor-critic) trains. (Pong's frames train in tests/test_pixels.py.)"""
    example = examples(script)
    argv = [
        "--stop-timesteps=1000",
        "--stop-iters=20",
        "--num-env-runners=1",
        "--num-envs-per-env-runner=2",
        "--evaluation-interval=1",
        "--evaluation-duration=1",
        f"--out={tmp_path}",
    ]
    if script == "rllib_gorila_minatar":
        argv.append("--learning-starts=100")
    results = example.main(argv, keep_ray_up=True)
    assert not results.errors
    (result,) = results
    assert result.metrics["evaluation"]["env_runners"]["num_episodes"] >= 1
    assert result.metrics["learners"]["__all_modules__"]["num_module_steps_trained_lifetime"] > 0
    assert (tmp_path / "learning_curve.png").stat().st_size > 10_000
    if script == "rllib_gorila_minatar":
        gorila = result.metrics["gorila"]
        assert gorila["learner_weights_version"] > 0
        assert gorila["replay_compression_ratio"] > 5, gorila
        assert 0 < gorila["replay_bytes_per_transition"] < 2 * 10 * 10 * 4 / 5


@pytest.mark.long
@pytest.mark.learning
@pytest.mark.timeout(3600)
@pytest.mark.parametrize(
    ("script", "target"), [("rllib_gorila_minatar", 10), ("rllib_vtrace_minatar", 4)]
)
def test_minatar_example_reaches_its_greedy_target_as_test(
    ray_session, examples, tmp_path, script, target, learning_curve
):
    """MinAtar Breakout, each script's defaults: the greedy evaluation return (10 episodes)
    reaches the script's target within its 1M env steps: 10 for GorilaDQN (the MinAtar race's
    recipe, which got there in 342-441 s here), 4 for VTrace (eight times the random policy's
    0.5; the script's docstring says why not 10)."""
    example = examples(script)
    assert example.parser.get_default("stop_reward") == target
    argv = ["--as-test", "--num-env-runners=2", "--seed=0", f"--out={tmp_path}"]
    results = example.main(argv, keep_ray_up=True)  # raises unless a trial reached the target
    every = example.parser.get_default("evaluation_interval")
    checks = greedy_checks(results, "evaluation/env_runners/episode_return_mean", every)
    learning_curve.extend(checks)
    assert not results.errors
    assert checks[0][1] < target, f"the first evaluation already reached the target: {checks}"


class PlacementWatch:
    """Polls the alive actors while a sweep runs (a thread): every actor that started after
    it and runs outside any placement group, and the classes of those seen inside one."""

    def __init__(self) -> None:
        import threading

        from conftest import alive_actor_placement_groups

        self._poll = alive_actor_placement_groups
        self._before = set(self._poll())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.outside: dict[str, str] = {}
        self.inside: set[str] = set()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            for actor_id, (name, group) in self._poll().items():
                if actor_id in self._before:
                    continue
                if group is None:
                    self.outside[actor_id] = name
                else:
                    self.inside.add(name)

    def __enter__(self) -> PlacementWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def test_asha_sweep_example_runs_each_trials_actors_in_its_placement_group(
    ray_session, examples, tmp_path
):
    """The GorilaDQN ASHA sweep with a 2-trial grid over ``samples_per_insert``: no actor of
    a trial runs outside the trial's placement group, and each trial's rate limiters hold the
    trial's value (Tune resolves the search space inside ``.replay()`` when each trial builds).

    With ``samples_per_insert=2`` and one runner, a learning chunk asks for more rows than the
    runner's queued requests insert: the learner's sample waits on the rate limiter, and the
    runners must keep getting requests meanwhile (the learner lives in the trial's driver, which
    hands them out), or the sample waits out ``timeout_s`` and ``train()`` raises
    ``RateLimitTimeout`` (it did, before the learner's wait kept the runners acting)."""
    example = examples("tune_gorila_asha")
    argv = [
        "--lr=1e-3",
        "--n-step=3",
        "--samples-per-insert",
        "2",
        "32",
        "--max-env-steps=1500",
        "--grace-env-steps=1000",
        "--checkpoint-freq=0",
        f"--storage-path={tmp_path / 'results'}",
        f"--out={tmp_path}",
    ]
    with PlacementWatch() as watch:
        results = example.main(argv)
    assert not results.errors and len(results) == 2
    assert watch.outside == {}, f"actors outside their trial's placement group: {watch.outside}"
    assert {"GorilaDQN", "GorilaEnvRunner", "RestartAwareReplayShard", "ParameterServer"} <= (
        watch.inside
    ), watch.inside
    limits = {}
    for result in results:
        wanted = result.config["replay_settings"]["samples_per_insert"]
        limits[wanted] = result.metrics["gorila"]["replay_samples_per_insert_limit"]
    assert limits == {2.0: 2.0, 32.0: 32.0}
    assert (tmp_path / "learning_curve.png").stat().st_size > 10_000


def test_pbt_sweep_example_runs_its_trials_inside_their_placement_groups(
    ray_session, examples, tmp_path
):
    """The VTrace PBT sweep with 2 trials and a perturbation every 1,000 env steps runs to its
    budget, and every actor stays in its trial's placement group. (Whether PBT exploits depends
    on which trial reports first after each interval: not asserted.)"""
    example = examples("tune_vtrace_pbt")
    argv = [
        "--num-trials=2",
        "--max-env-steps=3500",
        "--perturbation-env-steps=1000",
        f"--storage-path={tmp_path / 'results'}",
        f"--out={tmp_path}",
    ]
    with PlacementWatch() as watch:
        results = example.main(argv)
    assert not results.errors and len(results) == 2
    assert watch.outside == {}, f"actors outside their trial's placement group: {watch.outside}"
    assert {"VTrace", "VTraceEnvRunner"} <= watch.inside, watch.inside
    for result in results:  # PBT saved each trial at its perturbations (for the others)
        assert list((tmp_path / "results" / "tune_vtrace_pbt").glob(f"*{result.path[-60:]}*"))
    assert (tmp_path / "learning_curve.png").stat().st_size > 10_000


TIANSHOU_SWEEPS = {
    # script: (its swept flags with two values, the actors each trial starts)
    "tune_tianshou_gorila": (["--lr=1e-3", "--n-step", "1", "3"], {"GorilaActor"}),
    "tune_tianshou_vtrace": (["--lr=1e-3", "--ent-coef", "0", "0.01"], {"VTraceActor"}),
}


@pytest.mark.parametrize("script", sorted(TIANSHOU_SWEEPS))
def test_tianshou_tune_example_reports_each_epoch_inside_the_trials_placement_group(
    ray_session, examples, tmp_path, script
):
    """A Tianshou algorithm as a Tune function trainable, 2 trials: each reports every epoch
    (the test return, the collector's fields, the trainer's counters) with a checkpoint holding
    the algorithm (and GorilaDQN's replay), and its actor (and replay shard) run inside its
    placement group."""
    import ray.cloudpickle

    example = examples(script)
    ray.cloudpickle.register_pickle_by_value(example)  # the trial's process lacks examples/
    swept, actors = TIANSHOU_SWEEPS[script]
    argv = [
        *swept,
        "--max-env-steps=2000",
        "--epoch-steps=1000",
        f"--storage-path={tmp_path / 'results'}",
        f"--out={tmp_path}",
    ]
    try:
        with PlacementWatch() as watch:
            results = example.main(argv)
    finally:
        ray.cloudpickle.unregister_pickle_by_value(example)
    assert not results.errors and len(results) == 2
    assert watch.outside == {}, f"actors outside their trial's placement group: {watch.outside}"
    # Tune's function trial actor: "ImplicitFunc", or "wrap_function.<locals>.ImplicitFunc"
    # when an earlier Tune run in the session registered it
    assert any(name.endswith("ImplicitFunc") for name in watch.inside), watch.inside
    gorila = script == "tune_tianshou_gorila"
    if gorila:
        actors = actors | {"RestartAwareReplayShard"}
    assert actors <= watch.inside, watch.inside
    for result in results:
        frame = result.metrics_dataframe
        assert list(frame["epoch"]) == [1, 2]
        assert list(frame["env_step"]) == sorted(frame["env_step"]) and frame["env_step"][1] >= 2000
        assert "test/returns_stat/mean" in frame and "training/policy_lag_mean" in frame
        assert (Path(result.checkpoint.path) / "algorithm.pt").exists()
        if gorila:
            assert frame["training/replay/size"].iloc[-1] > 0
            assert (Path(result.checkpoint.path) / "replay" / "manifest.json").exists()
    assert (tmp_path / "learning_curve.png").stat().st_size > 10_000
