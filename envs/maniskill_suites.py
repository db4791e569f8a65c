"""Language-conditioned ManiSkill3 suites: several tasks served by one env, as LIBERO suites are.

A :class:`ManiSkillSuite` names ManiSkill3 tasks that have a motion-planning solution (so that
demonstrations can be recorded), gives each a natural-language instruction, and fixes what a
VLA sees in every task alike:

* ``main_images``: one camera (:attr:`ManiSkillSuite.camera_eye` looking at
  :attr:`ManiSkillSuite.camera_target`, field of view :attr:`ManiSkillSuite.camera_fov`), the
  same pose in every task, so that the tasks differ by what is on the table and by the
  instruction, not by the viewpoint (ManiSkill's own task cameras differ: PullCube-v1 looks
  from behind the robot);
* ``states``: 8-dim proprioception in OpenVLA-OFT's LIBERO layout (:func:`suite_states`):
  TCP position (3), axis-angle of the TCP orientation relative to the gripper-down rest
  orientation (3), the two finger joint positions (2);
* ``task_descriptions``: the task's instruction.

Env config (``env.type: maniskill``): ``env.suite`` selects a suite, ``env.task_ids`` its tasks
(indices into :attr:`ManiSkillSuite.tasks`). Which task an episode runs is decided at its
reset (:func:`task_for_reset`): ``options["task_ids"]`` when given (evaluation), else the
reset seed (``task_ids[seed % len(task_ids)]``), so that GRPO groups, which share a seed,
share the task too; an unseeded autoreset keeps the env's task.

Importing this module is cheap: no simulator.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

__all__ = ["ManiSkillSuite", "SuiteTask", "SUITES", "get_suite", "suite_names",
           "suite_states", "task_for_reset", "STATE_DIM"]

STATE_DIM = 8
"""Width of a suite's ``states``: TCP position 3 + axis-angle 3 + finger joints 2."""


@dataclass(frozen=True)
class SuiteTask:
    """One task of a suite.

    Attributes:
        env_id: registered ManiSkill3 env id with a motion-planning solution.
        instruction: the language instruction given to the policy.
        demo_steps: typical length of the task's planned demos in env steps (measured; None
            when unknown). Only used to record the longest tasks' demos first, so that
            ``demos.processes`` workers finish together (longest-processing-time-first order).
        demo_stride: planned joint targets per recorded step for this task's demos, overriding
            ``demos.stride`` (None: ``demos.stride``); for a task whose plans at the suite's
            stride would not fit its horizon.
    """

    env_id: str
    instruction: str
    demo_steps: int | None = None
    demo_stride: int | None = None


@dataclass(frozen=True)
class ManiSkillSuite:
    """A named set of ManiSkill3 tasks with one camera, one horizon and one protocol.

    Attributes:
        name: registry name (``env.suite``).
        tasks: the tasks; task id i is ``tasks[i]``.
        max_episode_steps: horizon of every task (env steps), longer than the motion planner's
            demonstrations (measured in :mod:`rlinf_embodied.sft.demos`).
        camera_eye: camera position (m, world frame; the robot base is at x = -0.615).
        camera_target: point the camera looks at (m).
        camera_fov: vertical field of view (rad).
        protocol: name of the evaluation protocol of the suite (eval/protocols.py).
        robot_uids: the robot of every task (ManiSkill's StackCube-v1 defaults to
            ``panda_wristcam``; the suite uses one robot, one camera).
        description: one line for listings.
    """

    name: str
    tasks: Tuple[SuiteTask, ...]
    max_episode_steps: int
    camera_eye: Tuple[float, float, float]
    camera_target: Tuple[float, float, float]
    camera_fov: float
    protocol: str
    robot_uids: str = "panda"
    description: str = ""

    @property
    def env_ids(self) -> Tuple[str, ...]:
        """The tasks' env ids, in task-id order."""
        return tuple(t.env_id for t in self.tasks)

    def task(self, task_id: int) -> SuiteTask:
        """Task ``task_id``.

        Raises:
            ValueError: outside ``0..len(tasks)-1`` (lists the tasks).
        """
        if not 0 <= int(task_id) < len(self.tasks):
            raise ValueError(f"Task id {task_id} is not in suite {self.name}; valid ids: "
                             f"{self.listing()}.")
        return self.tasks[int(task_id)]

    def listing(self) -> str:
        """``0: PushCube-v1 (push the cube ...); 1: ...``."""
        return "; ".join(f"{i}: {t.env_id} ({t.instruction})" for i, t in enumerate(self.tasks))

    def sensor_configs(self, size: int) -> Dict[str, Any]:
        """ManiSkill ``sensor_configs`` that turn every task's ``base_camera`` into the suite
        camera at ``size`` x ``size`` pixels (imports ManiSkill's pose helper)."""
        from mani_skill.utils import sapien_utils

        return {"base_camera": dict(
            width=int(size), height=int(size), fov=float(self.camera_fov),
            pose=sapien_utils.look_at(list(self.camera_eye), list(self.camera_target)))}

    def demo_stride(self, env_id: str, stride: int) -> int:
        """The stride of ``env_id``'s demos: its task's ``demo_stride``, else ``stride``
        (``demos.stride``)."""
        for t in self.tasks:
            if t.env_id == env_id and t.demo_stride is not None:
                return int(t.demo_stride)
        return int(stride)

    def env_kwargs(self) -> Dict[str, Any]:
        """``gym.make`` keyword arguments every task of the suite is built with (planning,
        conversion and the env alike): the robot."""
        return {"robot_uids": self.robot_uids}


SUITES: Dict[str, ManiSkillSuite] = {}
"""Registered suites by name."""


def register_suite(suite: ManiSkillSuite) -> ManiSkillSuite:
    """Add ``suite`` to :data:`SUITES`.

    Raises:
        ValueError: a different suite of that name is registered.
    """
    old = SUITES.get(suite.name)
    if old is not None and old != suite:
        raise ValueError(f"ManiSkill suite {suite.name!r} is already registered; pick another name.")
    SUITES[suite.name] = suite
    return suite


def suite_names() -> list:
    """Sorted names of the registered suites."""
    return sorted(SUITES)


def get_suite(name: str) -> ManiSkillSuite:
    """The registered suite ``name``.

    Raises:
        ValueError: unknown name (lists the registered ones and the closest).
    """
    if name not in SUITES:
        close = difflib.get_close_matches(str(name), list(SUITES), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"Unknown ManiSkill suite {name!r}.{hint} Registered suites: "
                         f"{', '.join(suite_names())}.")
    return SUITES[name]


def task_for_reset(task_ids: Sequence[int], current: int, seed: Optional[int],
                   option: Optional[int]) -> int:
    """The task of an episode that starts now.

    Args:
        task_ids: the env's tasks (``env.task_ids``).
        current: the env's task so far.
        seed: the reset seed, or None (an autoreset).
        option: ``options["task_ids"]`` for this env, or None.

    Returns:
        ``option`` if given, else ``task_ids[seed % len(task_ids)]`` for a seeded reset, else
        ``current``.
    """
    if option is not None:
        return int(option)
    if seed is not None:
        return int(task_ids[int(seed) % len(task_ids)])
    return int(current)


def _quat_wxyz_to_axis_angle(q: np.ndarray) -> np.ndarray:
    """(B, 4) unit quaternions (w, x, y, z; SAPIEN's order) -> (B, 3) axis-angle, radians.

    The sign is fixed so that w >= 0 (angles in [0, pi]); near-identity rotations give zeros.
    """
    q = np.where(q[:, :1] < 0, -q, q)
    return _axis_angle_of(q)


def _axis_angle_of(q: np.ndarray) -> np.ndarray:
    w = np.clip(q[:, 0], -1.0, 1.0)
    angle = 2.0 * np.arccos(w)
    s = np.sqrt(np.maximum(1.0 - w * w, 0.0))
    scale = np.where(s > 1e-8, angle / np.maximum(s, 1e-8), 0.0)
    return q[:, 1:] * scale[:, None]


def suite_states(raw_obs: Dict[str, Any]) -> np.ndarray:
    """(B, 8) float32 proprioception from a ManiSkill observation dict (live or recorded).

    Reads ``extra.tcp_pose`` (B, 7: position, then quaternion w, x, y, z) and the last two
    entries of ``agent.qpos`` (the Panda's finger joints), as numpy or torch.

    Raises:
        KeyError: the observation has no ``extra.tcp_pose`` or ``agent.qpos``.
    """
    def arr(x):
        return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)

    tcp = arr(raw_obs["extra"]["tcp_pose"]).reshape(-1, 7).astype(np.float64)
    qpos = arr(raw_obs["agent"]["qpos"]).reshape(tcp.shape[0], -1)
    rel = _quat_mul(_GRIPPER_DOWN_INV, tcp[:, 3:7])
    out = np.concatenate([tcp[:, :3], _quat_wxyz_to_axis_angle(rel), qpos[:, -2:]], 1)
    return out.astype(np.float32)


# The Panda's TCP points down (a half turn about x: w, x, y, z = 0, 1, 0, 0) in every task's
# rest pose. Orientations are taken relative to it: the axis-angle of the TCP quaternion itself
# sits at an angle of pi there, where axis-angle flips sign between neighbouring poses.
_GRIPPER_DOWN_INV = np.array([0.0, -1.0, 0.0, 0.0])


def _quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product ``a * b`` of (4,) or (B, 4) quaternions in (w, x, y, z) order."""
    a = np.broadcast_to(a, b.shape)
    w1, x1, y1, z1 = a[:, 0], a[:, 1], a[:, 2], a[:, 3]
    w2, x2, y2, z2 = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    return np.stack([w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2,
                     w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
                     w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2,
                     w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2], 1)


register_suite(ManiSkillSuite(
    name="maniskill_lang3",
    tasks=(
        SuiteTask("PushCube-v1", "push the cube to the goal region", demo_steps=70),
        SuiteTask("PullCube-v1", "pull the cube to the goal region", demo_steps=70),
        SuiteTask("StackCube-v1", "stack the red cube on top of the green cube", demo_steps=110),
    ),
    # The motion planner's demos take 62-79 steps (PushCube, PullCube) and 94-123 (StackCube),
    # converted with demos.stride=2 31-40 and 53-64 (rlinf_embodied/sft/vla_demos.py).
    max_episode_steps=80,
    camera_eye=(0.45, 0.0, 0.5),
    camera_target=(-0.05, 0.0, 0.0),
    camera_fov=1.0,
    protocol="maniskill_lang3_v1",
    description="PushCube, PullCube, StackCube with instructions, one front camera, 8-dim proprio",
))


register_suite(ManiSkillSuite(
    name="maniskill_lang3_peg",
    tasks=(
        SuiteTask("PushCube-v1", "push the cube to the goal region", demo_steps=70),
        SuiteTask("PullCube-v1", "pull the cube to the goal region", demo_steps=70),
        SuiteTask("LiftPegUpright-v1", "stand the peg upright on the table", demo_steps=150,
                  demo_stride=3),
    ),
    # StackCube replaced: at 64 px from the suite camera its 4 cm cubes are 3-4 pixels, and no
    # SFT of maniskill_lang3 solved a stack trial (the arm descends beside the red cube or on
    # the green one). LiftPegUpright's peg is 24 x 5 cm. Its plans (pivot the peg in a loose
    # grasp, lower it upright) take 91-105 steps at stride 2 and 72-78 at stride 3 (measured,
    # 8 of 8 replayed), hence demo_stride 3 and a 100-step horizon.
    max_episode_steps=100,
    camera_eye=(0.45, 0.0, 0.5),
    camera_target=(-0.05, 0.0, 0.0),
    camera_fov=1.0,
    protocol="maniskill_lang3_peg_v1",
    description="PushCube, PullCube, LiftPegUpright with instructions, one front camera, "
                "8-dim proprio",
))
