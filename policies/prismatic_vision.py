"""The Prismatic VLM's vision side: timm ViT backbones and the projector into the LM's space.

Architecture (Prismatic VLMs, Karamcheti et al. 2024; OpenVLA, Kim et al. 2024, section 3.1):

* ``vision_backbone``: one or two timm ViTs (``featurizer`` = DINOv2 ViT-L/14 with 4 registers,
  ``fused_featurizer`` = SigLIP So400m/14 for the fused ``dinosiglip`` backbone). Features are the
  patch tokens of the *second-to-last* block, without the final norm and without prefix
  (class/register) tokens; the two backbones' features are concatenated along channels.
  timm's ``LayerScale.gamma`` is stored as ``scale_factor`` (the HF port renames it because
  ``transformers`` used to rewrite parameters named ``gamma``).
* ``projector``: ``fc1 -> GELU -> fc2`` (single backbone) or ``fc1 (D -> 4D) -> GELU -> fc2 ->
  GELU -> fc3`` (fused, "no-align+fused-gelu-mlp").
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from rlinf_embodied.policies.prismatic_config import PrismaticArchConfig
from torch import nn

__all__ = ["HFLayerScale", "PrismaticProjector", "PrismaticVisionBackbone"]


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
