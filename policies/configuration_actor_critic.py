"""Configs of the small actor-critics (policies/mlp.py, policies/cnn.py), ``policy.type: mlp | cnn``.

Registered by type in :mod:`rlinf_embodied.config.components`; loaded lazily by the config loader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from rlinf_embodied.config import ConfigError, PolicyConfig


@dataclass
class ActorCriticPolicyConfig(PolicyConfig):
    """Fields shared by the small actor-critics (``mlp``, ``cnn``): MLP trunks on top of an
    observation encoder, a Gaussian (Box) or Categorical (Discrete) action head, a value head."""

    hidden_sizes: List[int] = field(default_factory=lambda: [256, 256, 256])
    """Widths of the actor (and critic) MLP trunk; ManiSkill's state PPO baseline uses 256x3."""
    activation: str = "tanh"
    """Trunk nonlinearity, ``tanh`` or ``relu`` (tanh in the ManiSkill/CleanRL state baselines)."""
    critic: bool = True
    """Build a value head; False for critic-free algorithms (GRPO, REINFORCE++)."""
    shared_critic: bool = False
    """Actor and critic share the MLP trunk (one network, two heads) instead of two trunks."""
    action_transform: str = "clip"
    """Box actions: ``clip`` the Gaussian sample to the bounds (log-prob of the unclipped
    sample) or squash it with ``tanh`` (log-prob with the tanh Jacobian). Needs finite bounds
    for ``tanh``."""
    normalize_obs: bool = False
    """Normalise ``states`` by their running mean and variance (clipped to +-10), refreshed after
    every policy update (policies/normalization.py; CleanRL / SB3 ``VecNormalize`` practice).
    Images are not normalised by it."""
    init_log_std: float = -0.5
    """Initial log standard deviation of the Gaussian in normalised [-1, 1] action units
    (ManiSkill PPO baseline: -0.5); learned, state-independent."""

    def __post_init__(self):
        super().__post_init__()
        if self.activation not in ("tanh", "relu"):
            raise ConfigError(f"policy.activation must be tanh or relu (got {self.activation!r}).")
        if self.action_transform not in ("clip", "tanh"):
            raise ConfigError(
                f"policy.action_transform must be clip or tanh (got {self.action_transform!r})."
            )
        if any(h < 1 for h in self.hidden_sizes):
            raise ConfigError(f"policy.hidden_sizes must be positive (got {self.hidden_sizes}).")


@dataclass
class MLPPolicyConfig(ActorCriticPolicyConfig):
    """Actor-critic on ``states`` (N, S) (policies/mlp.py)."""

    type: str = "mlp"
    """Selects policies/mlp.py."""


@dataclass
class CNNPolicyConfig(ActorCriticPolicyConfig):
    """Actor-critic on ``main_images`` (+ ``wrist_images``, + ``states``) (policies/cnn.py),
    after ManiSkill's RGB PPO baseline (NatureCNN encoder, 512-wide heads)."""

    type: str = "cnn"
    """Selects policies/cnn.py."""
    hidden_sizes: List[int] = field(default_factory=lambda: [512])
    """Widths of the actor (and critic) MLP on top of the encoder (ManiSkill RGB PPO: 512)."""
    activation: str = "relu"
    """Trunk nonlinearity, ``tanh`` or ``relu``."""
    conv_channels: List[int] = field(default_factory=lambda: [32, 64, 64])
    """Output channels per conv layer (NatureCNN, Mnih et al. 2015)."""
    conv_kernels: List[int] = field(default_factory=lambda: [8, 4, 3])
    """Kernel size per conv layer; same length as ``conv_channels``."""
    conv_strides: List[int] = field(default_factory=lambda: [4, 2, 1])
    """Stride per conv layer; same length as ``conv_channels``."""
    image_feature_dim: int = 256
    """Features per camera after the conv stack's linear projection."""
    state_feature_dim: int = 256
    """Features of the state encoder (one linear layer + ReLU)."""
    use_states: bool = True
    """Also encode ``states`` when the env provides them."""
    use_wrist_images: bool = True
    """Also encode ``wrist_images`` (own conv stack) when the env provides them."""

    def __post_init__(self):
        super().__post_init__()
        if self.image_feature_dim < 1:
            raise ConfigError(f"policy.image_feature_dim must be >= 1 (got {self.image_feature_dim}).")
        if self.state_feature_dim < 1:
            raise ConfigError(f"policy.state_feature_dim must be >= 1 (got {self.state_feature_dim}).")
        n = len(self.conv_channels)
        if n == 0 or len(self.conv_kernels) != n or len(self.conv_strides) != n:
            raise ConfigError(
                "policy.conv_channels, conv_kernels and conv_strides must be non-empty and of "
                f"equal length (got {self.conv_channels}, {self.conv_kernels}, "
                f"{self.conv_strides})."
            )

    def min_image_size(self) -> int:
        """Smallest square image side (pixels) the conv stack maps to at least 1x1 (the
        convs have no padding: side -> (side - kernel) // stride + 1); NatureCNN: 36."""
        need = 1
        for k, s in zip(reversed(self.conv_kernels), reversed(self.conv_strides)):
            need = (need - 1) * s + k
        return need

    def check_image_size(self, size: int, size_key: str) -> None:
        """Check that ``size`` x ``size`` images (the env's ``size_key`` setting, e.g.
        ``env.sensor_size``) keep at least 1x1 pixels through every conv layer; run before
        any worker builds the policy (``rlinf_embodied.runners.setup.validate_job``).

        Raises:
            ConfigError: naming the image size, the first layer whose input is smaller than
                its kernel, and the fix (a larger ``size_key`` or fewer / smaller layers).
        """
        side = int(size)
        n = len(self.conv_kernels)
        for i, (k, s) in enumerate(zip(self.conv_kernels, self.conv_strides)):
            if side < k:
                raise ConfigError(
                    f"{size_key}={size} gives {size}x{size} px images, too small for the cnn "
                    f"policy: conv layer {i + 1} of {n} (policy.conv_kernels[{i}]={k}, "
                    f"policy.conv_strides[{i}]={s}) gets {side}x{side} px, smaller than its "
                    f"kernel, so its output drops below 1 px; set {size_key} to at least "
                    f"{self.min_image_size()}, or use fewer layers or smaller kernels/strides "
                    f"(policy.conv_channels, policy.conv_kernels, policy.conv_strides)."
                )
            side = (side - k) // s + 1
