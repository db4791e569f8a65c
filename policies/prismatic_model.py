"""The Prismatic VLM shared by OpenVLA and OpenVLA-OFT, and its attention masks.

:class:`PrismaticVLM` = ``vision_backbone`` + ``projector``
(:mod:`~rlinf_embodied.policies.prismatic_vision`) + ``language_model``, a
``transformers.LlamaForCausalLM`` built from ``text_config``; projected patch embeddings are
inserted right after ``<s>``. Parameter names are those of the published HF checkpoints
(``vision_backbone.featurizer.*``, ``projector.fc1``, ``language_model.model.layers.*``,
``language_model.lm_head``). :func:`causal_allowed` and :func:`attention_bias` build the 4-D
float masks its decoder takes.

The rest of the family: the architecture config in
:mod:`~rlinf_embodied.policies.prismatic_config`, prompts and tokenizers in
:mod:`~rlinf_embodied.policies.prismatic_tokenizer`, checkpoint I/O and dataset statistics in
:mod:`~rlinf_embodied.policies.prismatic_checkpoint`, LoRA / gradient checkpointing / FSDP in
:mod:`~rlinf_embodied.policies.prismatic_training`.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from rlinf_embodied.policies.prismatic_config import PrismaticArchConfig
from rlinf_embodied.policies.prismatic_vision import PrismaticProjector, PrismaticVisionBackbone
from torch import nn

__all__ = ["PrismaticVLM", "attention_bias", "causal_allowed"]


@functools.lru_cache(maxsize=1)
def _cache_kwarg() -> str:
    """Name of LlamaModel's cache argument: ``cache`` (transformers 5) or ``past_key_values``."""
    import inspect

    from transformers.models.llama.modeling_llama import LlamaModel

    return "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"


class PrismaticVLM(nn.Module):
    """Vision backbone + projector + Llama, with parameter names as in the HF OpenVLA checkpoints.

    Args:
        arch: architecture config (from ``config.json`` or
            :func:`~rlinf_embodied.policies.prismatic_config.tiny_arch_dict`).
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
