"""Independent, upstream-style reference computations for the VLA fidelity tests.

Written from the openvla / openvla-oft evaluation code paths (numpy + PIL, per sample, no
padding, no code shared with policies/): image preprocessing, the OFT parallel pass with the
L1 head and proprio projector read straight from the ``.pt`` files, OpenVLA greedy decoding,
un-normalisation with upstream's ``+ 1e-8`` and the LIBERO gripper mapping. Only the HF / timm
submodules of a model (vision backbone, projector, Llama) are used as black boxes.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image

BF16_DINO_MEAN = [0.484375, 0.455078125, 0.40625]
BF16_DINO_STD = [0.228515625, 0.2236328125, 0.224609375]


# ------------------------------------------------------------------ images
def fixed_image(size: int = 256, seed: int = 0) -> np.ndarray:
    """(size, size, 3) uint8 with gradients, hard-edged shapes and noise (edges stress resizing)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64) / size
    img = np.stack([200 * xx + 30, 150 * yy + 50, 120 * (xx * yy) + 60], axis=-1)
    img[size // 5 : size // 2, size // 4 : size // 2] = [250, 20, 20]
    r = (xx - 0.7) ** 2 + (yy - 0.65) ** 2
    img[r < 0.02] = [10, 200, 40]
    img[:, (np.arange(size) // 7) % 5 == 0] *= 0.3
    img += rng.normal(0, 6, img.shape)
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def ref_jpeg(img: np.ndarray) -> np.ndarray:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=95, subsampling="4:2:0")
    return np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))


def ref_lanczos(img: np.ndarray, size: int) -> np.ndarray:
    """PIL's float ("F" mode) Lanczos resize per channel, then round half to even, uint8."""
    chans = [np.asarray(Image.fromarray(img[..., c].astype(np.float32), mode="F")
                        .resize((size, size), Image.LANCZOS), np.float64) for c in range(3)]
    return np.clip(np.round(np.stack(chans, -1)), 0, 255).astype(np.uint8)


def ref_crop_and_resize(img: np.ndarray, area: float = 0.9) -> np.ndarray:
    """TF ``crop_and_resize`` (bilinear) of the central sqrt(area) box, written per output row."""
    x = img.astype(np.float32) * np.float32(1.0 / 255.0)
    h, w, _ = x.shape
    side = np.float32(np.sqrt(np.float32(area)))
    y1 = x1 = (np.float32(1) - side) / np.float32(2)
    y2 = x2 = y1 + side
    out = np.zeros_like(x)
    xs = x1 * (w - 1) + np.arange(w, dtype=np.float32) * ((x2 - x1) * (w - 1) / np.float32(w - 1))
    left, right = np.floor(xs).astype(int), np.ceil(xs).astype(int)
    xl = (xs - np.floor(xs))[:, None]
    for r in range(h):
        in_y = y1 * (h - 1) + np.float32(r) * ((y2 - y1) * (h - 1) / np.float32(h - 1))
        top, bot = int(np.floor(in_y)), int(np.ceil(in_y))
        yl = in_y - np.floor(in_y)
        t = x[top, left] + (x[top, right] - x[top, left]) * xl
        b = x[bot, left] + (x[bot, right] - x[bot, left]) * xl
        out[r] = t + (b - t) * yl
    out = np.clip(out, 0, 1)
    return np.floor(out * np.float32(255.5)).astype(np.uint8)


def ref_pixels(img: np.ndarray, size: int, means, stds, center_crop: bool = True) -> np.ndarray:
    """(3 * backbones, S, S) float32 pixel values of one (H, W, 3) uint8 image."""
    u8 = ref_lanczos(ref_jpeg(img), size)
    if center_crop:
        u8 = ref_crop_and_resize(u8)
    x = u8.astype(np.float32).transpose(2, 0, 1) / np.float32(255.0)
    return np.concatenate([(x - np.asarray(m, np.float32)[:, None, None])
                           / np.asarray(s, np.float32)[:, None, None] for m, s in zip(means, stds)])


# ------------------------------------------------------------------ published directories
def write_published_dir(path: Path, vlm, arch_d: dict, tokenizer, stats: dict,
                        heads: dict | None = None) -> Path:
    """Write a directory in the published layout by hand: config.json, two safetensors shards
    with an index, dataset_statistics.json, preprocessor_config.json (bf16 DINOv2 stats),
    tokenizer files and ``{name}--150000_checkpoint.pt`` head files (given as state dicts,
    saved with the DDP ``module.`` prefix)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    sd = {k: v.detach().contiguous() for k, v in vlm.state_dict().items() if "rotary_emb" not in k}
    keys = sorted(sd)
    weight_map = {}
    for i, part in enumerate([keys[: len(keys) // 2], keys[len(keys) // 2 :]], 1):
        name = f"model-{i:05d}-of-00002.safetensors"
        save_file({k: sd[k] for k in part}, str(path / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in part})
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (path / "config.json").write_text(json.dumps(dict(arch_d, norm_stats=stats)))
    (path / "dataset_statistics.json").write_text(json.dumps(stats))
    (path / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "PrismaticImageProcessor", "image_resize_strategy": "resize-naive",
        "means": [BF16_DINO_MEAN, [0.5, 0.5, 0.5]], "stds": [BF16_DINO_STD, [0.5, 0.5, 0.5]],
        "use_fused_vision_backbone": True}))
    tokenizer.save_pretrained(str(path))
    for name, head in (heads or {}).items():
        torch.save({f"module.{k}": v for k, v in head.items()}, path / f"{name}--150000_checkpoint.pt")
    return path


def random_l1_head(d: int, a: int, seed: int = 5, out_scale: float = 4.0) -> dict:
    """State dict of an L1-regression head (upstream names), fc2 scaled so outputs leave [-1, 1]."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, s=0.2):
        return torch.randn(*shape, generator=g) * s

    sd = {"model.layer_norm1.weight": 1 + r(a * d), "model.layer_norm1.bias": r(a * d),
          "model.fc1.weight": r(d, a * d), "model.fc1.bias": r(d),
          "model.layer_norm2.weight": 1 + r(d), "model.layer_norm2.bias": r(d),
          "model.fc2.weight": r(a, d, s=out_scale / d ** 0.5), "model.fc2.bias": r(a)}
    for b in range(2):
        sd.update({f"model.mlp_resnet_blocks.{b}.ffn.0.weight": 1 + r(d),
                   f"model.mlp_resnet_blocks.{b}.ffn.0.bias": r(d),
                   f"model.mlp_resnet_blocks.{b}.ffn.1.weight": r(d, d),
                   f"model.mlp_resnet_blocks.{b}.ffn.1.bias": r(d)})
    return sd


def random_proprio_projector(d: int, s: int, seed: int = 6) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"fc1.weight": torch.randn(d, s, generator=g) * 0.3, "fc1.bias": torch.randn(d, generator=g) * 0.1,
            "fc2.weight": torch.randn(d, d, generator=g) * 0.1, "fc2.bias": torch.randn(d, generator=g) * 0.1}


def load_head_file(path: Path, prefix: str) -> dict:
    (f,) = path.glob(f"{prefix}--*_checkpoint.pt")
    return {k[len("module."):]: v for k, v in torch.load(f, weights_only=True).items()}


# ------------------------------------------------------------------ upstream-style actions
def _ln(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def ref_l1_head(sd: dict, hidden: torch.Tensor, chunk: int) -> torch.Tensor:
    """(K*A, D) action hidden states -> (K, A): upstream MLPResNet from raw tensors."""
    x = hidden.reshape(chunk, -1)
    x = torch.relu(_ln(x, sd["model.layer_norm1.weight"], sd["model.layer_norm1.bias"])
                   @ sd["model.fc1.weight"].T + sd["model.fc1.bias"])
    for b in range(2):
        p = f"model.mlp_resnet_blocks.{b}.ffn."
        x = x + torch.relu(_ln(x, sd[p + "0.weight"], sd[p + "0.bias"]) @ sd[p + "1.weight"].T
                           + sd[p + "1.bias"])
    x = _ln(x, sd["model.layer_norm2.weight"], sd["model.layer_norm2.bias"])
    return x @ sd["model.fc2.weight"].T + sd["model.fc2.bias"]


def ref_normalize_proprio(state: np.ndarray, st: dict) -> np.ndarray:
    lo, hi = np.asarray(st["q01"]), np.asarray(st["q99"])
    mask = np.asarray(st.get("mask", np.ones_like(lo, bool)))
    return np.clip(np.where(mask, 2 * (state - lo) / (hi - lo + 1e-8) - 1, state), -1.0, 1.0)


def ref_unnormalize_and_gripper(norm: np.ndarray, st: dict) -> np.ndarray:
    """Upstream ``_unnormalize_actions`` then LIBERO ``normalize_gripper_action(binarize)`` and
    ``invert_gripper_action``."""
    lo, hi = np.asarray(st["q01"]), np.asarray(st["q99"])
    mask = np.asarray(st.get("mask", np.ones_like(lo, bool)))
    a = np.where(mask, 0.5 * (norm + 1) * (hi - lo + 1e-8) + lo, norm)
    a[..., -1] = np.sign(2 * a[..., -1] - 1) * -1.0
    return a


def prompt_ids(tok, instruction: str) -> list:
    ids = tok(f"In: What action should the robot take to {instruction.lower()}?\nOut:").input_ids
    space = tok.convert_tokens_to_ids("\u2581")
    return ids if ids[-1] == space else ids + [space]


def ref_oft_actions(vlm, tok, pixels: torch.Tensor, instruction: str, proprio_sd: dict | None,
                    proprio: np.ndarray | None, head_sd: dict, chunk: int, adim: int) -> torch.Tensor:
    """(K, A) normalised actions of one sample, as OFT's ``predict_action`` with the L1 head:
    [<s>, patches (one image after the other), proprio token, prompt + ▁, K*A zero
    embeddings, </s>], every token attending to every token, readout of K*A positions
    starting at the last prompt token."""
    with torch.no_grad():
        patches = vlm.projector(vlm.vision_backbone(pixels[None]))[0]
        extra = []
        if proprio_sd is not None:
            x = torch.as_tensor(proprio, dtype=torch.float32)
            h = torch.nn.functional.gelu(x @ proprio_sd["fc1.weight"].T + proprio_sd["fc1.bias"])
            extra = [(h @ proprio_sd["fc2.weight"].T + proprio_sd["fc2.bias"])[None]]
        ids = prompt_ids(tok, instruction)
        emb = vlm.language_model.get_input_embeddings()
        text = emb(torch.tensor(ids))
        d = text.shape[-1]
        stop = emb(torch.tensor([tok.eos_token_id]))
        seq = torch.cat([text[:1], patches, *extra, text[1:], torch.zeros(chunk * adim, d), stop])
        length = seq.shape[0]
        full = torch.zeros(1, 1, length, length)
        hidden = vlm.language_model.model(inputs_embeds=seq[None], attention_mask=full,
                                          position_ids=torch.arange(length)[None]).last_hidden_state[0]
        # Upstream: NUM_PATCHES (+1 proprio) + NUM_PROMPT_TOKENS (= len(ids) - 1, <s> and ▁
        # included in ids) -> the index of the last prompt token (<s> sits at 0).
        start = patches.shape[0] + len(extra) + len(ids) - 1
        return ref_l1_head(head_sd, hidden[start : start + chunk * adim], chunk)


def ref_openvla_actions(vlm, tok, pixels: torch.Tensor, instruction: str, adim: int,
                        base_vocab: int) -> np.ndarray:
    """(A,) normalised actions of one sample, as OpenVLA's ``predict_action``: causal greedy
    decoding of A tokens over the full vocabulary (no cache), then ``vocab - id - 1`` clipped to
    the 255 bin centres of ``linspace(-1, 1, 256)``."""
    with torch.no_grad():
        patches = vlm.projector(vlm.vision_backbone(pixels[None]))[0]
        ids = prompt_ids(tok, instruction)
        emb = vlm.language_model.get_input_embeddings()
        text = emb(torch.tensor(ids))
        seq = torch.cat([text[:1], patches, text[1:]])
        out = []
        for _ in range(adim):
            length = seq.shape[0]
            causal = torch.full((length, length), float("-inf")).triu(1)[None, None]
            h = vlm.language_model.model(inputs_embeds=seq[None], attention_mask=causal,
                                         position_ids=torch.arange(length)[None]).last_hidden_state
            tok_id = int(vlm.language_model.lm_head(h[0, -1]).argmax())
            out.append(tok_id)
            seq = torch.cat([seq, emb(torch.tensor([tok_id]))])
    bins = np.linspace(-1, 1, 256)
    centres = (bins[:-1] + bins[1:]) / 2
    return centres[np.clip(base_vocab - np.asarray(out) - 1, 0, len(centres) - 1)]
