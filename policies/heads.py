"""Building blocks of the small actor-critics: initialisation, MLP trunks and action heads.

An action head maps features (N, F) to a distribution over a chunk of K actions and exposes
per-token log-probs (N, K, A) so that any granularity can be summed from them. ``samples`` are
the head's own draws (pre-clip/pre-squash Gaussian values, or category indices); actions are
``samples`` mapped into env units.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from rlinf_embodied.policies.base import SpaceSpec
from torch import nn

__all__ = ["CategoricalHead", "GaussianHead", "layer_init", "make_action_head", "make_mlp"]

ROOT2 = math.sqrt(2.0)
"""Orthogonal-init gain of hidden layers (CleanRL ppo_continuous_action / ManiSkill PPO)."""

_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


def layer_init(layer: nn.Linear, gain: float = ROOT2, bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights with ``gain``, constant bias (Engstrom et al. 2020 "Implementation
    Matters", as used by the CleanRL and ManiSkill PPO baselines)."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


def make_mlp(in_dim: int, hidden_sizes: Sequence[int], activation: str) -> tuple[nn.Module, int]:
    """Linear + activation layers of the given widths (orthogonally initialised).

    Returns:
        ``(module, out_dim)``; an empty ``hidden_sizes`` gives ``nn.Identity`` and ``in_dim``.
    """
    layers = []
    for width in hidden_sizes:
        layers += [layer_init(nn.Linear(in_dim, width)), _ACTIVATIONS[activation]()]
        in_dim = width
    return (nn.Sequential(*layers) if layers else nn.Identity()), in_dim


class GaussianHead(nn.Module):
    """Diagonal Gaussian over K*A normalised action dims with a learned, state-independent
    log standard deviation (CleanRL ``ppo_continuous_action``; ManiSkill PPO baseline).

    The Gaussian lives in normalised units where the Box maps to [-1, 1] per finite dim
    (``a_env = center + scale * a``; unbounded dims are left as is). ``transform``:

    - ``clip``: ``a = clip(u, -1, 1)``; the log-prob is that of the unclipped sample ``u``
      (the usual PPO practice), so ``u`` must be kept for re-evaluation.
    - ``tanh``: ``a = tanh(u)``; ``log p(a) = log N(u) - sum log(1 - tanh(u)^2)`` (change of
      variables, Haarnoja et al. 2018 "Soft Actor-Critic", appendix C). The constant
      ``log scale`` of the affine map to env units is omitted (it cancels in every ratio).
      Entropy is the base Gaussian's (the squashed one has no closed form).

    Greedy actions map the mean ``mu`` through the same transform.
    """

    def __init__(self, in_dim: int, chunk: int, low, high, transform: str, init_log_std: float):
        super().__init__()
        low = torch.as_tensor(low, dtype=torch.float32)
        high = torch.as_tensor(high, dtype=torch.float32)
        finite = torch.isfinite(low) & torch.isfinite(high)
        if transform == "tanh" and not bool(finite.all()):
            raise ValueError(
                f"policy.action_transform=tanh needs finite action bounds (got low {low.tolist()}, "
                f"high {high.tolist()}); use action_transform=clip or bound the action space."
            )
        self.chunk, self.dim, self.transform = chunk, low.numel(), transform
        self.mean = layer_init(nn.Linear(in_dim, chunk * self.dim), gain=0.01 * ROOT2)
        self.log_std = nn.Parameter(torch.full((chunk * self.dim,), float(init_log_std)))
        zero, one = torch.zeros_like(low), torch.ones_like(low)
        self.register_buffer(
            "center", torch.where(finite, (high + low) / 2, zero), persistent=False
        )
        self.register_buffer("scale", torch.where(finite, (high - low) / 2, one), persistent=False)
        inf = torch.full_like(low, math.inf)
        self.register_buffer("lo", torch.where(finite, -one, -inf), persistent=False)
        self.register_buffer("hi", torch.where(finite, one, inf), persistent=False)

    def _params(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (features.shape[0], self.chunk, self.dim)
        mu = self.mean(features).view(shape)
        return mu, self.log_std.view(1, self.chunk, self.dim).expand(shape)

    def _log_prob(self, mu, log_std, u) -> torch.Tensor:
        logp = -0.5 * ((u - mu) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
        if self.transform == "tanh":
            # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), stable for large |u|.
            logp = logp - 2.0 * (math.log(2.0) - u - nn.functional.softplus(-2.0 * u))
        return logp

    def to_env(self, u: torch.Tensor) -> torch.Tensor:
        """(N, K, A) samples -> env-unit actions."""
        a = torch.tanh(u) if self.transform == "tanh" else torch.clamp(u, self.lo, self.hi)
        return self.center + self.scale * a

    def samples_from_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Env-unit actions (N, K, A) -> samples ``u`` (clipped actions stay clipped)."""
        a = (actions.to(self.scale.dtype) - self.center) / self.scale
        if self.transform == "tanh":
            return torch.atanh(a.clamp(-1 + 1e-6, 1 - 1e-6))
        return a

    def sample(self, features: torch.Tensor, greedy: bool):
        """Returns ``(actions (N, K, A) env units, samples (N, K, A), logp (N, K, A))``."""
        mu, log_std = self._params(features)
        u = mu if greedy else mu + log_std.exp() * torch.randn_like(mu)
        return self.to_env(u), u, self._log_prob(mu, log_std, u)

    def log_prob(self, features: torch.Tensor, samples: torch.Tensor):
        """Returns ``(logp (N, K, A), entropy (N, K, A))`` of ``samples``."""
        mu, log_std = self._params(features)
        entropy = 0.5 + 0.5 * math.log(2 * math.pi) + log_std
        return self._log_prob(mu, log_std, samples.to(mu.dtype)), entropy


class CategoricalHead(nn.Module):
    """Independent categorical over ``n`` choices for each of K chunk steps (Discrete, A = 1).
    Samples are int64 indices (N, K, 1), identical to the env-unit actions."""

    def __init__(self, in_dim: int, chunk: int, n: int):
        super().__init__()
        self.chunk, self.n = chunk, n
        self.logits = layer_init(nn.Linear(in_dim, chunk * n), gain=0.01)

    def _log_softmax(self, features: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.logits(features).view(-1, self.chunk, self.n), dim=-1)

    def to_env(self, samples: torch.Tensor) -> torch.Tensor:
        return samples

    def samples_from_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return actions.long()

    def sample(self, features: torch.Tensor, greedy: bool):
        """Returns ``(actions (N, K, 1) int64, samples (N, K, 1) int64, logp (N, K, 1))``."""
        logp_all = self._log_softmax(features)
        if greedy:
            idx = logp_all.argmax(-1, keepdim=True)
        else:
            idx = torch.multinomial(logp_all.exp().flatten(0, 1), 1).view(-1, self.chunk, 1)
        return idx, idx, logp_all.gather(-1, idx)

    def log_prob(self, features: torch.Tensor, samples: torch.Tensor):
        """Returns ``(logp (N, K, 1), entropy (N, K, 1))`` of ``samples`` (N, K, 1)."""
        logp_all = self._log_softmax(features)
        entropy = -(logp_all.exp() * logp_all).sum(-1, keepdim=True)
        return logp_all.gather(-1, samples.long()), entropy


def make_action_head(in_dim: int, spec: SpaceSpec, config) -> nn.Module:
    """A :class:`CategoricalHead` for a Discrete spec, else a :class:`GaussianHead`."""
    if spec.discrete:
        return CategoricalHead(in_dim, config.action_chunk, spec.action_n)
    return GaussianHead(
        in_dim,
        config.action_chunk,
        spec.action_low,
        spec.action_high,
        config.action_transform,
        config.init_log_std,
    )
