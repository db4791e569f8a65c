"""Small tensor helpers shared by the losses and the policies.

Log-prob granularity ("level") names the shape of a log-prob tensor over a batch of B queries:

- ``token``  (B, K, A): one entry per action dimension (a VLA action token, a Gaussian dim);
- ``action`` (B, K): one entry per action of the chunk (summed over A);
- ``chunk``  (B,): one entry per query (summed over K and A).

Coarser levels are sums of finer ones, because the dimensions of one action and the actions of
one chunk are sampled independently given the observation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["LEVELS", "expand_prefix", "level_ndim", "level_of", "masked_mean", "sum_to_level"]

LEVELS = ("token", "action", "chunk")
"""Valid log-prob granularities, finest first."""

_NDIM = {"token": 3, "action": 2, "chunk": 1}


def level_ndim(level: str) -> int:
    """Number of dims of a tensor at ``level`` including the batch dim (token 3, action 2, chunk 1).

    Raises:
        ValueError: for an unknown level, listing the valid ones.
    """
    if level not in _NDIM:
        raise ValueError(
            f"Unknown log-prob granularity {level!r}; use one of {', '.join(LEVELS)} "
            "(policy.logprob_granularity / algorithm.ratio_level)."
        )
    return _NDIM[level]


def level_of(x: torch.Tensor) -> str:
    """The granularity of a (B,), (B, K) or (B, K, A) tensor, from its number of dims.

    Raises:
        ValueError: if ``x`` has 0 or more than 3 dims.
    """
    for name, nd in _NDIM.items():
        if x.dim() == nd:
            return name
    raise ValueError(
        f"Expected log-probs of shape (B,), (B, K) or (B, K, A); got {tuple(x.shape)}. "
        "Flatten the (T, N) rollout dims into one batch dim first."
    )


def sum_to_level(x: torch.Tensor, level: str) -> torch.Tensor:
    """Sum a (B, K, A) / (B, K) / (B,) tensor over its dims finer than ``level``.

    Args:
        x: log-probs (or entropies) at ``level_of(x)``.
        level: target granularity; must not be finer than ``x``'s.

    Returns:
        ``x`` summed over the trailing dims beyond ``level_ndim(level)``.

    Raises:
        ValueError: if ``level`` is finer than ``x`` (per-token values cannot be recovered from
            per-action sums).
    """
    nd = level_ndim(level)
    if x.dim() < nd:
        raise ValueError(
            f"Cannot take {level}-level values from a tensor of shape {tuple(x.shape)} "
            f"({level_of(x)} level). Set policy.logprob_granularity to {level!r} or finer."
        )
    if x.dim() == nd:
        return x
    return x.sum(dim=tuple(range(nd, x.dim())))


def expand_prefix(x: torch.Tensor, shape: Sequence[int], name: str = "tensor") -> torch.Tensor:
    """Broadcast ``x`` whose shape is a prefix of ``shape`` (e.g. (B,) to (B, K, A)).

    Raises:
        ValueError: if ``x.shape`` is not a prefix of ``shape``.
    """
    shape = tuple(shape)
    if tuple(x.shape) != shape[: x.dim()]:
        raise ValueError(
            f"{name} of shape {tuple(x.shape)} does not match the leading dims of {shape}; "
            f"pass it per query (B,) or with the same leading dims."
        )
    return x.reshape(tuple(x.shape) + (1,) * (len(shape) - x.dim())).expand(shape)


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of ``x`` over entries where ``mask`` is true (all entries when ``mask`` is None).

    Args:
        x: any shape.
        mask: bool or 0/1 tensor whose shape is a prefix of ``x.shape``; None keeps all.

    Returns:
        A scalar tensor; 0 when no entry is valid (so an all-masked micro-batch adds nothing).
    """
    if mask is None:
        return x.mean()
    m = expand_prefix(mask, x.shape, "mask").to(x.dtype)
    return (x * m).sum() / m.sum().clamp_min(1.0)


def group_index(groups, n: int, device=None) -> tuple[torch.Tensor, int]:
    """Dense group index of each of ``n`` rollouts.

    Args:
        groups: an int G (rollouts ``[g*G, (g+1)*G)`` share an initial state; ``n`` must be a
            multiple of G) or a (n,) integer tensor of arbitrary group ids.
        n: number of rollouts N.
        device: device of the returned index.

    Returns:
        ``(index (N,) int64 in [0, M), M)`` where M is the number of groups.

    Raises:
        ValueError: if N is not a multiple of G, or the id tensor has the wrong shape.
    """
    if isinstance(groups, int):
        if groups < 1 or n % groups != 0:
            raise ValueError(
                f"Number of rollouts N={n} must be a positive multiple of the group size "
                f"G={groups}; set env.num_envs to a multiple of algorithm.group_size."
            )
        return torch.arange(n, device=device) // groups, n // groups
    ids = torch.as_tensor(groups, device=device)
    if ids.shape != (n,):
        raise ValueError(f"Group ids must have shape (N,)=({n},); got {tuple(ids.shape)}.")
    uniq, inverse = torch.unique(ids, return_inverse=True)
    return inverse, int(uniq.numel())


def group_mean(
    x: torch.Tensor, index: torch.Tensor, num_groups: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group mean of ``x`` (N,) broadcast back to (N,), and the group sizes (N,)."""
    counts = torch.zeros(num_groups, dtype=x.dtype, device=x.device).index_add_(
        0, index, torch.ones_like(x)
    )
    sums = torch.zeros(num_groups, dtype=x.dtype, device=x.device).index_add_(0, index, x)
    return (sums / counts)[index], counts[index]
