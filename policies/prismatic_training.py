"""Training hooks of the Prismatic VLM: LoRA (inject, merge), gradient checkpointing, FSDP units."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from rlinf_embodied.policies.prismatic_model import PrismaticVLM
from torch import nn

__all__ = [
    "apply_lora",
    "enable_gradient_checkpointing",
    "fsdp_block_classes",
    "fully_shard_per_block",
    "iter_head_parameters",
    "merged_state_dict",
    "module_bytes",
]


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
