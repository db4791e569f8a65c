"""Inputs and outputs of the π0 / π0.5 model: state/action normalisation, images, prompts.

* :class:`PiNormalizer`: z-score (π0) or q01/q99 quantile (π0.5) normalisation of states and
  actions with the statistics of a checkpoint, in either published convention (openpi adds 1e-6
  to every denominator, ``transforms.Normalize``; LeRobot adds 1e-8 to the std and replaces a
  zero quantile range by 1e-8, ``NormalizerProcessorStep``). Statistics are persistent buffers,
  so policy checkpoints carry them.
* :func:`preprocess_images`: uint8 (N, H, W, 3) -> (N, 3, S, S) in [-1, 1], resized with
  centred black padding when the aspect differs (openpi ``resize_with_pad``; bilinear, in float).
* :class:`PiPromptTokenizer`: openpi's ``PaligemmaTokenizer`` prompts, right-padded: π0
  ``"<task>\\n"``; π0.5 ``"Task: <task>, State: <s_1 ... s_S>;\\nAction: "`` with each normalised
  state coordinate digitised into 256 bins over [-1, 1] (``np.digitize(x, linspace(-1, 1,
  257)[:-1]) - 1``). The task is stripped and ``_`` / newlines become spaces; BOS comes first.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["PiNormalizer", "PiPromptTokenizer", "pi_prompt", "preprocess_images", "state_bins"]

MODES = ("mean_std", "quantiles", "identity")
CONVENTIONS = ("openpi", "lerobot")


class PiNormalizer(nn.Module):
    """Normalises states and (un)normalises actions.

    Buffers (float32, persistent): ``{state,action}_{mean,std,q01,q99}``, each of the raw width
    (S or A); identity statistics until loaded (mean 0, std 1, q01 -1, q99 1).

    Args:
        state_dim: S; action_dim: A.
        modes: per key (``state``, ``action``): ``mean_std`` (π0), ``quantiles`` (π0.5) or
            ``identity`` (LeRobot's IDENTITY).
        convention: ``openpi`` or ``lerobot`` (see the module docstring).
    """

    def __init__(self, state_dim: int, action_dim: int, modes: Mapping[str, str],
                 convention: str = "openpi"):
        super().__init__()
        if any(modes.get(k) not in MODES for k in ("state", "action")) or convention not in CONVENTIONS:
            raise ValueError(
                f"PiNormalizer: modes {dict(modes)} must map state and action to one of {MODES}, "
                f"convention {convention!r} one of {CONVENTIONS}."
            )
        self.modes, self.convention = {k: modes[k] for k in ("state", "action")}, convention
        for key, dim in (("state", state_dim), ("action", action_dim)):
            self.register_buffer(f"{key}_mean", torch.zeros(dim))
            self.register_buffer(f"{key}_std", torch.ones(dim))
            self.register_buffer(f"{key}_q01", -torch.ones(dim))
            self.register_buffer(f"{key}_q99", torch.ones(dim))

    def set_stats(self, key: str, stats: Mapping[str, Any]) -> None:
        """Load ``stats`` (``mean``/``std``/``q01``/``q99`` arrays) of ``state`` or ``action``.

        Raises:
            ValueError: a statistic the mode needs is missing, or its width differs.
        """
        need = {"mean_std": ("mean", "std"), "quantiles": ("q01", "q99"), "identity": ()}[self.modes[key]]
        missing = [n for n in need if n not in stats]
        if missing:
            raise ValueError(f"The {key} statistics lack {missing} needed for {self.modes[key]} normalisation.")
        for name in ("mean", "std", "q01", "q99"):
            if name in stats:
                buf = getattr(self, f"{key}_{name}")
                val = torch.as_tensor(stats[name], dtype=torch.float32).reshape(-1)
                if val.numel() != buf.numel():
                    raise ValueError(
                        f"The {key} statistic {name!r} has {val.numel()} dims but the env's {key} "
                        f"has {buf.numel()}; use statistics of this env's dataset."
                    )
                buf.copy_(val)

    def _range(self, key: str) -> torch.Tensor:
        """q99 - q01 with the convention's guard against a zero range."""
        rng = getattr(self, f"{key}_q99") - getattr(self, f"{key}_q01")
        if self.convention == "openpi":
            return rng + 1e-6
        return torch.where(rng == 0, torch.full_like(rng, 1e-8), rng)

    def normalize(self, key: str, x: torch.Tensor) -> torch.Tensor:
        """(..., W) raw -> normalised float32."""
        if self.modes[key] == "identity":
            return x.float()
        if self.modes[key] == "quantiles":
            return (x.float() - getattr(self, f"{key}_q01")) / self._range(key) * 2.0 - 1.0
        eps = 1e-6 if self.convention == "openpi" else 1e-8
        return (x.float() - getattr(self, f"{key}_mean")) / (getattr(self, f"{key}_std") + eps)

    def unnormalize(self, key: str, x: torch.Tensor) -> torch.Tensor:
        """(..., W) normalised -> raw float32 (LeRobot's inverse z-score uses std without eps)."""
        if self.modes[key] == "identity":
            return x.float()
        if self.modes[key] == "quantiles":
            return (x.float() + 1.0) / 2.0 * self._range(key) + getattr(self, f"{key}_q01")
        std = getattr(self, f"{key}_std") + (1e-6 if self.convention == "openpi" else 0.0)
        return x.float() * std + getattr(self, f"{key}_mean")


def preprocess_images(images: torch.Tensor, size: int) -> torch.Tensor:
    """(N, H, W, 3) uint8 -> (N, 3, size, size) float32 in [-1, 1].

    Aspect kept: resized (bilinear, antialias off, as ``F.interpolate`` in openpi's PyTorch
    preprocessing) so the longer side is ``size``, then centred with black padding.
    """
    x = images.permute(0, 3, 1, 2).float() / 255.0
    h, w = x.shape[-2:]
    if (h, w) != (size, size):
        ratio = max(w / size, h / size)
        rh, rw = int(h / ratio), int(w / ratio)
        x = F.interpolate(x, size=(rh, rw), mode="bilinear", align_corners=False).clamp(0.0, 1.0)
        top, left = (size - rh) // 2, (size - rw) // 2
        x = F.pad(x, (left, size - rw - left, top, size - rh - top), value=0.0)
    return x * 2.0 - 1.0


def state_bins(state: torch.Tensor) -> torch.Tensor:
    """(N, S) normalised states -> (N, S) int64 bins: ``digitize(x, linspace(-1, 1, 257)[:-1]) - 1``
    (values below -1 give -1, above 1 give 255, as upstream)."""
    edges = torch.linspace(-1.0, 1.0, 257, dtype=torch.float64)[:-1].to(state.device)
    return torch.bucketize(state.double(), edges, right=True) - 1


def pi_prompt(task: str, bins: Sequence[int] | None = None) -> str:
    """π0's (``bins`` None) or π0.5's prompt text for one task (see the module docstring)."""
    cleaned = task.strip().replace("_", " ").replace("\n", " ")
    if bins is None:
        return cleaned + "\n"
    return f"Task: {cleaned}, State: {' '.join(str(int(b)) for b in bins)};\nAction: "


class PiPromptTokenizer:
    """Prompts -> right-padded ids (N, T) and validity (N, T), BOS first.

    Args:
        tokenizer: a ``transformers`` tokenizer (the PaliGemma one, or the tiny character-level
            one of :func:`~rlinf_embodied.policies.prismatic_tokenizer.tiny_tokenizer`).
        max_len: T.
    """

    def __init__(self, tokenizer: Any, max_len: int):
        self.tokenizer, self.max_len = tokenizer, int(max_len)
        if tokenizer.bos_token_id is None:
            raise ValueError("The π0 tokenizer has no BOS token; use the PaliGemma tokenizer files.")
        self.pad_id = 0  # padding ids are masked; openpi pads with 0 (PaliGemma's <pad>)

    @classmethod
    def from_dir(cls, path: str | os.PathLike, max_len: int) -> PiPromptTokenizer:
        """Load tokenizer files from ``path`` (never with remote code).

        Raises:
            FileNotFoundError: no ``tokenizer.model`` / ``tokenizer.json`` there.
        """
        from transformers import AutoTokenizer

        p = Path(path)
        if not any((p / n).is_file() for n in ("tokenizer.json", "tokenizer.model")):
            raise FileNotFoundError(
                f"No tokenizer.json or tokenizer.model in {p}: published π0 checkpoints do not ship "
                "the PaliGemma tokenizer; set policy.tokenizer to a directory holding the "
                "google/paligemma-3b-pt-224 tokenizer files."
            )
        return cls(AutoTokenizer.from_pretrained(str(p), trust_remote_code=False), max_len)

    def __call__(self, texts: Sequence[str], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokenise prompts (already formatted by :func:`pi_prompt`).

        Raises:
            ValueError: a prompt longer than T (names ``policy.max_token_len``).
        """
        ids = torch.full((len(texts), self.max_len), self.pad_id, dtype=torch.long)
        valid = torch.zeros(ids.shape, dtype=torch.bool)
        for i, text in enumerate(texts):
            body = [self.tokenizer.bos_token_id] + list(
                self.tokenizer(text, add_special_tokens=False)["input_ids"])
            if len(body) > self.max_len:
                raise ValueError(
                    f"The prompt {text!r} has {len(body)} tokens > policy.max_token_len="
                    f"{self.max_len}; raise policy.max_token_len."
                )
            ids[i, : len(body)] = torch.tensor(body, dtype=torch.long)
            valid[i, : len(body)] = True
        return ids.to(device), valid.to(device)
