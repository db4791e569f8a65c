"""π0 / π0.5 checkpoints in the published PyTorch layouts (policies/pi0_checkpoint.py).

Tiny instances are written here in LeRobot's and openpi's layouts (random tensors under every
published key, config.json, normalisation statistics, tokenizer files), loaded through
``policy.pretrained`` with no missing or unexpected keys, and their greedy chunk is compared
with a reference forward written independently below: plain tensor ops over the raw key ->
tensor dict, the full joint prefix + suffix sequence at every Euler step (no cache), big_vision
masks, RoPE, adaptive RMSNorm.
"""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from rlinf_embodied.policies import build_policy
from rlinf_embodied.policies.base import SpaceSpec
from rlinf_embodied.policies.pi0_arch import PiArch, preset_arch
from rlinf_embodied.policies.pi0_checkpoint import published_keys
from rlinf_embodied.policies.pi0_model import PiFlowModel
from rlinf_embodied.policies.prismatic_tokenizer import tiny_tokenizer
from safetensors.torch import save_file

from rlinf_embodied.policies.configuration_pi0 import Pi05PolicyConfig, Pi0PolicyConfig

pytestmark = pytest.mark.timeout(300)

N, S, A, H, K, STEPS = 2, 8, 7, 5, 3, 4
SPEC = SpaceSpec(action_low=[-50.0] * A, action_high=[50.0] * A, state_dim=S,
                 image_shape=(32, 32, 3), wrist_image_shape=(32, 32, 3))
TASKS = ["pick up the black bowl", "open_the top\ndrawer"]
LAYOUTS = [(k, layout) for k in ("pi0", "pi05") for layout in ("lerobot", "openpi")]


# ---------------------------------------------------------------------------------- writing
def shape_of(key: str, arch: PiArch) -> tuple:
    v, vl, ex = arch.vision, arch.vlm, arch.expert
    last = key.rsplit(".", 2)[-2:]
    if ".vision_model." in key:
        if "patch_embedding" in key:
            return (v.width, 3, v.patch_size, v.patch_size) if last[1] == "weight" else (v.width,)
        if "position_embedding" in key:
            return (v.num_patches, v.width)
        if last[0] == "fc1":
            return (v.mlp_dim, v.width) if last[1] == "weight" else (v.mlp_dim,)
        if last[0] == "fc2":
            return (v.width, v.mlp_dim) if last[1] == "weight" else (v.width,)
        return (v.width, v.width) if last[1] == "weight" and "proj" in last[0] else (v.width,)
    if "multi_modal_projector" in key:
        return (vl.width, v.width) if last[1] == "weight" else (vl.width,)
    if key.endswith("lm_head.weight"):
        return (arch.vocab_size, vl.width if ".paligemma." in key else ex.width)
    if ".layers." in key or key.endswith("norm.weight") or ".norm.dense." in key:
        g = vl if ".paligemma." in key else ex
        table = {"q_proj": (g.num_heads * g.head_dim, g.width), "k_proj": (g.num_kv_heads * g.head_dim, g.width),
                 "v_proj": (g.num_kv_heads * g.head_dim, g.width), "o_proj": (g.width, g.num_heads * g.head_dim),
                 "gate_proj": (g.mlp_dim, g.width), "up_proj": (g.mlp_dim, g.width), "down_proj": (g.width, g.mlp_dim)}
        if last[0] in table:
            return table[last[0]]
        if last[0] == "dense":
            return (3 * g.width, g.width) if last[1] == "weight" else (3 * g.width,)
        return (g.width,)
    w, d = ex.width, arch.action_dim
    proj = {"action_in_proj": (w, d), "action_out_proj": (d, w), "state_proj": (w, arch.state_dim),
            "action_time_mlp_in": (w, 2 * w), "action_time_mlp_out": (w, w), "time_mlp_in": (w, w),
            "time_mlp_out": (w, w)}[last[0]]
    return proj if last[1] == "weight" else (proj[0],)


def stats_for(seed):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, dim in (("state", S), ("action", A)):
        mean = torch.randn(dim, generator=g) * 0.1
        std = torch.rand(dim, generator=g) + 0.5
        out[key] = {"mean": mean.tolist(), "std": std.tolist(), "q01": (mean - 2 * std).tolist(),
                    "q99": (mean + 2 * std).tolist()}
    return out


def write_tiny(path, kind, layout, seed=0):
    """A tiny instance in a published layout; returns (raw weights without prefix, stats)."""
    arch = preset_arch("tiny", kind == "pi05", action_dim=A, state_dim=S)
    g = torch.Generator().manual_seed(seed)
    raw = {k: torch.randn(shape_of(k, arch), generator=g) * 0.2 for k in published_keys(arch, "openpi")}
    for k in raw:
        if "position_embedding" in k or "embed" in k or k.endswith("lm_head.weight"):
            raw[k] = raw[k] * 2.5
    prefix = "model." if layout == "lerobot" else ""
    save_file({prefix + k: v for k, v in raw.items()}, str(path / "model.safetensors"))
    stats = stats_for(seed + 1)
    variants = {"paligemma_variant": "gemma_tiny", "action_expert_variant": "gemma_tiny_expert",
                "vision_variant": "siglip_tiny"}
    if layout == "openpi":
        cfg = {"action_dim": A, "action_horizon": H, "precision": "float32", **variants}
        (path / "assets" / "lab" / "sim").mkdir(parents=True)
        (path / "assets" / "lab" / "sim" / "norm_stats.json").write_text(json.dumps(
            {"norm_stats": {"state": stats["state"], "actions": stats["action"]}}))
    else:
        mode = "QUANTILES" if kind == "pi05" else "MEAN_STD"
        cfg = {"type": kind, "chunk_size": H, "n_action_steps": K, "max_state_dim": S, "max_action_dim": A,
               "num_inference_steps": STEPS, "image_resolution": [32, 32], "tokenizer_max_length": 120,
               "input_features": {"observation.images.base_0_rgb": {"type": "VISUAL", "shape": [3, 32, 32]},
                                  "observation.images.left_wrist_0_rgb": {"type": "VISUAL", "shape": [3, 32, 32]},
                                  "observation.state": {"type": "STATE", "shape": [S]}},
               "output_features": {"action": {"type": "ACTION", "shape": [A]}},
               "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": mode, "ACTION": mode}, **variants}
        flat = {f"{feat}.{n}": torch.tensor(v) for feat, key in (("observation.state", "state"), ("action", "action"))
                for n, v in stats[key].items()}
        save_file(flat, str(path / "policy_preprocessor_step_4_normalizer_processor.safetensors"))
        steps = [{"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
                 {"registry_name": "normalizer_processor",
                  "config": {"eps": 1e-8, "features": {}, "norm_map": {"VISUAL": "IDENTITY", "STATE": mode,
                                                                       "ACTION": mode}},
                  "state_file": "policy_preprocessor_step_4_normalizer_processor.safetensors"}]
        (path / "policy_preprocessor.json").write_text(json.dumps({"name": "policy_preprocessor", "steps": steps}))
    (path / "config.json").write_text(json.dumps(cfg))
    tiny_tokenizer(arch.vocab_size).save_pretrained(str(path))
    return arch, raw, stats


def load(path, kind, **kw):
    cls = Pi0PolicyConfig if kind == "pi0" else Pi05PolicyConfig
    cfg = cls(pretrained=str(path), action_horizon=H, action_chunk=K, num_steps=STEPS, max_token_len=120, **kw)
    return build_policy(cfg, SPEC).eval()


def make_obs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"main_images": torch.randint(0, 256, (N, 32, 32, 3), dtype=torch.uint8, generator=g),
            "wrist_images": torch.randint(0, 256, (N, 32, 32, 3), dtype=torch.uint8, generator=g),
            "states": torch.randn(N, S, generator=g) * 0.5, "task_descriptions": TASKS}


# ---------------------------------------------------------------------------------- reference
def rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w)


def rope(x, pos):
    hd = x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = pos[:, None, :, None].float() * inv
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def siglip(w, pre, img, arch):
    v = arch.vision
    x = F.conv2d(img, w[pre + "embeddings.patch_embedding.weight"], w[pre + "embeddings.patch_embedding.bias"],
                 stride=v.patch_size).flatten(2).transpose(1, 2)
    x = x + w[pre + "embeddings.position_embedding.weight"]
    hd = v.width // v.num_heads
    for i in range(v.depth):
        p = f"{pre}encoder.layers.{i}."
        lin = lambda t, n: F.linear(t, w[p + n + ".weight"], w[p + n + ".bias"])  # noqa: E731
        h = F.layer_norm(x, (v.width,), w[p + "layer_norm1.weight"], w[p + "layer_norm1.bias"], 1e-6)
        q, k, val = (lin(h, f"self_attn.{n}_proj").view(N, -1, v.num_heads, hd).transpose(1, 2) for n in "qkv")
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), -1) @ val
        x = x + lin(att.transpose(1, 2).reshape(N, -1, v.width), "self_attn.out_proj")
        h = F.layer_norm(x, (v.width,), w[p + "layer_norm2.weight"], w[p + "layer_norm2.bias"], 1e-6)
        x = x + lin(F.gelu(lin(h, "mlp.fc1"), approximate="tanh"), "mlp.fc2")
    x = F.layer_norm(x, (v.width,), w[pre + "post_layernorm.weight"], w[pre + "post_layernorm.bias"], 1e-6)
    m = "paligemma_with_expert.paligemma.model.multi_modal_projector.linear."
    return F.linear(x, w[m + "weight"], w[m + "bias"])


def sincos(t, dim):
    frac = torch.linspace(0, 1, dim // 2, dtype=torch.float64)
    period = 4e-3 * (4.0 / 4e-3) ** frac
    ang = t.double()[:, None] * 2 * math.pi / period
    return torch.cat([ang.sin(), ang.cos()], -1).float()


def reference_velocity(w, arch, prefix, pvalid, state, x, t):
    """One expert velocity from the full joint sequence (no key/value cache)."""
    pi05, ex = arch.pi05, arch.expert
    act = F.linear(x, w["action_in_proj.weight"], w["action_in_proj.bias"])
    temb = sincos(t, ex.width)
    cond = None
    if pi05:
        cond = F.silu(F.linear(F.silu(F.linear(temb, w["time_mlp_in.weight"], w["time_mlp_in.bias"])),
                               w["time_mlp_out.weight"], w["time_mlp_out.bias"]))
        suffix, ar = act, [1] + [0] * (H - 1)
    else:
        fused = torch.cat([act, temb[:, None].expand_as(act)], -1)
        hid = F.silu(F.linear(fused, w["action_time_mlp_in.weight"], w["action_time_mlp_in.bias"]))
        act = F.linear(hid, w["action_time_mlp_out.weight"], w["action_time_mlp_out.bias"])
        st = F.linear(state, w["state_proj.weight"], w["state_proj.bias"])[:, None]
        suffix, ar = torch.cat([st, act], 1), [1, 1] + [0] * (H - 1)
    lp, ls = prefix.shape[1], suffix.shape[1]
    pad = torch.cat([pvalid, torch.ones(N, ls, dtype=torch.bool)], 1)
    cs = torch.tensor([0] * lp + ar).cumsum(0)
    allowed = (cs[None, :] <= cs[:, None])[None] & pad[:, None, :] & pad[:, :, None]
    pos = pad.long().cumsum(1) - 1
    streams = [(prefix, "paligemma_with_expert.paligemma.model.language_model.", None),
               (suffix, "paligemma_with_expert.gemma_expert.model.", cond)]
    hd = arch.vlm.head_dim

    def norm(h, root, name, c):
        if c is None:
            return rms(h, w[root + name + ".weight"]), None
        sc, sh, gate = F.linear(c, w[root + name + ".dense.weight"], w[root + name + ".dense.bias"])[:, None].chunk(3, -1)
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + sc) + sh, gate

    hs = [prefix, suffix]
    for i in range(arch.vlm.depth):
        qs, ks, vs, gates = [], [], [], []
        for (h, (_, root, c)) in zip(hs, streams):
            p = f"{root}layers.{i}."
            n, gate = norm(h, p, "input_layernorm", c)
            gates.append(gate)
            qs.append(F.linear(n, w[p + "self_attn.q_proj.weight"]).view(N, -1, arch.vlm.num_heads, hd))
            ks.append(F.linear(n, w[p + "self_attn.k_proj.weight"]).view(N, -1, 1, hd))
            vs.append(F.linear(n, w[p + "self_attn.v_proj.weight"]).view(N, -1, 1, hd))
        q, k, v = (torch.cat(z, 1).transpose(1, 2) for z in (qs, ks, vs))
        q, k = rope(q, pos), rope(k, pos)
        sc = q @ k.transpose(-1, -2) / math.sqrt(hd) + torch.where(allowed[:, None], 0.0, -1e30)
        out = (torch.softmax(sc, -1) @ v).transpose(1, 2).reshape(N, lp + ls, -1)
        new = []
        for j, (h, (_, root, c)) in enumerate(zip(hs, streams)):
            p = f"{root}layers.{i}."
            o = F.linear(out[:, :lp] if j == 0 else out[:, lp:], w[p + "self_attn.o_proj.weight"])
            h = h + (o if gates[j] is None else o * gates[j])
            n, gate = norm(h, p, "post_attention_layernorm", c)
            mlp = F.linear(F.gelu(F.linear(n, w[p + "mlp.gate_proj.weight"]), approximate="tanh")
                           * F.linear(n, w[p + "mlp.up_proj.weight"]), w[p + "mlp.down_proj.weight"])
            new.append(h + (mlp if gate is None else mlp * gate))
        hs = new
    out, _ = norm(hs[1], streams[1][1], "norm", cond)
    return F.linear(out[:, -H:], w["action_out_proj.weight"], w["action_out_proj.bias"])


def reference_chunk(w, arch, fi, stats, kind, layout, noise):
    """Greedy chunk (N, K, A) in env units from the raw weights."""
    imgs = [fi[key].permute(0, 3, 1, 2).float() / 255 * 2 - 1 for key in ("main_images", "wrist_images")]
    pre = "paligemma_with_expert.paligemma.model.vision_tower.vision_model."
    emb = w["paligemma_with_expert.paligemma.lm_head.weight"][fi["input_ids"]] * math.sqrt(arch.vlm.width)
    prefix = torch.cat([siglip(w, pre, i, arch) for i in imgs] + [emb], 1)
    pvalid = torch.cat([torch.ones(N, 2 * arch.vision.num_patches, dtype=torch.bool), fi["text_valid"]], 1)
    eps = 1e-6 if layout == "openpi" else 1e-8
    st = stats["state"]
    state = (fi["states"] - torch.tensor(st["mean"])) / (torch.tensor(st["std"]) + eps)
    x, dt = noise.clone(), -1.0 / STEPS
    for j in range(STEPS):
        t = torch.full((N,), 1.0 + j * dt)
        x = x + dt * reference_velocity(w, arch, prefix, pvalid, state, x, t)
    a, q = x[:, :K, :A], stats["action"]
    if kind == "pi05":
        rng = torch.tensor(q["q99"]) - torch.tensor(q["q01"]) + (1e-6 if layout == "openpi" else 0.0)
        return (a + 1) / 2 * rng + torch.tensor(q["q01"])
    return a * (torch.tensor(q["std"]) + (1e-6 if layout == "openpi" else 0.0)) + torch.tensor(q["mean"])


# ---------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("kind,layout", LAYOUTS)
def test_tiny_published_checkpoint_loads_and_matches_reference_forward(tmp_path, kind, layout):
    arch, raw, stats = write_tiny(tmp_path, kind, layout)
    p = load(tmp_path, kind)  # strict: raises on any missing / unexpected key or shape
    sd = p.model.state_dict()
    assert torch.equal(sd["paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"],
                       raw["paligemma_with_expert.paligemma.lm_head.weight"])  # tied: the stored name
    assert p.layout == layout and (p.unnorm_key == "lab/sim") == (layout == "openpi")
    obs = make_obs()
    fi = p.encode_obs(obs)
    tok = p.prompts.tokenizer  # character-level: one token per character
    texts = ["".join(tok.convert_ids_to_tokens(ids[v][1:].tolist())) for ids, v in zip(fi["input_ids"], fi["text_valid"])]
    assert (fi["input_ids"][:, 0] == tok.bos_token_id).all()
    if kind == "pi0":
        assert texts == ["pick up the black bowl\n", "open the top drawer\n"]
    else:
        q = stats["state"]
        norm = (obs["states"].numpy() - np.array(q["q01"])) / (np.array(q["q99"]) - np.array(q["q01"])
                                                              + (1e-6 if layout == "openpi" else 0)) * 2 - 1
        bins = np.digitize(norm, np.linspace(-1, 1, 257)[:-1]) - 1
        assert texts == [f"Task: {t}, State: {' '.join(map(str, b))};\nAction: "
                         for t, b in zip(["pick up the black bowl", "open the top drawer"], bins)]
    noise = torch.randn((H, A), generator=torch.Generator().manual_seed(0)).expand(N, H, A)
    ref = reference_chunk(raw, arch, fi, stats, kind, layout, noise)
    got = p.act(obs, "greedy").actions
    assert got.shape == (N, K, A)
    assert torch.allclose(got, ref, atol=1e-5, rtol=0), (got - ref).abs().max()
    # Re-written in its own layout it acts identically; in the other one up to the layouts'
    # normalisation epsilons (1e-6 vs 1e-8).
    p.save_pretrained_like(tmp_path / "same", layout=layout)
    assert torch.equal(load(tmp_path / "same", kind).act(obs, "greedy").actions, got)
    other = "openpi" if layout == "lerobot" else "lerobot"
    p.save_pretrained_like(tmp_path / "other", layout=other)
    assert torch.allclose(load(tmp_path / "other", kind).act(obs, "greedy").actions, got, atol=1e-4)


@pytest.mark.parametrize("kind,layout", LAYOUTS)
def test_eval_recognises_published_pi0_directories(tmp_path, kind, layout):
    from rlinf_embodied.eval.policy_files import vla_type

    write_tiny(tmp_path, kind, layout)
    assert vla_type(tmp_path) == kind


def test_loader_rejects_missing_unexpected_and_wrong_type(tmp_path):
    arch, raw, _ = write_tiny(tmp_path, "pi0", "openpi")
    with pytest.raises(ValueError, match="policy.type=pi0"):
        load(tmp_path, "pi05")
    for drop, extra in (("state_proj.bias", None), (None, "time_mlp_in.weight")):
        bad = {k: v for k, v in raw.items() if k != drop}
        if extra:
            bad[extra] = torch.zeros(2, 2)
        save_file(bad, str(tmp_path / "model.safetensors"))
        with pytest.raises(ValueError, match="missing keys|π0.5"):
            load(tmp_path, "pi0")
    (tmp_path / "assets" / "other").mkdir()
    (tmp_path / "assets" / "other" / "norm_stats.json").write_text((tmp_path / "assets/lab/sim/norm_stats.json").read_text())
    save_file(raw, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="unnorm_key"):
        load(tmp_path, "pi0")
    assert load(tmp_path, "pi0", unnorm_key="other").unnorm_key == "other"
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="policy.tokenizer"):
        load(tmp_path, "pi0", unnorm_key="other")


@pytest.mark.parametrize("pi05,count", [(False, 777), (True, 812)])
def test_full_size_module_tree_is_the_published_key_list(pi05, count):
    """At the published sizes (built on the meta device) the model's keys are upstream's: 812
    tensors for π0.5 (the count of an openpi conversion) and 777 for π0, minus the two stored
    vocabulary heads (tied embedding, unused expert head) the loader maps."""
    arch = preset_arch("full", pi05)
    with torch.device("meta"):
        model = PiFlowModel(arch)
    keys = published_keys(arch)
    assert len(keys) == len(set(keys)) == count
    own = set(model.state_dict())
    assert own == set(keys) - {"paligemma_with_expert.paligemma.lm_head.weight",
                               "paligemma_with_expert.gemma_expert.lm_head.weight"} | {
        "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"}
    sd = model.state_dict()
    v = "paligemma_with_expert.paligemma.model.vision_tower.vision_model."
    e = "paligemma_with_expert.gemma_expert.model.layers.17."
    expect = {v + "embeddings.patch_embedding.weight": (1152, 3, 14, 14),
              v + "embeddings.position_embedding.weight": (256, 1152),
              v + "encoder.layers.26.mlp.fc1.weight": (4304, 1152),
              "paligemma_with_expert.paligemma.model.multi_modal_projector.linear.weight": (2048, 1152),
              "paligemma_with_expert.paligemma.model.language_model.layers.17.mlp.gate_proj.weight": (16384, 2048),
              "paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.k_proj.weight": (256, 2048),
              e + "self_attn.q_proj.weight": (2048, 1024), e + "self_attn.o_proj.weight": (1024, 2048),
              "action_in_proj.weight": (1024, 32), "action_out_proj.weight": (32, 1024)}
    if pi05:
        expect.update({e + "input_layernorm.dense.weight": (3072, 1024), "time_mlp_in.weight": (1024, 1024)})
    else:
        expect.update({"state_proj.weight": (1024, 32), "action_time_mlp_in.weight": (1024, 2048)})
    for k, shape in expect.items():
        assert tuple(sd[k].shape) == shape, k
    n = sum(t.numel() for t in model.parameters())
    assert 3.2e9 < n < 3.4e9, n  # PaliGemma 3B (+ 0.3B expert) as published
    assert [k for k in published_keys(arch, "lerobot")][:1] == ["model." + keys[0]]
