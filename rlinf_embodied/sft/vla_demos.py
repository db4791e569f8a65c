"""RGB demonstrations of a language-conditioned ManiSkill suite, for VLA policies.

For each task of the suite (``env.suite``, ``env.task_ids``):

1. plan: ManiSkill's motion-planning solution in ``pd_joint_pos``
   (:func:`~rlinf_embodied.sft.demos.plan_demos`);
2. convert and render in one pass: each planned episode is replayed with ManiSkill's controller
   conversion (``mani_skill.trajectory.utils.actions.from_pd_joint_pos``, what
   ``replay_trajectory -c`` runs), after keeping every ``stride``-th planned joint target (and
   the last), into the policy's controller (``pd_ee_delta_pose``: 7-dim end
   effector delta pose, OpenVLA's action layout) inside the suite's own env
   (:func:`~rlinf_embodied.envs.maniskill.make_suite_task_env`: the suite camera at the env's
   ``sensor_size``), recorded with ManiSkill's ``RecordEpisode`` in its HDF5 trajectory format.
   Replays that do not end in success are dropped. Each episode's JSON entry carries its
   ``instruction``; the file's JSON carries ``suite``, ``control_mode``, ``sensor_size``.

Why a stride: ManiSkill's planner moves slowly (62-79 control steps for PushCube and PullCube,
94-123 for StackCube); every 2nd joint target still converts to a successful
``pd_ee_delta_pose`` replay in every task (measured 8/8 per task) with half the steps and twice
the motion per step, so episodes, evaluations and rollouts are twice as short, and the small
first motions are no longer below the width of one action token.

Files: ``<demos.dir>/<suite>/<env_id>/trajectories.h5`` (the plans) and
``trajectories.rgb.<control_mode>.<size>px.stride<k>.h5`` (+ ``.json``). Tasks run in parallel
processes (one per task, at most ``processes``). Read them with
:class:`~rlinf_embodied.sft.dataset.RGBDemoDataset`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlinf_embodied.sft.demos import DemoError, check_solvable, plan_demos

__all__ = ["SuiteDemoSet", "find_suite_demos", "generate_suite_demos", "suite_demo_file"]


@dataclass
class SuiteDemoSet:
    """The converted RGB demonstration files of a suite and what producing them cost.

    Attributes:
        paths: env id -> converted HDF5 file.
        episodes: env id -> episodes kept.
        steps: env id -> env steps of the kept episodes.
        planning_s: env id -> wall seconds of motion planning.
        convert_s: env id -> wall seconds of conversion + rendering.
        wall_s: wall seconds of the whole generation (tasks run in parallel).
    """

    paths: dict = field(default_factory=dict)
    episodes: dict = field(default_factory=dict)
    steps: dict = field(default_factory=dict)
    planning_s: dict = field(default_factory=dict)
    convert_s: dict = field(default_factory=dict)
    wall_s: float = 0.0

    def to_dict(self) -> dict:
        return {"paths": {k: str(v) for k, v in self.paths.items()}, "episodes": self.episodes,
                "steps": self.steps, "planning_s": self.planning_s, "convert_s": self.convert_s,
                "wall_s": self.wall_s, "env_steps": sum(self.steps.values())}


def suite_demo_file(directory: str | Path, suite: str, env_id: str, control_mode: str,
                    sensor_size: int, stride: int = 1) -> Path:
    """Path of a task's converted RGB demo file (it may not exist)."""
    return (Path(directory) / suite / env_id /
            f"trajectories.rgb.{control_mode}.{int(sensor_size)}px.stride{int(stride)}.h5")


def suite_generation_record(directory: str | Path, suite: str, control_mode: str,
                            sensor_size: int, stride: int = 1) -> Path:
    """Path of the generation record (wall time, env steps, episodes per task) of a suite's
    converted demos (it may not exist)."""
    return (Path(directory) / suite /
            f"generation.{control_mode}.{int(sensor_size)}px.stride{int(stride)}.json")


def find_suite_demos(directory: str | Path, env_cfg: Any, stride: int = 1) -> dict:
    """env id -> converted demo file of every selected suite task that has one (a task's
    ``demo_stride`` overrides ``stride``)."""
    out = {}
    suite = env_cfg.suite_spec()
    for env_id in env_cfg.env_ids():
        p = suite_demo_file(directory, env_cfg.suite, env_id, env_cfg.control_mode,
                            env_cfg.sensor_size, suite.demo_stride(env_id, stride))
        if p.is_file() and p.with_suffix(".json").is_file():
            out[env_id] = p
    return out


def generate_suite_demos(env_cfg: Any, directory: str | Path, per_task: int, *, seed: int = 0,
                         max_attempts_factor: int = 3, processes: int = 2, stride: int = 1,
                         log=print) -> SuiteDemoSet:
    """Plan, convert and render ``per_task`` successful demonstrations of every selected task.

    Args:
        env_cfg: a ManiSkill EnvConfig with ``suite`` set (its ``control_mode``,
            ``sensor_size`` and ``reward_mode`` are the recording's).
        directory: demos root.
        per_task: successful plans per task (the conversion may drop a few).
        seed: first planning seed of every task.
        max_attempts_factor: planning attempts per wanted demo before giving up.
        processes: tasks converted at the same time (one process each).
        stride: keep every ``stride``-th planned joint target (see the module docstring); a
            task's ``demo_stride`` overrides it.
        log: progress printer.

    Raises:
        DemoError: a task without a motion-planning solution, too many failed plans, or no
            replay surviving the conversion (names the task).
    """
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    if env_cfg.suite is None:
        raise DemoError("generate_suite_demos needs env.suite (e.g. maniskill_lang3).")
    suite = env_cfg.suite_spec()
    for env_id in env_cfg.env_ids():
        check_solvable(env_id)
    t0 = time.perf_counter()
    # longest tasks first: with fewer workers than tasks, the short ones fill in beside them
    order = sorted(env_cfg.suite_task_ids(), key=lambda t: -(suite.tasks[t].demo_steps or 0))
    jobs = [(env_cfg, str(directory), suite.tasks[t].env_id, suite.tasks[t].instruction, per_task,
             seed, per_task * max_attempts_factor, suite.demo_stride(suite.tasks[t].env_id, stride))
            for t in order]
    result = SuiteDemoSet()
    workers = max(1, min(processes, len(jobs)))
    if workers == 1:
        outs = [_task_demos(*job) for job in jobs]
    else:
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("forkserver")) as pool:
            outs = list(pool.map(_task_demos, *zip(*jobs)))
    ids = env_cfg.env_ids()
    for out in sorted(outs, key=lambda o: ids.index(o["env_id"])):  # the suite's order again
        for line in out["log"]:
            log(line)
        e = out["env_id"]
        result.paths[e] = Path(out["path"])
        result.episodes[e], result.steps[e] = out["episodes"], out["steps"]
        result.planning_s[e], result.convert_s[e] = out["planning_s"], out["convert_s"]
    result.wall_s = time.perf_counter() - t0
    return result


def _task_demos(env_cfg: Any, directory: str, env_id: str, instruction: str, n: int, seed: int,
                max_attempts: int, stride: int) -> dict:
    """One task: plan, then convert + render (runs in a pool process)."""
    import torch

    torch.set_num_threads(1)
    lines: list = []
    out_dir = Path(directory) / env_cfg.suite / env_id
    kept, planning_s = plan_demos(env_id, out_dir, n, reward_mode=env_cfg.reward_mode, seed=seed,
                                  max_attempts=max_attempts, log=lines.append,
                                  env_kwargs=env_cfg.suite_spec().env_kwargs())
    t0 = time.perf_counter()
    target = suite_demo_file(directory, env_cfg.suite, env_id, env_cfg.control_mode,
                             env_cfg.sensor_size, stride)
    episodes, steps = _convert(env_cfg, env_id, instruction, out_dir / "trajectories.h5", target,
                               stride)
    convert_s = time.perf_counter() - t0
    lines.append(f"{env_id}: {episodes} of {len(kept)} plans replayed successfully in "
                 f"{env_cfg.control_mode} with the {env_cfg.sensor_size} px suite camera "
                 f"({steps} steps, {convert_s:.1f} s) -> {target}")
    if not episodes:
        raise DemoError(f"No {env_id} demo survived conversion to {env_cfg.control_mode}; "
                        "try another control mode.")
    return {"env_id": env_id, "path": str(target), "episodes": episodes, "steps": steps,
            "planning_s": planning_s, "convert_s": convert_s, "log": lines}


def _convert(env_cfg: Any, env_id: str, instruction: str, plans: Path, target: Path,
             stride: int = 1) -> tuple:
    """Replay the planned episodes of ``plans`` (every ``stride``-th joint target and the last)
    into ``target``; returns (episodes, steps)."""
    import gymnasium as gym
    import h5py
    from mani_skill.trajectory.utils.actions import conversion
    from mani_skill.utils.wrappers.record import RecordEpisode

    from rlinf_embodied.envs.maniskill import make_suite_task_env, quiet_goal_marker_notice

    quiet_goal_marker_notice()
    for old in target.parent.glob(target.stem + ".*"):
        old.unlink()
    meta = json.loads(plans.with_suffix(".json").read_text())
    ori = gym.make(env_id, obs_mode="none", control_mode="pd_joint_pos", sim_backend="physx_cpu",
                   reward_mode=env_cfg.reward_mode, **env_cfg.suite_spec().env_kwargs()).unwrapped
    env = RecordEpisode(make_suite_task_env(env_cfg, env_id), output_dir=str(target.parent),
                        trajectory_name=target.stem, save_video=False, record_reward=True,
                        save_on_reset=False, source_type="motionplanning",
                        source_desc="ManiSkill motion plan converted by rlinf-embodied demos")
    info = env._json_data.get("env_info")
    if info is not None:  # the camera pose object is not JSON: record the suite camera instead
        suite = env_cfg.suite_spec()
        info["env_kwargs"] = {**info["env_kwargs"], "sensor_configs": {
            "width": int(env_cfg.sensor_size), "height": int(env_cfg.sensor_size),
            "fov": suite.camera_fov, "eye": list(suite.camera_eye),
            "target": list(suite.camera_target)}}
    episodes = steps = 0
    try:
        with h5py.File(plans, "r") as f:
            for ep in meta["episodes"]:
                actions = f[f"traj_{ep['episode_id']}"]["actions"][:]
                keep = list(range(stride - 1, len(actions), stride))
                if not keep or keep[-1] != len(actions) - 1:
                    keep.append(len(actions) - 1)
                actions = actions[keep]
                s = int(ep["episode_seed"])
                env.reset(seed=s)
                ori.reset(seed=s)
                info = conversion.from_pd_joint_pos(env_cfg.control_mode, actions, ori, env)
                ok = bool(info.get("success", False))
                if ok:
                    episodes += 1
                    steps += int(env._trajectory_buffer.action.shape[0])
                env.flush_trajectory(save=ok)
    finally:
        env.close()
        ori.close()
    side = target.with_suffix(".json")
    if side.is_file():
        data = json.loads(side.read_text())
        for ep in data["episodes"]:
            ep["instruction"] = instruction
        data["rlinf"] = {"suite": env_cfg.suite, "env_id": env_id, "instruction": instruction,
                         "control_mode": env_cfg.control_mode, "sensor_size": int(env_cfg.sensor_size),
                         "obs_mode": "rgb", "stride": int(stride)}
        side.write_text(json.dumps(data, indent=1))
    return episodes, steps
