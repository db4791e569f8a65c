"""Typed configuration: YAML + overrides, strict keys, type errors, variants by `type`."""

import warnings
from pathlib import Path

import pytest

from rlinf_embodied.config import ConfigError, JobConfig, load_config, save_config, to_yaml
from rlinf_embodied.envs.configuration_gym import GymEnvConfig
from rlinf_embodied.envs.configuration_libero import LiberoEnvConfig
from rlinf_embodied.envs.configuration_maniskill import ManiSkillEnvConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def write(tmp_path, text):
    p = tmp_path / "job.yaml"
    p.write_text(text)
    return p


def test_defaults_are_dataclasses():
    cfg = load_config(None)
    assert isinstance(cfg, JobConfig)
    assert isinstance(cfg.env, ManiSkillEnvConfig)
    assert cfg.env.env_id == "PushCube-v1"


def test_yaml_and_overrides(tmp_path):
    p = write(tmp_path, "env:\n  type: maniskill\n  num_envs: 4\ntrainer:\n  lr: 0.001\n")
    cfg = load_config(p, ["env.num_envs=16", "algorithm.gamma=0.95", "run.name=abc"])
    assert cfg.env.num_envs == 16
    assert cfg.trainer.lr == pytest.approx(0.001)
    assert cfg.algorithm.gamma == pytest.approx(0.95)
    assert cfg.run.name == "abc"


def test_variant_selected_by_type(tmp_path):
    p = write(tmp_path, "env:\n  type: libero\n  suite: libero_goal\n  task_ids: [1, 2]\n")
    cfg = load_config(p)
    assert isinstance(cfg.env, LiberoEnvConfig)
    assert cfg.env.task_ids == [1, 2]
    cfg = load_config(None, ["env.type=gym", "env.env_id=Pendulum-v1"])
    assert isinstance(cfg.env, GymEnvConfig) and cfg.env.env_id == "Pendulum-v1"
    with pytest.raises(ConfigError, match="env.suite"):  # a libero key under a gym env
        load_config(p, ["env.type=gym"])


def test_unknown_key_names_key_and_suggestion(tmp_path):
    p = write(tmp_path, "env:\n  type: maniskill\n  num_env: 4\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert "env.num_env" in msg and "num_envs" in msg


def test_unknown_key_in_override():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["trainer.learning_rate=0.1"])
    assert "trainer.learning_rate" in str(e.value)


def test_unknown_top_level_key(tmp_path):
    p = write(tmp_path, "trainr:\n  lr: 0.1\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "trainr" in str(e.value) and "trainer" in str(e.value)


def test_wrong_type_names_key_type_value(tmp_path):
    p = write(tmp_path, "env:\n  num_envs: many\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert "env.num_envs" in msg and "int" in msg and "many" in msg


def test_missing_file_names_path(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as e:
        load_config(missing)
    assert str(missing) in str(e.value)


def test_unknown_variant_lists_valid(tmp_path):
    p = write(tmp_path, "env:\n  type: manskill\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "maniskill" in str(e.value) and "libero" in str(e.value)


def test_cross_field_check_message(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["env.num_envs=0"])
    assert "env.num_envs" in str(e.value) and "0" in str(e.value)


def test_bad_override_syntax():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["env.num_envs"])
    assert "key=value" in str(e.value)


def test_save_roundtrip(tmp_path):
    cfg = load_config(None, ["env.num_envs=3"])
    path = save_config(cfg, tmp_path / "run")
    again = load_config(path)
    assert again == cfg
    assert to_yaml(again) == path.read_text()


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load(path):
    from rlinf_embodied.reasoning.config import ReasoningJobConfig, load_job_config

    cfg = load_job_config(path)
    assert isinstance(cfg, ReasoningJobConfig if path.name.startswith("reasoning_") else JobConfig)


# --- every field does something; bad values are refused before anything starts -----------------
def _config_classes():
    import dataclasses

    from rlinf_embodied.config import components

    job = JobConfig()
    classes = [type(getattr(job, f.name)) for f in dataclasses.fields(JobConfig)
               if dataclasses.is_dataclass(getattr(job, f.name))]
    for section in components.SECTIONS:
        classes += [components.config_class(section, n) for n in components.type_names(section)]
    return classes


def _read_somewhere(name: str, source: str) -> bool:
    """``x.name`` or ``getattr(x, "name"`` outside the config modules."""
    import re

    return bool(re.search(rf"\.{name}\b", source)
                or re.search(rf"getattr\(\s*[\w.]+,\s*[\"']{name}[\"']", source))


def test_every_config_field_is_read():
    """A static search: each field of every config dataclass (job sections, every registered
    env and policy type) is read as ``.field`` (or ``getattr(.., "field")``) by the package
    outside the files that define and validate the configs. Common names (``type``, ``name``)
    pass trivially; this catches settings nothing reads (``eval.greedy`` before it was wired)."""
    import dataclasses

    root = Path(__file__).resolve().parents[1]
    files = [p for d in ("rlinf_embodied", "envs", "policies", "eval") for p in (root / d).rglob("*.py")
             if p.name != "config.py" and not p.name.startswith("configuration_")
             and root / "rlinf_embodied" / "config" not in p.parents]
    source = "\n".join(p.read_text() for p in files)
    assert not _read_somewhere("greedy_eval_never_read", source)  # the search can fail
    unread = sorted({f"{c.__name__}.{f.name}" for c in _config_classes()
                     for f in dataclasses.fields(c) if not _read_somewhere(f.name, source)})
    assert not unread, f"config fields nothing reads (wire or delete them): {unread}"


@pytest.mark.parametrize("override, message", [
    ("algorithm.gamma=1.5", "algorithm.gamma must be in [0, 1]"),
    ("algorithm.gae_lambda=-0.1", "algorithm.gae_lambda must be in [0, 1]"),
    ("trainer.rollout_steps=0", "trainer.rollout_steps"),
    ("trainer.lr=-1", "trainer.lr must be a positive number"),
    ("trainer.lr=.nan", "trainer.lr must be a positive number"),
    ("algorithm.value_coef=.nan", "algorithm.value_coef"),
    ("trainer.lr_schedule=step", "constant, linear or cosine"),
    ("trainer.save_every=-1", "trainer.save_every must be >= 0"),
    ("eval.num_episodes=0", "eval.num_episodes"),
    ("eval.seed_offset=5", "eval.seed_offset"),
    ("run.name=../../outside", "run.name must be one directory name"),
    ("run.name=a/b", "run.name must be one directory name"),
    ("cluster.num_cpu_devices=0", "cluster.num_cpu_devices"),
    ("env.step_timeout_s=0", "env.step_timeout_s"),
    ("env.max_step_failures=0", "env.max_step_failures must be >= 1"),
    ("env.control_mode='", "Cannot parse override \"env.control_mode='\""),
    ("policy.hidden_sizes={a: 1}", "expected a list of int, got {a: 1} (mapping)"),
    ("trainer.keep_checkpoints=-1", "trainer.keep_checkpoints must be >= 0, 0 = keep all"),
    ("env.success_hold_steps=1", "set env.success_hold_steps above 1 or the ramp to null"),
    ("env.success_hold_ramp=[90, 40]", "env.success_hold_ramp must be [a, b] with 1 <= a < b"),
    ("env.success_hold_ramp=[4]", "env.success_hold_ramp must be [a, b] with 1 <= a < b"),
    ("env.success_hold_ramp=[0, 4]", "env.success_hold_ramp must be [a, b] with 1 <= a < b"),
    ("env.success_hold_ramp=[4, 4]", "env.success_hold_ramp must be [a, b] with 1 <= a < b"),
])
def test_out_of_range_values_are_refused(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(CONFIGS / "maniskill_pushcube_ppo_mlp.yaml", [override])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_missing_config_names_the_closest_shipped_one_sft_pipelines_included(tmp_path, monkeypatch):
    cwd = Path.cwd()
    from rlinf_embodied.sft.pipeline import load_sft_config

    with pytest.raises(ConfigError) as e:
        load_sft_config("configs/sft/maniskill_lang3_sft_rl_oftx.yaml")
    msg = str(e.value)
    assert msg.endswith("Did you mean configs/sft/maniskill_lang3_sft_rl_oft.yaml?"), msg
    with pytest.raises(ConfigError) as e:
        load_config("maniskill_pushcube_ppo_mpl")
    assert str(e.value).endswith("Did you mean configs/maniskill_pushcube_ppo_mlp.yaml?")
    # from another directory, configs/... would not be there: the shipped config's name is
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        load_config("./configs/maniskill_pushcube_ppo_mlp.yaml")
    assert str(e.value).endswith("Did you mean maniskill_pushcube_ppo_mlp (the shipped "
                                 "configs/maniskill_pushcube_ppo_mlp.yaml; its name alone works "
                                 "from any directory)?"), str(e.value)
    monkeypatch.chdir(cwd)
    with pytest.raises(ConfigError) as e:  # nothing close: every shipped name, SFT ones too
        load_config("nothing_like_it")
    msg = str(e.value)
    assert "sft/maniskill_lang3_sft_rl_pi0" in msg and "gym_pointreach_ppo_mlp" in msg
    assert "a name alone works too" in msg and "placement/" not in msg and "\n" not in msg
    # an SFT pipeline by its name alone, without sft/ (no job config shares a pipeline's name)
    from rlinf_embodied.config.loading import shipped_config

    assert shipped_config("maniskill_lang3_sft_rl_oft") == shipped_config("sft/maniskill_lang3_sft_rl_oft.yaml")
    assert shipped_config("maniskill_lang3_sft_rl_oft").parent.name == "sft"
    assert shipped_config("maniskill_pushcube_ppo_mlp").parent.name == "configs"
    assert shipped_config("placement/maniskill_lang3_sft_rl_oft") is None


def test_sft_commands_refuse_an_rl_job_config_by_name():
    from rlinf_embodied.sft.pipeline import load_sft_config

    with pytest.raises(ConfigError) as e:
        load_sft_config(str(CONFIGS / "maniskill_pushcube_ppo_mlp.yaml"))
    assert "is an RL job config" in str(e.value) and "rlinf-embodied train" in str(e.value)


def test_a_list_override_split_by_the_shell_says_to_quote_it():
    with pytest.raises(ConfigError) as e:
        load_config(CONFIGS / "maniskill_pushcube_ppo_mlp.yaml", ["policy.hidden_sizes=[64,", "64]"])
    assert "split by the shell: quote the whole override" in str(e.value)


def test_unquoted_overrides_inside_a_list_say_to_quote_them():
    with pytest.raises(ConfigError) as e:
        load_config(CONFIGS / "maniskill_pushcube_ppo_mlp.yaml", ["run.tags=[env.task_ids=[2]]"])
    msg = str(e.value)
    assert "Overrides inside a list are strings: quote each one" in msg and "\n" not in msg
    with pytest.raises(ConfigError) as e:  # a plain unclosed list gets no such hint
        load_config(CONFIGS / "maniskill_pushcube_ppo_mlp.yaml", ["policy.hidden_sizes=[64, 64"])
    assert "close brackets" in str(e.value) and "inside a list" not in str(e.value)


def test_empty_yaml_is_not_a_job(tmp_path):
    p = write(tmp_path, "\n# only a comment\n")
    with pytest.raises(ConfigError, match="is empty"):
        load_config(p)


def test_invalid_yaml_file_gives_line_and_column(tmp_path):
    p = write(tmp_path, "env:\n  num_envs: [1, 2\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "not valid YAML" in str(e.value) and "line" in str(e.value) and "\n" not in str(e.value)


def test_run_dir_stays_under_output_dir():
    cfg = load_config(None, ["run.name=ok-name_1", "run.output_dir=somewhere"])
    assert cfg.run.run_dir() == Path("somewhere") / "ok-name_1"


def test_a_fraction_that_fixes_no_env_is_refused():
    # 2 envs per env worker (one rank, one stage): round(0.1 x 2) = 0 envs would be fixed-length
    ppo = CONFIGS / "maniskill_pushcube_ppo_mlp.yaml"
    with pytest.raises(ConfigError) as e:
        load_config(ppo, ["env.num_envs=2", "env.ignore_terminations_fraction=0.1"])
    msg = str(e.value)
    assert "round(0.1 x 2) = 0" in msg and "raise it above 0.25" in msg and "\n" not in msg
    assert "env.num_envs to at least 6" in msg  # round(0.1 x 6) = 1
    # two pipeline stages halve each env worker's batch: 16 / 2 = 8, round(0.05 x 8) = 0
    with pytest.raises(ConfigError, match=r"round\(0.05 x 8\) = 0"):
        load_config(ppo, ["env.num_envs=16", "trainer.pipeline_stages=2",
                          "env.ignore_terminations_fraction=0.05"])
    # Python rounds half to even, as the env's mask does: round(0.125 x 4) = round(0.5) = 0
    with pytest.raises(ConfigError, match="env.num_envs to at least 5"):
        load_config(ppo, ["env.num_envs=4", "env.ignore_terminations_fraction=0.125"])
    ok = load_config(ppo, ["env.num_envs=4", "env.ignore_terminations_fraction=0.2"])
    assert ok.env.ignore_terminations_fraction == 0.2  # round(0.8) = 1 env
    # with the placement's env ranks known: 2 ranks give each 2 envs, round(0.4) = 0
    with pytest.raises(ConfigError, match=r"= 4 / \(2 x 1\)\), so it does nothing"):
        ok.check_fixed_length_envs(env_ranks=2)


def test_a_job_with_a_fraction_gives_workers_valid_env_copies():
    import dataclasses

    job = load_config(CONFIGS / "maniskill_pushcube_ppo_mlp.yaml",
                      ["env.ignore_terminations_fraction=0.5"])
    # what the env worker's in-training evaluation builds (workers/env_worker.py) and one rank's
    # share of a small batch: both stay valid
    ev = dataclasses.replace(job.env, num_envs=2, ignore_terminations=True)
    assert ev.ignore_terminations and ev.num_envs == 2
    assert dataclasses.replace(job.env, num_envs=1).num_envs == 1
    with pytest.raises(ConfigError, match="drop env.ignore_terminations_fraction"):
        load_config(CONFIGS / "maniskill_pushcube_ppo_mlp.yaml",
                    ["env.ignore_terminations=true", "env.ignore_terminations_fraction=0.5",
                     "env.success_hold_steps=1", "env.success_hold_ramp=null"])


def test_critic_settings_a_critic_free_advantage_ignores_warn():
    import warnings

    from rlinf_embodied.config import ConfigWarning

    grpo = CONFIGS / "maniskill_pushcube_grpo_mlp_finetune.yaml"  # critic: true, advantage grpo
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        job = load_config(grpo)  # the shipped config loads the SFT critic without a warning
        assert job.policy.critic is True and job.trainer.critic_lr is None
        load_config(CONFIGS / "maniskill_pushcube_ppo_mlp.yaml", ["trainer.critic_lr=1e-4"])  # GAE
    with pytest.warns(ConfigWarning, match="algorithm.advantage=grpo does not use its values"):
        job = load_config(grpo, ["trainer.critic_lr=1e-4"])
    assert job.trainer.critic_lr == 1e-4  # still valid: the critic is fitted at that rate
    with pytest.warns(ConfigWarning, match="critic_warmup_iterations=2 freezes the policy"):
        load_config(grpo, ["trainer.critic_warmup_iterations=2",
                           "algorithm.advantage=reinforce_pp"])


def test_fraction_check_is_exact_once_the_env_ranks_are_known():
    from rlinf_embodied.runners.setup import check_divisibility

    cfg = load_config(CONFIGS / "maniskill_pushcube_ppo_mlp.yaml",
                      ["env.num_envs=4", "env.ignore_terminations_fraction=0.25"])
    check_divisibility(cfg, env_ranks=1)  # 4 envs on one env worker: the first one is fixed-length
    with pytest.raises(ConfigError, match="ignore_terminations_fraction"):
        check_divisibility(cfg, env_ranks=2)  # 2 envs per worker: round(0.5) = 0 envs


def test_fraction_check_uses_the_elastic_shard_size():
    main = CONFIGS / "maniskill_pushcube_ppo_mlp.yaml"
    base = ["env.num_envs=8", "elastic.enabled=true", "env.ignore_terminations_fraction=0.2"]
    with pytest.raises(ConfigError, match="elastic.shard_envs"):  # 2 envs a shard: round(0.4) = 0
        load_config(main, base + ["elastic.shard_envs=2"])
    assert load_config(main, base + ["elastic.shard_envs=4"]).env.num_fixed_length(4) == 1


def test_a_mapping_override_replaces_a_free_dict_and_merges_into_a_section(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("env:\n  type: gym\n  env_id: CartPole-v1\n  num_envs: 2\n  kwargs: {a: 1, b: 2}\n"
                   "  image_keys: {pixels: main_images}\n")
    assert load_config(job, ["env.kwargs={c: 3}"]).env.kwargs == {"c": 3}
    assert load_config(job, ["env.kwargs.c=3"]).env.kwargs == {"a": 1, "b": 2, "c": 3}
    assert load_config(job, ["env.image_keys={}"]).env.image_keys == {}
    cfg = load_config(job, ["env={num_envs: 4}"])  # a section: only num_envs changes
    assert (cfg.env.num_envs, cfg.env.env_id, cfg.env.kwargs) == (4, "CartPole-v1", {"a": 1, "b": 2})
    with pytest.raises(ConfigError, match="env.kwargs"):
        load_config(job, ["env.kwargs=5"])


def test_the_success_hold_ramps_from_1_to_the_hold_over_its_iterations():
    cfg = load_config(CONFIGS / "maniskill_pushcube_ppo_mlp.yaml",
                      ["env.success_hold_steps=15", "env.success_hold_ramp=[40, 90]"])
    # 0-based iterations in, the log's (iteration + 1) ramp: 1 up to iter 40, 15 from iter 90
    at = cfg.env.hold_steps_at
    assert [at(0), at(39), at(40), at(64), at(88), at(89), at(149)] == [1, 1, 1, 8, 15, 15, 15]
    assert all(at(i) <= at(i + 1) for i in range(150))
    step = load_config(CONFIGS / "maniskill_pushcube_ppo_mlp.yaml",
                       ["env.success_hold_steps=5", "env.success_hold_ramp=[10, 11]"]).env
    assert [step.hold_steps_at(9), step.hold_steps_at(10)] == [1, 5]
    plain = load_config(CONFIGS / "maniskill_pushcube_ppo_mlp.yaml",
                        ["env.success_hold_steps=5", "env.success_hold_ramp=null"]).env
    assert plain.hold_steps_at(0) == 5


def test_a_hold_ramp_past_the_last_iteration_warns():
    from rlinf_embodied.config import ConfigWarning

    main = CONFIGS / "maniskill_pushcube_ppo_mlp.yaml"  # ramp [41, 91], hold 15
    # iteration 60 of the log is hold_steps_at(59): 1 + round(14 * 19 / 50) = 6
    with pytest.warns(ConfigWarning, match=r"trainer.iterations=60\): the hold reaches only 6 of"):
        load_config(main, ["trainer.iterations=60"])
    with pytest.warns(ConfigWarning, match=r"starts after the run's last iteration "
                      r"\(trainer.iterations=2\): every episode ends at its first success"):
        load_config(main, ["trainer.iterations=2"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        assert load_config(main, ["trainer.iterations=91"]).env.hold_steps_at(90) == 15
        load_config(main, ["trainer.iterations=2", "env.success_hold_ramp=null",
                           "env.success_hold_steps=1"])  # the quiet form it names


def test_suite_task_ids_are_indices_named_once():
    base = ["env.type=maniskill", "env.suite=maniskill_lang3", "env.obs_mode=rgb"]
    assert load_config(None, [*base, "env.task_ids=[0,2]"]).env.suite_task_ids() == [0, 2]
    with pytest.raises(ConfigError, match=r"env.task_ids \[0, 0\] names a task twice .*e.g. \[0\]"):
        load_config(None, [*base, "env.task_ids=[0,0]"])
    with pytest.raises(ConfigError, match=r"env.task_ids \[3\] must be non-empty indices into suite maniskill_lang3"):
        load_config(None, [*base, "env.task_ids=[3]"])


def test_an_error_among_many_overrides_names_the_one_that_set_the_key():
    """An SFT pipeline's RL stage passes ~20 overrides: an error lists them only when few, else
    names the override that set the failing key (config.loading.MAX_LISTED_OVERRIDES)."""
    from rlinf_embodied.config import ConfigError
    from rlinf_embodied.config.loading import MAX_LISTED_OVERRIDES

    many = [f"trainer.iterations={i}" for i in range(1, MAX_LISTED_OVERRIDES + 1)]
    cfg_file = "configs/maniskill_pushcube_ppo_mlp.yaml"
    with pytest.raises(ConfigError) as few:
        load_config(cfg_file, ["trainer.bogus=1"])
    assert f"in {cfg_file} + overrides ['trainer.bogus=1']." in str(few.value)
    with pytest.raises(ConfigError) as unknown:
        load_config(cfg_file, [*many, "trainer.bogus=1"])
    msg = str(unknown.value)
    assert f"Unknown config key 'trainer.bogus' in {cfg_file} + {len(many) + 1} overrides, " \
           "'trainer.bogus=1' among them." in msg
    assert "trainer.iterations=1" not in msg
    with pytest.raises(ConfigError) as wrong:
        load_config(cfg_file, [*many, "trainer.lr=abc", "trainer.lr=fast"])
    assert f"Wrong type for config key 'trainer.lr' in {cfg_file} + {len(many) + 2} overrides, " \
           "'trainer.lr=fast' among them: expected float, got 'fast' (str)" in str(wrong.value)
