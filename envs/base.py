"""The batched environment contract shared by every simulator adapter.

Shape vocabulary (see DESIGN.md): N envs, K action-chunk length, A action dim, S state dim,
H, W image size.

Two layers live here:

* :class:`BatchedEnv`, the contract the rollout, evaluation and training code program against:
  N envs stepped together, torch tensors in and out, a declared :class:`AutoresetMode`.
* :class:`SubBatch`, the simulator-facing half: M of the N envs hosted in one process (in-process
  or in a pool worker, see ``pool.py``), stepped as a batch on numpy arrays (or device tensors for
  GPU simulators). Adapters (``maniskill.py``, ``libero.py``, ``gymnasium_env.py``) only write a
  SubBatch; episode bookkeeping (autoreset, time limits, ``ignore_terminations``, chunking, env
  errors) is written once, in ``vector.py``.

Importing this module imports torch and numpy, never a simulator.
"""

from __future__ import annotations

import abc
import enum
import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

__all__ = [
    "AutoresetMode",
    "EnvWarning",
    "ActionSpec",
    "EnvSpec",
    "Transition",
    "SubBatch",
    "BatchedEnv",
    "EnvError",
    "OBS_KEYS",
    "drop_log_messages",
]

#: Observation keys of the contract. Absent keys are absent, not zeros.
OBS_KEYS = ("states", "main_images", "wrist_images", "task_descriptions")


class _DropMessages(logging.Filter):
    """Drops the records whose message contains one of ``words``; every other record passes."""

    def __init__(self, words: Sequence[str]):
        super().__init__()
        self.words = tuple(words)

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not any(w in msg for w in self.words)


def drop_log_messages(logger_names: Sequence[str], words: Sequence[str]) -> None:
    """Silence a simulator's known-harmless log lines: on each named logger, drop the records
    whose message contains one of ``words`` (installed once per process and logger; the
    callers say why each line is noise)."""
    for name in logger_names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) and f.words == tuple(words) for f in logger.filters):
            logger.addFilter(_DropMessages(words))


class EnvWarning(UserWarning):
    """Something about an env's behaviour that a run survives but its results depend on (an
    episode ended without ``info['success']``); the CLI and the env pool's workers print it as
    one ``warning: ...`` line."""


class EnvError(RuntimeError):
    """An environment could not be built, reset or stepped; the message says how to fix it.

    Attributes:
        summary: One line for a command-line error: the message without a worker's traceback
            (the traceback's last line, the error itself, kept).
    """

    def __init__(self, message: str, summary: str | None = None):
        super().__init__(message)
        self.summary = summary or message


class AutoresetMode(str, enum.Enum):
    """When a finished env starts its next episode (the gymnasium >= 1.0 vocabulary).

    * ``NEXT_STEP``: the step that ends an episode returns its final observation; the *next*
      ``step``/``chunk_step`` resets that env instead of stepping it (its actions are ignored,
      reward 0, done flags False, ``info["autoreset"]`` True). Gymnasium >= 1.0 default.
    * ``SAME_STEP``: a finished env is reset within the step that ends it; the returned
      observation is the new episode's first one and the final observation is in
      ``info["final_obs"]``.
    * ``DISABLED``: finished envs stay finished; the caller resets them with
      ``reset(env_ids=...)``. Stepping them first raises :class:`EnvError`.
    """

    NEXT_STEP = "next_step"
    SAME_STEP = "same_step"
    DISABLED = "disabled"

    @classmethod
    def parse(cls, value: "str | AutoresetMode") -> "AutoresetMode":
        """Parse ``next_step`` / ``same_step`` / ``disabled`` (case-insensitive).

        Raises:
            ValueError: for any other value, listing the valid ones.
        """
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            valid = ", ".join(m.value for m in cls)
            raise ValueError(f"Unknown autoreset mode {value!r}; use one of: {valid}.") from None


@dataclass(frozen=True)
class ActionSpec:
    """The action space of one env.

    Attributes:
        shape: ``(A,)``; discrete spaces have ``A == 1``.
        low: (A,) float32 lower bounds (env units).
        high: (A,) float32 upper bounds (env units).
        discrete: True for a ``Discrete(n)`` space; actions are then integers in ``[0, n)``
            passed as an (N, 1) tensor of any numeric dtype.
        n: number of discrete actions, or None for continuous spaces.
    """

    shape: Tuple[int, ...]
    low: np.ndarray
    high: np.ndarray
    discrete: bool = False
    n: Optional[int] = None

    @property
    def dim(self) -> int:
        """A, the action dimension."""
        return int(self.shape[0])


@dataclass(frozen=True)
class EnvSpec:
    """What a SubBatch reports about its envs after construction.

    Attributes:
        action: the action space.
        obs_shapes: observation key -> per-env shape, e.g. ``{"states": (S,),
            "main_images": (H, W, 3)}``; only keys that are present.
        max_episode_steps: the adapter's default time limit in env steps, or None for none.
        metadata: free-form adapter facts (e.g. ``{"control_freq_hz": 20}``).
    """

    action: ActionSpec
    obs_shapes: Dict[str, Tuple[int, ...]]
    max_episode_steps: Optional[int] = None
    metadata: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Transition:
    """Results of M envs after a reset or one step (numpy, or torch on GPU simulators).

    Attributes:
        obs: ``states`` (M, S) float32, ``main_images`` (M, H, W, 3) uint8, optional
            ``wrist_images`` (M, H, W, 3) uint8.
        reward: (M,) float32 (zeros after a reset).
        terminated: (M,) bool, the env's own termination (e.g. success).
        truncated: (M,) bool, the simulator's own truncation (the time limit is applied by
            :class:`~rlinf_embodied.envs.vector.VectorBatchedEnv`, not here).
        success: (M,) bool, the env's success check at this step.
        task_descriptions: M instructions, or None when unchanged since the last reset.
    """

    obs: Dict[str, Any]
    reward: Any
    terminated: Any
    truncated: Any
    success: Any
    task_descriptions: Optional[List[str]] = None

    @staticmethod
    def concat(parts: Sequence["Transition"]) -> "Transition":
        """Concatenate transitions of consecutive env groups along the env axis."""
        if len(parts) == 1:
            return parts[0]
        cat = torch.cat if isinstance(parts[0].reward, torch.Tensor) else np.concatenate
        tasks = None
        if all(p.task_descriptions is not None for p in parts):
            tasks = [t for p in parts for t in p.task_descriptions]
        return Transition(
            obs={k: cat([p.obs[k] for p in parts]) for k in parts[0].obs},
            reward=cat([p.reward for p in parts]),
            terminated=cat([p.terminated for p in parts]),
            truncated=cat([p.truncated for p in parts]),
            success=cat([p.success for p in parts]),
            task_descriptions=tasks,
        )


def reset_transition(obs: Dict[str, Any], task_descriptions: List[str]) -> Transition:
    """A :class:`Transition` for M freshly reset envs (zero reward, no done flags)."""
    m = len(task_descriptions)
    return Transition(
        obs=obs,
        reward=np.zeros(m, np.float32),
        terminated=np.zeros(m, bool),
        truncated=np.zeros(m, bool),
        success=np.zeros(m, bool),
        task_descriptions=list(task_descriptions),
    )


class SubBatch(abc.ABC):
    """M envs of one adapter living in one process and stepped as a batch.

    Constructed as ``SubBatchClass(cfg, env_ids, device)`` inside the process that runs it
    (pool workers build their own, so rendering contexts are created in the worker).
    ``env_ids`` are the global indices (0..N-1) of the hosted envs; methods take *local*
    indices into that list.

    Args (of subclasses' constructors):
        cfg: the adapter's EnvConfig dataclass.
        env_ids: global env indices hosted here, length M.
        device: the worker's CUDA device (:class:`~rlinf_embodied.envs.pool.WorkerDevice`) or
            None on CPU.

    The :class:`~rlinf_embodied.envs.vector.VectorBatchedEnv` takes a factory
    ``factory(env_ids, device)``, e.g. ``functools.partial(MySubBatch, cfg)``.

    Raises:
        TypeError: at class definition, a subclass that overrides :meth:`step_unobserved` but
            not :meth:`observe` (an episode ending inside a chunk would have no observation).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.step_unobserved is not SubBatch.step_unobserved and cls.observe is SubBatch.observe:
            raise TypeError(f"{cls.__name__} overrides step_unobserved but not observe(); "
                            f"implement both (observe returns the current observations) or neither.")

    @property
    @abc.abstractmethod
    def spec(self) -> EnvSpec:
        """The action/observation facts of the hosted envs (identical for all of them)."""

    @abc.abstractmethod
    def reset(
        self, local_ids: np.ndarray, seeds: List[Optional[int]], options: List[Dict[str, Any]]
    ) -> Transition:
        """Reset envs ``local_ids`` (M',) with one seed (or None) and one options dict each.

        Returns:
            A Transition over the M' envs, in ``local_ids`` order.
        """

    @abc.abstractmethod
    def step(self, local_ids: np.ndarray, actions: Any) -> Transition:
        """Step envs ``local_ids`` (M',) with ``actions`` (M', A) once.

        Returns:
            A Transition over the M' envs, in ``local_ids`` order.
        """

    def step_unobserved(self, local_ids: np.ndarray, actions: Any) -> Transition:
        """Step envs ``local_ids`` (M',) with ``actions`` (M', A) once; observations optional.

        The BatchedEnv calls this for every step of an action chunk but the last: only the
        observation after the chunk reaches the policy. An adapter whose observations are
        costly (rendering) returns a Transition with ``obs == {}`` and must then implement
        :meth:`observe`, which the BatchedEnv calls for envs whose episode ended on such a step.
        The default steps normally (observations included).

        Returns:
            A Transition over the M' envs, in ``local_ids`` order; ``obs`` may be ``{}``.
        """
        return self.step(local_ids, actions)

    def observe(self, local_ids: np.ndarray) -> Transition:
        """The current observations of envs ``local_ids`` (M',) without stepping them; reward
        0 and no flags. Needed only by adapters whose :meth:`step_unobserved` skips observations.

        Raises:
            NotImplementedError: the adapter always observes in :meth:`step_unobserved`.
        """
        raise NotImplementedError(
            f"{type(self).__name__}.step_unobserved returned no observations but the adapter has "
            f"no observe(); implement both or neither.")

    def call(self, name: str, local_ids: np.ndarray, *args: Any) -> List[Any]:
        """Run adapter method ``name(local_ids, *args)`` (one result per env); for tests/eval.

        Raises:
            AttributeError: if the adapter has no public method ``name``.
        """
        if name.startswith("_"):
            raise AttributeError(f"{type(self).__name__}.call refuses private method {name!r}")
        return getattr(self, name)(local_ids, *args)

    @abc.abstractmethod
    def close(self) -> None:
        """Release every simulator, renderer and file of the hosted envs."""


class BatchedEnv(abc.ABC):
    """N environments stepped together; the contract every simulator adapter fulfils.

    Observations are dicts: ``states`` (N, S) float32, ``main_images`` (N, H, W, 3) uint8,
    ``wrist_images`` (N, H, W, 3) uint8 (optional), ``task_descriptions`` list[str] of length N.
    Absent keys are absent, not zeros. Tensors are torch, on :attr:`device` (the simulator's
    device: CPU for process pools, the GPU for GPU physics).

    Every ``info`` carries, as (N,) tensors: ``success`` (bool, the env's own success check at
    the last executed step), ``success_once`` (bool, success at any step of the current
    episode), ``elapsed_steps`` (int64, steps of the current episode), ``autoreset`` (bool, reset
    at the start of this call, NEXT_STEP mode) and ``env_error`` (bool, the env's worker crashed
    or timed out and its episode was ended as truncated).

    Attributes:
        num_envs: N.
        action_spec: bounds, dimension and discreteness of actions.
        max_episode_steps: time limit in env steps (truncation), or None.
        autoreset_mode: the declared :class:`AutoresetMode`.
        ignore_terminations: when True, terminations never end an episode (``terminated`` is
            always False); episodes run to ``max_episode_steps`` (GRPO, fair evaluation).
    """

    num_envs: int
    action_spec: ActionSpec
    max_episode_steps: Optional[int]
    autoreset_mode: AutoresetMode
    ignore_terminations: bool
    device: torch.device

    @property
    def action_dim(self) -> int:
        """A, the action dimension (1 for discrete actions)."""
        return self.action_spec.dim

    @abc.abstractmethod
    def reset(
        self,
        seed: Optional[int | Sequence[int]] = None,
        env_ids: Optional[Sequence[int]] = None,
        options: Optional[Dict[str, Any]] = None,
    ) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """Reset all envs, or only ``env_ids``; the others are left untouched.

        Args:
            seed: base seed; env i is seeded with ``seed + i`` (global index). Or one seed per
                reset env (in ``env_ids`` order; e.g. GRPO groups of envs sharing a seed).
                None continues each env's own random stream (the very first reset uses the
                config's seed).
            env_ids: global indices to reset; None resets all N.
            options: adapter options. A value that is a sequence of ``len(env_ids)`` entries is
                split per env in ``env_ids`` order (e.g. LIBERO ``{"init_state_ids": [3, 4]}``);
                anything else is given to every reset env.

        Returns:
            ``(obs, info)`` for all N envs (rows of envs not reset are unchanged).

        Raises:
            EnvError: the reset failed even after restarting the env's worker.
            ValueError: a seed sequence whose length is not the number of reset envs.
        """

    @abc.abstractmethod
    def step(self, actions: Any) -> Tuple[Dict[str, Any], torch.Tensor, torch.Tensor,
                                           torch.Tensor, Dict[str, Any]]:
        """Step every env once.

        Args:
            actions: (N, A) tensor or array in env units (discrete: (N, 1) integers).

        Returns:
            ``(obs, reward (N,) float32, terminated (N,) bool, truncated (N,) bool, info)``.

        Raises:
            EnvError: ``autoreset_mode`` is DISABLED and a finished env was not reset.
        """

    @abc.abstractmethod
    def chunk_step(self, actions: Any) -> Tuple[Dict[str, Any], torch.Tensor, torch.Tensor,
                                                 torch.Tensor, Dict[str, Any]]:
        """Execute an action chunk open loop: up to K sub-steps per env.

        Each env stops at its first done (terminated or truncated): later sub-steps are not
        executed for it, their rewards are 0 and their done flags False. Autoreset happens at
        chunk granularity (NEXT_STEP: the next call resets it; SAME_STEP: reset after the chunk).

        Args:
            actions: (N, K, A) tensor or array in env units.

        Returns:
            ``(obs, rewards (N, K) float32, terminated (N, K) bool, truncated (N, K) bool,
            info)``; obs is the observation after each env's last executed sub-step and
            ``info["num_substeps"]`` (N,) int64 counts executed sub-steps.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release every process, simulator, renderer and file. Idempotent."""

    def __enter__(self) -> "BatchedEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
