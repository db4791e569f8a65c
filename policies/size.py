"""How many parameters a VLA policy config builds, without building it in memory.

``rlinf-embodied plan`` prices a job before anything is profiled from per-family guesses made for
the published sizes (OpenVLA 7.5B, π0 3.3B); it scales their memory by this count, so that the
tiny and small presets of the CPU pipelines are not priced as the 7B model.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

__all__ = ["parameter_count", "safetensors_parameter_count"]


def safetensors_parameter_count(directory: str | Path) -> int:
    """Elements of every tensor in the ``*.safetensors`` files of ``directory`` (shapes from the
    files' headers, their data is not read; 0 when there are none).

    Raises:
        ValueError: a file that is not safetensors (safetensors' own error).
    """
    from safetensors import SafetensorError, safe_open

    total = 0
    for f in sorted(Path(directory).glob("*.safetensors")):
        try:
            with safe_open(str(f), "pt") as st:
                total += sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys())
        except SafetensorError as e:
            raise ValueError(f"{f}: not a safetensors file ({e}).") from None
    return total


def parameter_count(config: Any) -> int | None:
    """Parameters of the model a VLA policy config loads or builds: the checkpoint's tensors
    when ``policy.pretrained`` is set (None when it is no directory with safetensors here),
    else the ``preset``'s modules built on the ``meta`` device (no memory, no weights). None for
    policy types that are not VLAs (their planning guesses are not per size).

    Raises:
        ValueError: an unknown preset (as building the policy would).
    """
    kind = getattr(config, "type", None)
    if kind not in ("openvla", "openvla_oft", "pi0", "pi05"):
        return None
    pretrained = getattr(config, "pretrained", None)
    if pretrained:  # not here (yet): its size is unknown, the published one is the guess
        return (safetensors_parameter_count(pretrained) or None) if Path(pretrained).is_dir() else None
    with torch.device("meta"):
        if kind in ("pi0", "pi05"):
            from rlinf_embodied.policies.pi0_arch import preset_arch
            from rlinf_embodied.policies.pi0_model import PiFlowModel

            model = PiFlowModel(preset_arch(config.preset, kind == "pi05"))
        else:
            from rlinf_embodied.policies.prismatic_config import (
                PrismaticArchConfig,
                openvla_7b_arch_dict,
                tiny_arch_dict,
            )
            from rlinf_embodied.policies.prismatic_model import PrismaticVLM

            arch = (tiny_arch_dict(**config.tiny.arch_kwargs()) if config.preset == "tiny"
                    else openvla_7b_arch_dict())
            model = PrismaticVLM(PrismaticArchConfig.from_dict(arch, source=f"preset {config.preset}"))
    return sum(p.numel() for p in model.parameters())
