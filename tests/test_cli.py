"""CLI: --version, config show (and its errors), doctor --json."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import rlinf_embodied
from rlinf_embodied.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def test_version():
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and rlinf_embodied.__version__ in r.stdout


def test_config_show_resolves_overrides(tmp_path):
    p = tmp_path / "j.yaml"
    p.write_text("env:\n  num_envs: 4\n")
    r = runner.invoke(app, ["config", "show", str(p), "env.num_envs=12", "trainer.lr=0.01"])
    assert r.exit_code == 0, r.output
    assert "num_envs: 12" in r.stdout and "lr: 0.01" in r.stdout


def test_config_show_errors_are_clear(tmp_path):
    r = runner.invoke(app, ["config", "show", str(tmp_path / "missing.yaml")])
    assert r.exit_code == 2 and "missing.yaml" in r.output
    p = tmp_path / "j.yaml"
    p.write_text("algorithm:\n  gama: 0.9\n")
    r = runner.invoke(app, ["config", "show", str(p)])
    assert r.exit_code == 2 and "gamma" in r.output
    # an env id the simulator does not know fails here, not after Ray started (train runs the
    # same validate_job)
    r = runner.invoke(app, ["config", "show", "configs/maniskill_pushcube_ppo_mlp.yaml", "env.env_id=PushCub-v1"])
    assert r.exit_code == 2 and "not a registered ManiSkill3 env" in r.output and "'PushCube-v1'" in r.output
    # the listing command runs this interpreter, from any directory
    assert f"List them with: {sys.executable} -c 'import mani_skill.envs, gymnasium;" in r.output
    # a policy path that is not there: `config show` notes it (a GPU config names a checkpoint
    # downloaded later), `train` refuses it before Ray starts (not in the actor after it)
    nope = tmp_path / "nope"
    r = runner.invoke(app, ["config", "show", "configs/maniskill_ppo_openvla_tiny.yaml",
                            f"policy.pretrained={nope}"])
    assert r.exit_code == 0 and (f"note: `train` refuses this config here: policy.pretrained="
                                 f"{nope} does not exist") in r.output
    r = runner.invoke(app, ["train", "configs/maniskill_ppo_openvla_tiny.yaml",
                            f"policy.pretrained={nope}", f"run.dir={tmp_path / 'run'}"])
    assert r.exit_code == 2 and f"policy.pretrained={nope} does not exist; set it" in r.output
    assert not (tmp_path / "run").exists()
    r = runner.invoke(app, ["train", "configs/maniskill_pushcube_ppo_mlp.yaml",
                            f"policy.checkpoint={p}", f"run.dir={tmp_path / 'run'}"])
    assert r.exit_code == 2 and f"policy.checkpoint={p} is a file, not a directory" in r.output
    empty = tmp_path / "empty"
    empty.mkdir()
    r = runner.invoke(app, ["train", "configs/maniskill_ppo_openvla_tiny.yaml",
                            f"policy.pretrained={empty}", f"run.dir={tmp_path / 'run'}"])
    assert r.exit_code == 2 and f"policy.pretrained={empty} has no config.json" in r.output
    r = runner.invoke(app, ["train", "configs/maniskill_pushcube_ppo_mlp.yaml",
                            f"policy.checkpoint={empty}", f"run.dir={tmp_path / 'run'}"])
    assert r.exit_code == 2 and f"{empty / 'policy.yaml'} is missing: {empty} is not a complete " \
        "policy checkpoint" in r.output
    assert not (tmp_path / "run").exists()


def test_config_show_rl_stage_prints_the_job_the_pipeline_trains(tmp_path):
    import yaml

    args = ["config", "show", "configs/sft/maniskill_lang3_sft_rl_oft.yaml", f"run.dir={tmp_path}"]
    r = runner.invoke(app, args + ["--rl-stage"])
    assert r.exit_code == 0, r.output
    job = yaml.safe_load(r.stdout)
    # rl.overrides applied to rl.config, the pipeline's env, the SFT checkpoint, rl.task_ids
    assert job["env"]["max_episode_steps"] == 48 and job["trainer"]["rollout_steps"] == 12
    assert job["trainer"]["iterations"] == 20 and job["trainer"]["eval_every"] == 0
    assert job["env"]["suite"] == "maniskill_lang3" and job["env"]["task_ids"] == [0, 1]
    assert job["policy"]["pretrained"] == str((tmp_path / "sft" / "vla").resolve())
    assert job["run"]["dir"] == str(tmp_path / "rl") and "bc" not in job
    # the token OpenVLA's: a fixed 34 iterations, rollouts at temperature 1.3 (docs/vla_suite.md)
    r = runner.invoke(app, ["config", "show", "configs/sft/maniskill_lang3_sft_rl_openvla.yaml",
                            f"run.dir={tmp_path}", "--rl-stage"])
    token = yaml.safe_load(r.stdout)
    assert (token["trainer"]["iterations"], token["trainer"]["eval_every"]) == (34, 0)
    # the time budget only a cap: 34 iterations at the 85 s of a loaded machine fit (2,400 s
    # stopped a rerun after 31)
    assert token["trainer"]["max_time_s"] >= 34 * 85 + 300
    assert token["policy"]["temperature"] == 1.3 and token["policy"]["type"] == "openvla"
    assert "it does not exist yet (run `rlinf-embodied sft` first)" in r.stderr
    # the pipeline's own sections without the flag: rl.overrides as written
    pipeline = yaml.safe_load(runner.invoke(app, args).stdout)
    assert pipeline["env"]["max_episode_steps"] == 80 and "bc" in pipeline
    # rl.overrides on the command line add to the file's: the recipe's 48-step episodes stay
    job = yaml.safe_load(runner.invoke(app, args + ["rl.overrides=[trainer.iterations=5]",
                                                    "--rl-stage"]).stdout)
    assert job["trainer"]["iterations"] == 5 and job["env"]["max_episode_steps"] == 48
    assert job["trainer"]["rollout_steps"] == 12
    job = yaml.safe_load(runner.invoke(app, args + [  # a key of the file's list named again
        'rl.overrides=["env.max_episode_steps=80","trainer.rollout_steps=20"]', "--rl-stage"]).stdout)
    assert job["env"]["max_episode_steps"] == 80 and job["trainer"]["rollout_steps"] == 20
    r = runner.invoke(app, ["config", "show", "configs/maniskill_pushcube_ppo_mlp.yaml", "--rl-stage"])
    assert r.exit_code == 2 and "is not an SFT pipeline YAML" in r.output and "drop --rl-stage" in r.output
    r = runner.invoke(app, ["config", "show", str(tmp_path / "missing.yaml"), "--rl-stage"])
    assert r.exit_code == 2 and "not found" in r.output and "pipeline" not in r.output, r.output


def test_every_shipped_config_passes_config_show():
    from rlinf_embodied.config import shipped_config

    for path in sorted(ROOT.glob("configs/*.yaml")) + sorted(ROOT.glob("configs/sft/*.yaml")):
        r = runner.invoke(app, ["config", "show", str(path)])
        assert r.exit_code == 0, (path.name, r.output)
        # its name alone resolves to it (reasoning_grpo_qwen2.5_0.5b: not a ".5b" suffix)
        assert Path(shipped_config(path.stem) or "").resolve() == path.resolve(), path


def test_config_show_prints_a_config_warning_as_one_line():
    r = runner.invoke(app, ["config", "show", "configs/maniskill_pushcube_grpo_mlp_finetune.yaml",
                            "trainer.critic_lr=1e-4"])
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.output.splitlines() if "critic_lr" in ln and "grpo" in ln)
    assert line.startswith("warning: trainer.critic_lr=0.0001 only changes how the critic")
    assert "UserWarning" not in r.output and "ConfigWarning" not in r.output


def test_config_show_rejects_what_train_would_reject_later():
    for args, words in (
        (["configs/gym_pointreach_ppo_mlp.yaml", "env.env_id=PointReach-v0"], "'toy/PointReach-v0'"),
        (["configs/gym_pointreach_ppo_mlp.yaml", "env.env_id=examples.my_gym_env:GoalSeekEnvv"], "GoalSeekEnvv"),
        (["configs/reasoning_grpo_tiny.yaml", "rollout.backend=vlm"], "hf or vllm"),
        (["configs/maniskill_pushcube_grpo_mlp.yaml", "trainer.critic_lr=1e-4"],
         "set trainer.critic_lr=null or policy.critic=true"),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "env.ignore_terminations=true",
          "env.ignore_terminations_fraction=0.5", "env.success_hold_steps=1",
          "env.success_hold_ramp=null"], "drop env.ignore_terminations_fraction"),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "env.ignore_terminations=true"],
         "env.success_hold_steps=15 does nothing with env.ignore_terminations=true"),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "trainer.lr=1e-3", "env.num_envs=8",
          "trainer.lr=3e-4"], "trainer.lr is given twice (trainer.lr=1e-3 and trainer.lr=3e-4)"),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "env.success_hold_steps=0"],
         "env.success_hold_steps must be >= 1"),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "trainer={lr: 1e-3, update_epochs: 2}",
          "trainer.lr=3e-4"], "trainer.lr is given twice (trainer={lr: 1e-3, update_epochs: 2} and"),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "trainer=5", "trainer.lr=7e-4"],
         "trainer.lr is given twice (trainer=5 and trainer.lr=7e-4)"),
        (["configs/maniskill_pickcube_ppo_mlp.yaml", "env.success_hold_steps=10"],
         "does nothing with env.ignore_terminations=true"),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "env.success_hold_steps=10",
          "env.ignore_terminations_fraction=1.0"], "does nothing with env.ignore_terminations_fraction=1.0"),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "trainer={lr:1e-3}"],
         "(YAML needs a space after the colon: {lr: ...})"),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "env.success_hold_ramp=abc"],
         "expected a list of int, or null, got 'abc' (str)"),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "eval.num_episodes=[1]"],
         "expected int, got [1] (list) (e.g. eval.num_episodes=32)."),
        # a wrong plain value names the config's own value as an example of the type
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "trainer.lr=abc"],
         "expected float, got 'abc' (str) (e.g. trainer.lr=0.0003)."),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "trainer.offload=maybe"],
         "expected bool, got 'maybe' (str) (e.g. trainer.offload=false)."),
        # a mapping for a list field (and the other way round): OmegaConf says only
        # "Cannot merge incompatible container types"
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "env.success_hold_ramp={a: 1}"],
         "'env.success_hold_ramp' in configs/maniskill_pushcube_ppo_mlp.yaml + overrides "
         "['env.success_hold_ramp={a: 1}']: expected a list of int, or null, got {a: 1} (mapping)"),
        (["configs/gym_pointreach_ppo_mlp.yaml", "env.kwargs=[1]"],
         "'env.kwargs' in configs/gym_pointreach_ppo_mlp.yaml + overrides ['env.kwargs=[1]']: "
         "expected a mapping, got [1] (list)"),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "env=[1]"],
         "expected a mapping (a config section), got [1] (list)"),
        # a plain value for a whole section: OmegaConf says "Merge error: int is not a
        # subclass of TrainerConfig"
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "trainer=1"],
         "Config key 'trainer' is a section, not a value (got '1' in"),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "cluster.address=bogus"],
         "cluster.address 'bogus' is not auto, HOST:PORT or ray://HOST:PORT"),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "cluster.address=10.0.0.1:99999"],
         "cluster.address '10.0.0.1:99999': port 99999 is outside 1-65535"),
        # the actor looked these up only at its first update, after Ray and a rollout
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "algorithm.loss=dpo"],
         "Unknown loss 'dpo'. Did you mean 'ppo'? Valid loss names: ppo, ppo_token"),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "algorithm.advantage=gea"],
         "Unknown advantage 'gea'. Did you mean 'gae'?"),
        # a field of another kind of env / policy (it suggested env.autoreset_mode)
        (["configs/gym_pointreach_ppo_mlp.yaml", "env.control_mode=pd_joint_pos"],
         "(env.control_mode is a field of env.type=maniskill, not of env.type=gym: the env section "
         "holds one kind's fields; drop env.control_mode"),
        # the type was not changed: the hint names the configs that have the field
        (["configs/maniskill_lang3_grpo_openvla_oft_finetune.yaml", "policy.initial_noise_head=true"],
         "drop policy.initial_noise_head, or start from a config of policy.type=pi0 or pi05)."),
        # OmegaConf reads any int as a bool (non-zero: true)
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "trainer.offload=2"],
         "'trainer.offload' in configs/maniskill_pushcube_ppo_mlp.yaml + overrides "
         "['trainer.offload=2']: expected bool, got 2 (int); write trainer.offload=true or "
         "trainer.offload=false."),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "env.=3"],
         "Override 'env.=3' has an empty part in its key 'env.'; write section.field=value"),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "env.type=libero"],
         "start from a config of env.type=libero rather than changing env.type by override"),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "placement=colocated"],
         "(or auto). Did you mean 'collocated'?"),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "placement=configs/placement"],
         "placement 'configs/placement' is a directory; name a placement YAML file in it"),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "algorithm.loss=grpo"],
         "algorithm.loss=grpo names an advantage estimator, not a loss: set algorithm.advantage=grpo"),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "algorithm.loss=PPO"],
         "Unknown loss 'PPO'. Did you mean 'ppo'?"),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "env.control_mode=bogus"],
         "env.control_mode 'bogus' is not a ManiSkill3 controller; they are named pd_*"),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "env=foo"],
         "set its fields one by one, env.<field>=value; env.type=... picks its kind."),
        (["configs/maniskill_pushcube_ppo_mlp.yaml", "env.success_hold_steps=51"],
         "is longer than an episode (env.max_episode_steps=50)"),
        # whole GRPO groups, checked before any placement is known (placement=auto)
        (["configs/maniskill_pushcube_grpo_mlp.yaml", "env.num_envs=10", "placement=auto"],
         "Set env.num_envs to a multiple of algorithm.group_size=4 (got 10)"),
        (["configs/maniskill_pushcube_grpo_mlp.yaml", "algorithm.group_size=1"],
         "algorithm.group_size=1 with GRPO: a group of one rollout has advantage 0"),
        # the SFT pipeline's RL stage is resolved and checked too (finetune / sft-rl run it)
        (["configs/sft/maniskill_pushcube_sft_rl_mlp.yaml", "rl.config=nope_config"],
         "rl.config nope_config is neither a file nor a shipped config; the shipped RL configs of "
         "mlp: maniskill_pushcube_grpo_mlp_finetune, maniskill_pushcube_ppo_mlp_finetune."),
        (["configs/sft/maniskill_pushcube_sft_rl_mlp.yaml", "rl.overrides=[trainer.critic_lr=abc]"],
         "trainer.critic_lr"),
    ):
        r = runner.invoke(app, ["config", "show", *args])
        assert r.exit_code == 2 and words in r.output, (args, r.output)
    ok = runner.invoke(app, ["config", "show", "configs/gym_pointreach_ppo_mlp.yaml",
                             "env.env_id=examples.my_gym_env:GoalSeekEnv"])
    assert ok.exit_code == 0, ok.output


def test_hold_errors_suggest_fixes_that_work():
    # Each suggested fix is applied as written and must load (the ramp goes with the hold).
    main = "configs/maniskill_pushcube_ppo_mlp.yaml"
    for bad, fixes in (
        (["env.ignore_terminations=true"],
         [["env.ignore_terminations=false"],
          ["env.success_hold_steps=1", "env.success_hold_ramp=null"]]),
        (["env.max_episode_steps=10"],
         [["env.success_hold_steps=10"],
          ["env.ignore_terminations=true", "env.success_hold_steps=1",
           "env.success_hold_ramp=null"]]),
    ):
        r = runner.invoke(app, ["config", "show", main, *bad])
        assert r.exit_code == 2, r.output
        text = " ".join(r.output.split())
        for fix in fixes:
            assert all(part in text for part in fix), (fix, text)
            merged = {o.split("=")[0]: o for o in [*bad, *fix]}  # a fix replaces a bad key
            ok = runner.invoke(app, ["config", "show", main, *merged.values()])
            assert ok.exit_code == 0, (bad, fix, ok.output)


def test_train_and_plan_refuse_a_key_given_twice():
    for cmd in (["train"], ["plan"]):
        r = runner.invoke(app, [*cmd, "configs/maniskill_pushcube_ppo_mlp.yaml", "run.seed=1",
                                "run.seed=2"])
        assert r.exit_code == 2 and "run.seed is given twice" in r.output, (cmd, r.output)


def test_resume_of_a_reasoning_run_says_it_cannot(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.yaml").write_text((ROOT / "configs" / "reasoning_grpo_tiny.yaml").read_text())
    r = runner.invoke(app, ["train", "--resume", str(run)])
    assert r.exit_code == 2 and "reasoning run" in r.output, r.output


def test_config_show_reads_sft_pipeline_files():
    r = runner.invoke(app, ["config", "show", "configs/sft/maniskill_pushcube_sft_rl_mlp.yaml", "bc.steps=17"])
    assert r.exit_code == 0, r.output
    assert "demos:" in r.stdout and "steps: 17" in r.stdout


def test_doctor_json_reports_every_check():
    # A real run: probes SAPIEN, MuJoCo and LIBERO in subprocesses.
    p = subprocess.run([sys.executable, "-m", "rlinf_embodied.cli", "doctor", "--json"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    data = json.loads(p.stdout)
    names = [c["name"] for c in data["checks"]]
    for expected in ("python", "torch", "ray", "pins", "sapien_render", "mujoco_render",
                     "libero", "gpu_render_mapping"):
        assert expected in names
    for c in data["checks"]:
        assert c["status"] in ("ok", "warn", "fail")
        assert set(c) == {"name", "status", "required", "detail", "fix"}
        if c["status"] != "ok":
            assert c["fix"], c
    failed = [c for c in data["checks"] if c["status"] == "fail" and c["required"]]
    assert data["ok"] == (not failed)
    assert p.returncode == (1 if failed else 0)
    # This machine is set up by scripts/setup.sh: everything must pass here.
    assert data["ok"], failed


def test_doctor_failure_has_fix(monkeypatch):
    from rlinf_embodied import doctor
    monkeypatch.setattr(doctor, "_version", lambda dist: None)
    c = doctor.check_sapien()
    assert c.status == "warn" and not c.required and "maniskill" in c.fix
    monkeypatch.setattr(doctor, "CHECKS", [lambda: doctor.Check("x", "fail", True, "d", "do y")])
    out = json.loads(doctor.format_checks(doctor.run_checks(), as_json=True))
    assert out["ok"] is False and out["checks"][0]["fix"] == "do y"


# --- train: refused before Ray starts or anything is written; resume rules --------------------
JOB = str(ROOT / "configs" / "gym_pointreach_ppo_mlp.yaml")


def _no_ray():
    import sys as _sys

    ray = _sys.modules.get("ray")
    return ray is None or not ray.is_initialized()


def test_train_refuses_bad_values_before_anything_runs(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.chdir(tmp_path)
    bad = [["trainer.rollout_steps=0"], ["trainer.lr=-1"], ["algorithm.gamma=1.5"],
           ["trainer.num_minibatches=100000"], ["run.name=../../outside"],
           ["algorithm.kl_coef=0.1"], ["placement=diagonal"]]
    if importlib.util.find_spec("wandb") is None:
        bad.append(["logging.wandb=true"])
    ray_was_up = not _no_ray()
    for overrides in bad:
        r = runner.invoke(app, ["train", JOB, *overrides])
        assert r.exit_code == 2, (overrides, r.output)
        assert len(r.output.strip().splitlines()) == 1 and r.output.startswith("error: "), r.output
    assert not any(tmp_path.rglob("*")), sorted(tmp_path.rglob("*"))  # no run directory
    assert not (tmp_path.parent.parent / "outside").exists()
    assert ray_was_up or _no_ray()


def _fake_run(tmp_path, iterations_done, damaged=(), config_overrides=()):
    """A run directory as training leaves it: config.yaml and checkpoints of a real policy."""
    from rlinf_embodied.checkpoint import atomic_write_json, checkpoint_dir
    from rlinf_embodied.config import load_config, save_config
    from rlinf_embodied.policies import build_policy, save_policy
    from rlinf_embodied.policies.base import SpaceSpec

    cfg = load_config(JOB, list(config_overrides))
    run = tmp_path / "run"
    save_config(cfg, run)
    policy = build_policy(cfg.policy, SpaceSpec(action_low=(-1.0, -1.0), action_high=(1.0, 1.0),
                                                state_dim=4))
    for it in iterations_done:
        with checkpoint_dir(run, f"iter_{it:06d}") as d:
            save_policy(policy, d / "policy")
            atomic_write_json(d / "runner_state.json", {"iteration": it, "env_steps": 100 * it})
    for it in damaged:
        w = run / "checkpoints" / f"iter_{it:06d}" / "policy" / "model.safetensors"
        w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    return run


def test_resume_of_finished_run_says_so(tmp_path):
    run = _fake_run(tmp_path, [30])
    r = runner.invoke(app, ["train", "--resume", str(run)])
    assert r.exit_code == 0, r.output
    assert "has finished" in r.output and "iteration 30" in r.output and "trainer.iterations=N" in r.output
    assert "not applied" not in r.output
    # an override that would change the run is named as not applied, not silently dropped
    r = runner.invoke(app, ["train", "--resume", str(run), "trainer.lr=0.002"])
    assert r.exit_code == 0, r.output
    assert "has finished" in r.output and "were not applied" in r.output, r.output
    assert "trainer.lr: 0.001 -> 0.002" in " ".join(r.output.split()), r.output


def test_resume_refuses_a_policy_change_and_leaves_the_run_as_it_was(tmp_path):
    run = _fake_run(tmp_path, [1])
    before = (run / "config.yaml").read_bytes()
    ray_was_up = not _no_ray()  # earlier tests in the same process may have started Ray
    r = runner.invoke(app, ["train", "--resume", str(run), "policy.hidden_sizes=[32,32]"])
    assert r.exit_code == 2, r.output
    out = " ".join(r.output.split())
    assert out.startswith("error: ") and "policy.hidden_sizes: [64, 64] -> [32, 32]" in out, out
    assert (run / "config.yaml").read_bytes() == before
    assert ray_was_up or _no_ray()


def test_resume_keeps_the_run_where_it_is_and_names_a_changed_seed(tmp_path):
    run = _fake_run(tmp_path, [1])
    before = (run / "config.yaml").read_bytes()
    for override in ("run.name=elsewhere", f"run.dir={tmp_path / 'other'}", "run.output_dir=x"):
        r = runner.invoke(app, ["train", "--resume", str(run), override])
        assert r.exit_code == 2, r.output
        out = " ".join(r.output.split())
        assert "cannot change on resume" in out and f"cp -r {run} NEW" in out, out
    assert (run / "config.yaml").read_bytes() == before
    from rlinf_embodied.cli import _resume_config

    _, _, ckpt = _resume_config(None, ["run.seed=99", "trainer.iterations=1"], str(run))
    assert ckpt is None  # finished; the seed change is named among the overrides not applied
    r = runner.invoke(app, ["train", "--resume", str(run), "run.seed=99"])
    assert "run.seed: " in r.output and "-> 99" in r.output, r.output


def test_resume_skips_a_truncated_checkpoint(tmp_path):
    run = _fake_run(tmp_path, [1, 2], damaged=[2])
    r = runner.invoke(app, ["train", "--resume", str(run), "trainer.iterations=1"])
    assert r.exit_code == 0, r.output
    assert "skipping checkpoint iter_000002" in r.output and "model.safetensors" in r.output
    assert "checkpoint iter_000001 is iteration 1" in r.output


def test_resume_with_no_loadable_checkpoint_is_an_error(tmp_path):
    run = _fake_run(tmp_path, [1], damaged=[1])
    r = runner.invoke(app, ["train", "--resume", str(run)])
    assert r.exit_code == 2 and "no complete checkpoint" in r.output, r.output


def test_a_refused_resume_is_its_error_line_alone(tmp_path):
    # a warning about the run's own config (a hold ramp after its last iteration) is said when
    # the resume goes ahead, not before the error line of a refused one (fresh-user trial)
    from rlinf_embodied.config import ConfigWarning

    with pytest.warns(ConfigWarning, match="starts after the run's last iteration"):
        run = _fake_run(tmp_path, [3], config_overrides=[
            "trainer.iterations=3", "env.success_hold_steps=5", "env.success_hold_ramp=[5,9]"])
    other = str(ROOT / "configs" / "maniskill_pushcube_ppo_mlp.yaml")
    r = runner.invoke(app, ["train", other, "--resume", str(run)])
    assert r.exit_code == 2 and "is not the config of run" in r.output, r.output
    assert "warning:" not in r.output and "success_hold_ramp" not in r.output, r.output
    r = runner.invoke(app, ["train", "--resume", str(run)])  # accepted: finished, warned
    assert r.exit_code == 0 and "has finished" in r.output, r.output
    assert r.output.count("warning:") == 1, r.output  # once, though the config is read twice
    assert "warning: env.success_hold_ramp=[5, 9] starts after the run's last iteration" in r.output


def test_resume_with_another_config_is_an_error(tmp_path):
    run = _fake_run(tmp_path, [30])
    other = str(ROOT / "configs" / "maniskill_pushcube_ppo_mlp.yaml")
    r = runner.invoke(app, ["train", other, "--resume", str(run)])
    out = " ".join(r.output.split())
    assert r.exit_code == 2 and "is not the config of run" in out and "given -> the run's: env.type" in out, out
    assert "more);" in out  # the first 6 differences, then a count
    # another seed is another experiment: listed too
    from omegaconf import OmegaConf

    reseeded = OmegaConf.load(JOB)
    reseeded.run.seed = int(OmegaConf.select(reseeded, "run.seed", default=0)) + 1
    OmegaConf.save(reseeded, tmp_path / "reseeded.yaml")
    r = runner.invoke(app, ["train", str(tmp_path / "reseeded.yaml"), "--resume", str(run)])
    assert r.exit_code == 2 and "run.seed" in r.output, r.output
    # the run's own config file is accepted (and the finished run reported)
    r = runner.invoke(app, ["train", JOB, "--resume", str(run)])
    assert r.exit_code == 0 and "has finished" in r.output, r.output


def test_resume_warns_when_the_lr_schedule_moves(tmp_path, capsys):
    from rlinf_embodied.cli import _resume_config

    run = _fake_run(tmp_path, [10], config_overrides=["trainer.lr_schedule=linear", "trainer.iterations=20"])
    cfg, _, ckpt = _resume_config(None, ["trainer.iterations=40"], str(run))
    err = capsys.readouterr().err
    assert ckpt.name == "iter_000010" and cfg.trainer.iterations == 40
    # linear: 1 - 10/20 = 0.5 before, 1 - 10/40 = 0.75 after
    assert "lr_schedule=linear" in err and "0.750 x trainer.lr instead of 0.500" in err, err
    assert "LR at iteration 11 (the first resumed one)" in err, err  # 1-based, as the log
    _resume_config(None, ["trainer.iterations=40", "trainer.lr_schedule=constant"], str(run))
    assert "lr_schedule" not in capsys.readouterr().err.split("changed settings")[-1].split(";")[-1]


def test_eval_of_truncated_checkpoint_is_one_line(tmp_path):
    run = _fake_run(tmp_path, [1], damaged=[1])
    r = runner.invoke(app, ["eval", "--env", "gym", "--task", "toy/PointReach-v0", "--policy",
                            str(run / "checkpoints" / "iter_000001"), "--num-processes", "0",
                            "--num-envs", "1", "--trials-per-task", "1", "--no-report",
                            "--output", str(tmp_path / "r.json")])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "model.safetensors cannot be read" in lines[0], r.output


def test_eval_libero_without_suite_names_the_fix():
    r = runner.invoke(app, ["eval", "--env", "libero", "--policy", "random"])
    assert r.exit_code == 2 and "--env libero needs --suite" in r.output, r.output
    # LIBERO's tasks are ids of the suite: an env id given with --task is refused, not ignored
    r = runner.invoke(app, ["eval", "--env", "libero", "--suite", "libero_spatial", "--task",
                            "PushCube-v1", "--policy", "random"])
    assert r.exit_code == 2 and "select them by id with --tasks" in r.output, r.output
    assert "not --task PushCube-v1" in r.output


def test_continue_hint_is_a_command_that_exists(monkeypatch):
    from rlinf_embodied.cli_run import self_command as _self_command

    exe = Path(sys.executable).parent / "rlinf-embodied"
    monkeypatch.setattr(sys, "argv", [str(exe), "train"])
    assert _self_command() == str(exe) and exe.exists()
    monkeypatch.setattr(sys, "argv", ["/somewhere/cli.py", "train"])
    assert _self_command().endswith("-m rlinf_embodied.cli")
    assert Path(_self_command().split()[0]).exists()


def test_eval_with_an_unknown_gym_id_is_one_line(tmp_path):
    r = runner.invoke(app, ["eval", "--env", "gym", "--task", "PointReach-v0", "--policy", "random",
                            "--trials-per-task", "1", "-o", str(tmp_path / "ev.json")])
    assert r.exit_code == 2 and "is not a registered gymnasium env" in r.output and "toy/PointReach-v0" in r.output
    assert "Traceback" not in r.output


def test_finetune_and_sft_rl_check_the_rl_stage_before_running_anything(tmp_path):
    for cmd in ("finetune", "sft-rl"):
        r = runner.invoke(app, [cmd, "configs/sft/maniskill_pushcube_sft_rl_mlp.yaml",
                                f"run.dir={tmp_path / cmd}", "rl.config=nope_config"])
        assert r.exit_code == 2 and "rl.config nope_config is neither a file nor a shipped " \
            "config" in r.output, (cmd, r.output)
        assert not (tmp_path / cmd).exists()  # no stage started


def test_command_line_errors_are_one_error_line(capsys):
    """The console entry point turns click's parser errors into one ``error:`` line, exit 2."""
    import pytest

    from rlinf_embodied.cli import run

    cases = [
        (["train", "--bogus"], "error: No such option: --bogus (see '"),
        (["train", "maniskill_pushcube_ppo_mlp", "--devices", "2"], "error: No such option: "
         "--devices (train uses the CUDA devices it sees, or cluster.num_cpu_devices=N on CPU)"),
        (["eval", "--env", "gym", "--trials-per-task", "abc"], "error: Invalid value for '--trials-per-task'"),
        (["plan"], "error: Missing argument 'config'."),
        (["config", "show"], "config show --help')"),
        (["config", "show", "configs"], "error: Config path configs is a directory; pass a YAML file."),
        (["plan", "configs/"], "is a directory; pass a YAML file."),
        # refused before the config loads (it took 5 s to say so)
        (["plan", "maniskill_pushcube_ppo_mlp", "--devices", "0"],
         "error: Invalid value for '--devices': Input should be greater than or equal to 1"),
        # an option's missing value: click gives no context, the hint names the subcommand
        (["eval", "compare", "a.json", "b.json", "--json"],
         "requires an argument. (see 'rlinf-embodied eval compare --help')"),
        (["train", "--resume"], "(see 'rlinf-embodied train --help')"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_:
            run(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2, (argv, err)
        assert err.count("\n") == 1 and err.startswith("error: ") and message in err, (argv, err)
        assert "╭" not in err
    # an error that is not click's propagates as itself (the except clauses must not fail)
    with pytest.raises(KeyboardInterrupt):
        from unittest import mock
        with mock.patch("rlinf_embodied.cli.app", side_effect=KeyboardInterrupt):
            run(["--version"])
    with pytest.raises(SystemExit) as exit_:  # a bare group still shows its help
        run(["config"])
    shown = capsys.readouterr()
    assert exit_.value.code == 2 and "show" in shown.out + shown.err
    with pytest.raises(SystemExit) as exit_:
        run(["--version"])
    assert exit_.value.code == 0 and rlinf_embodied.__version__ in capsys.readouterr().out


def test_report_without_checkpoint_says_why(capsys):
    from types import SimpleNamespace

    from rlinf_embodied.cli_run import report_saved as _report_saved

    def report(save_every, iterations=3, how="done"):
        cfg = SimpleNamespace(trainer=SimpleNamespace(save_every=save_every))
        _report_saved(SimpleNamespace(saved=None, state={"iteration": iterations, "env_steps": 300},
                                      cfg=cfg), Path("runs/x"), how)
        return " ".join(capsys.readouterr().out.split())

    assert "trainer.save_every=0 saves none, except on Ctrl-C" in report(0)
    # the issue-37 run: 2 iterations done, the first save due after 10
    text = report(10, 2, "failed")
    assert text.startswith("failed: 2 iterations, 300 env steps")
    assert ("trainer.save_every=10: the first checkpoint was due after iteration 10 and the run "
            "stopped after 2") in text and "first iteration ended" not in text
    assert "stopped before its first iteration ended" in report(10, 0, "failed")


def test_unwritable_outputs_fail_before_any_env_starts(tmp_path):
    # /proc refuses new files for every user (root included); nothing starts, one line, exit 2
    r = runner.invoke(app, ["train", "configs/gym_pointreach_ppo_mlp.yaml", "run.dir=/proc/rlinf_run"])
    assert r.exit_code == 2 and "Cannot write the run directory /proc/rlinf_run" in r.output
    assert "set run.dir=PATH" in r.output and len(r.output.strip().splitlines()) == 1
    r = runner.invoke(app, ["eval", "--env", "gym", "--task", "toy/PointReach-v0", "--policy", "random",
                            "--output", "/proc/rlinf_results.json"])
    assert r.exit_code == 2 and "Cannot write the results file /proc/rlinf_results.json" in r.output
    assert "--output PATH" in r.output
    from rlinf_embodied.checkpoint import unwritable

    assert unwritable(tmp_path / "new" / "dir") is None and (tmp_path / "new" / "dir").is_dir()
    assert list((tmp_path / "new" / "dir").iterdir()) == []  # the probe file is gone


def test_vllm_backend_outside_its_venv_names_the_venv(tmp_path):
    import importlib.util

    import pytest

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed in this venv")
    r = runner.invoke(app, ["train", "configs/reasoning_grpo_tiny.yaml", "rollout.backend=vllm",
                            f"run.dir={tmp_path / 'run'}"])
    assert r.exit_code == 2, r.output
    assert ".venv-vllm/bin/rlinf-embodied train" in r.output and "rollout.backend=hf" in r.output
    assert not (tmp_path / "run").exists()  # refused before the run directory was made


def test_eval_of_a_run_takes_its_env_type_when_env_is_left_out(tmp_path):
    run = _fake_run(tmp_path, [1])
    r = runner.invoke(app, ["eval", "--policy", str(run), "--trials-per-task", "1", "--output",
                            str(tmp_path / "r.json"), "--env-override", "nonsense=1"])
    # the env type came from the run (gym here), so the next check is about gym's settings
    assert "eval: --env gym (the env type of the policy's run" in r.output, r.output
    assert r.exit_code == 2 and "not a gym env setting" in r.output, r.output
    r = runner.invoke(app, ["eval", "--policy", "random"])
    assert r.exit_code == 2 and "--env is required" in r.output
    # another env type than the run's, without a task: named as such (it said "needs --task")
    r = runner.invoke(app, ["eval", "--policy", str(run), "--env", "maniskill"])
    assert r.exit_code == 2 and ("--env maniskill, but the policy's run trained on --env gym"
                                 in r.output), r.output
    # a mistyped run directory is named as such, not taken for a missing --env
    r = runner.invoke(app, ["eval", "--policy", str(tmp_path / "nope")])
    assert r.exit_code == 2 and f"--policy {tmp_path / 'nope'}: no such file or directory" in r.output
    # a module:function whose module is nowhere: refused before the envs are built (24 s)
    r = runner.invoke(app, ["eval", "--env", "maniskill", "--policy", "no_such_mod_xyz:make"])
    assert r.exit_code == 2 and ("Cannot import module 'no_such_mod_xyz' of --policy "
                                 "no_such_mod_xyz:make (No module named") in r.output, r.output
    (tmp_path / "pipe" / "sft" / "policy").mkdir(parents=True)  # a pipeline's run.dir
    r = runner.invoke(app, ["eval", "--policy", str(tmp_path / "pipe")])
    assert r.exit_code == 2 and f"give its RL run (--policy {tmp_path / 'pipe' / 'rl'})" in " ".join(r.output.split())


def test_eval_env_override_sets_and_records_env_settings(tmp_path):
    out = tmp_path / "r.json"
    args = ["eval", "--env", "gym", "--task", "toy/PointReach-v0", "--policy", "random", "--trials-per-task", "2",
            "--num-envs", "2", "--num-processes", "0", "--no-report", "--output", str(out)]
    r = runner.invoke(app, args + ["--env-override", "kwargs={dim: 3}", "--env-override", "success_hold_steps=2"])
    assert r.exit_code == 0, r.output
    cfg = json.loads(out.read_text())["header"]["env_config"]
    assert cfg["kwargs"] == {"dim": 3} and cfg["success_hold_steps"] == 2
    r = runner.invoke(app, args + ["--env-override", "kwargs"])
    assert r.exit_code == 2 and "is not KEY=VALUE" in r.output
    r = runner.invoke(app, args[:-1] + [str(tmp_path / "b.json"), "--env-override", "kwargs={dimm: 3}"])
    assert r.exit_code == 2 and "'dimm' (did you mean 'dim'?)" in r.output
    # a value of the wrong type is one line naming the type, not a traceback
    for bad, needs in (("success_hold_steps=abc", "success_hold_steps must be int"),
                       ("kwargs=3", "kwargs must be a mapping"),
                       ("state_keys=pos", "state_keys must be a list of str")):
        r = runner.invoke(app, args[:-1] + [str(tmp_path / "c.json"), "--env-override", bad])
        assert r.exit_code == 2 and needs in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "c.json").exists()
    r = runner.invoke(app, args[:-1] + [str(tmp_path / "c.json"), "--env-override", "num_envs=3"])
    assert r.exit_code == 2 and "set it with --num-envs instead" in r.output, r.output
    r = runner.invoke(app, args[:-1] + [str(tmp_path / "d.json"), "--env-override", "success_hold_steps='2'"])
    assert r.exit_code == 0, r.output  # a quoted number is converted, as train's overrides are
    assert json.loads((tmp_path / "d.json").read_text())["header"]["env_config"]["success_hold_steps"] == 2


def test_a_ray_start_timeout_says_to_retry():
    from rlinf_embodied.runners.errors import start_hint as _start_hint

    hint = _start_hint(Exception("The current node timed out during startup. This could happen "
                                 "because some of the raylet failed to startup"))
    assert "Ray could not start its local cluster in time" in hint and "run the same command again" in hint
    assert _start_hint(ValueError("env worker failed")) == ""


def test_command_help_paragraphs_are_reflowed_for_the_terminal():
    from rlinf_embodied.cli import _reflowed

    assert _reflowed("One\nline.\n\nExits 0,\n130 after ``Ctrl-C``.\n- a\n- b\n1. c\n    code") == (
        "One line.\n\nExits 0, 130 after `Ctrl-C`.\n- a\n- b\n1. c\n    code")
    helps = {i.callback.__name__: i.help for i in app.registered_commands}
    assert "or with `--resume` and no RL run to continue;" in helps["finetune"]
    r = runner.invoke(app, ["finetune", "--help"])  # 80 columns: no docstring line break left
    assert r.exit_code == 0 and "after Ctrl-C." in r.output
    assert "after Ctrl-C." not in [line.strip() for line in r.output.splitlines()], r.output


def test_mlp_pipeline_rl_stage_notes_the_checkpoint_sft_writes(tmp_path):
    r = runner.invoke(app, ["config", "show", "configs/sft/maniskill_pushcube_sft_rl_mlp.yaml",
                            f"run.dir={tmp_path}", "--rl-stage"])
    assert r.exit_code == 0 and "note: policy.checkpoint" in r.stderr, r.output


def test_eval_of_a_run_that_never_saved_says_so(tmp_path):
    (tmp_path / "config.yaml").write_text("run: {name: x}\n")
    r = runner.invoke(app, ["eval", "--policy", str(tmp_path), "--env", "gym",
                            "--task", "toy/PointReach-v0", "-o", str(tmp_path / "r.json")])
    assert r.exit_code == 2 and "stopped before its first save" in r.output, r.output
    # said before any env is built
    from rlinf_embodied.eval.request import EvalRequest
    from rlinf_embodied.eval.policy_files import PolicySourceError
    from rlinf_embodied.eval.run import evaluate

    def no_env(cfg):
        raise AssertionError("an env was built before the policy files were checked")

    with pytest.raises(PolicySourceError, match="stopped before its first save"):
        evaluate(EvalRequest(env="gym", task="toy/PointReach-v0", policy=str(tmp_path),
                             output=str(tmp_path / "r.json"), env_factory=no_env))


def test_help_keeps_square_brackets_and_listings_wrap_at_the_terminal_width():
    r = runner.invoke(app, ["eval", "--help"])  # typer renders help as rich markup
    assert r.exit_code == 0 and "'state_keys=[pos, goal]'" in " ".join(
        line.strip(" │") for line in r.output.splitlines()), r.output
    for command in (["envs", "list"], ["eval", "protocols"]):
        for columns in (72, 60):
            r = runner.invoke(app, command, env={"COLUMNS": str(columns)})
            assert r.exit_code == 0 and "maniskill_lang3" in r.output
            assert max(len(line) for line in r.output.splitlines()) <= columns, r.output



def test_sft_pipelines_given_to_train_or_plan_and_rl_keys_given_to_a_pipeline_say_where_they_go(tmp_path):
    for command in (["train"], ["plan", "--devices", "4"]):
        r = runner.invoke(app, [*command[:1], "maniskill_lang3_sft_rl_oft", *command[1:]])
        out = " ".join(r.output.split())
        assert r.exit_code == 2 and "is an SFT -> RL pipeline" in out and "sft-rl" in out, out
    r = runner.invoke(app, ["config", "show", "maniskill_pushcube_sft_rl_mlp", "--rl-stage", "trainer.lr=1e-5"])
    assert r.exit_code == 2 and "pass 'rl.overrides=[\"trainer.lr=1e-5\"]'" in r.output, r.output
    r = runner.invoke(app, ["config", "show", "maniskill_pushcube_sft_rl_mlp", "--rl-stage",
                            'rl.overrides=["trainer.lr=1e-5"]'])
    assert r.exit_code == 0 and "lr: 1.0e-05" in r.stdout, r.output
    # a shipped placement layout is no job; an explicit ./ path is never a shipped config
    r = runner.invoke(app, ["config", "show", "placement/collocated"])
    assert r.exit_code == 2 and "is a placement layout" in r.output and "placement=collocated" in r.output
    r = runner.invoke(app, ["config", "show", f"{tmp_path}/maniskill_pushcube_ppo_mlp.yaml"])
    assert r.exit_code == 2 and "Config file not found" in r.output, r.output
    # an evaluation results file where a job config or a run directory belongs
    res = tmp_path / "r.json"
    res.write_text(json.dumps({"format": "rlinf-embodied-eval/1", "header": {}, "episodes": []}))
    for args, words in ((["config", "show", str(res)], "is an evaluation results file, not a job config"),
                        (["train", str(res)], "is an evaluation results file, not a job config"),
                        (["train", "--resume", str(res)], f"--resume {res} is a file; pass the run directory")):
        r = runner.invoke(app, args)
        out = " ".join(r.output.split())
        assert r.exit_code == 2 and words in out and "Unknown config key" not in out, out
    # a placement= file that is not YAML, or not a mapping, is one line (it was a traceback,
    # or "not found" for a file that exists)
    (tmp_path / "bad.yaml").write_text("groups: [a\n  b: {")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "pc.png").write_bytes(b"\x89PNG")
    for name, words in (("bad.yaml", "not valid YAML (did not find expected ',' or ']' at line 2"),
                        ("list.yaml", "not a placement (a mapping with a groups: section)"),
                        ("pc.png", "is a .png file, not a placement YAML (.yaml)")):
        r = runner.invoke(app, ["config", "show", "gym_pointreach_ppo_mlp", f"placement={tmp_path / name}"])
        out = " ".join(r.output.split())
        assert r.exit_code == 2 and words in out and "Traceback" not in out, out


def test_eval_of_envs_built_in_process_that_fail_is_one_line(tmp_path):
    # --num-processes 0 builds the envs here: ManiSkill's AssertionError was a 91-line traceback
    r = runner.invoke(app, ["eval", "--env", "maniskill", "--task", "PushCube-v1", "--policy",
                            "random", "--env-override", "control_mode=pd_bogus", "--trials-per-task",
                            "1", "--num-processes", "0", "-o", str(tmp_path / "r.json")])
    out = " ".join(r.output.split())
    assert r.exit_code == 2 and "building the envs in this process failed: AssertionError: " \
        "pd_bogus not in supported modes" in out, out
    assert "Traceback" not in out and not (tmp_path / "r.json").exists()


def test_eval_refuses_devices_sizes_and_task_ranges_it_cannot_use(tmp_path):
    import torch

    base = ["eval", "--env", "gym", "--task", "toy/PointReach-v0", "--policy", "random",
            "--trials-per-task", "1", "-o", str(tmp_path / "r.json")]
    for device, message in [("tpu", "--device must be cpu, cuda or cuda:I (got 'tpu')"),
                            ("cuda:99", "--device cuda:99: this machine has")]:
        r = runner.invoke(app, [*base, "--device", device])
        assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, r.output
    if not torch.cuda.is_available():
        r = runner.invoke(app, [*base, "--device", "cuda"])
        assert r.exit_code == 2 and "this machine has 0 CUDA device(s)" in r.output, r.output
    r = runner.invoke(app, [*base, "--image-size", "-5"])
    assert r.exit_code == 2 and "--image-size must be >= 1 pixel (got -5)" in r.output, r.output
    r = runner.invoke(app, [*base[:5], "--policy", "randm", *base[7:]])
    assert r.exit_code == 2 and "Did you mean 'random'?" in r.output, r.output
    r = runner.invoke(app, [*base, "--num-processes", "-1"])
    assert r.exit_code == 2 and "--num-processes must be >= 0 (got -1;" in r.output, r.output
    assert "env.num_processes" not in r.output
    assert not (tmp_path / "r.json").exists()
    from rlinf_embodied.eval.cli import parse_tasks

    with pytest.raises(ValueError, match="the range 2-1 is reversed; write 1-2"):
        parse_tasks("2-1")
    assert parse_tasks(" 1 , 2-3 ") == [1, 2, 3]
    # the id as `envs list` writes it (gym/<gymnasium id>) is the gymnasium id, and names --env
    r = runner.invoke(app, ["eval", "--task", "gym/toy/PointReach-v0", "--policy",
                            "random", "--trials-per-task", "1", "--no-report", "-o", str(tmp_path / "r.json")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "r.json").read_text())["header"]["env_id"] == "toy/PointReach-v0"
    # a named env as `envs list` prints it (toy/PointReach-v0) is a gym env without --env ...
    r = runner.invoke(app, ["eval", "--task", "toy/PointReach-v0", "--policy", "random",
                            "--trials-per-task", "1", "--no-report", "-o", str(tmp_path / "n.json")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "n.json").read_text())["header"]["env"] == "gym"
    # ... and with another --env it says which (it said "not a registered ManiSkill3 env")
    r = runner.invoke(app, ["eval", "--env", "maniskill", "--task", "toy/PointReach-v0", "--policy",
                            "random", "-o", str(tmp_path / "m.json")])
    assert r.exit_code == 2 and ("--task toy/PointReach-v0 is a gym env (`envs list`); pass --env "
                                 "gym or leave --env out.") in r.output, r.output


def test_eval_refuses_a_missing_policy_before_building_an_env(tmp_path, monkeypatch):
    """With --env given, a --policy path that does not exist is refused before any env is
    built (it took about a minute of ManiSkill construction), and `eval compare` of a training
    run's in-training evaluation names the command that writes a comparable file."""
    import rlinf_embodied.eval.run as run_mod

    def no_env(*a, **k):
        raise AssertionError("evaluate() ran")

    monkeypatch.setattr(run_mod, "evaluate", no_env)
    r = runner.invoke(app, ["eval", "--env", "maniskill", "--suite", "maniskill_lang3", "--policy",
                            str(tmp_path / "nothing"), "-o", str(tmp_path / "r.json")])
    assert r.exit_code == 2, r.output
    assert r.output.strip().startswith(f"error: --policy {tmp_path / 'nothing'}: no such file or "
                                       "directory"), r.output
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "latest.json").write_text(json.dumps({"iteration": 3, "trials": []}))
    r = runner.invoke(app, ["eval", "compare", str(run / "eval" / "latest.json"),
                            str(run / "eval" / "latest.json")])
    assert r.exit_code == 2, r.output
    assert (f"is a training run's in-training evaluation (iteration 3), not an `eval` results "
            f"file; to compare that run, evaluate it into one: rlinf-embodied eval --policy {run} "
            f"--run-trials --output RESULTS.json.") in " ".join(r.output.split()), r.output


def test_eval_flags_that_do_not_fit_the_env_or_the_comparison_are_refused(tmp_path):
    base = ["eval", "--env", "gym", "--task", "toy/PointReach-v0", "--policy", "random",
            "--trials-per-task", "1", "--no-report"]
    for extra, message in [(["--suite", "maniskill_lang3"], "--suite maniskill_lang3 is not a suite of --env gym"),
                           (["--tasks", "0"], "--tasks selects tasks of a --suite"),
                           (["--tasks", " "], "names no task"),
                           (["--policy-type", "bogus"], "--policy-type 'bogus' is no policy type; valid:")]:
        r = runner.invoke(app, [*base, *extra, "-o", str(tmp_path / "x.json")])
        assert r.exit_code == 2 and message in " ".join(r.output.split()), (extra, r.output)
    r = runner.invoke(app, [*base, "-o", str(tmp_path / "a.json")])
    assert r.exit_code == 0, r.output
    a = str(tmp_path / "a.json")
    before = (tmp_path / "a.json").read_text()
    for out, message in [(a, "is one of the results files compared"), (str(tmp_path), "is a directory")]:
        r = runner.invoke(app, ["eval", "compare", a, a, "--json", out])
        assert r.exit_code == 2 and message in r.output, r.output
    assert (tmp_path / "a.json").read_text() == before  # the inputs stay as they were


def test_an_env_warning_from_a_pool_worker_is_one_line(tmp_path):
    # CartPole reports no info['success']: the env pool's worker process says so as one
    # `warning:` line (it printed Python's file:line: UserWarning form and the source line)
    p = subprocess.run([sys.executable, "-m", "rlinf_embodied.cli", "eval", "--task",
                        "gym/CartPole-v1", "--policy", "random", "--trials-per-task", "1",
                        "--num-processes", "1", "--no-report", "-o", str(tmp_path / "r.json")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert ("warning: env CartPole-v1 ended an episode without info['success']: success_once "
            "and success_at_end will read 0 (mean return still measures it)") in p.stderr
    assert "UserWarning" not in p.stderr and "EnvWarning" not in p.stderr, p.stderr


def test_plan_with_a_cluster_address_nobody_listens_on_fails_in_one_line():
    # ray.init retried such an address for good ("Failed to connect to GCS" every 5 s)
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # a process of its own: a Ray that other tests started in this one would be used instead
    r = subprocess.run([sys.executable, "-m", "rlinf_embodied.cli", "plan",
                        "maniskill_pushcube_ppo_mlp", f"cluster.address=127.0.0.1:{port}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert (f"error: cannot reach a Ray cluster at 127.0.0.1:{port} (Connection refused): start "
            f"its head there (`ray start --head --port {port}` on 127.0.0.1)") in r.stderr
    assert "Traceback" not in r.stderr


def test_a_new_run_leaves_a_directory_with_a_runs_files_as_it_is(tmp_path):
    """A fresh ``train`` reuses ``run.dir`` only when it is missing or holds just a
    ``config.yaml`` (a start that trained nothing); a run killed before its first checkpoint
    left ``metrics.jsonl``, which a new run in the same directory would append to."""
    from rlinf_embodied.cli_run import fresh_run_dir as _fresh_run_dir

    run = tmp_path / "foo"
    assert _fresh_run_dir(run) == run  # missing
    run.mkdir()
    (run / "config.yaml").write_text("run: {}\n")
    assert _fresh_run_dir(run) == run  # a start that trained nothing
    (run / "metrics.jsonl").write_text('{"iteration": 1}\n')
    assert _fresh_run_dir(run) == tmp_path / "foo_1"
    (tmp_path / "foo_1" / "checkpoints" / "iter_000001").mkdir(parents=True)
    assert _fresh_run_dir(run) == tmp_path / "foo_2"
    (tmp_path / "bar").write_text("a file")  # returned: the writability check refuses it
    assert _fresh_run_dir(tmp_path / "bar") == tmp_path / "bar"


def test_resume_warns_once_for_the_config_that_runs_and_not_before_an_error(tmp_path):
    """--resume loads the saved config.yaml twice (as saved, and with the overrides): a config
    warning was printed for both, and before a bad override's one-line error."""
    import warnings as w

    from rlinf_embodied.config import load_config, save_config

    run = tmp_path / "r1"
    with w.catch_warnings():
        w.simplefilter("ignore")
        save_config(load_config("configs/maniskill_pushcube_ppo_mlp.yaml",
                                ["trainer.iterations=40", f"run.dir={run}"]), run)
    r = runner.invoke(app, ["train", "--resume", str(run), "trainer.lr=abc"])
    assert r.exit_code == 2 and "warning" not in r.output.lower(), r.output
    assert r.output.strip().count("\n") == 0 and "Wrong type for config key 'trainer.lr'" in r.output
    r = runner.invoke(app, ["train", "--resume", str(run), "trainer.iterations=12"])
    # no checkpoint: refused, in its error line alone (the warning is said when a resume goes
    # ahead: test_a_refused_resume_is_its_error_line_alone)
    assert r.exit_code == 2 and "no complete checkpoint" in r.output, r.output
    assert "warning:" not in r.output, r.output


def test_a_second_ctrl_c_after_the_final_checkpoint_is_no_abort():
    from types import SimpleNamespace as NS

    from rlinf_embodied.cli_run import how_it_ended as _how_it_ended

    calm, twice = NS(aborted=False), NS(aborted=True)
    run = lambda saved_at, interrupted=True: NS(interrupted=interrupted, signals=calm,  # noqa: E731
                                                state={"iteration": 16}, _saved_at=saved_at)
    assert _how_it_ended(run(16, interrupted=False), calm) == "done"
    assert _how_it_ended(run(16), calm) == "interrupted"
    assert _how_it_ended(run(15), twice) == "aborted"  # the final save was cut short
    assert _how_it_ended(run(16), twice) == "interrupted"  # saved, then the shutdown was cut
