"""What SFT -> RL needs from the VLA policies (OpenVLA tokens, OFT discrete and continuous):
rollout log-probs that training reproduces, an update that follows the advantage's sign,
demonstration actions mapped onto the policy's own samples, dataset statistics that travel with
the published-layout checkpoint, and the tiny preset's sizes and word tokenizer."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from rlinf_embodied.policies import build_policy
from rlinf_embodied.policies.base import SpaceSpec
from rlinf_embodied.policies.prismatic_tokenizer import openvla_prompt, tiny_tokenizer

from rlinf_embodied.algorithms.update import logprob_mismatch
from rlinf_embodied.config import load_config
from tests.policies.grpo_step import one_group_update
from rlinf_embodied.policies.configuration_openvla import (
    OpenVLAOFTPolicyConfig,
    OpenVLAPolicyConfig,
    TinyArchConfig,
)

pytestmark = pytest.mark.timeout(300)

N, H = 8, 32
SPEC = SpaceSpec(action_low=[-1.0] * 7, action_high=[1.0] * 7, state_dim=8, image_shape=(H, H, 3))
WORDS = ["In", "What", "action", "should", "the", "robot", "take", "to", "push", "pull", "cube",
         "goal", "region", "Out"]
TINY = TinyArchConfig(image_size=32, patch_size=8, vit_dims=[32, 32], vit_depth=2, vit_heads=2,
                      llm_hidden=64, llm_layers=2, llm_heads=4, words=WORDS)
FAMILIES = {
    "openvla": lambda **kw: OpenVLAPolicyConfig(tiny=TINY, max_prompt_tokens=24,
                                                image_preprocessing="fast", center_crop=False, **kw),
    "oft_discrete": lambda **kw: OpenVLAOFTPolicyConfig(
        tiny=TINY, max_prompt_tokens=24, image_preprocessing="fast", center_crop=False,
        action_chunk=2, use_wrist_image=False, proprio_dim=8, **kw),
    "oft_continuous": lambda **kw: OpenVLAOFTPolicyConfig(
        tiny=TINY, max_prompt_tokens=24, image_preprocessing="fast", center_crop=False,
        action_chunk=2, use_wrist_image=False, proprio_dim=8, action_head="continuous", **kw),
}


def make(family: str, **kw):
    torch.manual_seed(0)
    return build_policy(FAMILIES[family](**kw), SPEC)


def make_obs(n=N, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"main_images": torch.randint(0, 256, (n, H, H, 3), dtype=torch.uint8, generator=g),
            "states": torch.randn(n, 8, generator=g) * 0.1,
            "task_descriptions": [("push", "pull")[i % 2] + " the cube to the goal region"
                                  for i in range(n)]}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_rollout_logprobs_equal_training_recomputation(family):
    """The rollout worker acts in eval mode, the actor recomputes in train mode: same numbers."""
    p = make(family, critic=True, value_head_hidden=32)
    p.eval()
    out = p.act(make_obs(), mode="sample")
    p.train()
    ev = p.evaluate(out.forward_inputs)
    valid = torch.ones(N, dtype=torch.bool)
    assert logprob_mismatch(ev.logprobs, out.logprobs, valid) < 1e-4
    assert torch.allclose(ev.values, out.values, atol=1e-5)
    # the check sees a disagreement: tokens scored at another temperature
    p.config = dataclasses.replace(p.config, temperature=2.0)
    if family != "oft_continuous":
        assert logprob_mismatch(p.evaluate(out.forward_inputs).logprobs, out.logprobs, valid) > 1e-2


@pytest.mark.parametrize("family", list(FAMILIES))
def test_one_update_follows_the_advantage_sign(family):
    """One GRPO/PPO update on a fixed batch: log-probs of actions with positive advantages rise,
    those with negative advantages fall (per action for token heads; on average for the
    continuous head, whose shared Gaussian mean moves towards the positive samples as a whole).
    All samples come from one observation, as a GRPO group's first step does."""
    p = make(family)
    obs = make_obs(n=1)
    obs = {k: (v * N if isinstance(v, list) else v.expand(N, *v.shape[1:]).clone()) for k, v in obs.items()}
    out = p.act(obs, mode="sample")
    cfg = load_config("configs/maniskill_lang3_grpo_openvla_oft_finetune.yaml", [
        "algorithm.group_size=8", "algorithm.filter_low=null", "algorithm.filter_high=null",
        "algorithm.target_kl=null", "trainer.update_epochs=1", "trainer.num_minibatches=1",
        "trainer.lr=1e-4"])
    # a small step for the Gaussian head, whose log-density is curved on the scale of its
    # std (0.14)
    up, down, metrics = one_group_update(p, out, cfg, lr=1e-4 if p.continuous_actions else 1e-3)
    assert metrics["train/rollout_logprob_diff_max"] < 1e-4
    assert metrics["train/nonzero_advantage_fraction"] == 1.0
    assert float(up.mean()) > 0 > float(down.mean()), (up, down)
    if not p.continuous_actions:
        assert bool((up > 0).all()) and bool((down < 0).all()), (up, down)


def test_equal_rewards_in_a_group_give_no_signal_and_the_console_says_so(tmp_path, capsys):
    """GRPO with every reward 0 (an SFT that solves nothing): all advantages are 0, the update
    leaves the action log-probs where they were, and the progress line says why."""
    from rlinf_embodied.metrics import MetricLogger

    p = make("oft_discrete")
    out = p.act(make_obs(), mode="sample")
    cfg = load_config("configs/maniskill_lang3_grpo_openvla_oft_finetune.yaml", [
        "algorithm.group_size=8", "algorithm.filter_low=null", "algorithm.filter_high=null",
        "algorithm.entropy_coef=0", "trainer.update_epochs=1", "trainer.num_minibatches=1"])
    up, down, metrics = one_group_update(p, out, cfg, lr=1e-3, rewards=torch.zeros(N))
    assert up.numel() == 0 and float(down.abs().max()) < 1e-6
    assert metrics["train/nonzero_advantage_fraction"] == 0.0
    logger = MetricLogger(tmp_path, tensorboard=False)
    logger._rich = None  # plain print, captured below
    logger.log(metrics, step=64, iteration=1)
    logger.close()
    assert "no update signal: every advantage is 0" in capsys.readouterr().out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_demo_actions_become_the_policys_samples_and_sft_fits_them(family, tmp_path):
    p = make(family)
    g = torch.Generator().manual_seed(1)
    actions = torch.rand(N, p.action_chunk, 7, generator=g) * 0.2 - 0.1
    actions[..., -1] = torch.where(torch.rand(N, p.action_chunk, generator=g) > 0.5, 1.0, -1.0)
    stats = {"demo": {"action": {"q01": [-0.1] * 6 + [-1.0], "q99": [0.1] * 6 + [1.0],
                                 "mask": [True] * 6 + [False]},
                      "proprio": {"q01": [-0.3] * 8, "q99": [0.3] * 8}}}
    p.set_dataset_statistics(stats, "demo")
    assert p.config.unnorm_key == "demo"
    fi = p.demo_forward_inputs(make_obs(), actions)
    samples = fi["action_samples"]
    decoded = samples if p.continuous_actions else p.tokenizer.decode_bins(samples)
    back = p.to_env(decoded)
    # half a bin in env units: the scaled dims span 0.2 of the bins' 2, the gripper all of it
    scale = torch.tensor([0.1] * 6 + [1.0])
    tol = 1e-5 if p.continuous_actions else 0.5 * p.tokenizer.bin_width * scale
    assert bool(((back - actions).abs() <= tol + 1e-6).all())
    opt = torch.optim.Adam(p.parameters(), lr=3e-3)
    p.train()
    first = None
    for _ in range(60):
        loss, _, _ = p.sft_loss(fi)
        first = float(loss) if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss) < 0.5 * first
    # statistics and heads travel with the published layout and are read back
    vla = p.save_pretrained_like(tmp_path / "vla")
    q = build_policy(dataclasses.replace(p.config, pretrained=str(vla)), SPEC)
    assert q.unnorm_key == "demo" and torch.equal(q.action_norm.q99, p.action_norm.q99)
    p.eval()
    q.eval()
    assert torch.allclose(q.act(make_obs(), mode="greedy").actions,
                          p.act(make_obs(), mode="greedy").actions, atol=1e-5)


def test_value_head_travels_with_the_published_layout(tmp_path):
    p = make("openvla", critic=True, value_head_hidden=32)
    with torch.no_grad():
        for w in p.value_head.parameters():
            w.add_(0.5)
    vla = p.save_pretrained_like(tmp_path / "vla")
    assert list(vla.glob("value_head--*_checkpoint.pt"))
    q = build_policy(dataclasses.replace(p.config, pretrained=str(vla)), SPEC)
    obs = make_obs()
    assert torch.allclose(q.predict_values(obs), p.eval().predict_values(obs), atol=1e-5)


def test_tiny_tokenizer_keeps_words_whole():
    words = tiny_tokenizer(768, WORDS)
    chars = tiny_tokenizer(768)
    prompt = openvla_prompt("push the cube to the goal region")
    ids = words(prompt, add_special_tokens=False)["input_ids"]
    assert len(ids) == 20 < len(chars(prompt, add_special_tokens=False)["input_ids"])
    assert words.decode(ids) == prompt
    assert "".join(words.convert_ids_to_tokens(words("a zebra", add_special_tokens=False)["input_ids"])) == "a zebra"


def test_tiny_arch_sizes_reach_the_model():
    p = make("openvla")
    vit = p.vlm.vision_backbone.featurizer
    assert vit.patch_embed.patch_size == (8, 8) and vit.embed_dim == 32
    assert p.vlm.vision_backbone.num_patches == 16 and p.vlm.llm_dim == 64
    from rlinf_embodied.config import ConfigError

    with pytest.raises(ConfigError, match="multiple of policy.tiny.patch_size"):
        TinyArchConfig(image_size=30, patch_size=8)
