"""A user's own policy and env type, outside the package: used by tests/test_components.py
through ``policy.type`` / ``env.type`` = ``tests.plugins.lab_components:Class`` (config alone,
no registration)."""

from __future__ import annotations

from dataclasses import dataclass

from rlinf_embodied.envs.configuration_gym import GymEnvConfig
from rlinf_embodied.envs.gymnasium_env import GymnasiumEnv
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
class FixedGoalEnvConfig(GymEnvConfig):
    """The toy PointReach env with its success radius set by config."""

    type: str = "tests.plugins.lab_components:FixedGoalEnv"
    env_id: str = "toy/PointReach-v0"
    goal_radius: float = 0.2
    """Success radius, passed to the env as ``kwargs["radius"]``."""


class FixedGoalEnv(GymnasiumEnv):
    config_class = FixedGoalEnvConfig

    def __init__(self, cfg: FixedGoalEnvConfig):
        import dataclasses

        super().__init__(dataclasses.replace(cfg, kwargs={**cfg.kwargs, "radius": cfg.goal_radius}))
