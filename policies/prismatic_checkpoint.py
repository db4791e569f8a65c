"""Prismatic checkpoints in the published Hugging Face layout, image statistics, dataset statistics.

Checkpoints are read in the published layout (``config.json`` with the Prismatic / OpenVLA
fields, ``model.safetensors`` or ``model-0000x-of-0000y.safetensors`` plus
``model.safetensors.index.json``, ``dataset_statistics.json``, ``preprocessor_config.json``,
tokenizer files) with parameter names as published. Nothing inside a checkpoint is executed:
``configuration_prismatic.py`` / ``modeling_prismatic.py`` are ignored and weights are read with
safetensors (OFT's ``.pt`` heads are read by the OFT policy with
``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from rlinf_embodied.policies.preprocessing import ImagePreprocessor, read_preprocessor_stats
from rlinf_embodied.policies.prismatic_config import PrismaticArchConfig
from rlinf_embodied.policies.prismatic_model import PrismaticVLM

__all__ = [
    "backbone_stats",
    "identity_norm_stats",
    "image_preprocessor",
    "load_prismatic",
    "read_norm_stats",
    "save_prismatic",
]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
STATS_NAME = "dataset_statistics.json"
PREPROCESSOR_NAME = "preprocessor_config.json"


def backbone_stats(vlm: PrismaticVLM) -> tuple[list[list[float]], list[list[float]]]:
    """Per-backbone normalisation (means, stds) of the timm pretrained configs (DINOv2: ImageNet
    statistics, SigLIP: 0.5 / 0.5), in the order of the stacked pixel channels."""
    vits = [vlm.vision_backbone.featurizer]
    if vlm.vision_backbone.fused_featurizer is not None:
        vits.append(vlm.vision_backbone.fused_featurizer)
    means = [list(map(float, v.pretrained_cfg.get("mean", (0.5, 0.5, 0.5)))) for v in vits]
    stds = [list(map(float, v.pretrained_cfg.get("std", (0.5, 0.5, 0.5)))) for v in vits]
    return means, stds


def image_preprocessor(vlm: PrismaticVLM, center_crop: bool, mode: str,
                       pretrained: str | os.PathLike | None = None) -> ImagePreprocessor:
    """The :class:`~rlinf_embodied.policies.preprocessing.ImagePreprocessor` of a model.

    Means/stds come from ``pretrained``'s ``preprocessor_config.json`` when it has one (what
    the upstream processor uses), else from the backbones' timm configs.

    Raises:
        ValueError: unknown ``mode`` or a malformed preprocessor config.
    """
    stats = read_preprocessor_stats(pretrained) if pretrained else None
    if stats is not None and len(stats[0]) != vlm.vision_backbone.num_backbones:
        raise ValueError(
            f"{Path(pretrained) / PREPROCESSOR_NAME} has {len(stats[0])} mean/std sets but the "
            f"model has {vlm.vision_backbone.num_backbones} vision backbones; restore the published file."
        )
    if stats is None:
        means, stds = backbone_stats(vlm)
        source = "timm backbone configs"
    else:
        means, stds = stats
        source = PREPROCESSOR_NAME
    return ImagePreprocessor(vlm.arch.image_sizes[0], means, stds, center_crop, mode,
                             stats_source=source)


def read_norm_stats(path: str | os.PathLike, arch: PrismaticArchConfig) -> dict[str, Any]:
    """Dataset statistics: ``dataset_statistics.json`` if present, else ``norm_stats`` in config."""
    p = Path(path) / STATS_NAME
    if p.exists():
        return json.loads(p.read_text())
    return dict(arch.norm_stats or {})


def _read_arch(path: Path) -> PrismaticArchConfig:
    cfg = path / CONFIG_NAME
    if not cfg.exists():
        raise FileNotFoundError(
            f"No {CONFIG_NAME} in {path}; point policy.pretrained at a directory in the published "
            "OpenVLA layout (config.json + safetensors shards), e.g. an SFT run's sft/vla."
        )
    return PrismaticArchConfig.from_dict(json.loads(cfg.read_text()), source=str(cfg))


def _weight_files(path: Path) -> list[Path]:
    index = path / WEIGHTS_INDEX_NAME
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [s for s in shards if not (path / s).exists()]
        if missing:
            raise FileNotFoundError(f"{index} lists shards missing from {path}: {missing[:4]}")
        return [path / s for s in shards]
    single = path / WEIGHTS_NAME
    if single.exists():
        return [single]
    raise FileNotFoundError(f"No {WEIGHTS_INDEX_NAME} or {WEIGHTS_NAME} in {path}.")


_IGNORED_KEYS = re.compile(r"(rotary_emb\.inv_freq|rotary_emb\.original_inv_freq)$")


def _build_empty(arch: PrismaticArchConfig, device: torch.device, dtype: torch.dtype, attn: str) -> PrismaticVLM:
    """Construct without random init (meta tensors), then allocate on ``device``.

    Non-persistent buffers (Llama's rotary ``inv_freq``) are recomputed on the device.
    """
    with torch.device("meta"):
        vlm = PrismaticVLM(arch, attn)
    vlm = vlm.to_empty(device=device)
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    lm = vlm.language_model.model
    with torch.device(device):
        lm.rotary_emb = LlamaRotaryEmbedding(config=lm.config)
    return vlm.to(dtype)


def load_prismatic(
    path: str | os.PathLike,
    device: torch.device,
    dtype: torch.dtype,
    attn_implementation: str = "sdpa",
) -> tuple[PrismaticVLM, dict[str, Any]]:
    """Load a checkpoint directory in the published OpenVLA HF layout.

    Args:
        path: directory with ``config.json`` and safetensors weights.
        device: target device (weights are streamed shard by shard, never fully on CPU).
        dtype: parameter dtype.
        attn_implementation: ``sdpa`` or ``eager``.

    Returns:
        ``(model in eval mode, norm_stats)``.

    Raises:
        FileNotFoundError: config or shards missing.
        ValueError: parameter names or shapes that do not match the config (the message lists
            the first offenders and says which config field to check).
    """
    from safetensors import safe_open

    path = Path(path)
    arch = _read_arch(path)
    vlm = _build_empty(arch, device, dtype, attn_implementation)
    expected = dict(vlm.state_dict())
    expected = {k: v for k, v in expected.items() if not _IGNORED_KEYS.search(k)}
    seen, unexpected, bad_shape = set(), [], []
    with torch.no_grad():
        for f in _weight_files(path):
            with safe_open(str(f), framework="pt", device="cpu") as sf:
                for key in sf.keys():  # noqa: SIM118 (safe_open is not a dict)
                    if _IGNORED_KEYS.search(key):
                        continue
                    if key not in expected:
                        unexpected.append(key)
                        continue
                    t = sf.get_tensor(key)
                    if tuple(t.shape) != tuple(expected[key].shape):
                        bad_shape.append(f"{key}: file {tuple(t.shape)} vs model {tuple(expected[key].shape)}")
                        continue
                    expected[key].copy_(t.to(device=device, dtype=expected[key].dtype))
                    seen.add(key)
    missing = sorted(set(expected) - seen)
    if unexpected or bad_shape or missing:
        raise ValueError(
            f"Checkpoint {path} does not match its config.json: "
            f"{len(missing)} missing (e.g. {missing[:3]}), {len(unexpected)} unexpected "
            f"(e.g. {unexpected[:3]}), {len(bad_shape)} with other shapes (e.g. {bad_shape[:2]}). "
            "Check timm_model_ids/timm_model_kwargs/text_config in config.json, and that the "
            "weights are an OpenVLA (Prismatic) checkpoint, not a LoRA adapter."
        )
    return vlm.eval(), read_norm_stats(path, arch)


def save_prismatic(
    vlm: PrismaticVLM,
    path: str | os.PathLike,
    norm_stats: Mapping[str, Any] | None = None,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    max_shard_bytes: int = 4 << 30,
    dtype: torch.dtype | None = None,
) -> list[Path]:
    """Write ``config.json``, safetensors shards + index, ``dataset_statistics.json`` and (unless
    present) ``preprocessor_config.json`` with the backbones' means/stds.

    Shards are named ``model-0000x-of-0000y.safetensors`` with a
    ``model.safetensors.index.json`` (HF sharding layout), even for one shard.

    Args:
        vlm: the model (its ``arch`` is written as config.json).
        path: output directory (created).
        norm_stats: dataset statistics to write; None writes none.
        state_dict: tensors to write instead of ``vlm.state_dict()`` (e.g. LoRA-merged).
        max_shard_bytes: shard size limit.
        dtype: cast floating tensors to this dtype (None: keep).

    Returns:
        Paths of the written shards.
    """
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    sd = dict(state_dict if state_dict is not None else vlm.state_dict())
    sd = {k: v for k, v in sd.items() if not _IGNORED_KEYS.search(k)}
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for k in sorted(sd):
        t = sd[k].detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        t = t.contiguous().cpu()
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = t
        size += nbytes
    n = len(shards)
    weight_map, files = {}, []
    total = 0
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{n:05d}.safetensors"
        save_file(shard, str(path / name), metadata={"format": "pt"})
        os.chmod(path / name, 0o644)  # safetensors writes 0600; the other files are 0644
        files.append(path / name)
        for k, t in shard.items():
            weight_map[k] = name
            total += t.numel() * t.element_size()
    (path / WEIGHTS_INDEX_NAME).write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
    cfg = vlm.arch.to_dict()
    cfg.setdefault("architectures", ["OpenVLAForActionPrediction"])
    cfg.setdefault("model_type", "openvla")
    if norm_stats is not None:
        cfg["norm_stats"] = dict(norm_stats)
        (path / STATS_NAME).write_text(json.dumps(dict(norm_stats), indent=2))
    (path / CONFIG_NAME).write_text(json.dumps(cfg, indent=2))
    if not (path / PREPROCESSOR_NAME).exists():
        means, stds = backbone_stats(vlm)
        n = len(means)
        (path / PREPROCESSOR_NAME).write_text(json.dumps({
            "image_processor_type": "PrismaticImageProcessor",
            "image_resize_strategy": "resize-naive",
            "input_sizes": [[3, s, s] for s in vlm.arch.image_sizes[:n]],
            "interpolations": ["bicubic"] * n,
            "means": means, "stds": stds,
            "use_fused_vision_backbone": n == 2,
        }, indent=2))
    return files


def identity_norm_stats(action_dim: int, proprio_dim: int | None = None, key: str = "tiny") -> dict[str, Any]:
    """Statistics that make un-normalisation the identity on [-1, 1] (tiny instances)."""
    stats: dict[str, Any] = {
        "action": {"q01": [-1.0] * action_dim, "q99": [1.0] * action_dim,
                   "mask": [True] * (action_dim - 1) + [False]}
    }
    if proprio_dim:
        stats["proprio"] = {"q01": [-1.0] * proprio_dim, "q99": [1.0] * proprio_dim}
    return {key: stats}
