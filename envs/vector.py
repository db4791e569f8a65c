"""The one implementation of the :class:`~rlinf_embodied.envs.base.BatchedEnv` contract.

:class:`VectorBatchedEnv` owns all episode bookkeeping over a backend (in-process SubBatch or a
:class:`~rlinf_embodied.envs.pool.ProcessPool`): autoreset in the declared mode, time limits,
``ignore_terminations``, ``success_hold_steps``, action chunks that stop each env at its first done, ``success_once``,
and ending an env's episode as truncated with ``info["env_error"]`` when its worker failed.
Adapters subclass it and only choose a SubBatch factory.

Why not gymnasium's ``VectorEnv``: it steps all sub-envs together, so it cannot stop one env in
the middle of an action chunk; the autoreset semantics below are gymnasium >= 1.0's (NEXT_STEP by
default), reproduced per env.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

from .base import AutoresetMode, BatchedEnv, EnvError, SubBatch
from .pool import InProcessBackend, ProcessPool, StepResult, assign_device

__all__ = ["VectorBatchedEnv", "split_options"]

log = logging.getLogger(__name__)


def split_options(options: Optional[Dict[str, Any]], n: int) -> List[Dict[str, Any]]:
    """One options dict per reset env.

    A value that is a list, tuple, array or tensor of length ``n`` is split (entry i goes to
    env i); any other value is given to every env.
    """
    out: List[Dict[str, Any]] = [{} for _ in range(n)]
    for key, value in (options or {}).items():
        if isinstance(value, (list, tuple, np.ndarray, torch.Tensor)) and len(value) == n:
            values = value.tolist() if hasattr(value, "tolist") else list(value)
            for i in range(n):
                out[i][key] = values[i]
        else:
            for d in out:
                d[key] = value
    return out


def _np(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


class VectorBatchedEnv(BatchedEnv):
    """N envs over SubBatches built by ``factory``, in-process or in a process pool.

    Args:
        factory: picklable ``factory(env_ids, device) -> SubBatch``.
        cfg: the EnvConfig (``num_envs``, ``autoreset_mode``, ``ignore_terminations``,
            ``max_episode_steps``, ``seed``, timeouts, ``start_method``, ``threads_per_process``).
        num_processes: 0 hosts all envs in this process; P >= 1 uses a pool of P workers
            (capped at N).
        device: torch device of the returned tensors (``cuda`` for GPU simulators).
        default_max_episode_steps: the adapter's time limit when ``cfg.max_episode_steps`` is
            None; None falls back to the SubBatch's spec.

    Raises:
        ValueError: unknown ``cfg.autoreset_mode`` (listing the valid ones).
        EnvError: a worker failed to build its envs.
    """

    def __init__(
        self,
        factory: Callable[..., SubBatch],
        cfg: Any,
        num_processes: int,
        device: str = "cpu",
        default_max_episode_steps: Optional[int] = None,
    ):
        self.cfg = cfg
        self.autoreset_mode = AutoresetMode.parse(cfg.autoreset_mode)
        self.ignore_terminations = bool(cfg.ignore_terminations)
        self.device = torch.device(device)
        self.num_envs = n = int(cfg.num_envs)
        self._closed = True
        if num_processes <= 0:
            self._backend: Any = InProcessBackend(factory, n, assign_device(0))
        else:
            self._backend = ProcessPool(
                factory,
                n,
                min(num_processes, n),
                start_method=cfg.start_method,
                step_timeout_s=cfg.step_timeout_s,
                reset_timeout_s=cfg.reset_timeout_s,
                startup_timeout_s=cfg.startup_timeout_s,
                num_threads=cfg.threads_per_process,
                max_step_failures=cfg.max_step_failures,
            )
        self._closed = False
        self.spec = self._backend.spec
        self.action_spec = self.spec.action
        self.max_episode_steps = (
            cfg.max_episode_steps
            or default_max_episode_steps
            or self.spec.max_episode_steps
        )
        self._seed = cfg.seed
        self._seeded = False
        self._started = False
        self._elapsed = np.zeros(n, np.int64)
        self._needs_reset = np.ones(n, bool)
        self._pending_error = np.zeros(n, bool)
        self._success = np.zeros(n, bool)
        self._success_once = np.zeros(n, bool)
        # consecutive steps with success (env.success_hold_steps)
        self._success_run = np.zeros(n, np.int64)
        self._hold_steps = int(cfg.success_hold_steps)
        self._obs: Dict[str, torch.Tensor] = {}
        self._tasks: List[str] = [""] * n
        # envs whose terminations do not end their episodes (all of them, or the first
        # EnvConfig.num_fixed_length(N) with env.ignore_terminations_fraction)
        self._fixed_length = np.full(n, self.ignore_terminations)
        self._fixed_length[: cfg.num_fixed_length(n)] = True

    # -- public API ----------------------------------------------------------------------------
    def reset(self, seed=None, env_ids=None, options=None):
        self._check_open()
        ids = self._ids(env_ids)
        if not self._started and ids.size != self.num_envs:
            raise EnvError("The first reset must reset every env; call reset() without env_ids.")
        if seed is None and not self._seeded:
            seed = self._seed
        # per-env seeds and options come in env_ids order; envs are reset in sorted id order
        order = (ids if env_ids is None else _np(env_ids).astype(np.int64).reshape(-1)).tolist()
        seeds: List[Optional[int]] = [None] * ids.size
        if seed is not None:
            self._seeded = True
            if isinstance(seed, (int, np.integer)):
                seeds = [int(seed) + int(i) for i in ids]
            else:  # one seed per env of env_ids, in that order
                given = [int(s) for s in seed]
                if len(given) != len(order) or len(set(order)) != len(order):
                    raise ValueError(f"reset got {len(given)} seeds for {len(order)} env ids; pass "
                                     f"one seed per (distinct) reset env, or one int (env i gets "
                                     f"seed + i).")
                by_env = dict(zip(order, given))
                seeds = [by_env[int(i)] for i in ids]
        opts = dict(zip(order, split_options(options, len(order))))
        self._reset_ids(ids, seeds, [opts[int(i)] for i in ids])
        self._started = True
        return self._obs_dict(), self._info(np.zeros(self.num_envs, bool),
                                            np.zeros(self.num_envs, bool),
                                            np.zeros(self.num_envs, np.int64))

    def step(self, actions):
        acts = self._prepare(actions, chunk=False)
        obs, rew, term, trunc, info = self._advance(acts)
        return obs, rew[:, 0], term[:, 0], trunc[:, 0], info

    def chunk_step(self, actions):
        return self._advance(self._prepare(actions, chunk=True))

    def env_method(self, name: str, *args: Any, env_ids: Optional[Sequence[int]] = None) -> List[Any]:
        """Run the adapter's SubBatch method ``name`` for ``env_ids``; one result per env.

        Example: ``env.env_method("get_sim_states")`` on LIBERO returns the MuJoCo states.
        """
        self._check_open()
        return self._backend.call(name, self._ids(env_ids), *args)

    def set_success_hold_steps(self, steps: int) -> None:
        """From the next step on, a successful termination ends an episode once success has
        held ``steps`` consecutive steps (``env.success_hold_steps``; the trainer's
        ``env.success_hold_ramp`` sets it per rollout). Episodes under way keep their count.

        Raises:
            ValueError: ``steps`` < 1.
        """
        if int(steps) < 1:
            raise ValueError(f"success hold must be >= 1 step (got {steps}).")
        self._hold_steps = int(steps)

    @property
    def num_env_errors(self) -> int:
        """Worker crashes and timeouts so far (each ended one or more episodes)."""
        return self._backend.num_errors

    def worker_pids(self) -> List[int]:
        """Process ids of the pool workers ([] when in-process)."""
        return self._backend.pids()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._backend.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- internals -----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise EnvError("This env is closed; build a new one with make_env(cfg).")

    def _ids(self, env_ids: Optional[Sequence[int]]) -> np.ndarray:
        if env_ids is None:
            return np.arange(self.num_envs, dtype=np.int64)
        ids = np.unique(_np(env_ids).astype(np.int64).reshape(-1))
        if ids.size and (ids[0] < 0 or ids[-1] >= self.num_envs):
            raise ValueError(f"env_ids must be in [0, {self.num_envs}) (got {ids.tolist()}).")
        return ids

    def _prepare(self, actions: Any, chunk: bool) -> Any:
        self._check_open()
        if not self._started:
            raise EnvError("Call reset() before step()/chunk_step().")
        if self.device.type == "cuda":
            acts = torch.as_tensor(actions, device=self.device)
        else:
            acts = _np(actions)
            acts = acts.astype(np.int64 if self.action_spec.discrete else np.float32, copy=False)
        want = "(N, K, A)" if chunk else "(N, A)"
        ndim = 3 if chunk else 2
        if acts.ndim != ndim or acts.shape[0] != self.num_envs or acts.shape[-1] != self.action_dim:
            raise ValueError(
                f"actions must have shape {want} = ({self.num_envs}, {'K, ' if chunk else ''}"
                f"{self.action_dim}) (got {tuple(acts.shape)})."
            )
        return acts if chunk else acts[:, None]

    def _reset_ids(self, ids: np.ndarray, seeds, options) -> None:
        res = self._backend.reset(ids, seeds, options)
        self._apply(res)
        self._elapsed[ids] = 0
        self._success[ids] = False
        self._success_once[ids] = False
        self._success_run[ids] = 0
        self._needs_reset[ids] = False
        self._pending_error[ids] = False
        self._mark_lost(res.lost_ids)

    def _mark_lost(self, lost: np.ndarray) -> None:
        """Envs whose worker restarted outside a call of theirs: end their episode next call."""
        if lost.size:
            live = lost[~self._needs_reset[lost]]
            self._pending_error[live] = True

    def _apply(self, res: StepResult) -> None:
        ids, tr = res.ids, res.transition
        if tr is None or ids.size == 0:
            return
        full = ids.size == self.num_envs
        index = None if full else torch.as_tensor(ids, device=self.device)
        for key, value in tr.obs.items():
            rows = torch.as_tensor(value, device=self.device)
            if full:
                self._obs[key] = rows
                continue
            old = self._obs.get(key)
            merged = (
                old.clone()  # never mutated in place: dicts returned earlier stay valid
                if old is not None
                else torch.zeros((self.num_envs,) + tuple(rows.shape[1:]), dtype=rows.dtype,
                                 device=self.device)
            )
            merged[index] = rows
            self._obs[key] = merged
        if tr.task_descriptions is not None:
            for i, text in zip(ids.tolist(), tr.task_descriptions):
                self._tasks[i] = text

    def _advance(self, acts: Any):
        n, k_max = acts.shape[0], acts.shape[1]
        autoreset = np.zeros(n, bool)
        waiting = self._needs_reset & ~self._pending_error
        if waiting.any():
            ids = np.flatnonzero(waiting)
            if self.autoreset_mode is AutoresetMode.DISABLED:
                raise EnvError(
                    f"Envs {ids.tolist()} finished their episodes and autoreset_mode is DISABLED; "
                    f"call reset(env_ids={ids.tolist()}) before stepping them."
                )
            self._reset_ids(ids, [None] * ids.size, [{} for _ in ids])
            autoreset[ids] = True
        rewards = np.zeros((n, k_max), np.float32)
        term = np.zeros((n, k_max), bool)
        trunc = np.zeros((n, k_max), bool)
        env_error = self._pending_error.copy()
        trunc[env_error, 0] = True
        self._pending_error[:] = False
        substeps = np.zeros(n, np.int64)
        lost = np.zeros(n, bool)
        stale = np.zeros(n, bool)  # the last executed step returned no observation
        active = ~autoreset & ~env_error
        for k in range(k_max):
            ids = np.flatnonzero(active)
            if ids.size == 0:
                break
            # only the observation after the chunk reaches the policy: the steps before it may
            # skip rendering (SubBatch.step_unobserved)
            res = self._backend.step(ids, acts[ids, k], observe=k == k_max - 1)
            ok = res.ids
            if ok.size:
                tr = res.transition
                self._apply(res)
                stale[ok] = not tr.obs
                self._elapsed[ok] += 1
                te = _np(tr.terminated).astype(bool)
                tu = _np(tr.truncated).astype(bool)
                success = _np(tr.success).astype(bool)
                self._success_run[ok] = np.where(success, self._success_run[ok] + 1, 0)
                te = te & ~self._fixed_length[ok]
                if self._hold_steps > 1:
                    # a successful termination waits until success has held long enough
                    te = te & (~success | (self._success_run[ok] >= self._hold_steps))
                if self.max_episode_steps:
                    tu = tu | (self._elapsed[ok] >= self.max_episode_steps)
                rewards[ok, k] = _np(tr.reward)
                term[ok, k] = te
                trunc[ok, k] = tu
                self._success[ok] = success
                self._success_once[ok] |= success
            failed = res.failed_ids
            trunc[failed, k] = True
            env_error[failed] = True
            stale[failed] = False
            substeps[np.concatenate([ok, failed])] += 1
            lost[res.lost_ids] = True
            active &= ~(term[:, k] | trunc[:, k])
        if stale.any():  # episodes that ended inside the chunk: observe where they ended
            res = self._backend.observe(np.flatnonzero(stale))
            self._apply(res)
            failed = res.failed_ids
            trunc[failed, substeps[failed] - 1] = True
            env_error[failed] = True
            lost[res.lost_ids] = True
        done = term.any(1) | trunc.any(1)
        self._needs_reset |= done | env_error
        self._mark_lost(np.flatnonzero(lost & ~done))
        info = self._info(autoreset, env_error, substeps)
        if self.autoreset_mode is AutoresetMode.SAME_STEP and done.any():
            ids = np.flatnonzero(done)
            info["final_obs"] = self._obs_dict()
            self._reset_ids(ids, [None] * ids.size, [{} for _ in ids])
        t = functools.partial(torch.as_tensor, device=self.device)
        return self._obs_dict(), t(rewards), t(term), t(trunc), info

    def _obs_dict(self) -> Dict[str, Any]:
        obs: Dict[str, Any] = dict(self._obs)
        obs["task_descriptions"] = list(self._tasks)
        return obs

    def _info(self, autoreset: np.ndarray, env_error: np.ndarray, substeps: np.ndarray) -> Dict[str, Any]:
        t = functools.partial(torch.tensor, device=self.device)
        return {
            "success": t(self._success),
            "success_once": t(self._success_once),
            "elapsed_steps": t(self._elapsed),
            "autoreset": t(autoreset),
            "env_error": t(env_error),
            "num_substeps": t(substeps),
        }

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_envs={self.num_envs}, action_dim={self.action_dim}, "
            f"max_episode_steps={self.max_episode_steps}, autoreset={self.autoreset_mode.value})"
        )

