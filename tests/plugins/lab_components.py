"""A user's own policy and env types, outside the package: used by tests/test_components.py
through ``policy.type`` / ``env.type`` = ``tests.plugins.lab_components:Class`` (config alone,
no registration)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from rlinf_embodied.envs.base import EnvSpec, Transition, reset_transition
from rlinf_embodied.envs.configuration_gym import GymEnvConfig
from rlinf_embodied.envs.gymnasium_env import GymnasiumEnv, GymSubBatch
from rlinf_embodied.policies.configuration_actor_critic import MLPPolicyConfig
from rlinf_embodied.policies.mlp import MLPPolicy


@dataclass
class ScaledMLPPolicyConfig(MLPPolicyConfig):
    """MLP policy whose Box actions are multiplied by ``action_scale``."""

    type: str = "tests.plugins.lab_components:ScaledMLPPolicy"
    action_scale: float = 0.5
    """Factor applied to every action (env units)."""


class ScaledMLPPolicy(MLPPolicy):
    config_class = ScaledMLPPolicyConfig

    def act(self, obs, mode="sample"):
        out = super().act(obs, mode)
        out.actions = out.actions * self.config.action_scale
        return out


@dataclass
class SpareLayerMLPPolicyConfig(MLPPolicyConfig):
    """MLP policy with one layer that no loss reaches."""

    type: str = "tests.plugins.lab_components:SpareLayerMLPPolicy"


class SpareLayerMLPPolicy(MLPPolicy):
    """An MLP policy holding a layer that nothing computes with, as a Prismatic ViT's last block
    (features come from the second-to-last): its parameters never get a gradient, so Adam keeps
    no state for them."""

    config_class = SpareLayerMLPPolicyConfig

    def __init__(self, config, spec):
        super().__init__(config, spec)
        self.spare = torch.nn.Linear(2, 2)


@dataclass
class FixedGoalEnvConfig(GymEnvConfig):
    """The toy PointReach env with its success radius set by config."""

    type: str = "tests.plugins.lab_components:FixedGoalEnv"
    env_id: str = "toy/PointReach-v0"
    goal_radius: float = 0.2
    """Success radius, passed to the env as ``kwargs["radius"]``."""


class FixedGoalEnv(GymnasiumEnv):
    config_class = FixedGoalEnvConfig

    def __init__(self, cfg: FixedGoalEnvConfig):
        super().__init__(dataclasses.replace(cfg, kwargs={**cfg.kwargs, "radius": cfg.goal_radius}))


@dataclass
class CameraReachEnvConfig(GymEnvConfig):
    """The toy PointReach env (2-D) seen by a camera that the adapter renders itself."""

    type: str = "tests.plugins.lab_components:CameraReachEnv"
    env_id: str = "toy/PointReach-v0"
    image_size: int = 16
    """Side of the rendered (image_size, image_size, 3) uint8 main image, in pixels."""


class CameraReachSubBatch(GymSubBatch):
    """A SubBatch whose observations cost a render: ``main_images`` (M, H, W, 3) uint8, the point
    white and the target red on black, drawn from each env's state (pos (2), target (2) in
    [-1, 1]). It implements the optional pair: ``step_unobserved`` steps without rendering
    (``obs == {}``; the inner steps of an action chunk), ``observe`` renders the current state
    (for an episode that ended inside a chunk). ``renders`` counts images drawn in this process.
    """

    renders = 0

    def __init__(self, cfg: CameraReachEnvConfig, env_ids, device=None):
        super().__init__(cfg, env_ids, device)
        self._size = cfg.image_size
        self._states = np.zeros((len(env_ids), 4), np.float32)
        base = super().spec
        self._camera_spec = EnvSpec(base.action, {**base.obs_shapes, "main_images": (self._size,) * 2 + (3,)},
                                    base.max_episode_steps)

    @property
    def spec(self) -> EnvSpec:
        return self._camera_spec

    def _render(self, local_ids) -> np.ndarray:
        type(self).renders += len(local_ids)
        images = np.zeros((len(local_ids), self._size, self._size, 3), np.uint8)
        for row, i in enumerate(local_ids):
            (px, py), (tx, ty) = np.clip((self._states[i].reshape(2, 2) + 1) / 2 * (self._size - 1), 0,
                                         self._size - 1).round().astype(int)
            images[row, ty, tx, 0] = 255
            images[row, py, px] = 255
        return images

    def _observed(self, local_ids, tr: Transition) -> Transition:
        self._states[local_ids] = tr.obs["states"]
        return dataclasses.replace(tr, obs={**tr.obs, "main_images": self._render(local_ids)})

    def reset(self, local_ids, seeds, options) -> Transition:
        return self._observed(local_ids, super().reset(local_ids, seeds, options))

    def step(self, local_ids, actions) -> Transition:
        return self._observed(local_ids, super().step(local_ids, actions))

    def step_unobserved(self, local_ids, actions) -> Transition:
        tr = super().step(local_ids, actions)
        self._states[local_ids] = tr.obs["states"]
        return dataclasses.replace(tr, obs={})

    def observe(self, local_ids) -> Transition:
        obs = {"states": self._states[local_ids].copy(), "main_images": self._render(local_ids)}
        return reset_transition(obs, [self._task] * len(local_ids))  # zero reward, no flags


class CameraReachEnv(GymnasiumEnv):
    """``env.type=tests.plugins.lab_components:CameraReachEnv``: N CameraReach envs, in-process
    (``env.vectorization=sync``) or in ``env.num_processes`` pool workers."""

    config_class = CameraReachEnvConfig
    sub_batch_class = CameraReachSubBatch
