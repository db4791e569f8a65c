"""The π0 / π0.5 network: PaliGemma (SigLIP + Gemma) beside a Gemma action expert.

Module tree and parameter names follow the published PyTorch layout (openpi's
``PI0Pytorch`` / LeRobot's ``PI0Pytorch``, keys without LeRobot's ``model.`` prefix)::

    paligemma_with_expert.paligemma.model.vision_tower.vision_model.{embeddings, encoder.layers.i, post_layernorm}
    paligemma_with_expert.paligemma.model.multi_modal_projector.linear
    paligemma_with_expert.paligemma.model.language_model.{embed_tokens, layers.i, norm}
    paligemma_with_expert.gemma_expert.model.{layers.i, norm}
    action_in_proj, action_out_proj, state_proj + action_time_mlp_{in,out} (π0) | time_mlp_{in,out} (π0.5)

The blocks are transformers' SigLIP and Gemma modules (``SiglipVisionEmbeddings``,
``SiglipEncoderLayer``, ``GemmaDecoderLayer`` as parameter containers, ``GemmaRMSNorm``,
``GemmaTextScaledWordEmbedding``, ``GemmaRotaryEmbedding``); the containers are this module's,
because transformers 5 no longer has the ``vision_model`` level of the published names and the
two vocabulary heads of the published checkpoints are not used (policies/pi0_checkpoint.py maps
them). The joint attention is written here: in layer i the expert's queries attend to the
keys/values of VLM layer i over the prefix (images + prompt) and to the expert's own tokens.

Sequence and attention (big_vision's prefix-LM masks, as openpi): the prefix (image tokens of
each camera, then the right-padded prompt) attends bidirectionally within itself; the suffix is
``[state] + H action tokens`` for π0 (the state token sees the prefix and itself, the actions see
everything) and the H action tokens for π0.5. The prefix never attends to the suffix, so its keys
and values are computed once per observation (:meth:`PiFlowModel.encode_prefix`) and reused by
every denoising step (:meth:`PiFlowModel.velocity`). Rotary positions count valid tokens only.

Flow convention (openpi): x_t = t * noise + (1 - t) * actions, the expert predicts the velocity
v = noise - actions, and sampling integrates from t = 1 (noise) to t = 0 (actions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from rlinf_embodied.policies.pi0_arch import GemmaSpec, PiArch, SiglipSpec
from torch import nn
from torch.nn import functional as F

__all__ = ["MASK_VALUE", "AdaRMSNorm", "PiFlowModel", "PrefixCache", "sinusoidal_time_embedding"]

MASK_VALUE = -2.3819763e38
"""Additive attention bias of a masked pair (openpi ``make_attn_mask`` / LeRobot
``OPENPI_ATTENTION_MASK_VALUE``): finite, so a row with no allowed key stays NaN-free."""
MIN_PERIOD, MAX_PERIOD = 4e-3, 4.0
"""Periods of the sine-cosine flow-time embedding (openpi ``posemb_sincos`` in ``embed_suffix``)."""


def _box(**children: nn.Module) -> nn.Module:
    """An ``nn.Module`` that only holds ``children`` (a level of the published key names)."""
    box = nn.Module()
    for name, child in children.items():
        box.add_module(name, child)
    return box


def sinusoidal_time_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """(B,) flow times -> (B, dim) float64 ``[sin(2 pi t / p), cos(2 pi t / p)]`` over ``dim/2``
    periods p log-spaced from 4e-3 to 4 (openpi ``create_sinusoidal_pos_embedding``)."""
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=t.device)
    period = MIN_PERIOD * (MAX_PERIOD / MIN_PERIOD) ** fraction
    x = t.to(torch.float64)[:, None] * (2 * math.pi / period)
    return torch.cat([torch.sin(x), torch.cos(x)], dim=-1)


class AdaRMSNorm(nn.Module):
    """π0.5's adaptive RMSNorm: ``dense(cond)`` gives scale, shift and a residual gate.

    ``y = rms_norm(x) * (1 + scale) + shift`` (statistics in float32); the gate multiplies the
    block output before the residual add (openpi ``transformers_replace`` GemmaRMSNorm with
    ``cond``; parameter names ``dense.weight`` / ``dense.bias`` as published).
    """

    def __init__(self, dim: int, cond_dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_dim, 3 * dim)
        nn.init.zeros_(self.dense.weight)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, L, D) inputs, (B, C) condition -> (normalised (B, L, D), gate (B, 1, D))."""
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        scale, shift, gate = self.dense(cond)[:, None].chunk(3, dim=-1)
        return (normed * (1 + scale.float()) + shift.float()).to(x.dtype), gate.to(x.dtype)


def _gemma_config(spec: GemmaSpec, vocab_size: int):
    from transformers import GemmaConfig

    return GemmaConfig(hidden_size=spec.width, intermediate_size=spec.mlp_dim,
                       num_hidden_layers=spec.depth, num_attention_heads=spec.num_heads,
                       num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                       vocab_size=vocab_size, hidden_activation="gelu_pytorch_tanh",
                       rms_norm_eps=1e-6)


def _siglip_tower(spec: SiglipSpec) -> nn.Module:
    from transformers import SiglipVisionConfig
    from transformers.models.siglip.modeling_siglip import SiglipEncoderLayer, SiglipVisionEmbeddings

    cfg = SiglipVisionConfig(hidden_size=spec.width, intermediate_size=spec.mlp_dim,
                             num_hidden_layers=spec.depth, num_attention_heads=spec.num_heads,
                             patch_size=spec.patch_size, image_size=spec.image_size,
                             hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6)
    cfg._attn_implementation = "eager"  # the same kernel with and without gradient
    encoder = _box(layers=nn.ModuleList(SiglipEncoderLayer(cfg) for _ in range(spec.depth)))
    return _box(embeddings=SiglipVisionEmbeddings(cfg), encoder=encoder,
                post_layernorm=nn.LayerNorm(spec.width, eps=1e-6))


def _gemma_layers(spec: GemmaSpec, vocab_size: int, adaptive: bool) -> nn.ModuleList:
    from transformers.models.gemma.modeling_gemma import GemmaDecoderLayer

    cfg = _gemma_config(spec, vocab_size)
    layers = nn.ModuleList(GemmaDecoderLayer(cfg, i) for i in range(spec.depth))
    if adaptive:
        for layer in layers:
            layer.input_layernorm = AdaRMSNorm(spec.width, spec.width)
            layer.post_attention_layernorm = AdaRMSNorm(spec.width, spec.width)
    return layers


def _norm(norm: nn.Module, x: torch.Tensor, cond: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    return norm(x, cond) if isinstance(norm, AdaRMSNorm) else (norm(x), None)


def _residual(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    return x + y if gate is None else x + y * gate


@dataclass
class PrefixCache:
    """What the denoising steps need from one prefix pass (leading dim B).

    Attributes:
        keys: per layer (B, kv heads, Lp, head dim), rotary applied.
        values: per layer, same shape.
        valid: (B, Lp) bool, non-padding prefix tokens.
        hidden: (B, Lp, D) final-norm outputs of the VLM (the value head reads them).
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    valid: torch.Tensor
    hidden: torch.Tensor


class PiFlowModel(nn.Module):
    """π0 (``arch.pi05`` False) or π0.5 as one module with the published parameter names.

    Args:
        arch: the :class:`~rlinf_embodied.policies.pi0_arch.PiArch`.
    """

    def __init__(self, arch: PiArch):
        super().__init__()
        from transformers.models.gemma.modeling_gemma import (
            GemmaRMSNorm,
            GemmaRotaryEmbedding,
            GemmaTextScaledWordEmbedding,
        )

        self.arch = arch
        vlm, exp = arch.vlm, arch.expert
        language_model = _box(
            embed_tokens=GemmaTextScaledWordEmbedding(arch.vocab_size, vlm.width, 0, embed_scale=vlm.width**0.5),
            layers=_gemma_layers(vlm, arch.vocab_size, adaptive=False),
            norm=GemmaRMSNorm(vlm.width, eps=1e-6),
        )
        paligemma = _box(model=_box(
            vision_tower=_box(vision_model=_siglip_tower(arch.vision)),
            multi_modal_projector=_box(linear=nn.Linear(arch.vision.width, vlm.width)),
            language_model=language_model,
        ))
        expert_norm = AdaRMSNorm(exp.width, exp.width) if arch.pi05 else GemmaRMSNorm(exp.width, eps=1e-6)
        gemma_expert = _box(model=_box(layers=_gemma_layers(exp, arch.vocab_size, arch.pi05), norm=expert_norm))
        self.paligemma_with_expert = _box(paligemma=paligemma, gemma_expert=gemma_expert)
        self.action_in_proj = nn.Linear(arch.action_dim, exp.width)
        self.action_out_proj = nn.Linear(exp.width, arch.action_dim)
        if arch.pi05:
            self.time_mlp_in = nn.Linear(exp.width, exp.width)
            self.time_mlp_out = nn.Linear(exp.width, exp.width)
        else:
            self.state_proj = nn.Linear(arch.state_dim, exp.width)
            self.action_time_mlp_in = nn.Linear(2 * exp.width, exp.width)
            self.action_time_mlp_out = nn.Linear(exp.width, exp.width)
        # Rotary tables (non-persistent buffers); Gemma's default theta 10 000.
        self.rotary = GemmaRotaryEmbedding(_gemma_config(vlm, arch.vocab_size))

    # ------------------------------------------------------------------ parts
    @property
    def vlm(self) -> nn.Module:
        """PaliGemma's ``model`` (vision tower, projector, language model)."""
        return self.paligemma_with_expert.paligemma.model

    @property
    def expert(self) -> nn.Module:
        """The action expert's ``model`` (layers, norm)."""
        return self.paligemma_with_expert.gemma_expert.model

    def embed_image(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) pixels in [-1, 1] -> (B, P, D) image tokens (SigLIP, then the projector)."""
        tower = self.vlm.vision_tower.vision_model
        h = tower.embeddings(pixels.to(tower.post_layernorm.weight.dtype))
        for layer in tower.encoder.layers:
            h = layer(h, None)
        return self.vlm.multi_modal_projector.linear(tower.post_layernorm(h))

    def embed_prefix(self, images: list[torch.Tensor], tokens: torch.Tensor,
                     token_valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Image tokens of each camera, then the prompt's (scaled) token embeddings.

        Args:
            images: per camera (B, 3, S, S) in [-1, 1].
            tokens: (B, T) prompt ids; token_valid: (B, T) bool.

        Returns:
            ``(embeddings (B, Lp, D), valid (B, Lp) bool)``.
        """
        parts = [self.embed_image(img) for img in images]
        valid = [torch.ones(p.shape[:2], dtype=torch.bool, device=p.device) for p in parts]
        parts.append(self.vlm.language_model.embed_tokens(tokens))
        valid.append(token_valid.bool())
        dtype = parts[-1].dtype
        return torch.cat([p.to(dtype) for p in parts], dim=1), torch.cat(valid, dim=1)

    # ------------------------------------------------------------------ attention
    def _qkv(self, layer: nn.Module, x: torch.Tensor, pos: torch.Tensor):
        from transformers.models.gemma.modeling_gemma import apply_rotary_pos_emb

        hd = self.arch.vlm.head_dim
        b, n = x.shape[:2]
        att = layer.self_attn
        q = att.q_proj(x).view(b, n, -1, hd).transpose(1, 2)
        k = att.k_proj(x).view(b, n, -1, hd).transpose(1, 2)
        v = att.v_proj(x).view(b, n, -1, hd).transpose(1, 2)
        cos, sin = self.rotary(v, pos)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """Eager attention (same kernel with and without gradient); (B, Lq, heads * head dim)."""
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.arch.vlm.head_dim**-0.5
        bias = torch.where(allowed[:, None], 0.0, MASK_VALUE).to(scores.dtype)
        probs = torch.softmax((scores + bias).float(), dim=-1).to(q.dtype)
        out = torch.matmul(probs, v)
        return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)

    @staticmethod
    def _finish(layer: nn.Module, h: torch.Tensor, attn: torch.Tensor, gate, cond) -> torch.Tensor:
        h = _residual(h, layer.self_attn.o_proj(attn), gate)
        x, gate = _norm(layer.post_attention_layernorm, h, cond)
        return _residual(h, layer.mlp(x), gate)

    # ------------------------------------------------------------------ passes
    def encode_prefix(self, embs: torch.Tensor, valid: torch.Tensor) -> PrefixCache:
        """Run the VLM over the prefix (bidirectional among valid tokens) and keep its keys and
        values for the expert.

        Args:
            embs: (B, Lp, D) from :meth:`embed_prefix`; valid: (B, Lp) bool.
        """
        pos = (valid.long().cumsum(1) - 1).clamp(min=0)
        allowed = valid[:, None, :] & valid[:, :, None]
        keys, values, h = [], [], embs
        for layer in self.vlm.language_model.layers:
            x, _ = _norm(layer.input_layernorm, h, None)
            q, k, v = self._qkv(layer, x, pos)
            keys.append(k)
            values.append(v)
            h = self._finish(layer, h, self._attend(q, k, v, allowed), None, None)
        return PrefixCache(keys, values, valid, self.vlm.language_model.norm(h))

    def embed_suffix(self, state: torch.Tensor | None, x_t: torch.Tensor,
                     t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Expert input tokens and π0.5's adaptive-norm condition.

        Args:
            state: (B, state_dim) normalised, padded state (π0; None for π0.5).
            x_t: (B, H, D) noisy actions; t: (B,) flow times.

        Returns:
            ``(tokens (B, [1 +] H, We), cond (B, We) or None)``.
        """
        act = self.action_in_proj(x_t)
        temb = sinusoidal_time_embedding(t, act.shape[-1]).to(act.dtype)
        if self.arch.pi05:
            cond = F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(temb))))
            return act, cond
        fused = torch.cat([act, temb[:, None].expand_as(act)], dim=-1)
        act = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(fused)))
        st = self.state_proj(state.to(act.dtype))[:, None]
        return torch.cat([st, act], dim=1), None

    def velocity(self, cache: PrefixCache, state: torch.Tensor | None, x_t: torch.Tensor,
                 t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One expert pass: the predicted velocity at (x_t, t).

        Args:
            cache: from :meth:`encode_prefix`.
            state: (B, state_dim) for π0, None for π0.5.
            x_t: (B, H, D); t: (B,) (per-sample times are allowed).

        Returns:
            ``(v_t (B, H, D) float32, hidden (B, H, We) float32 expert outputs at the actions)``.
        """
        h, cond = self.embed_suffix(state, x_t.to(self.action_in_proj.weight.dtype), t)
        b, ls = h.shape[:2]
        horizon = x_t.shape[1]
        n_prefix = cache.valid.long().sum(1, keepdim=True)
        pos = n_prefix + torch.arange(ls, device=h.device)[None]
        # big_vision ar-mask [1, 1, 0, ...] (π0) or [1, 0, ...] (π0.5): cumsum-based blocks.
        block = torch.ones(ls, dtype=torch.long, device=h.device)
        block[ls - horizon + 1:] = 0
        cs = block.cumsum(0)
        own = (cs[None, :] <= cs[:, None])[None].expand(b, -1, -1)
        allowed = torch.cat([cache.valid[:, None, :].expand(-1, ls, -1), own], dim=2)
        for i, layer in enumerate(self.expert.layers):
            x, gate = _norm(layer.input_layernorm, h, cond)
            q, k, v = self._qkv(layer, x, pos)
            k = torch.cat([cache.keys[i], k], dim=2)
            v = torch.cat([cache.values[i], v], dim=2)
            h = self._finish(layer, h, self._attend(q, k, v, allowed), gate, cond)
        out, _ = _norm(self.expert.norm, h, cond)
        out = out[:, -horizon:].float()
        return self.action_out_proj(out.to(self.action_out_proj.weight.dtype)).float(), out

    def flow_matching_loss(self, cache: PrefixCache, state: torch.Tensor | None, actions: torch.Tensor,
                           noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Per-element squared error of the velocity (openpi ``PI0Pytorch.forward``).

        Args:
            actions: (B, H, D) normalised, padded target chunk; noise: same shape; t: (B,).

        Returns:
            (B, H, D) float32 ``(v_theta(x_t, t) - (noise - actions))^2``.
        """
        tt = t[:, None, None].to(actions.dtype)
        x_t = tt * noise + (1 - tt) * actions
        v_t, _ = self.velocity(cache, state, x_t, t)
        return (v_t - (noise - actions).float()) ** 2
