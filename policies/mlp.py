"""``mlp``: actor-critic on state observations (N, S).

Gaussian head for Box actions (clip or tanh squash), categorical head for Discrete, 256x3 tanh
trunks by default, after ManiSkill3's state PPO baseline and CleanRL's
``ppo_continuous_action`` (orthogonal init, state-independent log-std).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from rlinf_embodied.policies.actor_critic import ActorCriticPolicy
from rlinf_embodied.policies.base import SpaceSpec, obs_tensor
from torch import nn

from rlinf_embodied.policies.configuration_actor_critic import MLPPolicyConfig

__all__ = ["MLPPolicy"]


class _StatesEncoder(nn.Module):
    """Passes ``states`` (N, S) through unchanged."""

    def forward(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return inputs["states"]


class MLPPolicy(ActorCriticPolicy):
    """State-based actor-critic (``policy.type: mlp``).

    Args:
        config: :class:`~rlinf_embodied.policies.configuration_actor_critic.MLPPolicyConfig`.
        spec: needs ``state_dim > 0``.

    Raises:
        ValueError: if the spec has no state observation.
    """

    config_class = MLPPolicyConfig

    def __init__(self, config: MLPPolicyConfig, spec: SpaceSpec):
        if spec.state_dim < 1:
            raise ValueError(
                "The mlp policy needs state observations (SpaceSpec.state_dim > 0); use an env "
                "obs mode with `states` or policy.type=cnn for images."
            )
        super().__init__(config, spec, _StatesEncoder(), spec.state_dim)

    def inputs_from_obs(self, obs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """``{"states": (N, S) float32}`` on the policy's device."""
        states = obs_tensor(
            obs, "states", self.device, torch.float32, "mlp", (self.spec.state_dim,)
        )
        return {"states": states}
