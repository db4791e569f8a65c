"""SFT path at tiny scale with real ManiSkill and real motion-planning data:
demos -> ManiSkill HDF5 -> DemoDataset -> BC -> held-out evaluation -> step-0 gate.

The two demos are planned from the initial states of the fair protocol's first two held-out
trials (seeds 1_000_000 and 1_000_001), so a policy that has cloned them well succeeds there;
the shipped pipeline keeps demo seeds below 1_000_000 (the config refuses others).
"""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

from rlinf_embodied.config import ConfigError, load_config
from rlinf_embodied.sft.config import SFTJobConfig

# The module's fixture plans, converts, clones and evaluates (about 1 minute on an idle
# 2-core machine); a loaded machine needs more than the default per-test limit.
pytestmark = pytest.mark.timeout(1800)

CONFIG = "configs/sft/maniskill_pushcube_sft_rl_mlp.yaml"
EVAL_SEED = 1_000_000  # maniskill_fair_v1 env_seed: trial i resets with EVAL_SEED + i


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """Record 2 demos, behaviour-clone them, evaluate and record the SFT checkpoint."""
    from rlinf_embodied.sft.demos import generate_demos
    from rlinf_embodied.sft.pipeline import load_sft_config, run_sft

    root = tmp_path_factory.mktemp("sft")
    cfg = load_sft_config(CONFIG, [
        f"run.dir={root / 'run'}", f"demos.dir={root / 'demos'}", "demos.num_trajectories=2",
        "bc.steps=400", "bc.batch_size=128", "eval.episodes=2", "eval.num_envs=2",
        "eval.num_processes=0", "eval.gate_episodes=2",
    ])
    demo = generate_demos("PushCube-v1", cfg.demos.dir, 2, seed=EVAL_SEED, log=lambda *_: None)
    out = run_sft(cfg, log=lambda *_: None)
    return cfg, demo, out


def test_demos_are_maniskill_trajectories_in_the_policy_controller(pipeline):
    from rlinf_embodied.sft.dataset import DemoDataset

    cfg, demo, _ = pipeline
    assert demo.seeds == [EVAL_SEED, EVAL_SEED + 1]
    meta = json.loads(demo.path.with_suffix(".json").read_text())
    assert meta["env_info"]["env_kwargs"]["control_mode"] == "pd_joint_delta_pos"
    assert all(e["success"] for e in meta["episodes"])
    with h5py.File(demo.path, "r") as f:
        acts = f["traj_0"]["actions"][:]
        obs = f["traj_0"]["obs"][:]
    assert obs.shape[0] == acts.shape[0] + 1  # ManiSkill stores the final observation too
    data = DemoDataset(demo.path)
    lengths = [e["elapsed_steps"] for e in meta["episodes"]]
    assert len(data) == sum(lengths)
    assert data.states.shape == (sum(lengths), obs.shape[1])
    assert data.actions.shape == (sum(lengths), 1, 8)  # 7 arm joints + gripper
    assert float(data.actions.abs().max()) <= 1.0  # normalised delta controller
    np.testing.assert_allclose(data.actions[: lengths[0], 0].numpy(), acts)
    # the last step of each demo is a success held forever: r / (1 - gamma)
    ret = data.returns(0.8)
    assert ret[lengths[0] - 1] == pytest.approx(float(data.rewards[lengths[0] - 1]) / 0.2)


def test_bc_fits_the_demos_and_the_sft_checkpoint_succeeds(pipeline):
    cfg, _, out = pipeline
    bc, ev = out["bc"], out["evaluation"]
    # the evaluation's time reaches summary.json's stages.sft_eval (it was null for MLPs)
    from rlinf_embodied.sft.summary import stage_costs

    assert ev["wall_s"] > 0 and stage_costs(cfg)["sft_eval"]["wall_s"] == ev["wall_s"]
    assert bc["bc/mse"] < 0.01  # greedy actions match the demo actions (range [-1, 1])
    assert bc["bc/log_std_min"] >= cfg.bc.min_log_std - 1e-6
    # bc.fit_log_std: the log-std is the log RMS residual of the greedy actions per dim
    # (floored), computed here from the saved checkpoint and the demos
    from rlinf_embodied.policies import load_policy
    from rlinf_embodied.sft.dataset import DemoDataset

    policy = load_policy(cfg.run_dir() / "sft" / "policy").eval()
    data = DemoDataset(_demo_path(pipeline))
    with torch.no_grad():
        greedy = policy.act({"states": data.states}, mode="greedy").actions
    rms = ((greedy - data.actions) ** 2).mean(0).sqrt().flatten()  # action range is [-1, 1]
    want = rms.clamp(min=1e-6).log().clamp(min=cfg.bc.min_log_std)
    torch.testing.assert_close(policy.action_head.log_std.detach(), want, atol=1e-4, rtol=0)
    assert float(want.mean()) < -2.0  # far below the -0.5 the head starts from
    assert bc["bc/value_mse"] < 1.0  # returns are up to 1 / (1 - 0.8) = 5
    assert ev["episodes"] == 2
    assert ev["rate"] >= 0.5  # replays the cloned motion from the demos' initial states
    lo, hi = ev["ci95"]
    assert lo < ev["rate"] < hi or ev["rate"] in (lo, hi)
    rec = json.loads((cfg.run_dir() / "sft" / "sft_record.json").read_text())
    assert rec["evaluation"]["rate"] == ev["rate"]


def _demo_path(pipeline):
    return pipeline[1].path


def test_sampled_success_is_greedy_at_tiny_noise_and_fails_with_wide_noise(pipeline, tmp_path):
    from rlinf_embodied.eval.results import ResultsFile
    from rlinf_embodied.sft.gate import sampled_success

    cfg, _, out = pipeline
    ckpt = cfg.run_dir() / "sft" / "policy"
    kw = dict(num_envs=2, num_processes=0)
    near = sampled_success(ckpt, cfg.env, 2, tmp_path / "near.json", log_std=-12.0, **kw)
    assert near["rate"] == out["evaluation"]["rate"] and near["episodes"] == 2
    # the shared evaluation path ran it: a results file of the sampling protocol
    header = ResultsFile.load(tmp_path / "near.json").header
    assert header["protocol"]["policy_mode"] == "sample"
    assert "policy_mode" in header["protocol"]["id"]
    wide = sampled_success(ckpt, cfg.env, 2, tmp_path / "wide.json", log_std=1.0, **kw)
    assert wide["rate"] == 0.0 and wide["log_std"] == 1.0 and wide["successes"] == 0
    assert wide["ci95"][0] == 0.0 < wide["ci95"][1]


def test_gate_passes_the_sft_checkpoint_and_refuses_a_bad_one(pipeline, tmp_path, capsys):
    from rlinf_embodied.eval.results import ResultsFile
    from rlinf_embodied.policies import build_policy, load_policy, save_policy

    from rlinf_embodied.sft.gate import GateError, check_gate, gate_for_job

    cfg, _, out = pipeline
    ckpt = cfg.run_dir() / "sft" / "policy"
    job = load_config("configs/maniskill_pushcube_ppo_mlp_finetune.yaml",
                      [f"policy.checkpoint={ckpt}", "env.num_processes=0"])
    capsys.readouterr()
    res = gate_for_job(job, tmp_path / "good")  # what `train` runs before starting RL
    assert res["passed"] and res["measured"] == res["recorded"] == out["evaluation"]["rate"]
    assert res["tasks"] == ["PushCube-v1"]
    # the re-evaluations take the SFT record's sensor_size; the greedy one says so, once a gate
    assert capsys.readouterr().err.count("the policy's env settings from its run") == 1
    for name in ("gate_eval.json", "gate_sampled.json"):
        assert ResultsFile.load(tmp_path / "good" / name).header["env_config"]["sensor_size"] == 128
    # the re-evaluations run with the RL job's env.num_processes (0: in-process)
    for name in ("gate_eval.json", "gate_sampled.json"):
        assert ResultsFile.load(tmp_path / "good" / name).header["num_processes"] == 0
    logged = json.loads((tmp_path / "good" / "gate.json").read_text())
    assert 0.0 <= logged["sampled"] <= 1.0 and logged["episodes"] == 2
    # batch-invariant re-evaluation (8 envs capped at 2 vs the SFT stage's 2): trial by trial
    assert logged["batch_invariant"] is True and logged["differing_trials"] == []
    sampled = ResultsFile.load(tmp_path / "good" / "gate_sampled.json")  # the shared eval path
    assert sampled.header["protocol"]["policy_mode"] == "sample"
    assert logged["sampled"] == sampled.summary()["overall"]["rate"]
    assert logged["log_std"] == pytest.approx(
        float(load_policy(ckpt).action_head.log_std.detach().mean()))

    # The same record, but weights that do not move the robot (a fresh, untrained policy).
    good = load_policy(ckpt)
    torch.manual_seed(0)
    bad = build_policy(good.config, good.spec)
    save_policy(bad, ckpt)
    with pytest.raises(GateError, match="would start from nothing"):
        check_gate(ckpt, job.env, tmp_path / "bad")
    gate = json.loads((tmp_path / "bad" / "gate.json").read_text())
    assert gate["measured"] == 0.0 and not gate["passed"]
    save_policy(good, ckpt)

    # A job without an SFT checkpoint is not gated.
    plain = load_config("configs/maniskill_pushcube_ppo_mlp.yaml")
    assert gate_for_job(plain, tmp_path / "plain") is None


def test_config_refuses_demo_seeds_in_the_evaluation_range():
    from rlinf_embodied.sft.pipeline import load_sft_config

    with pytest.raises(ConfigError, match="demos.seed"):
        load_sft_config(CONFIG, ["demos.seed=1000000"])
    assert isinstance(load_sft_config(CONFIG), SFTJobConfig)


def test_ctrl_c_in_a_stage_says_what_was_saved_and_how_to_go_on(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import rlinf_embodied.sft.pipeline as pipeline_module
    from rlinf_embodied.checkpoint import _COMPLETE as COMPLETE
    from rlinf_embodied.cli import app

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline_module, "run_rl", interrupted)
    config = "configs/sft/maniskill_pushcube_sft_rl_mlp.yaml"
    args = ["finetune", config, f"run.dir={tmp_path / 'run'}", f"demos.dir={tmp_path / 'demos'}"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 130, r.output
    assert "interrupted before any stage finished: nothing was saved" in r.output
    (tmp_path / "run" / "sft" / "policy").mkdir(parents=True)  # saved, not yet evaluated
    r = CliRunner().invoke(app, args)
    assert "nothing was saved" in r.output and "SFT checkpoint" not in r.output
    (tmp_path / "run" / "sft" / "sft_record.json").write_text("{}")
    ckpt = tmp_path / "run" / "rl" / "checkpoints" / "iter_000002"

    def saved_then_interrupted(*a, **k):  # as the runner: a complete checkpoint, then the Ctrl-C
        ckpt.mkdir(parents=True)
        (ckpt / COMPLETE).touch()
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline_module, "run_rl", saved_then_interrupted)
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 130, r.output
    text = " ".join(r.output.split())
    # the command to go on carries the overrides given; with an RL run saved it is --resume
    # (a plain `finetune` would be refused), which also writes the final evaluation and summary
    command = (f"rlinf-embodied finetune {config} run.dir={tmp_path / 'run'} "
               f"demos.dir={tmp_path / 'demos'}")
    assert f"the SFT checkpoint {tmp_path / 'run' / 'sft' / 'policy'};" in text
    assert (f"RL checkpoints in {ckpt.parent} (`{command} --resume` continues the RL run, then "
            "writes the final evaluation and summary)") in text
    assert "train --resume" not in text and "Traceback" not in r.output
    # a second RL run in the same directory would mix with the first: refused before any stage
    r = CliRunner().invoke(app, args)
    text = " ".join(r.output.split())
    assert r.exit_code == 2 and f"already holds an RL run; `{command} --resume` continues it" in text
    # files older than this command are an earlier run's: not offered as this one's
    import os
    import shutil

    os.utime(ckpt, (0, 0))
    os.utime(tmp_path / "run" / "sft" / "sft_record.json", (0, 0))
    monkeypatch.setattr(pipeline_module, "run_sft", interrupted)
    text = " ".join(CliRunner().invoke(app, ["sft", *args[1:]]).output.split())
    assert "continues the RL run" not in text
    assert (f"no RL checkpoint of this command (those in {ckpt.parent} are an earlier run's; "
            f"`{command} --resume` continues it)") in text
    assert f"an earlier run's SFT checkpoint {tmp_path / 'run' / 'sft' / 'policy'}" in text
    shutil.rmtree(tmp_path / "run" / "rl")

    def ray_did_not_start(*a, **k):
        raise RuntimeError("The current node timed out during startup. This could happen because "
                           "some of the Ray processes failed to startup.")

    monkeypatch.setattr(pipeline_module, "run_rl", ray_did_not_start)
    r = CliRunner().invoke(app, args)
    text = " ".join(r.output.split())
    assert r.exit_code == 1 and "error: The current node timed out during startup" in text, r.output
    assert "Ray could not start its local cluster in time" in text and "failed; saved:" in text


def test_an_interrupted_rl_stage_is_not_evaluated_as_finished(tmp_path, monkeypatch):
    import rlinf_embodied.runners.embodied as embodied
    import rlinf_embodied.sft.gate as gate
    from rlinf_embodied.sft.pipeline import load_sft_config, run_rl

    class StoppedRunner:  # what EmbodiedRunner.run leaves after a Ctrl-C: a checkpoint saved
        def __init__(self, job, run_dir, resume=False, checkpoint=None):
            self.interrupted = False

        def run(self):
            self.interrupted = True
            return {"iteration": 3, "env_steps": 96}

    monkeypatch.setattr(embodied, "EmbodiedRunner", StoppedRunner)
    monkeypatch.setattr(gate, "check_gate", lambda *a, **k: {"passed": True})
    cfg = load_sft_config("configs/sft/maniskill_pushcube_sft_rl_mlp.yaml", [f"run.dir={tmp_path}"])
    with pytest.raises(KeyboardInterrupt):
        run_rl(cfg, log=lambda *_: None)
    assert not (tmp_path / "rl" / "final_eval.json").exists()


def test_sft_refuses_fewer_recorded_demos_than_asked_for(pipeline):
    # a smaller (smoke) set left in a shared demos.dir must not be trained on silently
    import dataclasses

    from rlinf_embodied.sft.pipeline import run_sft

    cfg, _, _ = pipeline
    more = dataclasses.replace(cfg, demos=dataclasses.replace(cfg.demos, num_trajectories=5))
    with pytest.raises(ValueError, match=r"demos.num_trajectories=5 but .* holds fewer "
                                         r"\(PushCube-v1: 2\); run `rlinf-embodied demos"):
        run_sft(more, log=lambda *_: None)


def test_finetune_refuses_other_episode_settings_than_the_sft_evaluation(tmp_path):
    from typer.testing import CliRunner

    from rlinf_embodied.cli import app
    from rlinf_embodied.sft.pipeline import load_sft_config

    run = tmp_path / "run"
    (run / "sft" / "policy").mkdir(parents=True)
    sft_env = load_sft_config(CONFIG).env
    record = {"env": {"env_id": sft_env.env_id, "max_episode_steps": 100,
                      "control_mode": sft_env.control_mode, "obs_mode": sft_env.obs_mode},
              "protocol": "maniskill_fair_v1", "evaluation": {}}
    (run / "sft" / "sft_record.json").write_text(json.dumps(record))
    # (the RL rollout kept one whole 20-step episode, so the episode check is what refuses)
    r = CliRunner().invoke(app, ["finetune", CONFIG, f"run.dir={run}", "env.max_episode_steps=20",
                                 "rl.overrides=[trainer.rollout_steps=20]"])
    out = " ".join(r.output.split())
    assert r.exit_code == 2, r.output
    assert ("env.max_episode_steps=20 (SFT: 100): the SFT checkpoint in" in out
            and "set env.max_episode_steps=100 (the SFT evaluation's), or re-run `rlinf-embodied "
                "sft` with these settings first" in out), out
    assert "Traceback" not in r.output and not (run / "rl" / "gate.json").exists()
    # RL's final evaluation must run as many trials per task as the SFT evaluation, or McNemar
    # pairs only the shared ones: the record's (or, in an older record, its evaluation's) count
    for trials in ({"trials_per_task": 2}, {"evaluation": {"per_task": {"PushCube-v1": {"episodes": 2}}}}):
        (run / "sft" / "sft_record.json").write_text(json.dumps({**record, **trials}))
        r = CliRunner().invoke(app, ["finetune", CONFIG, f"run.dir={run}"])
        out = " ".join(r.output.split())
        assert r.exit_code == 2, r.output
        assert ("eval.episodes=100 (SFT: 2): the SFT checkpoint in" in out
                and "set eval.episodes=2 (the SFT evaluation's), or re-run" in out), out
    assert not (run / "rl" / "gate.json").exists()


def _results(path, env_id, successes, suite=None):
    """A results file of ``successes`` ({task: [success of trial 0, 1, ...]}; an int is a
    success first reached at that step) as an evaluation writes it, and what
    :func:`~rlinf_embodied.sft.gate.evaluate_checkpoint` returns for it."""
    from rlinf_embodied.eval.results import Episode, ResultsFile

    header = {"env": "maniskill", "suite": suite, "env_id": env_id, "batch_invariant": True,
              "protocol": {"id": "maniskill_fair_v1", "fingerprint": "f"}, "env_config": {}}
    eps = [Episode(task=t, trial=i, success=ok is not False, steps=10,
                   success_step=None if isinstance(ok, bool) else ok)
           for t, oks in successes.items() for i, ok in enumerate(oks)]
    res = ResultsFile(path, header, eps)
    res.save()
    o = res.summary()["overall"]
    return {"rate": o["rate"], "ci95": o["ci95"], "successes": o["successes"],
            "episodes": o["episodes"], "results": str(path), "success_at_end_rate": None,
            "per_task": {k: {"rate": v["rate"], "ci95": v["ci95"], "episodes": v["episodes"]}
                         for k, v in res.summary()["per_task"].items()}}


def _lang3_env(**kw):
    """A maniskill_lang3 EnvConfig (RGB, the VLA controller) with ``kw``."""
    from rlinf_embodied.config import config_class

    return config_class("env", "maniskill")(suite="maniskill_lang3", obs_mode="rgb",
                                            control_mode="pd_ee_delta_pose", **kw)


def _sft_dir(tmp_path):
    """An SFT stage directory with an (empty) policy directory."""
    (tmp_path / "sft" / "policy").mkdir(parents=True)
    return tmp_path / "sft"


def test_gate_of_an_rl_env_on_fewer_tasks_compares_the_recorded_trials_of_those(tmp_path, monkeypatch):
    # SFT evaluated on tasks 0, 1, 2 of a suite; the RL run trains on tasks 0 and 1 only
    # (rl.overrides=[env.task_ids=[0,1]]): the gate re-evaluates those, so its recorded side
    # must be their trials too (3 of 4 succeeded), not every task's (3 of 6)
    import types

    import rlinf_embodied.sft.gate as gate
    from rlinf_embodied.config import config_class
    from rlinf_embodied.sft.gate import SFTCheckpointError, check_gate, write_record

    env, sft = _lang3_env, _sft_dir(tmp_path)
    ev = _results(sft / "eval.json", None, {0: [True, True], 1: [True, False], 2: [False, False]},
                  suite="maniskill_lang3")
    write_record(sft, ev, env(), types.SimpleNamespace(protocol="maniskill_lang3_v1", episodes=2,
                                                       gate_episodes=2, gate_tolerance=0.3))
    ran = []

    def re_evaluation(checkpoint, env_cfg, output, trials, **kw):  # task 1's trial 0 fails now
        ran.append(env_cfg.suite_task_ids())
        return _results(output, None, {0: [True, True], 1: [False, False]}, suite="maniskill_lang3")

    monkeypatch.setattr(gate, "evaluate_checkpoint", re_evaluation)
    lines = []
    res = check_gate(sft / "policy", env(task_ids=[0, 1]), tmp_path / "rl", sampled=False,
                     log=lines.append)
    assert ran == [[0, 1]]
    assert res["recorded"] == 0.75 and res["measured"] == 0.5 and res["episodes"] == 4
    assert res["tasks"] == ["0", "1"] and res["differing_trials"] == ["1:0"] and res["passed"]
    assert json.loads((tmp_path / "rl" / "gate.json").read_text())["tasks"] == ["0", "1"]
    assert "on trials 0..1 of tasks 0, 1 (the RL env's; recorded: 0, 1, 2)" in lines[0], lines
    # every task: the recorded side is all six trials
    monkeypatch.setattr(gate, "evaluate_checkpoint", lambda c, e, output, t, **kw: _results(
        output, None, {0: [True, True], 1: [True, False], 2: [False, False]}, suite="maniskill_lang3"))
    res = check_gate(sft / "policy", env(), tmp_path / "all", sampled=False, log=lines.append)
    assert res["recorded"] == res["measured"] == 0.5 and res["tasks"] == ["0", "1", "2"]
    assert res["differing_trials"] == [] and res["episodes"] == 6
    # an RL env that runs none of the recorded tasks: refused before anything runs
    single = config_class("env", "maniskill")(env_id="PushCube-v1")
    with pytest.raises(SFTCheckpointError, match=r"has no trials of the RL env's tasks "
                                                 r"\(PushCube-v1; recorded: 0, 1, 2\)"):
        check_gate(sft / "policy", single, tmp_path / "none", sampled=False)
    # no SFT stage yet: the record's own path is named (sft/, beside policy/ and vla/)
    nowhere = tmp_path / "fresh" / "sft" / "vla"
    with pytest.raises(SFTCheckpointError, match=rf"^No SFT record {tmp_path / 'fresh' / 'sft' / 'sft_record.json'} "
                                                 rf"\({nowhere} does not exist either\); run `rlinf-embodied sft`"):
        check_gate(nowhere, single, tmp_path / "none", sampled=False)


def test_gate_of_shorter_rl_episodes_scores_the_recorded_trials_within_them(tmp_path, monkeypatch):
    # SFT evaluated at the protocol's 80 steps, RL in 48-step episodes (the OFT suite recipe's
    # rl.overrides): a recorded trial that first succeeded at step 60 is a failure within 48
    # steps, so both sides of the gate score the same steps of the same trials
    import types

    import rlinf_embodied.sft.gate as gate
    from rlinf_embodied.sft.gate import check_gate, write_record

    env, sft = _lang3_env, _sft_dir(tmp_path)
    ev = _results(sft / "eval.json", None, {0: [20, 60], 1: [48, False]}, suite="maniskill_lang3")
    eval_cfg = types.SimpleNamespace(protocol="maniskill_lang3_v1", episodes=2, gate_episodes=2,
                                     gate_tolerance=0.3)
    write_record(sft, ev, env(max_episode_steps=80, task_ids=[0, 1]), eval_cfg)
    monkeypatch.setattr(gate, "evaluate_checkpoint", lambda c, e, output, t, **kw: _results(
        output, None, {0: [20, False], 1: [48, False]}, suite="maniskill_lang3"))
    lines = []
    res = check_gate(sft / "policy", env(max_episode_steps=48, task_ids=[0, 1]), tmp_path / "rl",
                     sampled=False, log=lines.append)
    assert res["recorded"] == res["measured"] == 0.5 and res["differing_trials"] == []
    assert res["recorded_within_horizon"] is True
    assert (res["horizon"], res["recorded_horizon"]) == (48, 80)
    assert "recorded 0.50 within its first 48 steps (of 80)" in lines[0], lines
    # the same horizon: recorded as it is
    res = check_gate(sft / "policy", env(max_episode_steps=80, task_ids=[0, 1]), tmp_path / "same",
                     sampled=False, log=lines.append)
    assert res["recorded"] == 0.75 and res["recorded_within_horizon"] is False
    assert res["differing_trials"] == ["0:1"]
    # results written before success_step was recorded: full-horizon success, as before
    ev = _results(sft / "eval.json", None, {0: [True, True], 1: [True, False]}, suite="maniskill_lang3")
    write_record(sft, ev, env(max_episode_steps=80, task_ids=[0, 1]), eval_cfg)
    res = check_gate(sft / "policy", env(max_episode_steps=48, task_ids=[0, 1]), tmp_path / "old",
                     sampled=False, log=lines.append)
    assert res["recorded"] == 0.75 and res["recorded_within_horizon"] is False


def interrupted_once_runner(made: list, record):
    """A stand-in for EmbodiedRunner with its contract (resume from ``checkpoint``, checkpoints
    with ``runner_state.json``, the Ctrl-C flag, ``config.yaml`` written): the first run made
    stops after iteration 1 as after a Ctrl-C, later ones run to ``trainer.iterations``. Each
    construction appends ``record(resume, checkpoint, job, run_dir)`` to ``made``."""
    from rlinf_embodied.checkpoint import atomic_write_json, checkpoint_dir
    from rlinf_embodied.config import save_config

    class Runner:
        def __init__(self, job, run_dir, resume=False, checkpoint=None):
            self.job, self.run_dir, self.interrupted = job, run_dir, False
            self.state = (json.loads((checkpoint / "runner_state.json").read_text()) if resume
                          else {"iteration": 0, "env_steps": 0})
            made.append(record(resume, checkpoint, job, run_dir))
            save_config(job, run_dir)

        def run(self):
            stop = 1 if len(made) == 1 else self.job.trainer.iterations  # the first: Ctrl-C
            while self.state["iteration"] < stop:
                self.state = {"iteration": self.state["iteration"] + 1,
                              "env_steps": self.state["env_steps"] + 32}
                with checkpoint_dir(self.run_dir, f"iter_{self.state['iteration']:06d}") as d:
                    atomic_write_json(d / "runner_state.json", self.state)
            self.interrupted = stop < self.job.trainer.iterations
            return self.state

    return Runner


def test_finetune_resume_continues_a_stopped_rl_stage_and_writes_the_summary(tmp_path, monkeypatch):
    # The RL stage stopped by Ctrl-C after 1 iteration (a checkpoint saved); `finetune
    # --resume` continues it from that checkpoint to the configured iterations without a new
    # gate, then writes the final evaluation and summary as an uninterrupted finetune does.
    from typer.testing import CliRunner

    import rlinf_embodied.runners.embodied as embodied
    import rlinf_embodied.sft.gate as gate
    from rlinf_embodied.cli import app
    from rlinf_embodied.sft.gate import write_record
    from rlinf_embodied.sft.pipeline import load_sft_config

    run = tmp_path / "run"
    args = ["finetune", CONFIG, f"run.dir={run}", "eval.episodes=2", "eval.gate_episodes=2"]
    cfg = load_sft_config(CONFIG, args[2:])
    (run / "sft" / "policy").mkdir(parents=True)
    write_record(run / "sft", _results(run / "sft" / "eval.json", "PushCube-v1",
                                       {"PushCube-v1": [True, False]}), cfg.env, cfg.eval)
    made, gates = [], []

    monkeypatch.setattr(embodied, "EmbodiedRunner", interrupted_once_runner(
        made, lambda resume, ckpt, job, run_dir: (resume, ckpt and ckpt.name)))
    monkeypatch.setattr(gate, "check_gate", lambda *a, **k: gates.append(1) or {"passed": True})
    monkeypatch.setattr(gate, "evaluate_checkpoint", lambda c, e, output, trials, **k: _results(
        output, "PushCube-v1", {"PushCube-v1": [True, True][:trials]}))
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 130, r.output
    command = f"rlinf-embodied finetune {CONFIG} run.dir={run} eval.episodes=2 eval.gate_episodes=2 --resume"
    assert f"`{command}` continues the RL run" in " ".join(r.output.split())
    assert not (run / "rl" / "final_eval.json").exists() and not (run / "summary.json").exists()
    part = json.loads((run / "rl" / "rl_state.json").read_text())  # its time, for --resume
    assert part["interrupted"] is True and part["iteration"] == 1 and part["wall_s"] > 0
    # nothing to resume elsewhere; a policy that is not the run's cannot go on from its weights
    r = CliRunner().invoke(app, ["finetune", CONFIG, f"run.dir={tmp_path / 'other'}", "--resume"])
    assert r.exit_code == 2 and "holds no RL run to continue" in r.output, r.output
    out = " ".join(r.output.split())
    assert "nor has the SFT stage run" in out, r.output  # where to start, as a whole command
    assert f"`rlinf-embodied sft-rl {CONFIG} run.dir={tmp_path / 'other'}`" in out, out
    r = CliRunner().invoke(app, [*args, "rl.overrides=['policy.hidden_sizes=[32,32]']", "--resume"])
    out = " ".join(r.output.split())
    assert r.exit_code == 2 and "policy.hidden_sizes: [256, 256, 256] -> [32, 32]" in out, out
    assert len(made) == 1

    r = CliRunner().invoke(app, [*args, "--resume"])
    assert r.exit_code == 0, r.output
    assert "changed settings" not in r.output  # the RL job is the run's own
    from rlinf_embodied.sft.pipeline import validate_rl_stage

    iterations = validate_rl_stage(cfg).trainer.iterations  # rl.config's
    assert iterations > 1
    assert made[1] == (True, "iter_000001") and gates == [1]  # gate.json of the first part
    state = json.loads((run / "rl" / "rl_state.json").read_text())
    assert state["iteration"] == iterations and state["resumed_from"] == 1
    assert "interrupted" not in state
    assert state["wall_s_total"] == pytest.approx(part["wall_s"] + state["wall_s"])
    assert state["env_steps"] == 32 * iterations
    assert "on the SFT evaluation's 2 held-out trials" in r.output
    summary = json.loads((run / "summary.json").read_text())
    assert summary["sft"]["rate"] == 0.5 and summary["rl"]["rate"] == 1.0
    assert summary["rl"]["episodes"] == 2 and summary["paired"]["pairs"] == 2
    assert summary["stages"]["rl"]["iterations"] == iterations
    # a finished run: --resume trains no further and evaluates it again
    r = CliRunner().invoke(app, [*args, "--resume"])
    assert r.exit_code == 0 and len(made) == 2, r.output
    assert f"iter_{iterations:06d} has done trainer.iterations={iterations}" in r.output
    assert json.loads((run / "rl" / "rl_state.json").read_text()) == state
    # extended by two iterations: the stage's time adds both earlier parts' (Ctrl-C'd, finished)
    r = CliRunner().invoke(app, [*args, f"rl.overrides=[trainer.iterations={iterations + 2}]",
                                 "--resume"])
    assert r.exit_code == 0 and made[2] == (True, f"iter_{iterations:06d}"), r.output
    more = json.loads((run / "rl" / "rl_state.json").read_text())
    assert more["iteration"] == iterations + 2 and more["resumed_from"] == iterations
    assert more["wall_s_total"] == pytest.approx(state["wall_s_total"] + more["wall_s"])
    stages = json.loads((run / "summary.json").read_text())["stages"]
    assert stages["rl"]["wall_s"] == more["wall_s_total"] and stages["rl"]["iterations"] == iterations + 2


def test_finetune_resume_continues_a_moved_pipeline_run_from_its_own_sft_checkpoint(tmp_path, monkeypatch):
    # The RL stage's config.yaml names the SFT checkpoint it starts from by an absolute path
    # (policy.checkpoint=<run dir>/sft/policy). A run directory moved elsewhere (mv runs/a
    # runs/b) goes on with `finetune CONFIG run.dir=runs/b --resume` from runs/b's own SFT
    # checkpoint: that path is of the run directory, not a changed policy setting.
    import shutil

    from typer.testing import CliRunner

    import rlinf_embodied.runners.embodied as embodied
    import rlinf_embodied.sft.gate as gate
    from rlinf_embodied.cli import app
    from rlinf_embodied.sft.gate import write_record
    from rlinf_embodied.sft.pipeline import load_sft_config

    old, new = tmp_path / "runs" / "a", tmp_path / "runs" / "b"
    flags = ["eval.episodes=2", "eval.gate_episodes=2"]
    cfg = load_sft_config(CONFIG, [f"run.dir={old}", *flags])
    (old / "sft" / "policy").mkdir(parents=True)
    write_record(old / "sft", _results(old / "sft" / "eval.json", "PushCube-v1",
                                       {"PushCube-v1": [True, False]}), cfg.env, cfg.eval)
    made = []

    monkeypatch.setattr(embodied, "EmbodiedRunner", interrupted_once_runner(
        made, lambda resume, ckpt, job, run_dir: (resume, ckpt and ckpt.name,
                                                  job.policy.checkpoint, run_dir)))
    monkeypatch.setattr(gate, "check_gate", lambda *a, **k: {"passed": True})
    monkeypatch.setattr(gate, "evaluate_checkpoint", lambda c, e, output, trials, **k: _results(
        output, "PushCube-v1", {"PushCube-v1": [True, True][:trials]}))
    r = CliRunner().invoke(app, ["finetune", CONFIG, f"run.dir={old}", *flags])
    assert r.exit_code == 130, r.output
    assert made[0][2] == str((old / "sft" / "policy").resolve())  # absolute in rl/config.yaml
    assert str(old.resolve()) in (old / "rl" / "config.yaml").read_text()
    shutil.move(old, new)

    r = CliRunner().invoke(app, ["finetune", CONFIG, f"run.dir={new}", *flags, "--resume"])
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "cannot change on resume" not in out and "changed settings" not in out, out
    resume, ckpt, policy, run_dir = made[1]
    assert (resume, ckpt, run_dir) == (True, "iter_000001", new / "rl")
    assert policy == str((new / "sft" / "policy").resolve())  # the moved run's own
    assert str(old.resolve()) not in (new / "rl" / "config.yaml").read_text()
    assert json.loads((new / "summary.json").read_text())["rl"]["rate"] == 1.0
    # a path outside the run directory is no path of the run: changing it is still refused
    r = CliRunner().invoke(app, ["finetune", CONFIG, f"run.dir={new}", *flags,
                                 f"rl.overrides=[policy.checkpoint={tmp_path / 'elsewhere'}]",
                                 "--resume"])
    assert r.exit_code == 2 and "cannot change on resume" in " ".join(r.output.split()), r.output
