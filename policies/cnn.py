"""``cnn``: actor-critic on camera images (+ states), after ManiSkill3's RGB PPO baseline.

Each camera (``main_images``, and ``wrist_images`` when the env has them) goes through its own
NatureCNN-style conv stack (Mnih et al. 2015: 32/64/64 channels, kernels 8/4/3, strides 4/2/1)
and a linear projection; ``states`` go through one linear layer; the features are
concatenated and feed the actor/critic MLPs of :class:`ActorCriticPolicy`. Images arrive as
uint8 NHWC and are scaled to [0, 1] floats in NCHW inside the network, so ``forward_inputs``
stay uint8 (4x smaller rollout buffers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from rlinf_embodied.policies.actor_critic import ActorCriticPolicy
from rlinf_embodied.policies.base import SpaceSpec, obs_tensor
from torch import nn

from rlinf_embodied.policies.configuration_actor_critic import CNNPolicyConfig

__all__ = ["CNNPolicy"]

_CAMERAS = {"main_images": "image_shape", "wrist_images": "wrist_image_shape"}
"""Observation key -> SpaceSpec field of its shape."""


class _ConvEncoder(nn.Module):
    """uint8 (N, H, W, 3) images -> (N, out_dim) features."""

    def __init__(self, image_shape: Sequence[int], config: CNNPolicyConfig):
        super().__init__()
        layers: list[nn.Module] = []
        in_ch = image_shape[2]
        for ch, k, s in zip(config.conv_channels, config.conv_kernels, config.conv_strides):
            layers += [nn.Conv2d(in_ch, ch, kernel_size=k, stride=s), nn.ReLU()]
            in_ch = ch
        self.convs = nn.Sequential(*layers, nn.Flatten())
        h, w = image_shape[0], image_shape[1]
        try:
            with torch.no_grad():
                flat = self.convs(torch.zeros(1, image_shape[2], h, w)).shape[1]
        except RuntimeError as e:
            raise ValueError(
                f"Images of {h}x{w} are too small for the conv stack (kernels "
                f"{config.conv_kernels}, strides {config.conv_strides}); render larger images or "
                f"set smaller policy.conv_kernels / conv_strides. ({e})"
            ) from None
        self.project = nn.Sequential(nn.Linear(flat, config.image_feature_dim), nn.ReLU())

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.permute(0, 3, 1, 2).to(torch.float32) / 255.0
        return self.project(self.convs(x))


class _ImageStateEncoder(nn.Module):
    """Concatenated features of every used camera and (optionally) the states."""

    def __init__(self, config: CNNPolicyConfig, spec: SpaceSpec):
        super().__init__()
        self.cameras = nn.ModuleDict()
        for key, shape_field in _CAMERAS.items():
            shape = getattr(spec, shape_field)
            if shape is not None and (key == "main_images" or config.use_wrist_images):
                self.cameras[key] = _ConvEncoder(shape, config)
        self.feature_dim = config.image_feature_dim * len(self.cameras)
        self.states = None
        if config.use_states and spec.state_dim > 0:
            self.states = nn.Sequential(
                nn.Linear(spec.state_dim, config.state_feature_dim), nn.ReLU()
            )
            self.feature_dim += config.state_feature_dim

    def forward(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        feats = [enc(inputs[key]) for key, enc in self.cameras.items()]
        if self.states is not None:
            feats.append(self.states(inputs["states"]))
        return torch.cat(feats, dim=-1)


class CNNPolicy(ActorCriticPolicy):
    """Image-based actor-critic (``policy.type: cnn``).

    Args:
        config: :class:`~rlinf_embodied.policies.configuration_actor_critic.CNNPolicyConfig`.
        spec: needs ``image_shape``; ``wrist_image_shape`` and ``state_dim`` are used when set
            (and enabled in the config).

    Raises:
        ValueError: if the spec has no main camera or the images are too small.
    """

    config_class = CNNPolicyConfig

    def __init__(self, config: CNNPolicyConfig, spec: SpaceSpec):
        if spec.image_shape is None:
            raise ValueError(
                "The cnn policy needs `main_images` (SpaceSpec.image_shape); give the env images "
                "(ManiSkill/LIBERO: env.obs_mode=rgb; gym: map a Dict image key with "
                "env.image_keys={KEY: main_images}) or use policy.type=mlp for states."
            )
        encoder = _ImageStateEncoder(config, spec)
        super().__init__(config, spec, encoder, encoder.feature_dim)

    def inputs_from_obs(self, obs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """uint8 images (and float32 ``states``) on the policy's device."""
        inputs = {
            key: obs_tensor(
                obs, key, self.device, torch.uint8, "cnn", getattr(self.spec, _CAMERAS[key])
            )
            for key in self.encoder.cameras
        }
        if self.encoder.states is not None:
            inputs["states"] = obs_tensor(
                obs, "states", self.device, torch.float32, "cnn", (self.spec.state_dim,)
            )
        return inputs
