"""Demonstrations from ManiSkill's motion-planning solutions, in ManiSkill's trajectory format.

Format: ManiSkill's own HDF5 trajectories (``traj_<k>`` groups with ``obs``, ``actions``,
``env_states``, ``success`` ... plus a JSON of per-episode seeds and env kwargs). Chosen over
LeRobot's format because (1) ManiSkill's motion planner writes it directly
(``RecordEpisode``), (2) ManiSkill's ``replay_trajectory`` converts it to any controller and
observation mode (the planner drives ``pd_joint_pos``; our policies act in
``pd_joint_delta_pos``; the same file replays to ``state`` or ``rgb``), and (3) each episode
keeps its reset seed and env states, so a demo can be replayed and checked. It is read with
ManiSkill's ``ManiSkillTrajectoryDataset`` (h5py), see :mod:`rlinf_embodied.sft.dataset`.

Steps of :func:`generate_demos`:

1. plan: ``gym.make(env_id, control_mode="pd_joint_pos")`` wrapped in ``RecordEpisode``; the
   task's solution in ``mani_skill.examples.motionplanning.panda.solutions`` runs per seed;
   failed plans are discarded and the next seed is tried;
2. convert: ``python -m mani_skill.trajectory.replay_trajectory -c <control_mode> -o <obs>``
   replays each demo closed-loop in the target controller and keeps the successful replays.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MP_SOLUTIONS", "DemoError", "DemoSet", "check_solvable", "find_demos", "generate_demos",
           "plan_demos"]


class DemoError(RuntimeError):
    """Demonstrations cannot be generated or found; the message says what to do."""


#: Env ids with a motion-planning solution (ManiSkill's ``motionplanning/panda/run.py`` list).
MP_SOLUTIONS = ("PushCube-v1", "PickCube-v1", "StackCube-v1", "PullCube-v1",
                "PegInsertionSide-v1", "PlugCharger-v1", "LiftPegUpright-v1")


@dataclass
class DemoSet:
    """A converted demonstration file and what produced it.

    Attributes:
        path: the HDF5 trajectory file in the target controller / obs mode.
        env_id: ManiSkill env id.
        control_mode: controller of the stored actions.
        obs_mode: observation mode of the stored ``obs``.
        num_trajectories: episodes in the file.
        seeds: reset seed of each episode, in file order.
        planning_s: wall seconds of motion planning.
        convert_s: wall seconds of the replay conversion.
    """

    path: Path
    env_id: str
    control_mode: str
    obs_mode: str
    num_trajectories: int
    seeds: list
    planning_s: float = 0.0
    convert_s: float = 0.0

    def to_dict(self) -> dict:
        return {"path": str(self.path), "env_id": self.env_id, "control_mode": self.control_mode,
                "obs_mode": self.obs_mode, "num_trajectories": self.num_trajectories,
                "seeds": self.seeds, "planning_s": self.planning_s, "convert_s": self.convert_s}


def check_solvable(env_id: str) -> None:
    """Raise :class:`DemoError` (naming the tasks that have one) unless ManiSkill ships a
    motion-planning solution for ``env_id``."""
    if env_id not in MP_SOLUTIONS:
        raise DemoError(
            f"No ManiSkill motion-planning solution for {env_id!r}, so no demonstrations can be "
            f"recorded for it; use one of {', '.join(MP_SOLUTIONS)}."
        )


def _solver(env_id: str):
    check_solvable(env_id)
    try:
        from mani_skill.examples.motionplanning.panda import solutions
    except ImportError as e:  # mplib missing or built against another numpy
        raise DemoError(
            f"ManiSkill's motion planner cannot be imported ({e}); it needs `mplib` with "
            "numpy < 2 (bash scripts/setup.sh installs both)."
        ) from None
    name = "solve" + env_id.split("-")[0]
    return getattr(solutions, name)


def _tool_file(directory: Path, stem: str, obs_mode: str, control_mode: str) -> Path:
    return directory / f"{stem}.{obs_mode}.{control_mode}.physx_cpu.h5"


def find_demos(directory: str | Path, env_id: str, control_mode: str,
               obs_mode: str = "state") -> Path | None:
    """The converted trajectory file under ``directory`` for this env/controller/obs, or None."""
    d = Path(directory) / env_id / "motionplanning"
    path = _tool_file(d, "trajectories", obs_mode, control_mode)
    return path if path.is_file() and path.with_suffix(".json").is_file() else None


def generate_demos(
    env_id: str,
    directory: str | Path,
    num_trajectories: int,
    *,
    control_mode: str = "pd_joint_delta_pos",
    obs_mode: str = "state",
    reward_mode: str = "normalized_dense",
    seed: int = 0,
    max_attempts: int | None = None,
    log=print,
) -> DemoSet:
    """Record ``num_trajectories`` successful motion-planning demos and convert them.

    Args:
        env_id: a ManiSkill env id of :data:`MP_SOLUTIONS`.
        directory: output root; files go to ``<directory>/<env_id>/motionplanning/``
            (``trajectories.h5`` from the planner in ``pd_joint_pos``, and
            ``trajectories.<obs>.<control>.physx_cpu.h5`` after conversion).
        num_trajectories: successful episodes wanted.
        control_mode: controller of the converted actions (the policy's).
        obs_mode: ``state`` or ``rgb`` observations in the converted file.
        reward_mode: reward recorded in the converted file.
        seed: first reset seed (consecutive seeds after it).
        max_attempts: planning attempts before giving up (default 3x ``num_trajectories``).
        log: progress printer.

    Returns:
        The :class:`DemoSet` of the converted file.

    Raises:
        DemoError: no solution for the env, planner not importable, too many failed plans,
            or the conversion failed (its output is included).
    """
    out = Path(directory) / env_id / "motionplanning"
    kept, planning_s = plan_demos(env_id, out, num_trajectories, reward_mode=reward_mode,
                                  seed=seed, max_attempts=max_attempts, log=log)
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "mani_skill.trajectory.replay_trajectory",
           "--traj-path", str(out / "trajectories.h5"), "-c", control_mode, "-o", obs_mode,
           "--save-traj", "-b", "physx_cpu", "--reward-mode", reward_mode, "--record-rewards"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    target = _tool_file(out, "trajectories", obs_mode, control_mode)
    if proc.returncode != 0 or not target.is_file():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        raise DemoError(f"Converting the demos to {control_mode}/{obs_mode} failed:\n{tail}")
    convert_s = time.perf_counter() - t0
    meta = json.loads(target.with_suffix(".json").read_text())
    seeds = [int(e["episode_seed"]) for e in meta["episodes"]]
    log(f"converted to {control_mode}/{obs_mode}: {len(seeds)} of {len(kept)} replays "
        f"succeeded ({convert_s:.1f} s) -> {target}")
    if not seeds:
        raise DemoError(f"No demo survived conversion to {control_mode}; try pd_joint_pos.")
    return DemoSet(target, env_id, control_mode, obs_mode, len(seeds), seeds, planning_s, convert_s)


def plan_demos(env_id: str, out: Path, num_trajectories: int, *, reward_mode: str = "normalized_dense",
               seed: int = 0, max_attempts: int | None = None, env_kwargs: dict | None = None,
               log=print) -> tuple[list, float]:
    """Run ManiSkill's motion-planning solution of ``env_id`` until ``num_trajectories`` plans
    succeed; write them to ``out/trajectories.h5`` (+ ``.json``) in ``pd_joint_pos``.

    Removes every ``trajectories*`` file in ``out`` first (a new plan invalidates conversions).
    ``env_kwargs`` are extra ``gym.make`` arguments (a suite's robot).

    Returns:
        ``(seeds of the successful plans, wall seconds)``.

    Raises:
        DemoError: no solution for the env, planner not importable, or too many failed plans.
    """
    import gymnasium as gym
    from rlinf_embodied.envs.maniskill import quiet_goal_marker_notice

    quiet_goal_marker_notice()
    import mani_skill.envs  # noqa: F401  (registers the tasks)
    from mani_skill.utils.wrappers.record import RecordEpisode

    solve = _solver(env_id)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("trajectories*"):
        old.unlink()
    max_attempts = max_attempts or 3 * num_trajectories
    t0 = time.perf_counter()
    env = gym.make(env_id, obs_mode="none", control_mode="pd_joint_pos",
                   sim_backend="physx_cpu", render_mode="rgb_array", reward_mode=reward_mode,
                   **(env_kwargs or {}))
    env = RecordEpisode(env, output_dir=str(out), trajectory_name="trajectories", save_video=False,
                        source_type="motionplanning",
                        source_desc="ManiSkill motion-planning solution (rlinf-embodied demos)",
                        record_reward=False, save_on_reset=False)
    kept, attempts, s = [], 0, seed
    try:
        while len(kept) < num_trajectories:
            if attempts >= max_attempts:
                raise DemoError(
                    f"Only {len(kept)} of {attempts} motion plans for {env_id} succeeded "
                    f"(seeds {seed}..{s - 1}); raise demos.max_attempts_factor or ask for fewer."
                )
            attempts += 1
            try:
                res = solve(env, seed=s, debug=False, vis=False)
            except Exception as e:  # noqa: BLE001 - the planner raises on unreachable poses
                log(f"  seed {s}: planner error ({type(e).__name__}: {e})")
                res = -1
            ok = res != -1 and bool(res[-1]["success"].item())
            env.flush_trajectory(save=ok)
            if ok:
                kept.append(s)
            s += 1
    finally:
        env.close()
    planning_s = time.perf_counter() - t0
    log(f"planned {len(kept)} successful {env_id} demos in {attempts} attempts "
        f"({planning_s:.1f} s)")
    return kept, planning_s
