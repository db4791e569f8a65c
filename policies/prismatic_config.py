"""Architecture config of the Prismatic VLM (OpenVLA, OpenVLA-OFT) and the device/dtype choice.

:class:`PrismaticArchConfig` holds the architecture fields of a published OpenVLA ``config.json``
under their published names. :func:`openvla_7b_arch_dict` is openvla/openvla-7b's architecture;
:func:`tiny_arch_dict` keeps its module structure and parameter names and shrinks the sizes
through two extension keys that real checkpoints do not have: ``timm_model_kwargs`` (per
backbone, e.g. ``{"embed_dim": 32, "depth": 2, "num_heads": 2}``) and a full ``text_config``.
:func:`select_device_dtype` is the one place that decides device and dtype for VLA policies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "PrismaticArchConfig",
    "openvla_7b_arch_dict",
    "select_device_dtype",
    "tiny_arch_dict",
]


# Fused DINOv2 + SigLIP at 224 px and Llama-2 7B: the openvla/openvla-7b config (HF hub).
_DINOSIGLIP_224 = ["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"]


def select_device_dtype(
    device: str | torch.device | None = None, dtype: str = "auto"
) -> tuple[torch.device, torch.dtype]:
    """Device and parameter dtype of a VLA policy.

    Args:
        device: explicit torch device; None picks the first accelerator torch sees, else CPU.
        dtype: ``auto`` (bfloat16 on CUDA, float32 elsewhere: CPU bf16 matmuls are slow and the
            log-prob reproducibility tests need float32), ``float32``, ``bfloat16`` or
            ``float16``.

    Returns:
        ``(torch.device, torch.dtype)``.

    Raises:
        ValueError: for an unknown dtype name.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    names = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype == "auto":
        return device, (torch.bfloat16 if device.type == "cuda" else torch.float32)
    if dtype not in names:
        raise ValueError(f"policy.dtype must be auto, {', '.join(names)} (got {dtype!r}).")
    return device, names[dtype]


@dataclass(frozen=True)
class PrismaticArchConfig:
    """The architecture fields of a Prismatic/OpenVLA ``config.json`` (published key names).

    Attributes:
        timm_model_ids: timm model name per backbone (featurizer first).
        image_sizes: input resolution per backbone (square, pixels).
        timm_override_act_layers: activation override per backbone (None: timm's default).
        use_fused_vision_backbone: two backbones whose features are concatenated.
        text_config: ``LlamaConfig`` keyword arguments (the published config lists only a few;
            the rest are LlamaConfig defaults, which equal Llama-2 7B).
        pad_token_id: id of ``<PAD>`` (Llama-2 OpenVLA: 32000).
        pad_to_multiple_of: how far the embedding table was padded past the base vocabulary;
            the base vocabulary size is ``text_config.vocab_size - pad_to_multiple_of``.
        n_action_bins: action tokens per dimension (256).
        norm_stats: dataset statistics (may also come from ``dataset_statistics.json``).
        timm_model_kwargs: extension for tiny instances: extra ``timm.create_model`` kwargs per
            backbone (absent in published checkpoints).
        extra: every other key of the file, written back unchanged on save.
    """

    timm_model_ids: tuple[str, ...]
    image_sizes: tuple[int, ...]
    timm_override_act_layers: tuple[str | None, ...]
    use_fused_vision_backbone: bool
    text_config: dict[str, Any]
    pad_token_id: int = 32000
    pad_to_multiple_of: int = 64
    n_action_bins: int = 256
    norm_stats: dict[str, Any] | None = None
    timm_model_kwargs: tuple[dict[str, Any], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    _REQUIRED = ("timm_model_ids", "image_sizes", "use_fused_vision_backbone", "text_config")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "config") -> PrismaticArchConfig:
        """Parse a ``config.json`` dict.

        Raises:
            ValueError: a required field is missing or backbone lists disagree in length; the
                message names the file and the field.
        """
        missing = [k for k in cls._REQUIRED if k not in d]
        if missing:
            raise ValueError(
                f"{source} lacks {missing}: it is not a Prismatic/OpenVLA config (expected the "
                "fields of openvla/openvla-7b's config.json)."
            )
        ids = tuple(d["timm_model_ids"])
        n = 2 if d["use_fused_vision_backbone"] else 1
        sizes = tuple(int(s) for s in d["image_sizes"])
        acts = tuple(d.get("timm_override_act_layers") or [None] * len(ids))
        kw = tuple(dict(x) for x in (d.get("timm_model_kwargs") or [{}] * len(ids)))
        if not (len(ids) >= n and len(sizes) >= n and len(acts) >= n and len(kw) >= n):
            raise ValueError(
                f"{source}: use_fused_vision_backbone={d['use_fused_vision_backbone']} needs {n} "
                f"entries in timm_model_ids/image_sizes/timm_override_act_layers (got {ids}, "
                f"{sizes}, {acts})."
            )
        known = set(cls._REQUIRED) | {
            "timm_override_act_layers", "pad_token_id", "pad_to_multiple_of", "n_action_bins",
            "norm_stats", "timm_model_kwargs",
        }
        return cls(
            timm_model_ids=ids[:n],
            image_sizes=sizes[:n],
            timm_override_act_layers=acts[:n],
            use_fused_vision_backbone=bool(d["use_fused_vision_backbone"]),
            text_config=dict(d["text_config"]),
            pad_token_id=int(d.get("pad_token_id", 32000)),
            pad_to_multiple_of=int(d.get("pad_to_multiple_of", 64)),
            n_action_bins=int(d.get("n_action_bins", 256)),
            norm_stats=d.get("norm_stats"),
            timm_model_kwargs=kw[:n],
            extra={k: v for k, v in d.items() if k not in known},
        )

    def to_dict(self) -> dict[str, Any]:
        """The ``config.json`` dict (published keys plus the tiny-instance extension if used)."""
        d = dict(self.extra)
        d.update(
            timm_model_ids=list(self.timm_model_ids),
            image_sizes=list(self.image_sizes),
            timm_override_act_layers=list(self.timm_override_act_layers),
            use_fused_vision_backbone=self.use_fused_vision_backbone,
            text_config=dict(self.text_config),
            pad_token_id=self.pad_token_id,
            pad_to_multiple_of=self.pad_to_multiple_of,
            n_action_bins=self.n_action_bins,
        )
        if self.norm_stats is not None:
            d["norm_stats"] = self.norm_stats
        if any(self.timm_model_kwargs):
            d["timm_model_kwargs"] = [dict(x) for x in self.timm_model_kwargs]
        return d

    @property
    def llama_config(self):
        """``transformers.LlamaConfig`` of the language model."""
        from transformers import LlamaConfig

        tc = {k: v for k, v in self.text_config.items() if k not in ("model_type", "torch_dtype")}
        tc.setdefault("pad_token_id", self.pad_token_id)
        return LlamaConfig(**tc)

    @property
    def base_vocab_size(self) -> int:
        """V of the tokenizer (Llama-2: 32000); action tokens are its last ``n_action_bins`` ids."""
        return int(self.llama_config.vocab_size) - self.pad_to_multiple_of


def openvla_7b_arch_dict() -> dict[str, Any]:
    """The architecture part of openvla/openvla-7b's ``config.json`` (no weights, no stats)."""
    return {
        "model_type": "openvla",
        "vision_backbone_id": "dinosiglip-vit-so-224px",
        "llm_backbone_id": "llama2-7b-pure",
        "arch_specifier": "no-align+fused-gelu-mlp",
        "image_resize_strategy": "resize-naive",
        "timm_model_ids": list(_DINOSIGLIP_224),
        "image_sizes": [224, 224],
        "timm_override_act_layers": [None, None],
        "use_fused_vision_backbone": True,
        "text_config": {"model_type": "llama", "pad_token_id": 32000, "vocab_size": 32064},
        "pad_token_id": 32000,
        "pad_to_multiple_of": 64,
        "n_action_bins": 256,
        "llm_max_length": 2048,
    }


def tiny_arch_dict(
    image_size: int = 112,
    vit_dims: tuple[int, int] = (32, 48),
    vit_depth: int = 2,
    llm_hidden: int = 64,
    llm_layers: int = 2,
    base_vocab: int = 768,
    patch_size: int = 14,
    vit_heads: int = 2,
    llm_heads: int = 4,
    n_action_bins: int = 256,
) -> dict[str, Any]:
    """A tiny Prismatic config with the 7B model's module structure and parameter names.

    Same timm ids (DINOv2-reg4 + SigLIP), fused 3-layer projector and Llama LM, with small
    widths: ``image_size`` must be a multiple of ``patch_size`` (112 px at patch 14 gives 64
    patches per backbone; a patch size other than 14 goes into ``timm_model_kwargs``).
    The base vocabulary (512 text ids + 256 action ids by default) is padded by 64 like OpenVLA's.
    """
    if image_size % patch_size:
        raise ValueError(f"image_size must be a multiple of the patch size {patch_size} "
                         f"(got {image_size}).")
    patch = {} if patch_size == 14 else {"patch_size": patch_size}
    d = openvla_7b_arch_dict()
    d.update(
        llm_backbone_id="llama2-tiny",
        image_sizes=[image_size, image_size],
        timm_model_kwargs=[
            {"embed_dim": vit_dims[0], "depth": vit_depth, "num_heads": vit_heads, **patch},
            {"embed_dim": vit_dims[1], "depth": vit_depth, "num_heads": vit_heads, **patch},
        ],
        text_config={
            "model_type": "llama",
            "vocab_size": base_vocab + 64,
            "hidden_size": llm_hidden,
            "intermediate_size": 2 * llm_hidden,
            "num_hidden_layers": llm_layers,
            "num_attention_heads": llm_heads,
            "num_key_value_heads": llm_heads,
            "max_position_embeddings": 1024,
            "pad_token_id": base_vocab,
        },
        pad_token_id=base_vocab,
        n_action_bins=n_action_bins,
    )
    return d
