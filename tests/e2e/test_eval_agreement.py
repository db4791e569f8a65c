"""A run's in-training evaluation and ``rlinf-embodied eval --run-trials`` of the checkpoint it
saved agree trial by trial (issue 38).

A toy PPO run (toy/PointReach-v0, MLP, 2 iterations on Ray) evaluates 6 episodes in one batch
at iteration 2 and saves that iteration's weights; the standalone evaluation then runs the same
6 trials (the run's eval seeds, fixed-length episodes) with other batches (4 envs in-process;
1 env in an env process): every trial's return, success_once and success_at_end equal the run's
``eval/iter_000002.json`` record exactly, because both sides run the policy row by row.
"""

import json

import pytest

from rlinf_embodied.config import load_config
from rlinf_embodied.eval.request import EvalError, EvalRequest
from rlinf_embodied.eval.run import evaluate
from rlinf_embodied.runners.embodied import EmbodiedRunner

JOB = """
run: {name: agree, seed: 5}
cluster: {num_cpu_devices: 1}
placement: collocated
env: {type: gym, env_id: toy/PointReach-v0, num_envs: 4, max_episode_steps: 15,
      task_description: reach the point}
policy: {type: mlp, hidden_sizes: [32, 32]}
trainer: {iterations: 2, rollout_steps: 15, update_epochs: 1, num_minibatches: 2,
          eval_every: 2, save_every: 2}
eval: {num_episodes: 6, num_videos: 0}
logging: {tensorboard: false, console: false}
"""


@pytest.mark.parametrize("env_type", ["gym", "tests.plugins.lab_components:FixedGoalEnv"])
def test_in_training_eval_and_standalone_eval_agree_trial_by_trial(ray_session, tmp_path, env_type):
    # also a user env class (module:Class, seeded like gymnasium), with a setting of its own
    job = tmp_path / "job.yaml"
    job.write_text(JOB if env_type == "gym" else JOB.replace(
        "env: {type: gym,", f"env: {{type: '{env_type}', goal_radius: 0.3,"))
    cfg = load_config(job)
    run = tmp_path / "run"
    EmbodiedRunner(cfg, run).run()
    record = json.loads((run / "eval" / "iter_000002.json").read_text())
    assert record["batch_invariant"] is True and record["episodes"] == 6
    trials = {t["trial"]: t for t in record["trials"]}
    assert sorted(trials) == list(range(6))
    base = cfg.eval.trial_seed(cfg.run.seed)
    assert [trials[j]["seed"] for j in range(6)] == [base + j for j in range(6)]
    assert len({round(t["episode_return"], 9) for t in trials.values()}) == 6  # all distinct
    assert {t["instruction"] for t in trials.values()} == {"reach the point"}  # per trial

    for num_envs, procs in ((4, 0), (1, 1)):
        res = evaluate(EvalRequest(env=None, policy=str(run / "checkpoints" / "iter_000002"),
                                   run_trials=True, num_envs=num_envs, num_processes=procs,
                                   device="cpu", reports=False,
                                   output=str(tmp_path / f"standalone_{num_envs}.json")))
        h = res.header
        assert h["protocol"]["env_seed"] == base and h["protocol"]["ignore_terminations"] is True
        assert h["protocol"]["global_seed"] == cfg.run.seed and h["batch_invariant"] is True
        assert h["max_steps"] == 15 and h["env"] == env_type  # the run's env type, adopted
        got = {e.trial: e for e in res.episodes}
        assert sorted(got) == sorted(trials)
        for j, t in trials.items():
            e = got[j]
            assert e.steps == 15  # fixed length, as in training's evaluation
            assert (e.episode_return, e.success, e.success_at_end) == (
                t["episode_return"], t["success_once"], t["success_at_end"]), (num_envs, j)


def test_run_trials_needs_a_maniskill_or_gym_run(tmp_path):
    with pytest.raises(EvalError, match="--run-trials needs --policy to be a training run"):
        evaluate(EvalRequest(env="gym", task="toy/PointReach-v0", policy="random",
                             run_trials=True, output=str(tmp_path / "r.json")))
    # a run directory (or an SFT checkpoint's) without in-training evaluation records
    plain = tmp_path / "plain_run"
    plain.mkdir()
    (plain / "config.yaml").write_text("env: {type: gym, env_id: toy/PointReach-v0}\n")
    with pytest.raises(EvalError, match="recorded none .no eval/iter_.*drop --run-trials"):
        evaluate(EvalRequest(env=None, policy=str(plain), run_trials=True,
                             output=str(tmp_path / "p.json")))
    run = tmp_path / "libero_run"
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "iter_000001.json").write_text("{}")
    (run / "config.yaml").write_text("env: {type: libero, suite: libero_spatial}\n")
    with pytest.raises(EvalError, match="LIBERO run's in-training evaluation picks stored"):
        evaluate(EvalRequest(env="libero", suite="libero_spatial", policy=str(run),
                             run_trials=True, output=str(tmp_path / "l.json")))
