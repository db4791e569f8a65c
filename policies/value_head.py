"""Critic for VLA policies: an MLP on the LM hidden state at the first action readout position.

RL4VLA (PPO on ManiSkill3 with OpenVLA) puts the value head on the LM's hidden state and shares
the LoRA backbone between actor and critic; RLinf does the same for OpenVLA and OpenVLA-OFT.
The readout position is the one whose output predicts the first action token (the last prompt
token), so the value depends on the observation only, never on the sampled actions.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ValueHead"]


class ValueHead(nn.Module):
    """``Linear(D, H) -> GELU -> Linear(H, 1)``, computed in float32.

    The last layer starts at zero so that initial values are 0 and the first PPO updates are
    not dominated by a random critic.

    Args:
        hidden_dim: D, the LM hidden size (Llama-2 7B: 4096).
        mlp_dim: H, the width of the hidden layer.
    """

    def __init__(self, hidden_dim: int, mlp_dim: int = 1024):
        super().__init__()
        self.fc1 = nn.Linear(hidden_dim, mlp_dim)
        self.fc2 = nn.Linear(mlp_dim, 1)
        nn.init.zeros_(self.fc2.weight)
        nn.init.zeros_(self.fc2.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(N, D) hidden states (any float dtype) -> (N,) float32 values."""
        h = hidden.to(self.fc1.weight.dtype)
        return self.fc2(nn.functional.gelu(self.fc1(h))).squeeze(-1).float()
