"""Batch filters: pure functions returning a keep mask over rollouts, registered by name."""

from __future__ import annotations

import torch

from rlinf_embodied.algorithms.registry import register_filter
from rlinf_embodied.algorithms.utils import group_index, group_mean

__all__ = ["dynamic_sampling"]


@register_filter("dynamic_sampling")
def dynamic_sampling(
    success: torch.Tensor,
    groups: int | torch.Tensor,
    *,
    low: float = 0.1,
    high: float = 0.9,
) -> torch.Tensor:
    """GRPO dynamic sampling: keep only the groups whose success rate lies in [low, high].

    A group where every rollout succeeds (or every one fails) has zero group-relative advantage
    and only dilutes the batch (DAPO, Yu et al. 2025, section 3.2; SimpleVLA-RL keeps groups
    with success rate in [0.1, 0.9], see REFERENCE.md "RL recipes").

    Args:
        success: (N,) bool or float in [0, 1], the outcome of each rollout.
        groups: int G (consecutive blocks of G rollouts) or (N,) integer group ids.
        low: smallest success rate kept (inclusive).
        high: largest success rate kept (inclusive).

    Returns:
        (N,) bool keep mask, constant within each group.

    Raises:
        ValueError: if ``low > high``, ``success`` is not (N,), or N is not a multiple of G.
    """
    if low > high:
        raise ValueError(f"algorithm.filter_low ({low}) must be <= algorithm.filter_high ({high}).")
    if success.dim() != 1:
        raise ValueError(f"success must be (N,); got {tuple(success.shape)}.")
    rate = success.to(torch.float64)
    index, num_groups = group_index(groups, rate.shape[0], rate.device)
    mean, _ = group_mean(rate, index, num_groups)
    return (mean >= low) & (mean <= high)
