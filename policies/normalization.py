"""Running observation normalisation for state inputs (``policy.normalize_obs``).

``x -> clip((x - mean) / sqrt(var + eps), -clip, clip)`` per state dimension, with the mean
and variance of every state the policy has been trained on so far. This is the observation
normalisation of CleanRL's ``ppo_continuous_action`` (gymnasium's ``NormalizeObservation``)
and of Stable-Baselines3's ``VecNormalize`` (clip 10, eps 1e-8), moved into the policy: the
statistics are buffers of the model, so checkpoints, weight syncs and evaluation carry them,
and the rollout and actor workers always normalise with the same numbers.

When they change: :meth:`ObsNormalizer.update` runs after each policy update (see
:func:`rlinf_embodied.algorithms.update.update_policy`), on that update's batch. The rollout of
iteration k and the loss of iteration k therefore see the same statistics, so the importance
ratios of PPO start at exactly 1; the next rollout uses the refreshed ones. Before the first
update the statistics are mean 0 / variance 1 (the identity up to the clip).

Why it matters here: ManiSkill's state vectors mix joint angles (about 1 rad) with object and
goal positions that vary by a few centimetres; unnormalised, the cube-to-goal offset is a tiny
input signal. Measured on PushCube-v1 (16 envs): see docs/results.md.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ObsNormalizer"]


class ObsNormalizer(nn.Module):
    """Per-dimension running mean / variance of (N, S) inputs, applied in ``forward``.

    Buffers (float64, persistent, so in every state dict): ``mean`` (S,), ``var`` (S,),
    ``count`` () (number of rows seen).

    Args:
        dim: S, the state dimension.
        clip: normalised values are clipped to [-clip, clip] (SB3 ``VecNormalize`` default 10).
        eps: added to the variance before the square root (SB3 default 1e-8).
    """

    def __init__(self, dim: int, clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        self.clip, self.eps = float(clip), float(eps)
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, S) -> (N, S) normalised, in ``x``'s dtype."""
        mean = self.mean.to(device=x.device, dtype=x.dtype)
        std = torch.sqrt(self.var + self.eps).to(device=x.device, dtype=x.dtype)
        return torch.clamp((x - mean) / std, -self.clip, self.clip)

    @torch.no_grad()
    def update(self, x: torch.Tensor, all_reduce: bool = True) -> None:
        """Merge the rows of ``x`` (B, S) into the running statistics.

        Chan, Golub and LeVeque's parallel combination of (count, mean, M2) ("Algorithms for
        computing the sample variance", 1979): exact for any split of the data into batches.
        With ``all_reduce`` and an initialised ``torch.distributed`` process group of more
        than one rank, the batch moments are summed over ranks first, so every rank ends with
        the same statistics (each rank trains on its own envs' data).

        Raises:
            ValueError: if ``x`` is not (B, S) with S the normaliser's dimension.
        """
        if x.dim() != 2 or x.shape[1] != self.mean.shape[0]:
            raise ValueError(
                f"ObsNormalizer.update needs (B, S={self.mean.shape[0]}) states; got {tuple(x.shape)}."
            )
        x = x.detach().to(device=self.mean.device, dtype=torch.float64)
        moments = torch.stack([
            torch.full_like(self.mean, float(x.shape[0])), x.sum(0), (x * x).sum(0)
        ])
        if all_reduce and torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            torch.distributed.all_reduce(moments)
        n_b = moments[0, 0]
        if n_b <= 0:
            return
        mean_b = moments[1] / n_b
        var_b = torch.clamp(moments[2] / n_b - mean_b * mean_b, min=0.0)
        n_a = self.count
        total = n_a + n_b
        delta = mean_b - self.mean
        m2 = self.var * n_a + var_b * n_b + delta * delta * n_a * n_b / total
        self.mean.copy_(self.mean + delta * n_b / total)
        self.var.copy_(m2 / total)
        self.count.copy_(total)
