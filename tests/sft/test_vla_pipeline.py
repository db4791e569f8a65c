"""The VLA SFT path on the language-conditioned ManiSkill suite, at tiny scale with real
ManiSkill and real motion plans: suite env -> RGB demos in pd_ee_delta_pose with instructions
-> SFT of a tiny OpenVLA-OFT with the demos' statistics -> published layout -> held-out
evaluation with per-task results and the executed chunk recorded; and the one-line refusals
(task without a motion-planning solution, demos of another controller / image size, an SFT
checkpoint of another family)."""

from __future__ import annotations

import json

import pytest
import torch

from rlinf_embodied.config import ConfigError

pytestmark = [pytest.mark.maniskill, pytest.mark.timeout(1800)]

CONFIG = "configs/sft/maniskill_lang3_sft_rl_oft.yaml"
K = 4


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """One demo each of PushCube and PullCube at 32 px, a 20-step SFT, 1 trial per task."""
    from rlinf_embodied.sft.pipeline import load_sft_config, run_demos, run_sft

    root = tmp_path_factory.mktemp("vla")
    cfg = load_sft_config(CONFIG, [
        f"run.dir={root / 'run'}", f"demos.dir={root / 'demos'}", "demos.num_trajectories=1",
        "demos.processes=1", "env.task_ids=[0,1]", "env.sensor_size=32",
        "env.max_episode_steps=12", "policy.tiny.image_size=32", "policy.tiny.vit_dims=[32,32]",
        "policy.tiny.llm_hidden=64", "policy.tiny.llm_layers=2", f"policy.action_chunk={K}",
        "bc.steps=20", "bc.batch_size=16", "eval.episodes=1", "eval.num_envs=2",
        "eval.num_processes=0", "eval.gate_episodes=1"])
    run_demos(cfg, log=lambda *_: None)
    out = run_sft(cfg, log=lambda *_: None)
    return cfg, out


def test_suite_env_serves_a_mix_of_tasks():
    from rlinf_embodied.config import config_class
    from rlinf_embodied.envs import make_env

    cfg = config_class("env", "maniskill")(suite="maniskill_lang3", obs_mode="rgb", num_envs=3,
                                           num_processes=0, sensor_size=32,
                                           control_mode="pd_ee_delta_pose")
    env = make_env(cfg)
    try:
        obs, _ = env.reset(seed=0)  # env i: seed i -> task i % 3
        assert obs["task_descriptions"] == ["push the cube to the goal region",
                                            "pull the cube to the goal region",
                                            "stack the red cube on top of the green cube"]
        assert obs["main_images"].shape == (3, 32, 32, 3) and obs["states"].shape == (3, 8)
        # a gripper pointing down has a near-zero orientation in the proprio layout
        assert float(obs["states"][:, 3:6].abs().max()) < 0.5
        obs, _ = env.reset(seed=7, env_ids=[1], options={"task_ids": [2]})
        assert obs["task_descriptions"][1].startswith("stack")
        obs, *_ = env.step(torch.zeros(3, 7))
        assert obs["task_descriptions"][1].startswith("stack")
        assert env.max_episode_steps == 80
    finally:
        env.close()
    with pytest.raises(ConfigError, match="task_ids"):
        config_class("env", "maniskill")(suite="maniskill_lang3", obs_mode="rgb", task_ids=[5])
    with pytest.raises(ConfigError, match="Unknown ManiSkill suite"):
        config_class("env", "maniskill")(suite="maniskill_lang", obs_mode="rgb")


def test_demos_store_rgb_instructions_and_the_vla_controller(pipeline):
    from rlinf_embodied.sft.dataset import RGBDemoDataset
    from rlinf_embodied.sft.vla_demos import find_suite_demos

    cfg, _ = pipeline
    found = find_suite_demos(cfg.demos.dir, cfg.env, stride=cfg.demos.stride)
    assert list(found) == ["PushCube-v1", "PullCube-v1"]
    meta = json.loads(found["PullCube-v1"].with_suffix(".json").read_text())
    assert meta["episodes"][0]["instruction"] == "pull the cube to the goal region"
    assert meta["rlinf"]["control_mode"] == "pd_ee_delta_pose" and meta["rlinf"]["sensor_size"] == 32
    data = RGBDemoDataset(list(found.values()))
    assert data.main_images.shape[1:] == (32, 32, 3) and data.actions.shape[1] == 7
    assert data.num_trajectories == 2 and len(data) > 40
    chunk = data.chunks(torch.tensor([len(data) - 1]), K)  # past the end: the last action repeated
    assert torch.equal(chunk[0, 0], chunk[0, -1])
    other = type(cfg.env)(**{**cfg.env.__dict__, "sensor_size": 64})
    with pytest.raises(ValueError, match="env.sensor_size=32 but the policy's env has env.sensor_size=64"):
        data.check_env(other)
    other = type(cfg.env)(**{**cfg.env.__dict__, "control_mode": "pd_joint_delta_pos"})
    with pytest.raises(ValueError, match="control_mode"):
        data.check_env(other)


def test_sft_checkpoint_has_the_published_layout_and_demo_statistics(pipeline):
    from rlinf_embodied.policies import load_policy

    cfg, out = pipeline
    vla = cfg.run_dir() / "sft" / "vla"
    stats = json.loads((vla / "dataset_statistics.json").read_text())
    key = "maniskill_lang3_pd_ee_delta_pose"
    assert set(stats[key]) >= {"action", "proprio", "num_transitions"}
    assert len(stats[key]["action"]["q01"]) == 7 and stats[key]["action"]["mask"][-1] is False
    assert list(vla.glob("proprio_projector--*_checkpoint.pt"))
    policy = load_policy(out["checkpoint"])
    assert policy.unnorm_key == key and policy.config.pretrained == str(vla.resolve())
    assert policy.config.image_preprocessing == "fast"
    # `eval --policy <run>/sft/policy` takes the SFT env's controller and image size from the
    # record beside it, as it does from a training run's config.yaml
    from rlinf_embodied.eval.request import run_env_config

    env, src = run_env_config(str(cfg.run_dir() / "sft" / "policy"))
    assert src.name == "sft_record.json"
    assert env["control_mode"] == "pd_ee_delta_pose" and env["sensor_size"] == 32
    # the record names the run's own files relative to it (a moved run's record stays right)
    record = json.loads(src.read_text())
    assert (record["policy"], record["pretrained"]) == ("policy", "vla")


def test_evaluation_reports_tasks_and_the_executed_chunk(pipeline):
    from rlinf_embodied.eval.results import ResultsFile

    cfg, out = pipeline
    ev = out["evaluation"]
    assert set(ev["per_task"]) == {"0", "1"} and ev["episodes"] == 2
    res = ResultsFile.load(ev["results"])
    assert res.header["protocol"]["name"] == "maniskill_lang3_v1"
    for e in res.episodes:
        assert e.action_chunk == K and e.open_loop_steps == K
        assert e.queries == -(-e.steps // K)
        # success_step: the steps at the end of the chunk in which success first held
        assert (e.success_step is None) if not e.success else (K <= e.success_step <= e.steps)
        assert e.instruction in ("push the cube to the goal region", "pull the cube to the goal region")


def test_bad_inputs_get_one_line(pipeline, tmp_path):
    from rlinf_embodied.sft.gate import GateError, check_gate
    from rlinf_embodied.sft.pipeline import load_sft_config, validate_rl_stage

    cfg, out = pipeline
    with pytest.raises(ConfigError, match="no ManiSkill motion-planning solution"):
        load_sft_config("configs/sft/maniskill_pushcube_sft_rl_mlp.yaml", ["env.env_id=PushT-v1"])
    token_sft = load_sft_config("configs/sft/maniskill_lang3_sft_rl_openvla.yaml",
                                ["rl.config=maniskill_lang3_grpo_openvla_oft_finetune"])
    with pytest.raises(ConfigError, match="policy.type is 'openvla' in the SFT config but 'openvla_oft'"):
        validate_rl_stage(token_sft)
    with pytest.raises(ConfigError, match="policy.action_chunk is 4 in the SFT config but 8"):
        validate_rl_stage(cfg, ["policy.action_chunk=8", "trainer.rollout_steps=6"])  # 48 steps
    with pytest.raises(GateError, match="holds a 'openvla_oft' policy but the RL run's policy.type is 'openvla'"):
        check_gate(cfg.run_dir() / "sft" / "vla", cfg.env, tmp_path, policy_type="openvla")


def test_gate_samples_as_the_rl_run_does(pipeline, tmp_path):
    """An RL run whose sampling setting (here the token temperature) differs from the SFT
    checkpoint's saved config: the gate's sampled evaluation draws at the RL run's value (a copy
    of the checkpoint with it), and with the checkpoint's own value it evaluates the checkpoint."""
    from rlinf_embodied.eval.results import ResultsFile
    from rlinf_embodied.sft.gate import sampled_success

    cfg, out = pipeline
    ckpt = out["checkpoint"]
    moved = sampled_success(ckpt, cfg.env, 1, tmp_path / "moved.json", protocol="maniskill_lang3_v1",
                            num_envs=2, num_processes=0, policy_overrides={"temperature": 0.5})
    assert moved["changed"] == {"temperature": 0.5} and moved["saved"] == {"temperature": 1.0}
    header = ResultsFile.load(moved["results"]).header
    assert header["execution"]["sample_temperature"] == 0.5
    assert header["policy"]["path"].endswith("moved_policy")  # the copy, not the checkpoint
    same = sampled_success(ckpt, cfg.env, 1, tmp_path / "same.json", protocol="maniskill_lang3_v1",
                           num_envs=2, num_processes=0, policy_overrides={"temperature": 1.0})
    assert same["changed"] == {} and not (tmp_path / "same_policy").exists()
    assert ResultsFile.load(same["results"]).header["execution"]["sample_temperature"] == 1.0
