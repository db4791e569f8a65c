"""Config of the ManiSkill3 adapter (envs/maniskill.py), ``env.type: maniskill``.

Registered by type in :mod:`rlinf_embodied.config.components`; loaded lazily by the config loader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rlinf_embodied.config import ConfigError, EnvConfig


@dataclass
class ManiSkillEnvConfig(EnvConfig):
    """ManiSkill3 task (SAPIEN). GPU physics on CUDA machines, physx_cpu processes otherwise."""

    type: str = "maniskill"
    env_id: str = "PushCube-v1"
    """Any registered ManiSkill3 env id."""
    obs_mode: str = "state"
    """``state`` or ``rgb``."""
    control_mode: str = "pd_joint_delta_pos"
    """ManiSkill controller (the ManiSkill PPO baseline uses pd_joint_delta_pos)."""
    reward_mode: str = "normalized_dense"
    """``sparse``, ``dense`` or ``normalized_dense``."""
    sensor_size: int = 128
    """Camera width and height in pixels for ``obs_mode=rgb``."""
    sim_backend: str = "auto"
    """``auto`` (GPU when CUDA is available), ``physx_cpu`` or ``physx_cuda``."""
    render_images: bool = False
    """With ``obs_mode=state``, also render ManiSkill's human camera into ``main_images``
    (``sensor_size`` pixels) so state policies get videos; costs a CPU render per step."""
    task_description: Optional[str] = None
    """Language instruction; None uses the per-task table."""

    def check_available(self) -> None:
        """``env_id`` is a registered ManiSkill3 env.

        Raises:
            ConfigError: for an unknown id (with the closest registered ones).
        """
        import mani_skill.envs  # noqa: F401 - registers the ManiSkill envs with gymnasium

        from rlinf_embodied.config import check_registered_env_id

        check_registered_env_id(
            self.env_id, "ManiSkill3",
            ".venv/bin/python -c \"import mani_skill.envs, gymnasium; print(sorted(gymnasium.registry))\"")

    def __post_init__(self):
        super().__post_init__()
        if self.sensor_size < 1:
            raise ConfigError(f"env.sensor_size must be >= 1 (got {self.sensor_size}).")
        if self.obs_mode not in ("state", "rgb"):
            raise ConfigError(f"env.obs_mode must be state or rgb (got {self.obs_mode!r}).")
        if self.sim_backend not in ("auto", "physx_cpu", "physx_cuda"):
            raise ConfigError(
                f"env.sim_backend must be auto, physx_cpu or physx_cuda (got {self.sim_backend!r})."
            )
