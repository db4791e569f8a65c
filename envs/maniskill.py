"""ManiSkill3 adapter: any registered ManiSkill3 env id as a BatchedEnv.

* On a CUDA machine (``sim_backend`` ``auto`` or ``physx_cuda``) one process runs all N envs
  with GPU physics: a single ``gym.make(id, num_envs=N, sim_backend="physx_cuda:<k>")``; tensors
  stay on that GPU. GPU physics steps all N envs together, so envs that are waiting for a reset
  or stopped inside an action chunk are stepped with zero actions and their results discarded.
* On CPU (``physx_cpu``) each env is its own single-env ManiSkill instance; the N envs are split
  over ``num_processes`` pool workers (``0``: all in this process). ManiSkill's time-limit wrapper
  is removed; the BatchedEnv applies ``max_episode_steps`` (default: the task's registered
  limit, e.g. 50 for PushCube-v1).

Observations: ``obs_mode="state"`` gives ``states`` (N, S) float32. ``obs_mode="rgb"`` gives
``main_images`` (N, H, W, 3) uint8 from the first non-hand camera (``sensor_size`` pixels
square), ``wrist_images`` from ``hand_camera`` when the robot has one, and ``states``: the
agent's and the task's extra state, flattened. ``task_descriptions`` come from
``INSTRUCTIONS`` (or ``env.task_description``). Success is ManiSkill's ``info["success"]``.
"""

from __future__ import annotations

import difflib
import functools
import re
from typing import Any, Dict, List, Optional

import numpy as np

from .base import ActionSpec, EnvSpec, SubBatch, Transition, drop_log_messages
from .maniskill_suites import task_for_reset
from .pool import WorkerDevice, visible_cuda_devices
from .vector import VectorBatchedEnv

__all__ = ["ManiSkillEnv", "ManiSkillSubBatch", "ManiSkillGPUSubBatch", "ManiSkillSuiteSubBatch",
           "INSTRUCTIONS", "default_instruction", "make_suite_task_env", "suite_obs",
           "quiet_goal_marker_notice"]

#: Language instructions per ManiSkill3 task (phrased after each task's documented goal).
INSTRUCTIONS: Dict[str, str] = {
    "PushCube-v1": "push the cube to the goal region",
    "PullCube-v1": "pull the cube to the goal region",
    "PickCube-v1": "pick up the cube and move it to the goal position",
    "StackCube-v1": "stack the red cube on top of the green cube",
    "PegInsertionSide-v1": "insert the peg into the hole on the side of the box",
    "PushT-v1": "push the T-shaped block onto the T-shaped goal",
    "PokeCube-v1": "use the peg to poke the cube to the goal region",
    "LiftPegUpright-v1": "lift the peg and stand it upright",
    "PlugCharger-v1": "plug the charger into the wall socket",
    "PullCubeTool-v1": "use the tool to pull the cube closer",
    "RollBall-v1": "roll the ball to the goal region",
    "PickSingleYCB-v1": "pick up the object and move it to the goal position",
    "TurnFaucet-v1": "turn the faucet handle",
    "OpenCabinetDrawer-v1": "open the cabinet drawer",
}


def default_instruction(env_id: str) -> str:
    """The instruction of ``env_id``: the table, else the id's words (``PushCube-v1`` -> ``push cube``)."""
    if env_id in INSTRUCTIONS:
        return INSTRUCTIONS[env_id]
    name = re.sub(r"-v\d+$", "", env_id)
    return " ".join(w.lower() for w in re.findall(r"[A-Z][a-z]*|[a-z]+|\d+", name))


def quiet_goal_marker_notice() -> None:
    """Drop ManiSkill's "No initial pose set for actor builder of goal_region" warning, which
    PullCube logs each time it builds an env (mani_skill 3.0.1; one line per env process, dozens
    per run). Its goal region is a kinematic visual marker without collision, so the
    slow-simulation concern it links (haosulab/ManiSkill#421) does not apply. The same warning
    for any other actor (a user's task) passes. mani_skill names its logger ``"mani_skill "``,
    with a trailing space."""
    drop_log_messages(("mani_skill ", "mani_skill"),
                      ("No initial pose set for actor builder of goal_region,",))


def _registered(env_id: str):
    """ManiSkill's registry entry of ``env_id``.

    Raises:
        ValueError: unknown id, with close matches.
    """
    quiet_goal_marker_notice()
    import mani_skill.envs  # noqa: F401  (registers the tasks)
    from mani_skill.utils.registration import REGISTERED_ENVS

    if env_id not in REGISTERED_ENVS:
        close = difflib.get_close_matches(env_id, list(REGISTERED_ENVS), n=5, cutoff=0.5)
        hint = f" Close matches: {', '.join(close)}." if close else ""
        raise ValueError(f"Unknown ManiSkill3 env id {env_id!r}.{hint} Fix env.env_id.")
    return REGISTERED_ENVS[env_id]


def _make(cfg: Any, num_envs: int, sim_backend: str, render_backend: str, env_id: Optional[str] = None):
    import gymnasium as gym

    env_id = env_id or cfg.env_id
    _registered(env_id)
    kwargs: Dict[str, Any] = dict(
        num_envs=num_envs, obs_mode=cfg.obs_mode, control_mode=cfg.control_mode,
        reward_mode=cfg.reward_mode, sim_backend=sim_backend, render_backend=render_backend,
    )
    suite = cfg.suite_spec() if getattr(cfg, "suite", None) else None
    if suite is not None:
        kwargs.update(suite.env_kwargs())
    if cfg.obs_mode == "rgb":
        kwargs["sensor_configs"] = (suite.sensor_configs(cfg.sensor_size) if suite is not None
                                    else dict(width=cfg.sensor_size, height=cfg.sensor_size))
    if _renders_video(cfg):
        kwargs["render_mode"] = "rgb_array"
        kwargs["human_render_camera_configs"] = dict(width=cfg.sensor_size, height=cfg.sensor_size)
    return gym.make(env_id, disable_env_checker=True, **kwargs).unwrapped  # no TimeLimit


def make_suite_task_env(cfg: Any, env_id: str, render_backend: str = "cpu"):
    """One physx_cpu ManiSkill env of a suite task with the suite's camera (``cfg.suite``), its
    controller, obs mode and reward mode; no time limit. Demonstrations are recorded in it, so
    that they show what the policy will see (:mod:`rlinf_embodied.sft.vla_demos`)."""
    return _make(cfg, 1, "physx_cpu", render_backend, env_id=env_id)


def suite_obs(raw: Any) -> Dict[str, Any]:
    """A suite env's ManiSkill observation (live or recorded, leading dim B) -> contract keys:
    ``main_images`` (B, H, W, 3) uint8 from the first camera, ``states`` (B, 8) float32
    (:func:`~rlinf_embodied.envs.maniskill_suites.suite_states`), as torch tensors."""
    import torch

    from .maniskill_suites import suite_states

    cams = raw["sensor_data"]
    rgb = cams[next(iter(cams))]["rgb"]
    rgb = rgb if isinstance(rgb, torch.Tensor) else torch.as_tensor(np.asarray(rgb))
    return {"main_images": rgb[..., :3].to(torch.uint8),
            "states": torch.as_tensor(suite_states(raw))}


def _renders_video(cfg: Any) -> bool:
    return cfg.obs_mode == "state" and bool(getattr(cfg, "render_images", False))


def _with_render(env: Any, obs: Dict[str, Any], cfg: Any) -> Dict[str, Any]:
    """Add the human camera's frame as ``main_images`` (1, H, W, 3) uint8 when configured."""
    if _renders_video(cfg):
        import torch

        frame = env.render()
        frame = frame if isinstance(frame, torch.Tensor) else torch.as_tensor(frame)
        obs["main_images"] = frame[..., :3].to(torch.uint8).reshape(1, *frame.shape[-3:-1], 3)
    return obs


def _flatten(tree: Any) -> List[Any]:
    """Leaves of a nested dict of (B, ...) tensors, each as (B, -1), in key order."""
    if isinstance(tree, dict):
        return [leaf for value in tree.values() for leaf in _flatten(value)]
    return [tree.reshape(tree.shape[0], -1)]


def _convert_obs(raw: Any, obs_mode: str) -> Dict[str, Any]:
    """ManiSkill batched obs -> contract keys (torch, on the simulator's device)."""
    import torch

    if obs_mode == "state":
        return {"states": raw.float()}
    out = {"states": torch.cat(_flatten(raw.get("agent", {})) + _flatten(raw.get("extra", {})), -1).float()}
    cams = raw["sensor_data"]
    main = next((c for c in cams if c != "hand_camera"), next(iter(cams)))
    out["main_images"] = cams[main]["rgb"][..., :3].to(torch.uint8)
    if "hand_camera" in cams and main != "hand_camera":
        out["wrist_images"] = cams["hand_camera"]["rgb"][..., :3].to(torch.uint8)
    return out


def step_without_obs(env: Any, action: Any):
    """One step of an unwrapped single-env ManiSkill instance without computing observations
    (no sensor capture, so no rendering): ``BaseEnv.step`` of mani_skill 3.0.1
    (mani_skill/envs/sapien_env.py) less ``get_obs``. The suite's and the pipelines' tasks
    (PushCube, PullCube, PickCube, StackCube, ...) compute rewards from the scene, not from
    the observation, so ``obs=None`` is passed to the reward; tests/envs/test_unobserved_steps.py checks
    rewards, flags and later observations against ``env.step``.

    Returns:
        ``(reward (1,), terminated (1,), truncated (1,), info)`` as ``env.step`` returns them.
    """
    import torch

    action = env._step_action(action)
    env._elapsed_steps += 1
    info = env.get_info()
    reward = env.get_reward(obs=None, action=action, info=info)
    done = torch.zeros(env.num_envs, dtype=torch.bool, device=env.device)
    for key in ("success", "fail"):
        if key in info:
            done = done | info[key]
    return reward, done, torch.zeros_like(done), info


def _spec(env: Any, obs: Dict[str, Any], cfg: Any) -> EnvSpec:
    space = env.single_action_space
    action = ActionSpec(tuple(space.shape), space.low.astype(np.float32), space.high.astype(np.float32))
    return EnvSpec(
        action=action,
        obs_shapes={k: tuple(v.shape[1:]) for k, v in obs.items()},
        max_episode_steps=_registered(env.spec.id if env.spec is not None else cfg.env_id).max_episode_steps,
        metadata={"control_freq_hz": getattr(env, "control_freq", None)},
    )


class ManiSkillSubBatch(SubBatch):
    """M single-env physx_cpu ManiSkill instances in one process, stepped one after another.

    Args:
        cfg: a :class:`~rlinf_embodied.envs.configuration_maniskill.ManiSkillEnvConfig`.
        env_ids: global env indices hosted here.
        device: the worker's GPU (renders on it when present), or None (CPU rendering with
            ``obs_mode=rgb``; no renderer at all for ``state``).
    """

    def __init__(self, cfg: Any, env_ids: List[int], device: Optional[WorkerDevice] = None):
        if cfg.obs_mode == "state" and not _renders_video(cfg):
            render = "none"
        else:
            render = f"cuda:{device.ordinal}" if device is not None else "cpu"
        self._cfg = cfg
        self._envs = [_make(cfg, 1, "physx_cpu", render) for _ in env_ids]
        raw, _ = self._envs[0].reset(seed=0)
        obs = _with_render(self._envs[0], _convert_obs(raw, cfg.obs_mode), cfg)
        self._spec = _spec(self._envs[0], obs, cfg)
        self._task = cfg.task_description or default_instruction(cfg.env_id)

    @property
    def spec(self) -> EnvSpec:
        return self._spec

    def _pack(self, parts: List[Dict[str, Any]], rew, term, trunc, succ, reset: bool) -> Transition:
        import torch

        obs = {k: torch.cat([p[k] for p in parts]).numpy() for k in parts[0]} if parts else {}
        cat = lambda xs: torch.cat(xs).reshape(-1).numpy()  # noqa: E731
        return Transition(
            obs=obs,
            reward=cat(rew).astype(np.float32),
            terminated=cat(term).astype(bool),
            truncated=cat(trunc).astype(bool),
            success=cat(succ).astype(bool),
            task_descriptions=[self._task] * len(parts) if reset else None,
        )

    def reset(self, local_ids, seeds, options) -> Transition:
        import torch

        parts, zeros, no = [], [], []
        for i, seed, opts in zip(local_ids, seeds, options):
            raw, info = self._envs[i].reset(seed=seed, options=opts or None)
            parts.append(_with_render(self._envs[i], _convert_obs(raw, self._cfg.obs_mode), self._cfg))
            zeros.append(torch.zeros(1))
            no.append(torch.zeros(1, dtype=torch.bool))
        return self._pack(parts, zeros, no, no, no, reset=True)

    def _active(self, i: int) -> Any:
        """The ManiSkill instance env ``i`` (local) runs now."""
        return self._envs[i]

    def _observation(self, env: Any, raw: Any) -> Dict[str, Any]:
        return _with_render(env, _convert_obs(raw, self._cfg.obs_mode), self._cfg)

    def step(self, local_ids, actions) -> Transition:
        return self._step(local_ids, actions, observe=True)

    def step_unobserved(self, local_ids, actions) -> Transition:
        """Step without rendering: on CPU the camera costs ~15 ms of a ~17 ms step at 64 px
        (measured, PushCube-v1 with the suite camera), physics and reward ~1.3 ms."""
        return self._step(local_ids, actions, observe=False)

    def observe(self, local_ids) -> Transition:
        import torch

        envs = [self._active(i) for i in local_ids]
        parts = [self._observation(env, env.get_obs(env.get_info())) for env in envs]
        zeros, no = [torch.zeros(1)] * len(envs), [torch.zeros(1, dtype=torch.bool)] * len(envs)
        return self._pack(parts, zeros, no, no, no, reset=False)

    def _step(self, local_ids, actions, observe: bool) -> Transition:
        parts, rew, term, trunc, succ = [], [], [], [], []
        for j, i in enumerate(local_ids):
            env = self._active(i)
            if observe:
                raw, r, te, tu, info = env.step(actions[j : j + 1])
                parts.append(self._observation(env, raw))
            else:
                r, te, tu, info = step_without_obs(env, actions[j : j + 1])
            rew.append(r)
            term.append(te)
            trunc.append(tu)
            succ.append(info["success"])
        return self._pack(parts, rew, term, trunc, succ, reset=False)

    def close(self) -> None:
        for env in self._envs:
            env.close()
        self._envs = []


class ManiSkillSuiteSubBatch(ManiSkillSubBatch):
    """M envs of a language-conditioned suite (``env.suite``), each serving a mix of its tasks.

    Each env slot keeps one physx_cpu ManiSkill instance per task it has run (built on first
    use; GPU physics cannot mix tasks in one instance). The task of an episode is chosen at its
    reset (:func:`~rlinf_embodied.envs.maniskill_suites.task_for_reset`): ``options["task_ids"]``,
    else the seed, else the slot's previous task. Observations: the suite camera's
    ``main_images``, 8-dim ``states`` and the task's instruction.
    """

    def __init__(self, cfg: Any, env_ids: List[int], device: Optional[WorkerDevice] = None):
        self._cfg = cfg
        self._suite = cfg.suite_spec()
        self._task_ids = cfg.suite_task_ids()
        self._render = f"cuda:{device.ordinal}" if device is not None else "cpu"
        self._current = [self._task_ids[g % len(self._task_ids)] for g in env_ids]
        self._slots: List[Dict[int, Any]] = [{} for _ in env_ids]
        env = self._env(0, self._current[0])
        raw, _ = env.reset(seed=0)
        import dataclasses

        self._spec = dataclasses.replace(_spec(env, suite_obs(raw), cfg),
                                         max_episode_steps=self._suite.max_episode_steps)
        self._envs = []
        self._task = ""

    def _env(self, i: int, task: int):
        if task not in self._slots[i]:
            self._slots[i][task] = _make(self._cfg, 1, "physx_cpu", self._render,
                                         env_id=self._suite.task(task).env_id)
        return self._slots[i][task]

    def reset(self, local_ids, seeds, options) -> Transition:
        import torch

        parts, zeros, no, texts = [], [], [], []
        for i, seed, opts in zip(local_ids, seeds, options):
            opts = dict(opts or {})
            task = task_for_reset(self._task_ids, self._current[i], seed, opts.pop("task_ids", None))
            self._suite.task(task)  # a clear error for an unknown task id
            self._current[i] = task
            raw, _ = self._env(i, task).reset(seed=seed, options=opts or None)
            parts.append(suite_obs(raw))
            texts.append(self._suite.tasks[task].instruction)
            zeros.append(torch.zeros(1))
            no.append(torch.zeros(1, dtype=torch.bool))
        tr = self._pack(parts, zeros, no, no, no, reset=True)
        tr.task_descriptions = texts
        return tr

    def _active(self, i: int) -> Any:
        return self._slots[i][self._current[i]]

    def _observation(self, env: Any, raw: Any) -> Dict[str, Any]:
        return suite_obs(raw)

    def get_task_ids(self, local_ids) -> List[int]:
        """The suite task id each env runs now."""
        return [self._current[i] for i in local_ids]

    def close(self) -> None:
        for slot in self._slots:
            for env in slot.values():
                env.close()
        self._slots = []


class ManiSkillGPUSubBatch(SubBatch):
    """All N envs in one GPU-physics ManiSkill instance (``physx_cuda``); tensors stay on the GPU.

    Partial resets use ManiSkill's ``options["env_idx"]``; per-env seeds are applied only when
    every env is reset at once (ManiSkill seeds a partial reset from its main RNG).
    """

    def __init__(self, cfg: Any, env_ids: List[int], device: Optional[WorkerDevice] = None):
        ordinal = device.ordinal if device is not None else 0
        self._cfg = cfg
        self._n = len(env_ids)
        self._env = _make(cfg, self._n, f"physx_cuda:{ordinal}", f"cuda:{ordinal}")
        raw, _ = self._env.reset(seed=list(range(self._n)))
        self._spec = _spec(self._env, _convert_obs(raw, cfg.obs_mode), cfg)
        self._task = cfg.task_description or default_instruction(cfg.env_id)
        self.device = self._env.device

    @property
    def spec(self) -> EnvSpec:
        return self._spec

    def reset(self, local_ids, seeds, options) -> Transition:
        import torch

        idx = torch.as_tensor(np.asarray(local_ids), device=self.device)
        full = len(local_ids) == self._n and all(s is not None for s in seeds)
        raw, _ = self._env.reset(seed=list(seeds) if full else None, options={"env_idx": idx})
        obs = {k: v[idx] for k, v in _convert_obs(raw, self._cfg.obs_mode).items()}
        m = len(local_ids)
        zeros = torch.zeros(m, device=self.device)
        no = torch.zeros(m, dtype=torch.bool, device=self.device)
        return Transition(obs, zeros, no, no, no.clone(), [self._task] * m)

    def step(self, local_ids, actions) -> Transition:
        import torch

        idx = torch.as_tensor(np.asarray(local_ids), device=self.device)
        acts = torch.as_tensor(actions, device=self.device, dtype=torch.float32)
        if len(local_ids) != self._n:
            full = torch.zeros((self._n,) + tuple(acts.shape[1:]), device=self.device)
            full[idx] = acts
            acts = full
        raw, rew, term, trunc, info = self._env.step(acts)
        obs = {k: v[idx] for k, v in _convert_obs(raw, self._cfg.obs_mode).items()}
        return Transition(obs, rew[idx].float(), term[idx].bool(), trunc[idx].bool(),
                          info["success"][idx].bool())

    def close(self) -> None:
        self._env.close()


class ManiSkillEnv(VectorBatchedEnv):
    """N ManiSkill3 envs (``env.type=maniskill``); GPU physics on CUDA machines.

    Args:
        cfg: a :class:`~rlinf_embodied.envs.configuration_maniskill.ManiSkillEnvConfig`.

    Raises:
        ValueError: unknown env id (with close matches), or ``physx_cuda`` without a GPU.
    """

    def __init__(self, cfg: Any):
        gpus = visible_cuda_devices()
        if getattr(cfg, "suite", None):
            for env_id in cfg.env_ids():
                _registered(env_id)
            # Envs mixing tasks are one physx_cpu instance per task and slot; on a GPU machine
            # the pool workers render on their GPU.
            super().__init__(functools.partial(ManiSkillSuiteSubBatch, cfg), cfg,
                             num_processes=cfg.num_processes,
                             default_max_episode_steps=cfg.suite_spec().max_episode_steps)
            return
        _registered(cfg.env_id)  # fail fast, in this process, with close matches
        backend = cfg.sim_backend
        if backend == "auto":
            backend = "physx_cuda" if gpus else "physx_cpu"
        if backend == "physx_cuda":
            if not gpus:
                raise ValueError("env.sim_backend=physx_cuda needs a CUDA GPU; use physx_cpu or auto.")
            super().__init__(functools.partial(ManiSkillGPUSubBatch, cfg), cfg, num_processes=0,
                             device="cuda:0")
        else:
            super().__init__(functools.partial(ManiSkillSubBatch, cfg), cfg,
                             num_processes=cfg.num_processes)
