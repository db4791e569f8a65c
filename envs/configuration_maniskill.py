"""Config of the ManiSkill3 adapter (envs/maniskill.py), ``env.type: maniskill``.

Registered by type in :mod:`rlinf_embodied.config.components`; loaded lazily by the config loader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

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
    suite: Optional[str] = None
    """A language-conditioned suite of several tasks (envs/maniskill_suites.py, e.g.
    ``maniskill_lang3``): every env serves a mix of the suite's tasks with the suite's camera,
    8-dim proprio ``states`` and instructions; ``env_id`` and ``task_description`` are then
    unused. None: the single task ``env_id``."""
    task_ids: Optional[List[int]] = None
    """Tasks of ``suite`` (indices into its task list) the envs serve; a seeded reset picks
    ``task_ids[seed % len(task_ids)]``. None: every task of the suite."""

    def suite_spec(self):
        """The :class:`~rlinf_embodied.envs.maniskill_suites.ManiSkillSuite` of ``suite``, or None."""
        if self.suite is None:
            return None
        from rlinf_embodied.envs.maniskill_suites import get_suite

        return get_suite(self.suite)

    def suite_task_ids(self) -> List[int]:
        """``task_ids``, or every task of the suite when None ([] without a suite)."""
        suite = self.suite_spec()
        if suite is None:
            return []
        return list(self.task_ids) if self.task_ids is not None else list(range(len(suite.tasks)))

    def env_ids(self) -> List[str]:
        """The env ids this config runs: the suite's selected tasks, or ``[env_id]``."""
        suite = self.suite_spec()
        if suite is None:
            return [self.env_id]
        return [suite.tasks[t].env_id for t in self.suite_task_ids()]

    def check_available(self) -> None:
        """``env_id`` is a registered ManiSkill3 env.

        Raises:
            ConfigError: for an unknown id (with the closest registered ones).
        """
        import mani_skill.envs  # noqa: F401 - registers the ManiSkill envs with gymnasium

        from rlinf_embodied.config import check_registered_env_id

        for env_id in self.env_ids():
            check_registered_env_id(env_id, "ManiSkill3", imports="mani_skill.envs, gymnasium")

    def __post_init__(self):
        super().__post_init__()
        if self.sensor_size < 1:
            raise ConfigError(f"env.sensor_size must be >= 1 (got {self.sensor_size}).")
        if self.obs_mode not in ("state", "rgb"):
            raise ConfigError(f"env.obs_mode must be state or rgb (got {self.obs_mode!r}).")
        if "pd_" not in self.control_mode:
            # every ManiSkill3 robot's controller names a PD controller (pd_joint_delta_pos,
            # pd_ee_delta_pose, base_pd_joint_vel_arm_pd_joint_pos, ...): agents/robots/*.py
            raise ConfigError(
                f"env.control_mode {self.control_mode!r} is not a ManiSkill3 controller; they are "
                "named pd_* (e.g. pd_joint_delta_pos, pd_ee_delta_pose; a robot's own list is its "
                "agent's supported_control_modes).")
        if self.sim_backend not in ("auto", "physx_cpu", "physx_cuda"):
            raise ConfigError(
                f"env.sim_backend must be auto, physx_cpu or physx_cuda (got {self.sim_backend!r})."
            )
        if self.suite is not None:
            try:
                suite = self.suite_spec()
            except ValueError as e:
                raise ConfigError(f"env.suite: {e}") from None
            if self.obs_mode != "rgb":
                raise ConfigError(f"env.suite={self.suite} gives camera images; set env.obs_mode=rgb "
                                  f"(got {self.obs_mode!r}).")
            bad = [t for t in (self.task_ids or []) if not 0 <= t < len(suite.tasks)]
            if bad or self.task_ids == []:
                raise ConfigError(f"env.task_ids {self.task_ids} must be non-empty indices into "
                                  f"suite {self.suite}: {suite.listing()}.")
            if self.task_ids and len(set(self.task_ids)) < len(self.task_ids):
                raise ConfigError(f"env.task_ids {self.task_ids} names a task twice (a task's share "
                                  f"of resets would double); set each once, e.g. "
                                  f"{sorted(set(self.task_ids))}.")
        elif self.task_ids is not None:
            raise ConfigError("env.task_ids selects tasks of env.suite; set env.suite (e.g. "
                              "maniskill_lang3) or remove env.task_ids.")
