"""Typed configuration: YAML + overrides, strict keys, type errors, variants by `type`."""

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
