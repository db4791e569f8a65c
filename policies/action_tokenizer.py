"""Discrete action tokens and action (un-)normalisation for OpenVLA-style policies.

Three small pieces shared by :mod:`rlinf_embodied.policies.openvla` and
:mod:`rlinf_embodied.policies.openvla_oft`:

* :class:`ActionTokenizer` maps normalised actions in [-1, 1] to the last ``n_bins`` ids of the
  base vocabulary and back to bin centres (OpenVLA paper, section 3.2; repo
  ``prismatic/vla/action_tokenizer.py`` and ``OpenVLAForActionPrediction.predict_action``).
* :class:`ActionNormalizer` applies the dataset statistics shipped with a checkpoint
  (``dataset_statistics.json`` / ``norm_stats`` in ``config.json``): q01/q99 bounds with a
  per-dimension mask ("BOUNDS_Q99" in the OpenVLA-OFT repo, ``prismatic/vla/constants.py``).
* :class:`GripperConvention` turns the model's gripper output into the env's convention
  (REFERENCE.md, openvla_v1 protocol: map [0, 1] to [-1, 1], take the sign, invert).

Everything is torch and device-agnostic; numpy inputs are not accepted on purpose (the rollout
keeps tensors on the policy's device).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["ActionNormalizer", "ActionTokenizer", "GripperConvention", "select_norm_stats"]


class ActionTokenizer:
    """Uniform discretisation of normalised actions into the last ``n_bins`` vocabulary ids.

    OpenVLA's published convention, reproduced exactly so that real checkpoints decode the same
    way: ``n_bins`` (256) *edges* ``linspace(-1, 1, n_bins)`` give ``n_bins - 1`` intervals whose
    centres are the decoded values. Encoding uses ``d = digitize(a, edges)`` in ``[1, n_bins]``
    and token ``vocab_size - d``; decoding inverts it and clamps ``d - 1`` to the last centre, so
    the 256 token ids ``[vocab_size - 256, vocab_size)`` are all valid outputs (the two highest
    bins share the top centre). Bin width is ``2 / (n_bins - 1)``; a round trip of an action in
    [-1, 1] is off by at most half of it.

    Within this module a *bin index* ``b`` in ``[0, n_bins)`` is the offset of the token inside the
    action slice of the vocabulary: ``token = vocab_size - n_bins + b``. Restricting logits to
    ``logits[..., vocab_size - n_bins: vocab_size]`` therefore yields logits indexed by ``b``.

    Args:
        vocab_size: V, size of the *base* tokenizer vocabulary (Llama-2: 32000; the LM's embedding
            table is padded beyond it, ``text_config.vocab_size - pad_to_multiple_of``).
        n_bins: Number of action tokens (``n_action_bins`` in the checkpoint config, 256).

    Raises:
        ValueError: if ``n_bins < 2`` or ``vocab_size < n_bins``.
    """

    def __init__(self, vocab_size: int, n_bins: int = 256):
        if n_bins < 2:
            raise ValueError(f"n_bins must be >= 2 (got {n_bins}).")
        if vocab_size < n_bins:
            raise ValueError(
                f"vocab_size ({vocab_size}) must be at least n_bins ({n_bins}); check the "
                "checkpoint's text_config.vocab_size and pad_to_multiple_of."
            )
        self.vocab_size = int(vocab_size)
        self.n_bins = int(n_bins)
        self.edges = torch.linspace(-1.0, 1.0, self.n_bins, dtype=torch.float64)
        self.centres = (self.edges[:-1] + self.edges[1:]) / 2.0

    @property
    def first_token_id(self) -> int:
        """Smallest action token id, ``vocab_size - n_bins`` (Llama-2 OpenVLA: 31744)."""
        return self.vocab_size - self.n_bins

    @property
    def bin_width(self) -> float:
        """Width of one interval in normalised units, ``2 / (n_bins - 1)``."""
        return 2.0 / (self.n_bins - 1)

    def encode_bins(self, actions: torch.Tensor) -> torch.Tensor:
        """Normalised actions -> bin indices.

        Args:
            actions: float tensor of any shape, normalised units; clipped to [-1, 1].

        Returns:
            int64 tensor of the same shape, values in ``[0, n_bins)``.
        """
        a = actions.detach().to(torch.float64).clamp(-1.0, 1.0)
        edges = self.edges.to(a.device)
        d = torch.bucketize(a, edges, right=True)  # == numpy.digitize(a, edges): 1..n_bins
        return (self.n_bins - d).long()

    def decode_bins(self, bins: torch.Tensor) -> torch.Tensor:
        """Bin indices -> normalised actions at the bin centres.

        Args:
            bins: integer tensor of any shape, values in ``[0, n_bins)``.

        Returns:
            float32 tensor of the same shape, values in [-1, 1].
        """
        d = self.n_bins - bins.long()
        idx = (d - 1).clamp(0, self.n_bins - 2)
        return self.centres.to(bins.device)[idx].to(torch.float32)

    def bins_to_tokens(self, bins: torch.Tensor) -> torch.Tensor:
        """Bin indices -> vocabulary ids (int64)."""
        return bins.long() + self.first_token_id

    def tokens_to_bins(self, tokens: torch.Tensor) -> torch.Tensor:
        """Vocabulary ids -> bin indices (int64); ids outside the action slice raise.

        Raises:
            ValueError: if any id is not one of the last ``n_bins`` ids of the base vocabulary.
        """
        b = tokens.long() - self.first_token_id
        if bool(((b < 0) | (b >= self.n_bins)).any()):
            raise ValueError(
                f"token ids outside the action range [{self.first_token_id}, {self.vocab_size}): "
                f"min {int(tokens.min())}, max {int(tokens.max())}"
            )
        return b

    def encode(self, actions: torch.Tensor) -> torch.Tensor:
        """Normalised actions -> vocabulary ids (int64), same shape."""
        return self.bins_to_tokens(self.encode_bins(actions))

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Vocabulary ids -> normalised actions (float32), same shape."""
        return self.decode_bins(self.tokens_to_bins(tokens))

    def action_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Restrict LM logits (..., V_padded) to the action slice (..., n_bins), indexed by bin."""
        return logits[..., self.first_token_id : self.vocab_size]


def select_norm_stats(norm_stats: Mapping[str, Any], unnorm_key: str | None) -> dict[str, Any]:
    """Pick one dataset's statistics from a checkpoint's ``norm_stats``.

    Args:
        norm_stats: ``{dataset_name: {"action": {"q01": [...], "q99": [...], "mask": [...]},
            "proprio": {...}}}`` as in ``dataset_statistics.json``.
        unnorm_key: dataset name; None is allowed when there is exactly one.

    Returns:
        The chosen dataset's dict.

    Raises:
        ValueError: no statistics, an ambiguous None key, or an unknown key (lists the valid ones).
    """
    if not norm_stats:
        raise ValueError(
            "The checkpoint has no norm_stats; add dataset_statistics.json to the checkpoint "
            "directory (or norm_stats to config.json)."
        )
    if unnorm_key is None:
        if len(norm_stats) != 1:
            raise ValueError(
                "The checkpoint has statistics for several datasets; set policy.unnorm_key to one "
                f"of {sorted(norm_stats)}."
            )
        unnorm_key = next(iter(norm_stats))
    if unnorm_key not in norm_stats:
        raise ValueError(
            f"policy.unnorm_key {unnorm_key!r} is not in the checkpoint's statistics; valid keys: "
            f"{sorted(norm_stats)}."
        )
    return dict(norm_stats[unnorm_key])


class ActionNormalizer:
    """BOUNDS_Q99 (un-)normalisation: ``a = 0.5 (a_norm + 1)(q99 - q01) + q01`` where mask is set.

    Dimensions whose mask is False (the gripper in OpenVLA's statistics) pass through unchanged.

    Args:
        q01: per-dimension 1st percentile, length A.
        q99: per-dimension 99th percentile, length A.
        mask: per-dimension bool, length A; None means all True.

    Raises:
        ValueError: if the lengths differ.
    """

    def __init__(
        self,
        q01: Sequence[float],
        q99: Sequence[float],
        mask: Sequence[bool] | None = None,
    ):
        self.q01 = torch.as_tensor(q01, dtype=torch.float32)
        self.q99 = torch.as_tensor(q99, dtype=torch.float32)
        self.mask = (
            torch.ones_like(self.q01, dtype=torch.bool)
            if mask is None
            else torch.as_tensor(mask, dtype=torch.bool)
        )
        if not (self.q01.shape == self.q99.shape == self.mask.shape) or self.q01.ndim != 1:
            raise ValueError(
                f"q01, q99 and mask must be 1-D of equal length (got {tuple(self.q01.shape)}, "
                f"{tuple(self.q99.shape)}, {tuple(self.mask.shape)})."
            )

    @classmethod
    def from_stats(cls, stats: Mapping[str, Any]) -> ActionNormalizer:
        """Build from one ``{"q01", "q99", "mask"?}`` dict of ``dataset_statistics.json``.

        Raises:
            ValueError: if q01 or q99 is missing.
        """
        for key in ("q01", "q99"):
            if key not in stats:
                raise ValueError(f"Normalisation statistics lack {key!r} (have {sorted(stats)}).")
        return cls(stats["q01"], stats["q99"], stats.get("mask"))

    @property
    def dim(self) -> int:
        """A (or S for proprio), the number of dimensions."""
        return int(self.q01.numel())

    def _check(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.dim:
            raise ValueError(
                f"Last dimension {x.shape[-1]} does not match the statistics' {self.dim}; the "
                "env's action/state layout differs from the checkpoint's dataset."
            )

    def unnormalize(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised (..., A) -> env units (..., A), float32, on ``x``'s device."""
        self._check(x)
        lo, hi, m = (t.to(x.device) for t in (self.q01, self.q99, self.mask))
        x = x.float()
        return torch.where(m, 0.5 * (x + 1.0) * (hi - lo) + lo, x)

    def normalize(self, x: torch.Tensor, clip: bool = True) -> torch.Tensor:
        """Env units (..., A) -> normalised (..., A), float32; the inverse of :meth:`unnormalize`.

        Used for OFT's proprio input (openvla-oft ``normalize_proprio``, clipped to [-1, 1]).
        The 1e-8 guard against q99 == q01 follows the OFT repo.
        """
        self._check(x)
        lo, hi, m = (t.to(x.device) for t in (self.q01, self.q99, self.mask))
        x = x.float()
        y = 2.0 * (x - lo) / (hi - lo + 1e-8) - 1.0
        if clip:
            y = y.clamp(-1.0, 1.0)
        return torch.where(m, y, x)


@dataclasses.dataclass(frozen=True)
class GripperConvention:
    """How the model's gripper output becomes the env's gripper command.

    Applied after un-normalisation, in this order (openvla_v1 protocol, REFERENCE.md; the
    OpenVLA/OFT LIBERO eval scripts ``normalize_gripper_action`` then ``invert_gripper_action``).

    Attributes:
        index: Position of the gripper in the action vector (-1: last).
        to_signed: Map [0, 1] to [-1, 1] (``2 g - 1``); OpenVLA emits 0 = close, 1 = open.
        binarize: Replace the value by its sign (0 stays 0).
        invert: Multiply by -1 (LIBERO: -1 open, +1 close, the opposite of OpenVLA's data).
    """

    index: int = -1
    to_signed: bool = False
    binarize: bool = False
    invert: bool = False

    @classmethod
    def libero(cls) -> GripperConvention:
        """The openvla_v1 LIBERO convention: signed, binarised, inverted."""
        return cls(index=-1, to_signed=True, binarize=True, invert=True)

    def apply(self, actions: torch.Tensor) -> torch.Tensor:
        """Return a copy of ``actions`` (..., A) with the gripper dimension converted."""
        if not (self.to_signed or self.binarize or self.invert):
            return actions
        out = actions.clone()
        g = out[..., self.index]
        if self.to_signed:
            g = 2.0 * g - 1.0
        if self.binarize:
            g = torch.sign(g)
        if self.invert:
            g = -g
        out[..., self.index] = g
        return out
