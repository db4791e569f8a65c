"""A state policy whose cost grows with the batch like a VLA's: the benchmarks' stand-in for a
heavy model (``policy.type: benchmarks.token_policy:TokenMLPPolicy``).

Each observation (N, S) is projected to ``num_tokens`` tokens of width ``token_width``, which a
residual per-token MLP of ``token_layers`` layers processes; the mean token feeds the usual
actor/critic trunks of :class:`~rlinf_embodied.policies.mlp.MLPPolicy`. The forward costs about
``2 * N * num_tokens * token_layers * token_width**2`` FLOPs on weights that stay in cache, so it
is compute-bound and proportional to N, as a transformer over N x tokens is. A wide plain MLP is
not: at width 2048 its 50 MB of weights are streamed from memory once per forward whatever N is
(measured on the CI machine: 21 ms at N=8, 28 ms at N=16), which caps what two pipeline stages
can gain at (E + F) / max(E, 2F) <= 1.5 for env time E and forward time F.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from rlinf_embodied.policies.actor_critic import ActorCriticPolicy
from rlinf_embodied.policies.configuration_actor_critic import MLPPolicyConfig
from rlinf_embodied.policies.mlp import MLPPolicy

__all__ = ["TokenMLPPolicy", "TokenMLPPolicyConfig"]


@dataclass
class TokenMLPPolicyConfig(MLPPolicyConfig):
    """MLP policy with a per-token encoder (benchmarks/token_policy.py)."""

    type: str = "benchmarks.token_policy:TokenMLPPolicy"
    num_tokens: int = 16
    """Tokens per observation (L)."""
    token_width: int = 256
    """Width of every token (D)."""
    token_layers: int = 4
    """Residual per-token layers; the knob the benchmarks calibrate."""


class _TokenEncoder(nn.Module):
    """(N, S) states -> (N, D): tokens (N, L, D), residual ReLU layers, mean over L."""

    def __init__(self, state_dim: int, cfg: TokenMLPPolicyConfig):
        super().__init__()
        self.num_tokens, self.width = cfg.num_tokens, cfg.token_width
        self.embed = nn.Linear(state_dim, cfg.num_tokens * cfg.token_width)
        self.layers = nn.ModuleList(nn.Linear(cfg.token_width, cfg.token_width) for _ in range(cfg.token_layers))
        for layer in self.layers:  # small residual updates keep the features bounded
            nn.init.normal_(layer.weight, std=0.1 / cfg.token_width ** 0.5)
            nn.init.zeros_(layer.bias)

    def forward(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        x = self.embed(inputs["states"]).view(-1, self.num_tokens, self.width)
        for layer in self.layers:
            x = x + torch.relu(layer(x))
        return x.mean(dim=1)


class TokenMLPPolicy(MLPPolicy):
    """:class:`MLPPolicy` on top of a per-token encoder whose cost is linear in N."""

    config_class = TokenMLPPolicyConfig

    def __init__(self, config: TokenMLPPolicyConfig, spec):
        if spec.state_dim < 1:
            raise ValueError("TokenMLPPolicy needs state observations (SpaceSpec.state_dim > 0).")
        ActorCriticPolicy.__init__(self, config, spec, _TokenEncoder(spec.state_dim, config), config.token_width)
