"""Architecture of the π0 / π0.5 model: SigLIP and Gemma sizes by variant name, and presets.

The published models name their Gemma sizes by variant (openpi ``gemma.get_config``, LeRobot
``get_gemma_config``): ``gemma_2b`` for the PaliGemma language model and ``gemma_300m`` for the
action expert; the vision tower is SigLIP So400m/14 (27 blocks, width 1152, MLP 4304) at
``image_resolution`` (224). The ``*_tiny`` and ``*_small`` variants keep the module structure
and shrink the sizes (RLinf tests with a dummy Gemma of width 64, depth 4); they exist only here,
so a tiny instance written in a published layout names them in its ``config.json``
(``paligemma_variant``, ``action_expert_variant`` and the extra key ``vision_variant``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["GEMMA_VARIANTS", "VISION_VARIANTS", "GemmaSpec", "PiArch", "SiglipSpec", "preset_arch"]


@dataclass(frozen=True)
class GemmaSpec:
    """One Gemma stack: width D, depth L, MLP width, attention heads (query / key-value) and
    head dim. The VLM and the expert must share depth, heads and head dim (their attention is
    joint)."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class SiglipSpec:
    """The SigLIP vision tower: width, depth, MLP width, heads, patch size, image size (px)."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    patch_size: int
    image_size: int

    @property
    def num_patches(self) -> int:
        """Image tokens per camera: (image_size / patch_size)^2 (256 at 224 px, patch 14)."""
        return (self.image_size // self.patch_size) ** 2


# openpi src/openpi/models/gemma.py get_config (the numbers, as LeRobot's get_gemma_config).
GEMMA_VARIANTS = {
    "gemma_2b": GemmaSpec(2048, 18, 16_384, 8, 1, 256),
    "gemma_300m": GemmaSpec(1024, 18, 4096, 8, 1, 256),
    "gemma_tiny": GemmaSpec(64, 2, 128, 2, 1, 16),
    "gemma_tiny_expert": GemmaSpec(32, 2, 64, 2, 1, 16),
    "gemma_small": GemmaSpec(128, 4, 256, 4, 1, 32),
    "gemma_small_expert": GemmaSpec(64, 4, 128, 4, 1, 32),
}
VISION_VARIANTS = {
    "so400m_14": SiglipSpec(1152, 27, 4304, 16, 14, 224),
    "siglip_tiny": SiglipSpec(32, 2, 64, 2, 8, 32),
    "siglip_small": SiglipSpec(64, 2, 128, 2, 8, 64),
}
VOCAB_SIZE = 257_152
"""PaliGemma's vocabulary (openpi / LeRobot ``vocab_size``)."""
_PRESETS = {
    "tiny": ("siglip_tiny", "gemma_tiny", "gemma_tiny_expert", 512),
    "small": ("siglip_small", "gemma_small", "gemma_small_expert", 512),
    "full": ("so400m_14", "gemma_2b", "gemma_300m", VOCAB_SIZE),
}


@dataclass(frozen=True)
class PiArch:
    """Everything that fixes the weights' shapes.

    Attributes:
        vision: the SigLIP tower.
        vlm: the PaliGemma language model.
        expert: the action expert.
        vocab_size: rows of the token embedding.
        pi05: π0.5 (adaptive RMSNorm in the expert, ``time_mlp_*``, no state token) or π0.
        action_dim: D, padded action width the expert reads and writes (published: 32).
        state_dim: padded state width of π0's state token (published: 32).
        variants: ``(vision, vlm, expert)`` variant names, for ``config.json``.
    """

    vision: SiglipSpec
    vlm: GemmaSpec
    expert: GemmaSpec
    vocab_size: int
    pi05: bool
    action_dim: int = 32
    state_dim: int = 32
    variants: tuple[str, str, str] = ("so400m_14", "gemma_2b", "gemma_300m")

    def __post_init__(self):
        a, b = self.vlm, self.expert
        if (a.depth, a.num_heads, a.num_kv_heads, a.head_dim) != (b.depth, b.num_heads, b.num_kv_heads, b.head_dim):
            raise ValueError(
                f"The VLM ({a}) and the action expert ({b}) must share depth, heads and head dim: "
                "their attention is joint."
            )

    @classmethod
    def from_variants(cls, vision: str, vlm: str, expert: str, *, pi05: bool, vocab_size: int,
                      image_size: int | None = None, action_dim: int = 32,
                      state_dim: int = 32) -> PiArch:
        """The architecture of named variants.

        Raises:
            ValueError: an unknown variant name (lists the known ones).
        """
        for name, table in ((vision, VISION_VARIANTS), (vlm, GEMMA_VARIANTS), (expert, GEMMA_VARIANTS)):
            if name not in table:
                raise ValueError(f"Unknown π0 variant {name!r}; known: {', '.join(table)}.")
        v = VISION_VARIANTS[vision]
        if image_size is not None:
            v = replace(v, image_size=int(image_size))
        return cls(v, GEMMA_VARIANTS[vlm], GEMMA_VARIANTS[expert], vocab_size, pi05,
                   action_dim, state_dim, (vision, vlm, expert))


def preset_arch(name: str, pi05: bool, action_dim: int = 32, state_dim: int = 32) -> PiArch:
    """The architecture of ``policy.preset`` (``tiny``, ``small``, ``full``).

    Raises:
        ValueError: unknown preset.
    """
    if name not in _PRESETS:
        raise ValueError(f"Unknown π0 preset {name!r}; use one of {', '.join(_PRESETS)}.")
    vision, vlm, expert, vocab = _PRESETS[name]
    return PiArch.from_variants(vision, vlm, expert, pi05=pi05, vocab_size=vocab,
                                action_dim=action_dim, state_dim=state_dim)
