"""A run directory holding VLA checkpoints can be moved or copied: ``save_policy`` stores a path
field of the policy config (``pretrained``, π0's ``tokenizer``) that lies inside the checkpoint's
run directory relative to the checkpoint (listed in ``paths.yaml``), and ``load_policy`` resolves
it against the directory it loads from; paths outside the run, and checkpoints written before
(no ``paths.yaml``), mean what they meant. ``train --resume`` of a moved pipeline's RL run starts
from the pipeline's own SFT checkpoint."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from rlinf_embodied.policies import build_policy, load_policy, save_policy
from rlinf_embodied.policies.base import SpaceSpec
from rlinf_embodied.policies.registry import (
    PATHS_FILE,
    PolicyCheckpointError,
    _relative_paths,
    _resolve_paths,
    run_root,
)

from rlinf_embodied.checkpoint import atomic_write_json, checkpoint_dir
from rlinf_embodied.policies.configuration_openvla import OpenVLAPolicyConfig, TinyArchConfig
from rlinf_embodied.policies.configuration_pi0 import Pi0PolicyConfig

pytestmark = pytest.mark.timeout(300)

N, H = 2, 32
SPEC = SpaceSpec(action_low=[-1.0] * 7, action_high=[1.0] * 7, state_dim=8, image_shape=(H, H, 3))
WORDS = ["In", "What", "action", "should", "the", "robot", "take", "to", "push", "cube", "goal",
         "region", "Out"]
TINY = TinyArchConfig(image_size=32, patch_size=8, vit_dims=[32, 32], vit_depth=2, vit_heads=2,
                      llm_hidden=64, llm_layers=2, llm_heads=4, words=WORDS)
FAMILIES = {
    "openvla": lambda **kw: OpenVLAPolicyConfig(tiny=TINY, max_prompt_tokens=24, center_crop=False,
                                                image_preprocessing="fast", **kw),
    "pi0": lambda **kw: Pi0PolicyConfig(action_horizon=4, action_chunk=2, num_steps=2,
                                        use_wrist_image=False, max_token_len=48, dtype="float32",
                                        **kw),
}


def make(family: str, **kw):
    torch.manual_seed(0)
    return build_policy(FAMILIES[family](**kw), SPEC).eval()


def make_obs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"main_images": torch.randint(0, 256, (N, H, H, 3), dtype=torch.uint8, generator=g),
            "states": torch.randn(N, 8, generator=g) * 0.1,
            "task_descriptions": ["push the cube to the goal region"] * N}


def sft_rl_run(family: str, run: Path):
    """A pipeline run directory as run_vla_sft and the RL stage leave it: ``sft/vla`` (published
    layout), ``sft/policy`` and ``rl/checkpoints/iter_000001/policy`` whose ``pretrained`` is the
    absolute ``sft/vla``. Returns the policy (its greedy actions are what a load must give)."""
    p = make(family)
    vla = p.save_pretrained_like(run / "sft" / "vla").resolve()
    p = build_policy(dataclasses.replace(p.config, pretrained=str(vla)), SPEC).eval()
    save_policy(p, run / "sft" / "policy")
    with checkpoint_dir(run / "rl", "iter_000001") as d:  # saved in a temporary sibling first
        save_policy(p, d / "policy")
        atomic_write_json(d / "runner_state.json", {"iteration": 1, "env_steps": 1})
    return p


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_moved_or_copied_run_loads_its_own_sft_files(family, tmp_path):
    a, b, c = (tmp_path / "runs" / n for n in "abc")
    p = sft_rl_run(family, a)
    greedy = p.act(make_obs(), "greedy").actions
    sft, rl = Path("sft/policy"), Path("rl/checkpoints/iter_000001/policy")
    saved = yaml.safe_load((a / rl / "policy.yaml").read_text())
    assert saved["pretrained"] == "../../../../sft/vla", saved["pretrained"]
    assert yaml.safe_load((a / sft / "policy.yaml").read_text())["pretrained"] == "../vla"
    assert yaml.safe_load((a / rl / PATHS_FILE).read_text()) == {"relative_to_checkpoint": ["pretrained"]}

    shutil.move(a, b)  # mv runs/a runs/b: runs/a/sft/vla is gone
    for ckpt in (b / sft, b / rl):
        q = load_policy(ckpt).eval()
        assert q.config.pretrained == str((b / "sft" / "vla").resolve())
        assert torch.allclose(q.act(make_obs(), "greedy").actions, greedy, atol=1e-5)

    shutil.copytree(b, c)  # cp -r runs/b runs/c: runs/c reads runs/c's files, not runs/b's
    shutil.rmtree(b)
    q = load_policy(c / rl).eval()
    assert q.config.pretrained == str((c / "sft" / "vla").resolve())
    assert torch.allclose(q.act(make_obs(), "greedy").actions, greedy, atol=1e-5)

    # a checkpoint taken out of its run: the relative path leads nowhere, and the error says so
    shutil.copytree(c / rl, tmp_path / "alone")
    with pytest.raises(PolicyCheckpointError, match="moved or copied without its run"):
        load_policy(tmp_path / "alone")


def test_paths_outside_the_run_stay_as_given_and_old_checkpoints_load_as_before(tmp_path, monkeypatch):
    p = make("openvla")
    greedy = p.act(make_obs(), "greedy").actions
    models = tmp_path / "models"
    vla = p.save_pretrained_like(models / "vla").resolve()
    # absolute, outside the run: stored as it is, and still found after the run moved
    run = tmp_path / "runs" / "a"
    p.config = dataclasses.replace(p.config, pretrained=str(vla))
    save_policy(p, run / "checkpoints" / "iter_000001" / "policy")
    ckpt = run / "checkpoints" / "iter_000001" / "policy"
    assert yaml.safe_load((ckpt / "policy.yaml").read_text())["pretrained"] == str(vla)
    assert not (ckpt / PATHS_FILE).exists()
    shutil.move(run, tmp_path / "runs" / "b")
    q = load_policy(tmp_path / "runs" / "b" / "checkpoints" / "iter_000001" / "policy").eval()
    assert q.config.pretrained == str(vla)
    assert torch.allclose(q.act(make_obs(), "greedy").actions, greedy, atol=1e-5)
    # a checkpoint written before paths.yaml existed, with a path relative to the working
    # directory (configs/*.yaml: pretrained: checkpoints/...): still the working directory's
    monkeypatch.chdir(tmp_path)
    p.config = dataclasses.replace(p.config, pretrained="models/vla")
    old = tmp_path / "runs" / "c" / "checkpoints" / "iter_000001" / "policy"
    save_policy(p, old)  # outside runs/c: written as given, no paths.yaml
    assert yaml.safe_load((old / "policy.yaml").read_text())["pretrained"] == "models/vla"
    assert not (old / PATHS_FILE).exists()
    assert load_policy(old).config.pretrained == "models/vla"
    # written over by a save whose paths are all outside: the stale paths.yaml goes
    (old / PATHS_FILE).write_text("relative_to_checkpoint: [pretrained]\n")
    save_policy(p, old)
    assert not (old / PATHS_FILE).exists()


def test_run_root_and_every_path_field(tmp_path):
    pipe = tmp_path / "pipe"
    (pipe / "sft").mkdir(parents=True)
    assert run_root(pipe / "sft" / "policy") == pipe.resolve()
    assert run_root(pipe / "rl" / "checkpoints" / ".iter_000001.x.tmp" / "policy") == pipe.resolve()
    assert run_root(tmp_path / "r" / "checkpoints" / "best" / "policy") == (tmp_path / "r").resolve()
    assert run_root(tmp_path / "r" / "rl" / "checkpoints" / "iter_000001" / "policy") == \
        (tmp_path / "r" / "rl").resolve()  # an "rl" run without sft/ beside it: itself
    assert run_root(tmp_path / "anywhere" / "policy") is None
    # π0's tokenizer too: inside the run relative, outside as given
    ckpt = pipe / "rl" / "checkpoints" / "iter_000002" / "policy"
    cfg = Pi0PolicyConfig(pretrained=str(pipe / "sft" / "vla"), tokenizer=str(pipe / "sft" / "tok"))
    rel, fields = _relative_paths(cfg, ckpt)
    assert fields == ["pretrained", "tokenizer"] and rel.tokenizer == "../../../../sft/tok"
    ckpt.mkdir(parents=True)
    (ckpt / PATHS_FILE).write_text(yaml.safe_dump({"relative_to_checkpoint": fields}))
    assert _resolve_paths(rel, ckpt).tokenizer == str((pipe / "sft" / "tok").resolve())
    cfg = dataclasses.replace(cfg, tokenizer="/opt/paligemma")
    rel, fields = _relative_paths(cfg, ckpt)
    assert fields == ["pretrained"] and rel.tokenizer == "/opt/paligemma"


def test_train_resume_of_a_moved_pipeline_rl_run_uses_its_own_sft_checkpoint(tmp_path):
    from rlinf_embodied.cli import _resume_config
    from rlinf_embodied.config import load_config, save_config

    old, new = tmp_path / "runs" / "a", tmp_path / "runs" / "b"
    root = Path(__file__).resolve().parents[2]
    cfg = load_config(str(root / "configs" / "gym_pointreach_ppo_mlp.yaml"),
                      [f"policy.checkpoint={(old / 'sft' / 'policy').resolve()}",
                       f"run.dir={old / 'rl'}", "trainer.iterations=5"])
    policy = build_policy(dataclasses.replace(cfg.policy, checkpoint=None),
                          SpaceSpec(action_low=(-1.0, -1.0), action_high=(1.0, 1.0), state_dim=4))
    save_policy(policy, old / "sft" / "policy")
    save_config(cfg, old / "rl")
    with checkpoint_dir(old / "rl", "iter_000001") as d:
        save_policy(policy, d / "policy")
        atomic_write_json(d / "runner_state.json", {"iteration": 1, "env_steps": 1})
    shutil.move(old, new)
    got, run_dir, ckpt = _resume_config(None, [], str(new / "rl"))
    assert got.policy.checkpoint == str((new / "sft" / "policy").resolve())
    assert got.run.dir == str((new / "rl").resolve())  # the config.yaml it rewrites says so
    assert run_dir == new / "rl" and ckpt.name == "iter_000001"
    # the run's own config file, given, is accepted (the same paths, rebased alike)
    (tmp_path / "job.yaml").write_text((new / "rl" / "config.yaml").read_text())
    assert _resume_config(str(tmp_path / "job.yaml"), [], str(new / "rl"))[2] is not None
    # the config.yaml the resumed run rewrites records the new place: moved again, it follows
    save_config(got, new / "rl")
    shutil.move(new, old)
    assert _resume_config(None, [], str(old / "rl"))[0].policy.checkpoint == \
        str((old / "sft" / "policy").resolve())
    # an RL run without the pipeline's sft/ beside it: its paths are left alone
    shutil.move(old / "rl", tmp_path / "rl")
    assert _resume_config(None, [], str(tmp_path / "rl"))[0].policy.checkpoint == \
        str((new / "sft" / "policy").resolve())
