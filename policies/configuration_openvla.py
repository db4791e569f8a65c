"""Configs of the VLA policies (policies/openvla.py, policies/openvla_oft.py),
``policy.type: openvla | openvla_oft``.

Registered by type in :mod:`rlinf_embodied.config.components`; loaded lazily by the config loader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from rlinf_embodied.config import ConfigError, PolicyConfig


@dataclass
class TinyArchConfig:
    """Sizes of ``policy.preset: tiny``: the 7B model's modules and parameter names (fused
    DINOv2 + SigLIP ViTs, projector, Llama), small widths and depths
    (:func:`~rlinf_embodied.policies.prismatic_config.tiny_arch_dict`)."""

    image_size: int = 112
    """Input resolution of both ViTs in pixels, a multiple of ``patch_size`` (the 7B model:
    224). Env images are resized to it."""
    patch_size: int = 14
    """ViT patch size in pixels (the 7B model: 14); (image_size / patch_size)^2 patches per
    image and backbone."""
    vit_dims: List[int] = field(default_factory=lambda: [32, 48])
    """Widths of the DINOv2-style and SigLIP-style ViTs (7B: 1024, 1152)."""
    vit_depth: int = 2
    """Blocks per ViT; features come from the second-to-last one, as in Prismatic (7B: 24, 27)."""
    vit_heads: int = 2
    """Attention heads of each ViT; must divide both ``vit_dims`` (7B: 16)."""
    llm_hidden: int = 64
    """Llama width (7B: 4096)."""
    llm_layers: int = 2
    """Llama layers (7B: 32)."""
    llm_heads: int = 4
    """Llama attention heads; must divide ``llm_hidden`` (7B: 32)."""
    n_action_bins: int = 256
    """Action tokens per dimension, the last ids of the vocabulary (OpenVLA: 256 uniform bins
    on [-1, 1] of the q01/q99-normalised action)."""
    words: List[str] = field(default_factory=list)
    """Whole words the tiny tokenizer keeps as single ids (the prompt template's and the
    instructions'); the rest of the text is character-level. [] (default): all
    character-level, about 80 prompt ids for a ManiSkill instruction instead of about 20."""

    def __post_init__(self):
        if self.patch_size < 1 or self.image_size % self.patch_size:
            raise ConfigError(f"policy.tiny.image_size ({self.image_size}) must be a multiple of "
                              f"policy.tiny.patch_size ({self.patch_size}).")
        if len(self.vit_dims) != 2:
            raise ConfigError(f"policy.tiny.vit_dims needs two widths, one per backbone (got {self.vit_dims}).")
        for d in self.vit_dims:
            if d % self.vit_heads:
                raise ConfigError(f"policy.tiny.vit_dims {self.vit_dims} must be multiples of "
                                  f"policy.tiny.vit_heads ({self.vit_heads}).")
        if self.llm_hidden % self.llm_heads:
            raise ConfigError(f"policy.tiny.llm_hidden ({self.llm_hidden}) must be a multiple of "
                              f"policy.tiny.llm_heads ({self.llm_heads}).")
        if not 2 <= self.n_action_bins <= 256:
            raise ConfigError(f"policy.tiny.n_action_bins must be in [2, 256] (got {self.n_action_bins}).")
        if self.vit_depth < 2:
            raise ConfigError(f"policy.tiny.vit_depth must be >= 2: features come from the "
                              f"second-to-last block (got {self.vit_depth}).")

    def arch_kwargs(self) -> dict:
        """Keyword arguments of :func:`~rlinf_embodied.policies.prismatic_config.tiny_arch_dict`."""
        return dict(image_size=self.image_size, patch_size=self.patch_size,
                    vit_dims=tuple(self.vit_dims), vit_depth=self.vit_depth,
                    vit_heads=self.vit_heads, llm_hidden=self.llm_hidden,
                    llm_layers=self.llm_layers, llm_heads=self.llm_heads,
                    n_action_bins=self.n_action_bins)


@dataclass
class VLAPolicyConfig(PolicyConfig):
    """Fields shared by the VLA policies (``openvla``, ``openvla_oft``; policies/openvla*.py).

    Weights come from ``pretrained`` (a directory in the published Hugging Face layout, never
    executing code shipped with it) or, without it, from a random ``preset`` architecture;
    ``checkpoint`` still names a ``save_policy`` directory of this framework (RL checkpoints).
    """

    pretrained: Optional[str] = None
    """Directory in the published OpenVLA / OpenVLA-OFT layout (config.json, safetensors shards,
    dataset_statistics.json, tokenizer files; OFT also ``*--*_checkpoint.pt`` heads); None builds
    ``preset`` with random weights."""
    preset: str = "tiny"
    """Architecture when ``pretrained`` is None: ``tiny`` (CPU tests, same module structure) or
    ``openvla-7b`` (DINOv2+SigLIP, Llama-2 7B; random weights, for memory/throughput checks)."""
    tiny: TinyArchConfig = field(default_factory=TinyArchConfig)
    """Sizes of ``preset: tiny`` (ignored with ``pretrained``: the checkpoint's config.json
    holds its sizes)."""
    unnorm_key: Optional[str] = None
    """Dataset whose q01/q99 statistics un-normalise actions (e.g. ``libero_spatial_no_noops``);
    None when the checkpoint has exactly one."""
    temperature: float = 1.0
    """Sampling temperature of the action tokens, also used to score them in ``evaluate``
    (SimpleVLA-RL / RLinf GRPO on LIBERO: 1.6). Greedy mode ignores it for the choice."""
    max_prompt_tokens: int = 128
    """T, prompt ids after ``<s>``; prompts are padded to it so rollouts stack (Llama-2 needs
    about 40 for LIBERO instructions, the tiny char-level tokenizer about 120)."""
    center_crop: bool = True
    """Crop the central 90% of the image area and resize back (OpenVLA/OFT LIBERO models were
    fine-tuned with random-crop augmentation; set False for models trained without it)."""
    image_preprocessing: str = "auto"
    """``upstream``: JPEG q95 round trip, Lanczos-3 resize, TF ``crop_and_resize`` centre crop and
    the checkpoint's ``preprocessor_config.json`` mean/std, as the openvla / openvla-oft LIBERO
    evals (per image on the CPU); ``fast``: batched bilinear resize and crop on the device
    (a few grey levels off); ``auto``: upstream when ``pretrained`` is set, else fast
    (policies/preprocessing.py)."""
    gripper_to_signed: bool = False
    """Map the gripper output from [0, 1] to [-1, 1] (openvla_v1 LIBERO protocol: true)."""
    gripper_binarize: bool = False
    """Replace the gripper output by its sign (openvla_v1 LIBERO protocol: true)."""
    gripper_invert: bool = False
    """Negate the gripper output (LIBERO: -1 open, +1 close, opposite to OpenVLA's data: true)."""
    lora_rank: int = 0
    """LoRA r through peft; 0 trains every weight. RL recipes use 32 (SimpleVLA-RL, RLinf);
    with r > 0 only the adapters and the heads are trainable."""
    lora_alpha: Optional[int] = None
    """LoRA alpha; None uses min(r, 16) as OpenVLA/OFT fine-tuning does."""
    lora_dropout: float = 0.0
    """LoRA dropout (0 keeps rollout and training forward passes identical)."""
    lora_targets: str = "llm"
    """Linear layers that get adapters: ``llm`` (Llama layers) or ``all`` (plus both ViTs and the
    projector, like OFT's ``all-linear``)."""
    gradient_checkpointing: bool = False
    """Recompute each transformer block's activations in backward (needed for 7B training)."""
    critic: bool = False
    """Value head on the LM hidden state (PPO); GRPO runs without it."""
    value_head_hidden: int = 1024
    """Width of the value head's hidden layer."""
    dtype: str = "auto"
    """Parameter dtype: ``auto`` (bfloat16 when CUDA is available, else float32), ``float32``,
    ``bfloat16``."""
    attn_implementation: str = "sdpa"
    """Llama attention kernel: ``sdpa`` or ``eager`` (both take the custom 4-D masks)."""

    def __post_init__(self):
        super().__post_init__()
        if self.pretrained is None and self.preset not in ("tiny", "openvla-7b"):
            raise ConfigError(f"policy.preset must be tiny or openvla-7b (got {self.preset!r}).")
        if self.temperature <= 0:
            raise ConfigError(
                f"policy.temperature must be > 0 (got {self.temperature}); use act mode "
                "'greedy' for argmax actions."
            )
        if self.lora_rank < 0:
            raise ConfigError(f"policy.lora_rank must be >= 0 (got {self.lora_rank}).")
        if self.lora_targets not in ("llm", "all"):
            raise ConfigError(f"policy.lora_targets must be llm or all (got {self.lora_targets!r}).")
        if self.dtype not in ("auto", "float32", "bfloat16"):
            raise ConfigError(f"policy.dtype must be auto, float32 or bfloat16 (got {self.dtype!r}).")
        if self.attn_implementation not in ("sdpa", "eager"):
            raise ConfigError(
                f"policy.attn_implementation must be sdpa or eager (got {self.attn_implementation!r})."
            )
        if self.image_preprocessing not in ("auto", "fast", "upstream"):
            raise ConfigError(
                "policy.image_preprocessing must be auto, fast or upstream (got "
                f"{self.image_preprocessing!r})."
            )
        if self.max_prompt_tokens < 8:
            raise ConfigError(f"policy.max_prompt_tokens must be >= 8 (got {self.max_prompt_tokens}).")


@dataclass
class OpenVLAPolicyConfig(VLAPolicyConfig):
    """OpenVLA: Prismatic VLM decoding K x A action tokens autoregressively (policies/openvla.py)."""

    type: str = "openvla"
    """Selects policies/openvla.py."""
    logprob_granularity: str = "token"
    """Log-probs per action token (N, K, A) by default, as RL4VLA / SimpleVLA-RL use them."""


@dataclass
class OpenVLAOFTPolicyConfig(VLAPolicyConfig):
    """OpenVLA-OFT: all K x A action positions decoded in one pass (policies/openvla_oft.py)."""

    type: str = "openvla_oft"
    """Selects policies/openvla_oft.py."""
    action_chunk: int = 8
    """K, actions per query executed open loop (OFT on LIBERO: 8)."""
    logprob_granularity: str = "token"
    """Log-probs per action token (N, K, A) by default."""
    action_head: str = "discrete"
    """``discrete``: logits of the last 256 vocabulary ids at each action position (what
    RLinf / SimpleVLA-RL train); ``continuous``: OFT's L1-regression MLP head with a learnable
    Gaussian std for RL (checkpoints trained with it give near-zero success under token RL)."""
    use_wrist_image: bool = True
    """Feed ``wrist_images`` as a second image (OFT LIBERO: agentview + wrist)."""
    use_proprio: bool = True
    """Feed ``states`` through the proprio projector as one extra token (OFT LIBERO: 8-dim)."""
    proprio_dim: int = 8
    """S of the proprio input (LIBERO: eef position 3 + axis-angle 3 + gripper qpos 2)."""
    attention: str = "full"
    """``full``: every token attends to every token (what the published OFT checkpoints were
    trained with, openvla-oft issue #27); ``action_block``: causal prefix, bidirectional among
    the action positions."""
    init_log_std: float = -2.0
    """Initial log std of the continuous head's Gaussian, normalised action units."""

    def __post_init__(self):
        super().__post_init__()
        if self.action_head not in ("discrete", "continuous"):
            raise ConfigError(
                f"policy.action_head must be discrete or continuous (got {self.action_head!r})."
            )
        if self.attention not in ("full", "action_block"):
            raise ConfigError(
                f"policy.attention must be full or action_block (got {self.attention!r})."
            )
