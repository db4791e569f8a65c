"""The episode loop: run (task, trial) pairs on the N slots of one batched env, each once.

:func:`run_pairs` steps the env with the policy's actions (one step, or a chunk of K run open
loop), refills a slot with the next pair as soon as its episode ends, and hands the finished
:class:`~rlinf_embodied.eval.results.Episode` records (``success`` from ``success_once``,
``success_at_end`` in fair evaluation, steps, return, queries, error) to its caller after each
step. Optional MP4s are streamed per slot and kept for all episodes or only failures.
"""

from __future__ import annotations

import os
import time
import traceback
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence

import numpy as np
from rlinf_embodied.eval.request import EvalError, Pair
from rlinf_embodied.eval.results import Episode

__all__ = ["run_pairs"]


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
        video_fps: frames per second of the MP4s (one frame per policy query: the
            observation the policy acted on; eval passes the control rate / K, real time).
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
    first_success = np.full(n, -1, np.int64)  # elapsed steps when success first held, or -1
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
                first_success[i] = -1
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
                       action_chunk=chunk[i], open_loop_steps=chunk[i], head=head,
                       success_step=int(first_success[i]) if success and first_success[i] >= 0
                       else None)

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
                if success_once[i] and first_success[i] < 0:
                    first_success[i] = elapsed[i]
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
