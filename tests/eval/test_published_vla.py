"""Published OpenVLA-OFT / OpenVLA directories (written by hand in the upstream layout) evaluate
as upstream would: heads and proprio projector loaded, actions equal to an independent,
upstream-style computation (vla_reference.py), the execution recorded."""

import numpy as np
import pytest
import torch
import vla_reference as ref
from rlinf_embodied.eval.protocols import get_protocol
from rlinf_embodied.eval.policy_files import PolicySourceError
from rlinf_embodied.eval.sources import PolicyContext, resolve_policy

pytest.importorskip("transformers")
pytestmark = pytest.mark.timeout(300)

H, N, K, A, S = 128, 2, 8, 7, 8
TASKS = ["Pick up the black bowl", "open the top drawer of the cabinet"]
Q01 = [-0.9, -0.8, -0.7, -0.2, -0.3, -0.1, 0.0]
Q99 = [0.9, 0.8, 0.95, 0.2, 0.3, 0.4, 1.0]
STATS = {
    "bridge_orig": {"action": {"q01": [-1.0] * 7, "q99": [1.0] * 7}},
    "libero_spatial_no_noops": {
        "action": {"q01": Q01, "q99": Q99, "mask": [True] * 6 + [False]},
        "proprio": {"q01": [-0.5] * 4 + [-1.0] * 4, "q99": [0.5] * 4 + [1.0] * 4},
    },
}


def _ctx(shapes):
    return PolicyContext(np.full(A, -1.0), np.ones(A), False, N, "libero", "libero_spatial",
                         None, get_protocol("openvla_v1"), "cpu", shapes)


def _model(seed, action_logits_only=False):
    from rlinf_embodied.policies.prismatic_config import PrismaticArchConfig, tiny_arch_dict
    from rlinf_embodied.policies.prismatic_model import PrismaticVLM

    arch_d = tiny_arch_dict()
    torch.manual_seed(seed)
    vlm = PrismaticVLM(PrismaticArchConfig.from_dict(arch_d)).eval()
    if action_logits_only:
        # Zero the lm_head rows of every non-action id: upstream's argmax over the whole
        # vocabulary then equals the policy's argmax over the 256 action ids.
        with torch.no_grad():
            w = vlm.language_model.lm_head.weight
            base = vlm.arch.base_vocab_size
            w[: base - 256] = 0
            w[base:] = 0
    return vlm, arch_d


def _obs(seed=0):
    rng = np.random.default_rng(seed)
    return {"main_images": np.stack([ref.fixed_image(H, seed=i) for i in range(N)]),
            "wrist_images": np.stack([ref.fixed_image(H, seed=10 + i)[::-1] for i in range(N)]),
            "states": rng.uniform(-0.7, 0.7, (N, S)).astype(np.float32),
            "task_descriptions": TASKS}


def _pixels(images, vlm):
    s = vlm.arch.image_sizes[0]
    means, stds = [ref.BF16_DINO_MEAN, [0.5] * 3], [ref.BF16_DINO_STD, [0.5] * 3]
    return torch.from_numpy(np.stack([ref.ref_pixels(im, s, means, stds) for im in images]))


def test_published_oft_directory_loads_l1_head_and_proprio_and_matches_upstream(tmp_path):
    from rlinf_embodied.policies.prismatic_tokenizer import tiny_tokenizer

    vlm, arch_d = _model(11)
    d = vlm.llm_dim
    tok = tiny_tokenizer(vlm.arch.base_vocab_size)
    path = ref.write_published_dir(tmp_path / "oft", vlm, arch_d, tok, STATS, heads={
        "action_head": ref.random_l1_head(d, A), "proprio_projector": ref.random_proprio_projector(d, S)})
    shapes = {"states": (S,), "main_images": (H, H, 3), "wrist_images": (H, H, 3)}
    loaded = resolve_policy(str(path), _ctx(shapes))
    ex = loaded.execution
    assert loaded.kind == "openvla_oft"
    assert ex["head"] == "l1_regression" and ex["action_chunk"] == K and ex["open_loop_steps"] == K
    assert ex["use_proprio"] and ex["use_wrist_image"]
    assert ex["sample_temperature"] == 1.0  # what `--policy-mode sample` draws at (recorded)
    assert ex["unnorm_key"] == "libero_spatial_no_noops"  # "libero_spatial" absent: fallback
    assert ex["preprocessing"]["mode"] == "upstream"
    assert ex["preprocessing"]["mean_std_from"] == "preprocessor_config.json"
    obs = _obs()
    got = np.asarray(loaded.act(obs))
    assert got.shape == (N, K, A)

    head, proj = ref.load_head_file(path, "action_head"), ref.load_head_file(path, "proprio_projector")
    stats = STATS["libero_spatial_no_noops"]
    main, wrist = _pixels(obs["main_images"], vlm), _pixels(obs["wrist_images"], vlm)
    norm = []
    for i in range(N):
        px = torch.cat([main[i], wrist[i]])  # agentview then wrist, per backbone
        p = ref.ref_normalize_proprio(obs["states"][i].astype(np.float64), stats["proprio"])
        norm.append(ref.ref_oft_actions(vlm, tok, px, TASKS[i], proj, p, head, K, A).numpy())
    norm = np.stack(norm)
    # The L1 head's outputs leave [-1, 1] here; upstream un-normalises them unclipped.
    assert np.abs(norm[..., :6]).max() > 1.0
    want = ref.ref_unnormalize_and_gripper(norm.astype(np.float64), stats["action"])
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=0)


def test_published_openvla_directory_matches_upstream_greedy_decoding(tmp_path):
    from rlinf_embodied.policies.prismatic_tokenizer import tiny_tokenizer

    vlm, arch_d = _model(12, action_logits_only=True)
    tok = tiny_tokenizer(vlm.arch.base_vocab_size)
    stats = {"libero_spatial": STATS["libero_spatial_no_noops"], "bridge_orig": STATS["bridge_orig"]}
    path = ref.write_published_dir(tmp_path / "ovla", vlm, arch_d, tok, stats)
    loaded = resolve_policy(str(path), _ctx({"states": (S,), "main_images": (H, H, 3)}))
    ex = loaded.execution
    assert loaded.kind == "openvla" and ex["head"] == "autoregressive_tokens"
    assert ex["action_chunk"] == 1 and ex["unnorm_key"] == "libero_spatial"  # "{suite}" first
    obs = _obs(1)
    got = np.asarray(loaded.act(obs))
    assert got.shape == (N, 1, A)
    px = _pixels(obs["main_images"], vlm)
    norm = np.stack([ref.ref_openvla_actions(vlm, tok, px[i], TASKS[i], A, vlm.arch.base_vocab_size)
                     for i in range(N)])
    want = ref.ref_unnormalize_and_gripper(norm, stats["libero_spatial"]["action"])
    np.testing.assert_allclose(got[:, 0], want, atol=1e-5, rtol=0)


def test_oft_layout_inference_and_refusals(tmp_path):
    """No head file: the discrete-token model (one image, no proprio); a diffusion head is
    refused in one line; proprio without statistics raises instead of feeding raw states."""
    from rlinf_embodied.policies.prismatic_tokenizer import tiny_tokenizer

    vlm, arch_d = _model(13)
    d = vlm.llm_dim
    tok = tiny_tokenizer(vlm.arch.base_vocab_size)
    shapes = {"states": (S,), "main_images": (H, H, 3), "wrist_images": (H, H, 3)}
    # No head file (the SFT models RL systems start from): OpenVLA unless --policy-type says OFT.
    plain = ref.write_published_dir(tmp_path / "plain", vlm, arch_d, tok, STATS)
    assert resolve_policy(str(plain), _ctx(shapes)).kind == "openvla"
    ex = resolve_policy(str(plain), _ctx(shapes), expected_type="openvla_oft").execution
    assert ex["head"] == "parallel_tokens" and ex["action_chunk"] == K
    assert not ex["use_proprio"] and not ex["use_wrist_image"]
    # The GRPO recipe names such a checkpoint and runs it the same way (item 3).
    from rlinf_embodied.config import load_config

    recipe = load_config("configs/libero_spatial_grpo_openvla_oft.yaml").policy
    assert (recipe.action_head, recipe.use_wrist_image, recipe.use_proprio) == ("discrete", False, False)
    assert recipe.action_chunk == ex["action_chunk"] and recipe.image_preprocessing == "upstream"
    bad_stats = {"libero_spatial": {"action": STATS["libero_spatial_no_noops"]["action"]}}
    nostats = ref.write_published_dir(tmp_path / "nostats", vlm, arch_d, tok, bad_stats,
                                      heads={"proprio_projector": ref.random_proprio_projector(d, S)})
    with pytest.raises(PolicySourceError, match="no 'proprio' entry"):
        resolve_policy(str(nostats), _ctx(shapes))
    diff = ref.write_published_dir(tmp_path / "diffusion", vlm, arch_d, tok, STATS, heads={
        "action_head": ref.random_l1_head(d, A), "noisy_action_projector": {"w": torch.zeros(1)}})
    with pytest.raises(PolicySourceError, match="diffusion action head") as e:
        resolve_policy(str(diff), _ctx(shapes))
    assert "\n" not in str(e.value)
    proprio_only = ref.write_published_dir(tmp_path / "proprio", vlm, arch_d, tok, STATS,
                                           heads={"proprio_projector": ref.random_proprio_projector(d, S)})
    loaded = resolve_policy(str(proprio_only), _ctx(shapes))
    ex = loaded.execution
    assert ex["head"] == "parallel_tokens" and ex["use_proprio"] and not ex["use_wrist_image"]
    many = {"a": STATS["bridge_orig"], "b": STATS["bridge_orig"]}
    other = ref.write_published_dir(tmp_path / "other", vlm, arch_d, tok, many)
    with pytest.raises(PolicySourceError, match="none of"):
        resolve_policy(str(other), _ctx(shapes))
