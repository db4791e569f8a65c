"""The Prismatic VLM shared by OpenVLA and OpenVLA-OFT: model, inputs, checkpoints, training hooks.

Architecture (Prismatic VLMs, Karamcheti et al. 2024; OpenVLA, Kim et al. 2024, section 3.1):

* ``vision_backbone``: one or two timm ViTs (``featurizer`` = DINOv2 ViT-L/14 with 4 registers,
  ``fused_featurizer`` = SigLIP So400m/14 for the fused ``dinosiglip`` backbone). Features are the
  patch tokens of the *second-to-last* block, without the final norm and without prefix
  (class/register) tokens; the two backbones' features are concatenated along channels.
  timm's ``LayerScale.gamma`` is stored as ``scale_factor`` (the HF port renames it because
  ``transformers`` used to rewrite parameters named ``gamma``).
* ``projector``: ``fc1 -> GELU -> fc2`` (single backbone) or ``fc1 (D -> 4D) -> GELU -> fc2 ->
  GELU -> fc3`` (fused, "no-align+fused-gelu-mlp").
* ``language_model``: ``transformers.LlamaForCausalLM`` built from ``text_config``; projected
  patch embeddings are inserted right after ``<s>``.

Checkpoints are read in the published Hugging Face layout (``config.json`` with the Prismatic /
OpenVLA fields, ``model.safetensors`` or ``model-0000x-of-0000y.safetensors`` plus
``model.safetensors.index.json``, ``dataset_statistics.json``, tokenizer files) with parameter
names as published (``vision_backbone.featurizer.*``, ``projector.fc1``,
``language_model.model.layers.*``, ``language_model.lm_head``). Nothing inside a checkpoint is
executed: ``configuration_prismatic.py`` / ``modeling_prismatic.py`` are ignored and weights are
read with safetensors (and ``torch.load(weights_only=True)`` for OFT's ``.pt`` heads).

Tiny instances keep the module structure and parameter names and shrink the sizes through two
extension keys that real checkpoints do not have: ``timm_model_kwargs`` (per backbone, e.g.
``{"embed_dim": 32, "depth": 2, "num_heads": 2}``) and a full ``text_config``.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rlinf_embodied.policies.preprocessing import ImagePreprocessor, read_preprocessor_stats

__all__ = [
    "backbone_stats",
    "image_preprocessor",
    "PrismaticArchConfig",
    "PrismaticVLM",
    "PromptTokenizer",
    "apply_lora",
    "attention_bias",
    "causal_allowed",
    "enable_gradient_checkpointing",
    "fsdp_block_classes",
    "fully_shard_per_block",
    "load_prismatic",
    "openvla_7b_arch_dict",
    "openvla_prompt",
    "read_norm_stats",
    "save_prismatic",
    "select_device_dtype",
    "tiny_arch_dict",
    "tiny_tokenizer",
]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
STATS_NAME = "dataset_statistics.json"
PREPROCESSOR_NAME = "preprocessor_config.json"
SPACE_TOKEN = "\u2581"
"""SentencePiece's word-boundary piece. OpenVLA appends its id (29871 in Llama-2) after "Out:"
because training prompts had it there (``predict_action`` in the OpenVLA HF code)."""

# Fused DINOv2 + SigLIP at 224 px and Llama-2 7B: the openvla/openvla-7b config (HF hub).
_DINOSIGLIP_224 = ["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"]


# ----------------------------------------------------------------------------------------------
# Device and dtype: the one place that decides them for VLA policies.
# ----------------------------------------------------------------------------------------------
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


# ----------------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------------
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
) -> dict[str, Any]:
    """A tiny Prismatic config with the 7B model's module structure and parameter names.

    Same timm ids (DINOv2-reg4 + SigLIP, patch 14), fused 3-layer projector and Llama LM, with
    small widths: ``image_size`` must be a multiple of 14 (112 px gives 64 patches per backbone).
    The base vocabulary (512 text ids + 256 action ids by default) is padded by 64 like OpenVLA's.
    """
    if image_size % 14:
        raise ValueError(f"image_size must be a multiple of the patch size 14 (got {image_size}).")
    d = openvla_7b_arch_dict()
    d.update(
        llm_backbone_id="llama2-tiny",
        image_sizes=[image_size, image_size],
        timm_model_kwargs=[
            {"embed_dim": vit_dims[0], "depth": vit_depth, "num_heads": 2},
            {"embed_dim": vit_dims[1], "depth": vit_depth, "num_heads": 2},
        ],
        text_config={
            "model_type": "llama",
            "vocab_size": base_vocab + 64,
            "hidden_size": llm_hidden,
            "intermediate_size": 2 * llm_hidden,
            "num_hidden_layers": llm_layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "max_position_embeddings": 1024,
            "pad_token_id": base_vocab,
        },
        pad_token_id=base_vocab,
    )
    return d


# ----------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------
class HFLayerScale(nn.Module):
    """timm ``LayerScale`` with its parameter named ``scale_factor`` (HF OpenVLA naming)."""

    def __init__(self, gamma: torch.Tensor):
        super().__init__()
        self.scale_factor = nn.Parameter(gamma.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale_factor


def _create_featurizer(model_id: str, img_size: int, act: str | None, kwargs: Mapping) -> nn.Module:
    import timm
    from timm.layers import LayerScale

    extra = dict(kwargs)
    if act is not None:
        extra["act_layer"] = act
    vit = timm.create_model(model_id, pretrained=False, num_classes=0, img_size=img_size, **extra)
    for parent in list(vit.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, LayerScale):
                setattr(parent, name, HFLayerScale(child.gamma))
    return vit


class PrismaticVisionBackbone(nn.Module):
    """One or two timm ViTs returning second-to-last-block patch features.

    Args:
        arch: the checkpoint's architecture config.
    """

    def __init__(self, arch: PrismaticArchConfig):
        super().__init__()
        n = len(arch.timm_model_ids)
        self.featurizer = _create_featurizer(
            arch.timm_model_ids[0], arch.image_sizes[0], arch.timm_override_act_layers[0],
            arch.timm_model_kwargs[0] if arch.timm_model_kwargs else {},
        )
        self.embed_dim = self.featurizer.embed_dim
        if n == 2:
            self.fused_featurizer = _create_featurizer(
                arch.timm_model_ids[1], arch.image_sizes[1], arch.timm_override_act_layers[1],
                arch.timm_model_kwargs[1] if arch.timm_model_kwargs else {},
            )
            self.embed_dim += self.fused_featurizer.embed_dim
        else:
            self.fused_featurizer = None
        self.num_backbones = n

    @property
    def num_patches(self) -> int:
        """P, patch tokens per image."""
        return int(self.featurizer.patch_embed.num_patches)

    @staticmethod
    def _features(vit: nn.Module, x: torch.Tensor) -> torch.Tensor:
        (out,) = vit.forward_intermediates(
            x, indices=[len(vit.blocks) - 2], stop_early=True, output_fmt="NLC",
            intermediates_only=True,
        )
        return out

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Patch features of every image.

        Args:
            pixel_values: (B, I * 3 * num_backbones, S, S) float, I images per sample, each
                image's channels grouped per backbone (upstream OFT layout).

        Returns:
            (B, I * P, D_vision) features, images in input order.
        """
        per_image = 3 * self.num_backbones
        if pixel_values.shape[1] % per_image:
            raise ValueError(
                f"pixel_values has {pixel_values.shape[1]} channels, not a multiple of {per_image}."
            )
        feats = []
        for img in torch.split(pixel_values, per_image, dim=1):
            f = self._features(self.featurizer, img[:, :3])
            if self.fused_featurizer is not None:
                f = torch.cat([f, self._features(self.fused_featurizer, img[:, 3:6])], dim=2)
            feats.append(f)
        return torch.cat(feats, dim=1)


class PrismaticProjector(nn.Module):
    """Vision -> LM projector (Prismatic ``gelu-mlp`` / ``fused-gelu-mlp``)."""

    def __init__(self, fused: bool, vision_dim: int, llm_dim: int):
        super().__init__()
        self.fused = fused
        if fused:
            self.fc1 = nn.Linear(vision_dim, 4 * vision_dim)
            self.fc2 = nn.Linear(4 * vision_dim, llm_dim)
            self.fc3 = nn.Linear(llm_dim, llm_dim)
        else:
            self.fc1 = nn.Linear(vision_dim, llm_dim)
            self.fc2 = nn.Linear(llm_dim, llm_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, D_vision) -> (B, L, D_llm)."""
        x = self.fc2(F.gelu(self.fc1(x)))
        return self.fc3(F.gelu(x)) if self.fused else x


@functools.lru_cache(maxsize=1)
def _cache_kwarg() -> str:
    """Name of LlamaModel's cache argument: ``cache`` (transformers 5) or ``past_key_values``."""
    import inspect

    from transformers.models.llama.modeling_llama import LlamaModel

    return "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"


class PrismaticVLM(nn.Module):
    """Vision backbone + projector + Llama, with parameter names as in the HF OpenVLA checkpoints.

    Args:
        arch: architecture config (from ``config.json`` or :func:`tiny_arch_dict`).
        attn_implementation: ``sdpa`` (default) or ``eager``; both take our 4-D float masks.
    """

    def __init__(self, arch: PrismaticArchConfig, attn_implementation: str = "sdpa"):
        super().__init__()
        from transformers import LlamaForCausalLM

        self.arch = arch
        self.vision_backbone = PrismaticVisionBackbone(arch)
        llama_cfg = arch.llama_config
        llama_cfg._attn_implementation = attn_implementation
        self.projector = PrismaticProjector(
            arch.use_fused_vision_backbone, self.vision_backbone.embed_dim, llama_cfg.hidden_size
        )
        self.language_model = LlamaForCausalLM(llama_cfg)

    @property
    def llm_dim(self) -> int:
        """D, the LM hidden size (Llama-2 7B: 4096)."""
        return int(self.language_model.config.hidden_size)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, L) int64 -> (B, L, D) input embeddings."""
        return self.language_model.get_input_embeddings()(ids)

    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(B, I*3*nb, S, S) -> (B, I*P, D) projected patch embeddings."""
        dtype = self.projector.fc1.weight.dtype
        return self.projector(self.vision_backbone(pixel_values.to(dtype)))

    def decode(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any = None,
        use_cache: bool = False,
    ) -> tuple[torch.Tensor, Any]:
        """Run the Llama decoder (no LM head).

        Args:
            inputs_embeds: (B, Lq, D).
            attention_mask: (B, 1, Lq, Lk) additive float mask from :func:`attention_bias`
                (Lk includes cached positions).
            position_ids: (B, Lq) int64 rotary positions.
            past_key_values: a ``transformers`` cache or None.
            use_cache: return the updated cache.

        Returns:
            ``(hidden (B, Lq, D), cache or None)``.
        """
        out = self.language_model.model(
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=use_cache,
            **{_cache_kwarg(): past_key_values},
        )
        if not use_cache:
            return out.last_hidden_state, None
        return out.last_hidden_state, getattr(out, _cache_kwarg())

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., V_padded) logits (float32)."""
        return self.language_model.lm_head(hidden).float()


# ----------------------------------------------------------------------------------------------
# Attention masks
# ----------------------------------------------------------------------------------------------
def causal_allowed(key_valid: torch.Tensor, q_start: int = 0) -> torch.Tensor:
    """Boolean (B, Lq, Lk) "query may attend key" for causal attention over valid keys.

    Args:
        key_valid: (B, Lk) bool, False at padding.
        q_start: absolute position of the first query (queries are the last Lk - q_start keys).
    """
    lk = key_valid.shape[1]
    q = torch.arange(q_start, lk, device=key_valid.device)
    k = torch.arange(lk, device=key_valid.device)
    return (k[None, :] <= q[:, None])[None] & key_valid[:, None, :]


def attention_bias(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, Lq, Lk) bool -> (B, 1, Lq, Lk) additive mask: 0 where allowed, dtype-min elsewhere.

    A float mask (rather than bool) keeps fully masked rows finite with SDPA and works with the
    eager attention too; ``transformers`` passes 4-D masks through unchanged.
    """
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    bias.masked_fill_(~allowed, torch.finfo(dtype).min)
    return bias[:, None]


# ----------------------------------------------------------------------------------------------
# Inputs: prompts and images
# ----------------------------------------------------------------------------------------------
def openvla_prompt(instruction: str) -> str:
    """OpenVLA's prompt (OpenVLA repo ``PurePromptBuilder``; REFERENCE.md openvla_v1)."""
    return f"In: What action should the robot take to {instruction.lower()}?\nOut:"


class PromptTokenizer:
    """Tokenises OpenVLA prompts into fixed-width, padded id rows.

    Each row is ``[<s>] + [pad] * k + prompt ids + [▁]`` of width ``1 + max_prompt_tokens``:
    padding sits right after ``<s>`` (where image patches are inserted), so every sample's patch
    embeddings and the end of its prompt are at the same positions. Rotary positions are
    recomputed from the validity mask, so a padded row computes what the unpadded one would.

    Args:
        tokenizer: a ``transformers`` tokenizer loaded from the checkpoint directory.
        max_prompt_tokens: T, prompt ids after ``<s>`` (including the ``▁`` suffix).

    Raises:
        ValueError: if the tokenizer has no BOS token.
    """

    def __init__(self, tokenizer: Any, max_prompt_tokens: int):
        self.tokenizer = tokenizer
        self.max_prompt_tokens = int(max_prompt_tokens)
        if tokenizer.bos_token_id is None:
            raise ValueError("The checkpoint's tokenizer has no BOS token (<s>).")
        self.bos_id = int(tokenizer.bos_token_id)
        space = tokenizer.convert_tokens_to_ids(SPACE_TOKEN)
        unk = tokenizer.unk_token_id
        self.suffix_ids = [int(space)] if space is not None and space != unk else []
        self.eos_id = int(tokenizer.eos_token_id) if tokenizer.eos_token_id is not None else 2

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, max_prompt_tokens: int) -> PromptTokenizer:
        """Load the tokenizer files of a checkpoint directory (never with remote code).

        Raises:
            FileNotFoundError: if the directory has no tokenizer files.
        """
        from transformers import AutoTokenizer

        p = Path(path)
        if not any((p / n).exists() for n in ("tokenizer.json", "tokenizer.model")):
            raise FileNotFoundError(
                f"No tokenizer.json or tokenizer.model in {p}; copy the tokenizer files of the "
                "checkpoint into that directory."
            )
        tok = AutoTokenizer.from_pretrained(str(p), trust_remote_code=False)
        return cls(tok, max_prompt_tokens)

    def __call__(self, instructions: Sequence[str], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokenise a batch.

        Args:
            instructions: N task descriptions (lower-cased inside the prompt).
            device: where the tensors go.

        Returns:
            ``(ids (N, 1 + T) int64, valid (N, 1 + T) bool)``.

        Raises:
            ValueError: if a prompt is longer than T (names the config field to raise).
        """
        width = self.max_prompt_tokens
        ids = torch.full((len(instructions), 1 + width), self.bos_id, dtype=torch.long)
        valid = torch.zeros(ids.shape, dtype=torch.bool)
        valid[:, 0] = True
        for i, text in enumerate(instructions):
            body = self.tokenizer(openvla_prompt(text), add_special_tokens=False)["input_ids"]
            body = list(body) + self.suffix_ids
            if len(body) > width:
                raise ValueError(
                    f"Prompt for {text!r} has {len(body)} tokens > policy.max_prompt_tokens="
                    f"{width}; raise policy.max_prompt_tokens."
                )
            ids[i, 1 + width - len(body) :] = torch.tensor(body, dtype=torch.long)
            valid[i, 1 + width - len(body) :] = True
        return ids.to(device), valid.to(device)


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


# ----------------------------------------------------------------------------------------------
# Checkpoints
# ----------------------------------------------------------------------------------------------
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
            f"No {CONFIG_NAME} in {path}; point policy.checkpoint at a directory in the published "
            "OpenVLA layout (config.json + safetensors shards)."
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


def tiny_tokenizer(base_vocab: int) -> Any:
    """A character-level tokenizer for tiny instances, as a ``transformers`` fast tokenizer.

    Ids: ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, ``▁`` 3, newline and printable ASCII, then reserved
    ``<extra_i>`` tokens up to ``base_vocab`` (the last 256 are the action tokens, as in Llama-2
    where they are rarely used pieces) and ``<PAD>`` = ``base_vocab``. ``save_pretrained`` writes
    ``tokenizer.json`` + ``tokenizer_config.json``, loadable with ``AutoTokenizer`` like the
    real Llama-2 tokenizer files.

    Raises:
        ValueError: if ``base_vocab`` cannot hold the characters plus 256 action ids.
    """
    from tokenizers import Tokenizer, models, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, SPACE_TOKEN: 3}
    for ch in ["\n"] + [chr(c) for c in range(32, 127)]:
        vocab[ch] = len(vocab)
    if len(vocab) + 256 > base_vocab:
        raise ValueError(f"base_vocab {base_vocab} too small for {len(vocab)} text ids + 256 actions.")
    while len(vocab) < base_vocab:
        vocab[f"<extra_{len(vocab)}>"] = len(vocab)
    vocab["<PAD>"] = base_vocab
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<PAD>", model_max_length=2048,
    )


# ----------------------------------------------------------------------------------------------
# Training hooks: LoRA, gradient checkpointing, FSDP
# ----------------------------------------------------------------------------------------------
def _lora_targets(vlm: PrismaticVLM, scope: str) -> list[str]:
    roots = {"llm": ["language_model.model"], "all": ["language_model.model", "vision_backbone", "projector"]}
    if scope not in roots:
        raise ValueError(f"policy.lora_targets must be 'llm' or 'all' (got {scope!r}).")
    names = []
    for name, mod in vlm.named_modules():
        if isinstance(mod, nn.Linear) and any(name.startswith(r + ".") for r in roots[scope]):
            if ".attn_pool." in name:  # SigLIP's MAP head is not used for features
                continue
            names.append(name)
    return names


def apply_lora(vlm: PrismaticVLM, rank: int, alpha: int, dropout: float = 0.0, scope: str = "llm") -> list[str]:
    """Inject peft LoRA adapters into every Linear of the LM (or of the whole VLM), in place.

    OpenVLA/OFT fine-tune with ``target_modules="all-linear"`` and ``lora_alpha = min(r, 16)``;
    SimpleVLA-RL and RLinf use r = 32 for RL. The LM head and SigLIP's pooling head are excluded.
    Freezes everything in ``vlm`` except the adapters (callers unfreeze their own heads).

    Args:
        vlm: the model.
        rank: LoRA r (> 0).
        alpha: LoRA alpha.
        dropout: LoRA dropout.
        scope: ``llm`` (LM layers) or ``all`` (plus vision backbones and projector).

    Returns:
        The adapted module names.
    """
    from peft import LoraConfig, inject_adapter_in_model

    targets = _lora_targets(vlm, scope)
    cfg = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets,
                     init_lora_weights="gaussian")
    inject_adapter_in_model(cfg, vlm)
    for name, p in vlm.named_parameters():
        p.requires_grad_("lora_" in name)
    return targets


def merged_state_dict(vlm: PrismaticVLM) -> dict[str, torch.Tensor]:
    """State dict with LoRA adapters folded into the base weights, under the published names.

    ``W' = W + (alpha / r) B A`` per adapted Linear; adapter tensors are dropped and peft's
    ``.base_layer.`` infix removed, so the result loads as a plain OpenVLA checkpoint.
    """
    sd = {}
    for name, mod in vlm.named_modules():
        base = getattr(mod, "base_layer", None)
        if base is not None and hasattr(mod, "lora_A") and hasattr(mod, "get_delta_weight"):
            w = base.weight.detach().clone()
            for adapter in mod.active_adapters:
                if adapter in mod.lora_A:
                    w += mod.get_delta_weight(adapter).to(w.dtype)
            sd[f"{name}.weight"] = w
            if base.bias is not None:
                sd[f"{name}.bias"] = base.bias.detach().clone()
    for k, v in vlm.state_dict().items():
        if "lora_" in k or ".base_layer." in k:
            continue
        sd.setdefault(k, v)
    return sd


def enable_gradient_checkpointing(vlm: PrismaticVLM) -> None:
    """Recompute activations per transformer block (Llama layers and both ViTs) in backward."""
    lm, kwargs = vlm.language_model, {"use_reentrant": False}
    if hasattr(lm, "activation_checkpointing_enable"):  # transformers >= 5.x
        lm.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    vlm.vision_backbone.featurizer.set_grad_checkpointing(True)
    if vlm.vision_backbone.fused_featurizer is not None:
        vlm.vision_backbone.fused_featurizer.set_grad_checkpointing(True)


def fsdp_block_classes(vlm: PrismaticVLM | None = None) -> tuple[type, ...]:
    """Module classes that form one FSDP unit each: Llama decoder layers and timm ViT blocks.

    For FSDP1 pass ``functools.partial(transformer_auto_wrap_policy,
    transformer_layer_cls=set(fsdp_block_classes()))``; for FSDP2 use
    :func:`fully_shard_per_block`.
    """
    from timm.models.vision_transformer import Block
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    return (LlamaDecoderLayer, Block)


def fully_shard_per_block(module: nn.Module, **fsdp_kwargs: Any) -> nn.Module:
    """Apply torch FSDP2 ``fully_shard`` to every block of :func:`fsdp_block_classes`, then root.

    Args:
        module: the policy (or the VLM); must be called inside an initialised process group.
        **fsdp_kwargs: forwarded to ``fully_shard`` (``mesh``, ``mp_policy``,
            ``offload_policy``, ``reshard_after_forward``).

    Returns:
        ``module`` (sharded in place); its ``act``/``evaluate``/``predict_values`` gather the
        root parameters like ``forward`` does (``register_fsdp_forward_method``).
    """
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    classes = fsdp_block_classes()
    for sub in list(module.modules()):
        if isinstance(sub, classes):
            fully_shard(sub, **fsdp_kwargs)
    fully_shard(module, **fsdp_kwargs)
    # Policies are driven through act/evaluate, not forward(): make those gather the root's
    # parameters (projectors, embeddings, heads) the way forward() would.
    for name in ("act", "evaluate", "predict_values"):
        if callable(getattr(module, name, None)):
            register_fsdp_forward_method(module, name)
    return module


def iter_head_parameters(modules: Iterable[nn.Module | None]) -> Iterable[nn.Parameter]:
    """Parameters of the given (possibly None) modules."""
    for m in modules:
        if m is not None:
            yield from m.parameters()


def module_bytes(module: nn.Module) -> int:
    """Bytes of the parameters of ``module`` (for memory estimates)."""
    return sum(p.numel() * p.element_size() for p in module.parameters())


def identity_norm_stats(action_dim: int, proprio_dim: int | None = None, key: str = "tiny") -> dict[str, Any]:
    """Statistics that make un-normalisation the identity on [-1, 1] (tiny instances)."""
    stats: dict[str, Any] = {
        "action": {"q01": [-1.0] * action_dim, "q99": [1.0] * action_dim,
                   "mask": [True] * (action_dim - 1) + [False]}
    }
    if proprio_dim:
        stats["proprio"] = {"q01": [-1.0] * proprio_dim, "q99": [1.0] * proprio_dim}
    return {key: stats}


