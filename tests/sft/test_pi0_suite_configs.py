"""The π0 / π0.5 suite pipelines' configs load and their RL stage validates (nothing runs), and
an SFT checkpoint of another family is refused in one line (config check and step-0 gate)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlinf_embodied.config import ConfigError
from rlinf_embodied.sft.gate import GateError, check_family
from rlinf_embodied.sft.pipeline import VLA_TYPES, load_sft_config, validate_rl_stage

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("family", ["pi0", "pi05"])
def test_pipeline_config_loads_and_its_rl_stage_validates(family, tmp_path):
    cfg = load_sft_config(f"configs/sft/maniskill_lang3_sft_rl_{family}.yaml", [f"run.dir={tmp_path}"])
    assert cfg.policy.type == family in VLA_TYPES and cfg.env.suite == "maniskill_lang3"
    job = validate_rl_stage(cfg)
    assert job.policy.type == family
    assert Path(job.policy.pretrained) == (tmp_path / "sft" / "vla").resolve()
    assert job.policy.noise_method == "flow_sde" and job.algorithm.advantage == "grpo"
    assert job.env.num_envs % job.algorithm.group_size == 0 and job.env.suite == "maniskill_lang3"
    # the RL stage acts as the SFT checkpoint does: same horizon, chunk, denoising steps
    for name in ("action_horizon", "action_chunk", "num_steps", "max_token_len", "use_wrist_image"):
        assert getattr(job.policy, name) == getattr(cfg.policy, name), name
    with pytest.raises(ConfigError, match=r"policy\.action_horizon is 8 in the SFT config but 10"):
        validate_rl_stage(cfg, ["policy.action_horizon=10"])
    # a shrunk RL stage whose env count breaks the groups: the fix is named where it goes
    path = f"configs/sft/maniskill_lang3_sft_rl_{family}.yaml"
    with pytest.raises(ConfigError, match=r"env.num_envs=64: no pipeline stage reads it.*"
                                          r"set rl.overrides=\[env.num_envs=64\] for the RL stage"):
        load_sft_config(path, ["env.num_envs=64"])
    # however the override is written, and for every env field no stage reads
    with pytest.raises(ConfigError, match=r"^env.num_envs=4,env.seed=3: no pipeline stage reads them"):
        load_sft_config(path, ["env={num_envs: 4, seed: 3}"])
    with pytest.raises(ConfigError, match=r"env.video=true: .*rl.overrides=\[env.video=true\] for the RL stage\.$"):
        load_sft_config(path, ["env.video=true"])
    assert load_sft_config(path, ["env.max_episode_steps=60"]).env.max_episode_steps == 60  # read
    with pytest.raises(ConfigError, match=r"The RL stage \(rl.config maniskill_lang3_grpo_pi0\w*_finetune, with its own env.*multiple of algorithm.group_size=8 \(got 4\).*Set it in rl.overrides"):
        validate_rl_stage(cfg, ["env.num_envs=4", "algorithm.group_size=8"])


def test_rl_stage_of_another_family_is_refused(tmp_path):
    cfg = load_sft_config("configs/sft/maniskill_lang3_sft_rl_pi0.yaml", [
        f"run.dir={tmp_path}", "rl.config=maniskill_lang3_grpo_pi05_finetune"])
    with pytest.raises(ConfigError, match="of another family") as e:
        validate_rl_stage(cfg)
    # the fix names the family's own RL configs
    assert "set rl.config to an RL config of pi0 (maniskill_lang3_grpo_pi0_finetune" in str(e.value)
    # a VLA's RL config for the state MLP pipeline fails on the pipeline's env (state obs for a
    # camera suite) before the family check: the family is still what the error names
    mlp = load_sft_config("configs/sft/maniskill_pushcube_sft_rl_mlp.yaml", [
        f"run.dir={tmp_path}", "rl.config=maniskill_lang3_grpo_openvla_finetune"])
    with pytest.raises(ConfigError, match=r"^policy.type is 'mlp' in the SFT config but 'openvla' "
                       r"in the RL config maniskill_lang3_grpo_openvla_finetune.*an RL config of "
                       r"mlp \(maniskill_pushcube_grpo_mlp_finetune, maniskill_pushcube_ppo_mlp_finetune\)"):
        validate_rl_stage(mlp)


@pytest.mark.parametrize("have,want", [("pi0", "openvla_oft"), ("openvla", "pi05"), ("pi05", "pi0")])
def test_gate_refuses_an_sft_checkpoint_of_another_family_in_one_line(have, want):
    with pytest.raises(GateError) as e:
        check_family({"policy_type": have}, want, "runs/x/sft/vla")
    msg = str(e.value)
    assert "\n" not in msg and repr(have) in msg and repr(want) in msg
    check_family({"policy_type": want}, want, "runs/x/sft/vla")  # the same family passes


@pytest.mark.parametrize("name", ["oft", "openvla", "pi0", "pi05"])
def test_rl_stage_reward_and_time_limits_survive_rl_overrides(name, tmp_path):
    """``rl.reward_mode`` sets the RL run's reward (the demos and evaluations keep the
    pipeline env's), ``rl.overrides`` add to it instead of dropping it, and the env's time
    limits reach the RL stage."""
    from rlinf_embodied.sft.pipeline import rl_job_config

    path = f"configs/sft/maniskill_lang3_sft_rl_{name}.yaml"
    cfg = load_sft_config(path, [f"run.dir={tmp_path}", "rl.overrides=[trainer.iterations=2]",
                                 "env.startup_timeout_s=1200"])
    # every VLA family's RL stage takes SimpleVLA-RL's outcome reward (the OFT recipe's)
    assert cfg.env.reward_mode == "sparse" and cfg.rl.reward_mode == "sparse"
    assert rl_job_config(cfg).env.reward_mode == "sparse"
    cfg = load_sft_config(path, [f"run.dir={tmp_path}", "rl.overrides=[trainer.iterations=2]",
                                 "env.startup_timeout_s=1200", "rl.reward_mode=normalized_dense"])
    rl_reward = "normalized_dense"
    assert cfg.env.reward_mode == "sparse"  # the demos and evaluations keep the pipeline env's
    job = rl_job_config(cfg)
    assert job.env.reward_mode == rl_reward and job.trainer.iterations == 2
    assert job.env.startup_timeout_s == 1200
    # the MLP pipeline keeps its env's reward for RL (no rl.reward_mode)
    mlp = load_sft_config("configs/sft/maniskill_pushcube_sft_rl_mlp.yaml", [f"run.dir={tmp_path}"])
    assert mlp.rl.reward_mode is None and rl_job_config(mlp).env.reward_mode == mlp.env.reward_mode


def test_the_pipelines_sampling_fields_reach_the_rl_stage(tmp_path):
    """``policy.noise_method`` / ``noise_level`` (π0) and ``policy.temperature`` (OpenVLA) of
    the pipeline are what its RL rollouts sample with (they were silently the RL config's);
    ``rl.overrides`` still win."""
    from rlinf_embodied.sft.pipeline import rl_job_config

    pi0 = "configs/sft/maniskill_lang3_sft_rl_pi0.yaml"
    job = rl_job_config(load_sft_config(pi0, [f"run.dir={tmp_path}", "policy.noise_method=flow_noise",
                                              "policy.noise_level=0.7"]))
    assert (job.policy.noise_method, job.policy.noise_level) == ("flow_noise", 0.7)
    job = rl_job_config(load_sft_config(pi0, [f"run.dir={tmp_path}", "policy.noise_level=0.7",
                                              "rl.overrides=[policy.noise_level=0.3]"]))
    assert (job.policy.noise_method, job.policy.noise_level) == ("flow_sde", 0.3)
    tok = "configs/sft/maniskill_lang3_sft_rl_openvla.yaml"
    assert rl_job_config(load_sft_config(tok, [f"run.dir={tmp_path}", "policy.temperature=1.0"])
                         ).policy.temperature == 1.0


def test_the_rl_checkpoint_to_evaluate_is_latest_or_best():
    cfg = load_sft_config("configs/sft/maniskill_lang3_sft_rl_oft.yaml")
    assert cfg.eval.rl_checkpoint == "latest"
    assert load_sft_config("configs/sft/maniskill_lang3_sft_rl_oft.yaml",
                           ["eval.rl_checkpoint=best"]).eval.rl_checkpoint == "best"
    with pytest.raises(ConfigError, match="eval.rl_checkpoint must be latest or best"):
        load_sft_config("configs/sft/maniskill_lang3_sft_rl_oft.yaml", ["eval.rl_checkpoint=final"])


def test_rl_task_ids_select_the_rl_stage_tasks_and_keep_the_pipeline_evaluation(tmp_path):
    """``rl.task_ids`` trains RL on a subset of the suite (the pipeline's env, hence the SFT and
    final evaluations, keeps every task); tasks outside the pipeline's are refused in one line."""
    from rlinf_embodied.sft.pipeline import rl_job_config

    path = "configs/sft/maniskill_lang3_sft_rl_oft.yaml"
    cfg = load_sft_config(path, [f"run.dir={tmp_path}", "rl.task_ids=[0,1]"])
    assert rl_job_config(cfg).env.task_ids == [0, 1]
    assert cfg.env.task_ids is None and cfg.env.env_ids() == ["PushCube-v1", "PullCube-v1",
                                                              "StackCube-v1"]
    assert rl_job_config(load_sft_config(path, [f"run.dir={tmp_path}", "rl.task_ids=null"])
                         ).env.task_ids == [0, 1, 2]
    with pytest.raises(ConfigError, match=r"^rl.task_ids=\[1, 2\] must be a non-empty subset of "
                                          r"the pipeline's tasks \[0, 1\].*drop \[2\]"):
        load_sft_config(path, [f"run.dir={tmp_path}", "env.task_ids=[0,1]", "rl.task_ids=[1,2]"])
    with pytest.raises(ConfigError, match=r"rl.task_ids selects tasks of a suite"):
        load_sft_config("configs/sft/maniskill_pushcube_sft_rl_mlp.yaml",
                        [f"run.dir={tmp_path}", "rl.task_ids=[0]"])


@pytest.mark.parametrize("path", sorted(Path("configs/sft").glob("maniskill_lang3*_sft_rl_*.yaml")),
                         ids=lambda p: p.name)
def test_every_suite_pipeline_rolls_out_whole_episodes(path, tmp_path):
    """GRPO compares the returns of whole episodes: each RL rollout must cover the RL env's
    episode exactly (maniskill_lang3: 20 queries of K = 4 for 80 steps, the OFT recipe's 12 for
    its 48-step training episodes; maniskill_lang3_peg: 25 for 100), no longer than the suite's
    horizon, and the SFT and final evaluations use the suite's protocol and horizon."""
    from rlinf_embodied.sft.pipeline import rl_job_config

    cfg = load_sft_config(str(path), [f"run.dir={tmp_path}"])
    job = rl_job_config(cfg)
    horizon = cfg.env.suite_spec().max_episode_steps
    assert cfg.env.max_episode_steps == horizon
    assert job.trainer.rollout_steps * job.policy.action_chunk == job.env.max_episode_steps <= horizon
    assert job.env.ignore_terminations  # fixed-length episodes: every env is one whole episode
    assert cfg.eval.protocol == cfg.env.suite_spec().protocol


def test_a_gate_longer_than_the_sft_evaluation_is_refused(tmp_path):
    path = "configs/sft/maniskill_lang3_sft_rl_oft.yaml"
    with pytest.raises(ConfigError, match=r"^eval.gate_episodes=60 exceeds eval.episodes=50: .*"
                                          r"set eval.gate_episodes <= 50\.$"):
        load_sft_config(path, [f"run.dir={tmp_path}", "eval.gate_episodes=60"])
    assert load_sft_config(path, ["eval.gate_episodes=50"]).eval.gate_episodes == 50


def test_a_protocol_of_another_suite_or_bad_eval_counts_are_refused_at_load(tmp_path):
    """Caught when the config loads, not after SFT has trained (the SFT evaluation needs the
    protocol's horizon for the suite)."""
    path = "configs/sft/maniskill_lang3_peg_sft_rl_oft.yaml"
    with pytest.raises(ConfigError, match=r"^eval.protocol=maniskill_lang3_v1: Protocol "
                                          r"maniskill_lang3_v1 defines max steps for "
                                          r"maniskill_lang3, .*set eval.protocol="
                                          r"maniskill_lang3_peg_v1 \(the suite's\)\.$"):
        load_sft_config(path, ["eval.protocol=maniskill_lang3_v1"])
    with pytest.raises(ConfigError, match=r"^eval.protocol=maniskill_lang3_peg_v1: .*set "
                                          r"eval.protocol=maniskill_lang3_v1 \(the suite's\)"):
        load_sft_config(path, ["env.suite=maniskill_lang3"])
    with pytest.raises(ConfigError, match=r"^eval.protocol=openvla_v1: .*maniskill"):
        load_sft_config(path, ["eval.protocol=openvla_v1"])
    with pytest.raises(ConfigError, match=r"^eval.episodes and eval.gate_episodes must be >= 1 "
                                          r"\(got 0 and 10\)"):
        load_sft_config(path, ["eval.episodes=0"])
    with pytest.raises(ConfigError, match=r"^eval.gate_tolerance is a success-rate difference"):
        load_sft_config(path, ["eval.gate_tolerance=-0.5"])
    # the MLP pipeline's protocol (maniskill_fair_v1) uses each env's own time limit
    assert load_sft_config("configs/sft/maniskill_pushcube_sft_rl_mlp.yaml").eval.protocol == \
        "maniskill_fair_v1"


def test_an_rl_rollout_that_is_not_one_whole_episode_is_refused(tmp_path):
    """GRPO compares whole episodes' returns: a rollout shorter or longer than the RL env's
    fixed-length episode is refused when the pipeline config loads, naming the setting."""
    path = "configs/sft/maniskill_lang3_sft_rl_oft.yaml"
    # (rl.overrides on the command line add to the recipe's 48-step ones)
    cases = {'["trainer.rollout_steps=20"]': "set trainer.rollout_steps=12",
             '["env.max_episode_steps=80"]': "set trainer.rollout_steps=20",
             '["env.max_episode_steps=50"]': r"set env.max_episode_steps to a multiple of 4 "
                                             r"\(e.g. 52, with trainer.rollout_steps=13\)"}
    for overrides, fix in cases.items():
        with pytest.raises(ConfigError, match=r"^The RL stage .*GRPO compares the returns of whole "
                                              rf"episodes; {fix}\.$"):
            validate_rl_stage(load_sft_config(path, [f"run.dir={tmp_path}", f"rl.overrides={overrides}"]))
    job = validate_rl_stage(load_sft_config(path, [f"run.dir={tmp_path}", 'rl.overrides=["env.max_episode_steps=60","trainer.rollout_steps=15"]']))
    assert job.env.max_episode_steps == 60 and job.trainer.rollout_steps == 15


def test_policy_override_that_stops_at_the_sft_stage_is_noted(capsys, tmp_path):
    """A pipeline's policy.* override reaches the RL stage only for the sampling fields and
    those RL must share with SFT; one the RL stage takes from rl.config (train_expert_only,
    critic) is noted, naming the rl.overrides spelling that sets it there."""
    from rlinf_embodied.sft.pipeline import load_sft_config, rl_job_config

    path = "configs/sft/maniskill_lang3_sft_rl_pi0.yaml"
    cfg = load_sft_config(path, [f"run.dir={tmp_path}", "policy.train_expert_only=false",
                                 "policy.noise_level=0.3"])
    err = capsys.readouterr().err
    assert ("note: policy.train_expert_only=false applies to the SFT stage only; the RL stage "
            "keeps maniskill_lang3_grpo_pi0_finetune's policy.train_expert_only=true (pass "
            "'rl.overrides=[\"policy.train_expert_only=false\"]'") in err
    assert "noise_level" not in err  # a sampling field: it reaches the RL stage
    job = rl_job_config(cfg)
    assert job.policy.train_expert_only is True and job.policy.noise_level == 0.3
    load_sft_config(path, [f"run.dir={tmp_path}",
                           'rl.overrides=["policy.train_expert_only=false"]'])
    assert "applies to the SFT stage only" not in capsys.readouterr().err
