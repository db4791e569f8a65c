"""Tiny OpenVLA / OpenVLA-OFT instances behind the policy contract (policies/openvla*.py).

Tiny instances keep the real module structure and parameter names (DINOv2 + SigLIP timm ViTs,
fused projector, Llama LM); everything runs on CPU in float32.
"""

import json

import pytest
import torch
from rlinf_embodied.policies import build_policy, load_policy, save_policy
from rlinf_embodied.policies.base import SpaceSpec
from rlinf_embodied.policies.openvla import OpenVLAPolicy
from rlinf_embodied.policies.openvla_oft import OpenVLAOFTPolicy
from rlinf_embodied.policies.prismatic_checkpoint import (
    identity_norm_stats,
    load_prismatic,
    save_prismatic,
)
from rlinf_embodied.policies.prismatic_config import (
    PrismaticArchConfig,
    openvla_7b_arch_dict,
    tiny_arch_dict,
)
from rlinf_embodied.policies.prismatic_model import PrismaticVLM
from rlinf_embodied.policies.prismatic_training import fsdp_block_classes, fully_shard_per_block
from safetensors.torch import save_file

from rlinf_embodied.config import load_config
from rlinf_embodied.policies.configuration_openvla import OpenVLAOFTPolicyConfig, OpenVLAPolicyConfig

pytestmark = pytest.mark.timeout(120)

N, H = 2, 64
SPEC = SpaceSpec(action_low=[-1.0] * 7, action_high=[1.0] * 7, state_dim=8,
                 image_shape=(H, H, 3), wrist_image_shape=(H, H, 3))
TASKS = ["pick up the black bowl", "open the top drawer"]


def make_obs(seed=0, n=N):
    g = torch.Generator().manual_seed(seed)
    return {
        "main_images": torch.randint(0, 256, (n, H, H, 3), dtype=torch.uint8, generator=g),
        "wrist_images": torch.randint(0, 256, (n, H, H, 3), dtype=torch.uint8, generator=g),
        "states": torch.randn(n, 8, generator=g),
        "task_descriptions": TASKS[:n],
    }


def oft(**kw):
    torch.manual_seed(0)
    kw.setdefault("max_prompt_tokens", 80)
    return OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(**kw), SPEC).eval()


def ovla(**kw):
    torch.manual_seed(0)
    kw.setdefault("max_prompt_tokens", 80)
    return OpenVLAPolicy(OpenVLAPolicyConfig(**kw), SPEC).eval()


@pytest.fixture(scope="module")
def obs():
    return make_obs()


# ------------------------------------------------------------------ act / evaluate consistency
@pytest.mark.parametrize("granularity", ["token", "chunk"])
def test_openvla_evaluate_reproduces_rollout_logprobs(obs, granularity):
    p = ovla(critic=True, logprob_granularity=granularity, temperature=1.6)
    out = p.act(obs)
    assert out.actions.shape == (N, 1, 7) and out.actions.dtype == torch.float32
    assert out.logprobs.shape == ((N, 1, 7) if granularity == "token" else (N,))
    assert out.forward_inputs["action_samples"].shape == (N, 1, 7)
    ev = p.evaluate(out.forward_inputs)
    # KV-cached decoding vs one teacher-forced pass: equal up to float32 rounding.
    assert torch.allclose(ev.logprobs, out.logprobs, atol=1e-5, rtol=0)
    assert torch.allclose(ev.values, out.values, atol=1e-6)
    assert ev.entropy.shape == ev.logprobs.shape and bool((ev.entropy > 0).all())


@pytest.mark.parametrize("head", ["discrete", "continuous"])
@pytest.mark.parametrize("attention", ["full", "action_block"])
def test_oft_evaluate_reproduces_rollout_logprobs_exactly(obs, head, attention):
    p = oft(critic=True, action_head=head, attention=attention)
    out = p.act(obs)
    assert out.actions.shape == (N, 8, 7)
    assert out.logprobs.shape == (N, 8, 7) and out.values.shape == (N,)
    ev = p.evaluate(out.forward_inputs)
    assert torch.equal(ev.logprobs, out.logprobs)
    assert torch.equal(ev.values, out.values)
    assert ev.logprobs.requires_grad


def test_greedy_is_deterministic_and_sampling_varies(obs):
    for p in (ovla(), oft()):
        a, b = p.act(obs, "greedy"), p.act(obs, "greedy")
        assert torch.equal(a.actions, b.actions)
        assert torch.equal(a.forward_inputs["action_samples"], b.forward_inputs["action_samples"])
    p = oft(temperature=5.0)
    torch.manual_seed(1)
    s1 = p.act(obs).forward_inputs["action_samples"]
    s2 = p.act(obs).forward_inputs["action_samples"]
    assert not torch.equal(s1, s2)
    with pytest.raises(ValueError, match="mode"):
        p.act(obs, "beam")


def test_padding_does_not_change_outputs(obs):
    """Prompts are padded after <s>; rotary positions skip the padding."""
    a = oft(max_prompt_tokens=72)
    b = oft(max_prompt_tokens=100)
    b.load_state_dict(a.state_dict())
    ra = a._readout(a.encode_obs(obs, wrist=True, states=True))
    rb = b._readout(b.encode_obs(obs, wrist=True, states=True))
    assert torch.allclose(ra, rb, atol=1e-5)
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        oft(max_prompt_tokens=20).act(obs)


def test_unnormalisation_and_gripper_convention(obs):
    p = oft(gripper_to_signed=True, gripper_binarize=True, gripper_invert=True)
    q01 = torch.tensor([-0.9, -0.8, -0.7, -0.2, -0.3, -0.1, 0.0])
    q99 = torch.tensor([0.9, 0.8, 0.95, 0.2, 0.3, 0.4, 1.0])
    p.action_norm.q01, p.action_norm.q99 = q01, q99
    out = p.act(obs, "greedy")
    norm = p.tokenizer.decode_bins(out.forward_inputs["action_samples"])
    expected = 0.5 * (norm + 1) * (q99 - q01) + q01
    assert torch.allclose(out.actions[..., :6], expected[..., :6], atol=1e-6)
    assert set(out.actions[..., 6].unique().tolist()) <= {-1.0, 0.0, 1.0}


# ------------------------------------------------------------------ training hooks
def test_lora_trains_adapters_and_heads_only(obs):
    p = oft(critic=True, lora_rank=4, gradient_checkpointing=True).train()
    trainable = {n for n, q in p.named_parameters() if q.requires_grad}
    assert trainable and all(("lora_" in n) or n.startswith(("value_head.", "proprio_projector."))
                             for n in trainable)
    assert any(n.startswith("value_head.") for n in trainable)
    frozen = {n: q.detach().clone() for n, q in p.named_parameters() if not q.requires_grad}
    lora = {n: q.detach().clone() for n, q in p.named_parameters() if "lora_B" in n}
    out = p.act(obs)
    ev = p.evaluate(out.forward_inputs)
    loss = -ev.logprobs.mean() + (ev.values - 1.0).pow(2).mean()
    opt = torch.optim.AdamW([q for q in p.parameters() if q.requires_grad], lr=1e-2)
    loss.backward()
    opt.step()
    for n, q in p.named_parameters():
        if n in frozen:
            assert torch.equal(q, frozen[n]), n
    assert any(not torch.equal(q, lora[n]) for n, q in p.named_parameters() if n in lora)
    from timm.models.vision_transformer import Block
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    assert set(fsdp_block_classes()) == {LlamaDecoderLayer, Block}


# ------------------------------------------------------------------ checkpoints
def test_save_policy_load_policy_gives_identical_outputs(obs, tmp_path):
    p = oft(critic=True, lora_rank=4, action_head="continuous")
    with torch.no_grad():  # make the adapters non-trivial
        for n, q in p.named_parameters():
            if "lora_B" in n or "action_log_std" in n:
                q.add_(0.01)
    save_policy(p, tmp_path / "ckpt")
    q = load_policy(tmp_path / "ckpt", expected_type="openvla_oft").eval()
    a, b = p.act(obs, "greedy"), q.act(obs, "greedy")
    assert torch.equal(a.actions, b.actions) and torch.equal(a.values, b.values)
    cfg = OpenVLAOFTPolicyConfig(critic=True, lora_rank=4, action_head="continuous",
                                 max_prompt_tokens=80, checkpoint=str(tmp_path / "ckpt"))
    r = build_policy(cfg, SPEC).eval()
    assert torch.equal(r.act(obs, "greedy").actions, a.actions)


def test_save_pretrained_like_writes_published_layout_and_reloads(obs, tmp_path):
    p = oft(action_head="continuous", lora_rank=4)
    with torch.no_grad():
        for n, q in p.named_parameters():
            if "lora_B" in n:
                q.add_(0.01)
    d = p.save_pretrained_like(tmp_path / "oft", step=150000)
    names = sorted(x.name for x in d.iterdir())
    for f in ("config.json", "dataset_statistics.json", "model.safetensors.index.json",
              "model-00001-of-00001.safetensors", "tokenizer.json",
              "action_head--150000_checkpoint.pt", "proprio_projector--150000_checkpoint.pt"):
        assert f in names, names
    keys = set(json.loads((d / "model.safetensors.index.json").read_text())["weight_map"])
    for k in ("vision_backbone.featurizer.blocks.0.ls1.scale_factor",
              "vision_backbone.featurizer.reg_token",
              "vision_backbone.fused_featurizer.attn_pool.latent",
              "projector.fc1.weight", "projector.fc3.bias",
              "language_model.model.layers.1.self_attn.q_proj.weight",
              "language_model.model.embed_tokens.weight", "language_model.lm_head.weight"):
        assert k in keys, k
    assert not any("lora" in k or "base_layer" in k for k in keys)
    head = torch.load(d / "action_head--150000_checkpoint.pt", weights_only=True)
    assert "module.model.fc1.weight" in head and "module.model.mlp_resnet_blocks.1.ffn.1.weight" in head
    # LoRA merged into the base weights: a plain (adapter-free) policy loaded from it matches.
    # (fast preprocessing: "auto" would pick the upstream path for a pretrained directory)
    q = oft(action_head="continuous", pretrained=str(d), image_preprocessing="fast")
    q.action_log_std.data.copy_(p.action_log_std.data)
    assert torch.allclose(q.act(obs, "greedy").actions, p.act(obs, "greedy").actions, atol=1e-5)


def test_loader_reads_hand_written_sharded_checkpoint(tmp_path):
    """A checkpoint written with plain safetensors in HF's sharded layout, published names."""
    arch_d = dict(tiny_arch_dict(), norm_stats=identity_norm_stats(7))
    torch.manual_seed(3)
    ref = PrismaticVLM(PrismaticArchConfig.from_dict(arch_d))
    sd = {k: v.contiguous() for k, v in ref.state_dict().items() if "rotary_emb" not in k}
    keys = sorted(sd)
    halves = [keys[: len(keys) // 2], keys[len(keys) // 2 :]]
    weight_map = {}
    for i, part in enumerate(halves, 1):
        name = f"model-{i:05d}-of-00002.safetensors"
        save_file({k: sd[k] for k in part}, str(tmp_path / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in part})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_text(json.dumps(arch_d))
    vlm, stats = load_prismatic(tmp_path, torch.device("cpu"), torch.float32)
    assert set(stats) == {"tiny"}
    for k, v in vlm.state_dict().items():
        if "rotary_emb" not in k:
            assert torch.equal(v, sd[k]), k
    # A config that does not fit the weights names the fields to check.
    bad = dict(arch_d, text_config=dict(arch_d["text_config"], num_hidden_layers=3))
    (tmp_path / "config.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="does not match its config.json"):
        load_prismatic(tmp_path, torch.device("cpu"), torch.float32)
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_prismatic(tmp_path / "nowhere", torch.device("cpu"), torch.float32)
    save_prismatic(ref, tmp_path / "resaved", max_shard_bytes=200_000)
    assert len(list((tmp_path / "resaved").glob("model-*-of-*.safetensors"))) > 1


def test_registry_configs_and_input_errors():
    p = build_policy(OpenVLAPolicyConfig(max_prompt_tokens=80), SPEC)
    assert isinstance(p, OpenVLAPolicy)
    for name in ("libero_spatial_grpo_openvla_oft_tiny", "maniskill_ppo_openvla_tiny",
                 "libero_spatial_grpo_openvla_oft", "maniskill_ppo_openvla"):
        cfg = load_config(f"configs/{name}.yaml")
        assert cfg.policy.type in ("openvla", "openvla_oft")
    with pytest.raises(ValueError, match="proprio_dim"):
        OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(), SpaceSpec(action_low=[-1] * 7, action_high=[1] * 7,
                                                            state_dim=3, image_shape=(H, H, 3),
                                                            wrist_image_shape=(H, H, 3)))
    with pytest.raises(ValueError, match="valid keys"):
        OpenVLAPolicy(OpenVLAPolicyConfig(unnorm_key="bridge_orig"), SPEC)


def test_openvla_7b_architecture_builds_on_meta_device():
    """The real architecture (no weights): 7.54B parameters, published names and widths."""
    with torch.device("meta"):
        vlm = PrismaticVLM(PrismaticArchConfig.from_dict(openvla_7b_arch_dict()))
    n = sum(q.numel() for q in vlm.parameters())
    assert 7.50e9 < n < 7.60e9, n  # OpenVLA-7B model card: 7.54B
    assert vlm.vision_backbone.num_patches == 256 and vlm.vision_backbone.embed_dim == 1024 + 1152
    assert tuple(vlm.projector.fc1.weight.shape) == (4 * 2176, 2176)
    assert vlm.arch.base_vocab_size == 32000 and vlm.llm_dim == 4096
    names = set(vlm.state_dict())
    assert "vision_backbone.featurizer.blocks.23.ls2.scale_factor" in names
    assert "vision_backbone.fused_featurizer.blocks.26.mlp.fc2.weight" in names


def test_fsdp2_fully_shard_per_block_runs_act_and_backward(obs):
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29617", rank=0, world_size=1)
    try:
        p = oft(lora_rank=4, critic=True)
        fully_shard_per_block(p)
        out = p.act(obs)
        ev = p.evaluate(out.forward_inputs)
        assert torch.equal(ev.logprobs, out.logprobs)
        (-ev.logprobs.mean() + ev.values.pow(2).mean()).backward()
    finally:
        dist.destroy_process_group()
