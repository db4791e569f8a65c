"""Gymnasium adapter: any gymnasium id, or a ``module:Class`` entry point, as a BatchedEnv.

Observations: a ``Box`` observation becomes ``states`` (N, S) float32 (flattened). A ``Dict``
observation is mapped by config: ``image_keys`` names the keys that become ``main_images`` /
``wrist_images`` ((H, W, 3) uint8 each); ``state_keys`` (default: every other Box key, sorted)
are flattened and concatenated into ``states``.

Actions: ``Box`` (A,) in env units, or ``Discrete(n)`` passed as A=1 integers (N, 1).

Vectorisation: ``vectorization="sync"`` keeps all envs in this process; ``"async"`` hosts them
in a :class:`~rlinf_embodied.envs.pool.ProcessPool` (``forkserver``/``spawn``), with timeouts
and worker restarts. Autoreset follows gymnasium >= 1.0 semantics (``next_step`` by default, no
``final_info``); see :class:`~rlinf_embodied.envs.base.AutoresetMode`.

Success: ``info["success"]`` of the gymnasium env when it reports one, else False (with a
warning at the first episode end that reported none).
"""

from __future__ import annotations

import difflib
import functools
import importlib
import warnings
from typing import Any, Dict, List, Optional

import numpy as np

from .base import ActionSpec, EnvSpec, EnvWarning, SubBatch, Transition, reset_transition
from .vector import VectorBatchedEnv

__all__ = ["GymnasiumEnv", "GymSubBatch", "make_gymnasium_env", "register_toy_envs"]

TOY_ENVS = {
    "toy/PointReach-v0": ("rlinf_embodied.envs.toy:PointReachEnv", 50),
    "toy/Countdown-v0": ("rlinf_embodied.envs.toy:CountdownEnv", 100),
}


def register_toy_envs() -> None:
    """Register the toy envs with gymnasium (idempotent)."""
    import gymnasium

    for env_id, (entry_point, max_steps) in TOY_ENVS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(env_id, entry_point=entry_point, max_episode_steps=max_steps)


def _entry_point_class(env_id: str):
    """The class of a ``module:Class`` entry point, or None when ``env_id`` is a gymnasium id."""
    module, sep, attr = env_id.partition(":")
    if not sep or not attr.isidentifier():
        return None  # also gymnasium's own "module:Env-v0" syntax
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(
            f"Cannot import gym entry point {env_id!r}: {e}. Give 'package.module:ClassName' "
            f"importable from this Python (and from pool workers)."
        ) from e


def unknown_kwargs(env_id: str, kwargs: Dict[str, Any]) -> Optional[str]:
    """Why ``kwargs`` do not fit the constructor of ``env_id`` (names it does not take, with
    close matches), or None when they fit or the constructor takes ``**kwargs``; looks at the
    signature only (no env is built). ``env_id``: a gymnasium id (registered, ``module:id``)
    or a ``module:Class`` entry point."""
    import inspect

    if not kwargs:
        return None
    cls = _entry_point_class(env_id)
    try:
        if cls is None:
            import gymnasium
            from gymnasium.envs.registration import load_env_creator

            register_toy_envs()
            module, sep, name = env_id.rpartition(":")
            if sep:  # gymnasium's module:id form: the module registers the id
                importlib.import_module(module)
            entry = gymnasium.spec(name).entry_point
            cls = load_env_creator(entry) if isinstance(entry, str) else entry
        params = inspect.signature(cls).parameters.values()
    except Exception:  # noqa: BLE001 - an id or entry point this check cannot resolve: the env says
        return None
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    bad = [k for k in kwargs if k not in names]
    if not bad:
        return None
    close = {k: difflib.get_close_matches(k, names, n=1) for k in bad}
    hints = ", ".join(f"{k!r}" + (f" (did you mean {c[0]!r}?)" if c else "") for k, c in close.items())
    return (f"env.kwargs {hints} not taken by {env_id}'s constructor; it takes "
            f"{', '.join(names) or 'no arguments'}.")


def make_gymnasium_env(env_id: str, kwargs: Dict[str, Any], max_episode_steps: Optional[int]):
    """One gymnasium env from an id or a ``module:Class`` entry point.

    Raises:
        ValueError: unknown id (with close matches) or unimportable entry point.
    """
    import gymnasium

    cls = _entry_point_class(env_id)
    if cls is not None:
        return cls(**kwargs)
    register_toy_envs()
    if ":" not in env_id and env_id not in gymnasium.registry:
        close = difflib.get_close_matches(env_id, list(gymnasium.registry), n=5, cutoff=0.6)
        hint = f" Close matches: {', '.join(close)}." if close else ""
        raise ValueError(
            f"Unknown gymnasium env id {env_id!r}.{hint} Register it with gymnasium.register, or "
            f"set env.env_id to 'package.module:ClassName'."
        )
    return gymnasium.make(env_id, max_episode_steps=max_episode_steps, disable_env_checker=True,
                          **kwargs)


def _looks_like_image(space) -> bool:
    """A uint8 Box of shape (H, W, 3) or (H, W, 4) with H, W >= 8."""
    shape = tuple(space.shape or ())
    return (np.dtype(space.dtype) == np.uint8 and len(shape) == 3 and shape[-1] in (3, 4)
            and min(shape[:2]) >= 8)


class _ObsMapper:
    """Maps one gymnasium observation to contract keys; built from the observation space."""

    def __init__(self, space, image_keys: Dict[str, str], state_keys: List[str]):
        from gymnasium import spaces

        self.shapes: Dict[str, tuple] = {}
        if isinstance(space, spaces.Dict):
            missing = [k for k in list(image_keys) + list(state_keys) if k not in space.spaces]
            if missing:
                raise ValueError(
                    f"Observation keys {missing} are not in the env's Dict observation "
                    f"(keys: {sorted(space.spaces)}); fix env.image_keys / env.state_keys."
                )
            self.image_keys = dict(image_keys)
            self.state_keys = list(state_keys) or sorted(
                k for k, s in space.spaces.items()
                if k not in image_keys and isinstance(s, spaces.Box)
            )
            if not state_keys:  # defaulted: an image would be flattened into thousands of states
                k = next((k for k in self.state_keys if _looks_like_image(space.spaces[k])), None)
                if k is not None:
                    raise ValueError(
                        f"Observation key {k!r} is an image ({tuple(space.spaces[k].shape)} uint8) "
                        f"but not in env.image_keys, so it would be flattened into the state "
                        f"vector; map it (env.image_keys={{{k}: main_images}}) or name the state "
                        f"keys (env.state_keys=[...]) to leave it out.")
            for key, target in self.image_keys.items():
                shape = tuple(space.spaces[key].shape)
                if len(shape) != 3 or shape[-1] != 3:
                    raise ValueError(
                        f"Image key {key!r} has shape {shape}; images must be (H, W, 3) uint8."
                    )
                self.shapes[target] = shape
            size = sum(int(np.prod(space.spaces[k].shape)) for k in self.state_keys)
        elif isinstance(space, spaces.Box):
            if image_keys:
                raise ValueError("env.image_keys needs a Dict observation space; this env has a Box.")
            self.image_keys, self.state_keys = {}, []
            size = int(np.prod(space.shape))
        else:
            raise ValueError(
                f"Unsupported observation space {space}; use Box or Dict (wrap the env with "
                f"gymnasium.wrappers.FlattenObservation for others)."
            )
        if size:
            self.shapes["states"] = (size,)

    def __call__(self, observations: List[Any]) -> Dict[str, np.ndarray]:
        out: Dict[str, np.ndarray] = {}
        if not isinstance(observations[0], dict):
            out["states"] = np.stack([np.asarray(o, np.float32).reshape(-1) for o in observations])
            return out
        if self.state_keys:
            out["states"] = np.stack([
                np.concatenate([np.asarray(o[k], np.float32).reshape(-1) for k in self.state_keys])
                for o in observations
            ])
        for key, target in self.image_keys.items():
            out[target] = np.stack([np.asarray(o[key], np.uint8) for o in observations])
        return out


class GymSubBatch(SubBatch):
    """M gymnasium envs in one process, stepped one after another.

    Args:
        cfg: a :class:`~rlinf_embodied.envs.configuration_gym.GymEnvConfig`.
        env_ids: global env indices hosted here.
        device: unused (gymnasium envs run on the CPU).
    """

    def __init__(self, cfg: Any, env_ids: List[int], device: Any = None):
        from gymnasium import spaces

        self._envs = [make_gymnasium_env(cfg.env_id, dict(cfg.kwargs), cfg.max_episode_steps)
                      for _ in env_ids]
        first = self._envs[0]
        self._mapper = _ObsMapper(first.observation_space, dict(cfg.image_keys), list(cfg.state_keys))
        act = first.action_space
        if isinstance(act, spaces.Discrete):
            self._discrete = True
            action = ActionSpec((1,), np.zeros(1, np.float32) + act.start,
                                np.full(1, act.start + act.n - 1, np.float32), True, int(act.n))
        elif isinstance(act, spaces.Box) and len(act.shape) == 1:
            self._discrete = False
            action = ActionSpec(tuple(act.shape), act.low.astype(np.float32),
                                act.high.astype(np.float32))
        else:
            raise ValueError(
                f"Unsupported action space {act}; use a 1-D Box or a Discrete space."
            )
        spec = getattr(first, "spec", None)
        self._spec = EnvSpec(action, self._mapper.shapes,
                             cfg.max_episode_steps or (spec.max_episode_steps if spec else None))
        self._task = cfg.task_description or cfg.env_id
        self._env_id, self._check_success = cfg.env_id, True  # until success is seen or warned

    @property
    def spec(self) -> EnvSpec:
        return self._spec

    def reset(self, local_ids, seeds, options) -> Transition:
        obs = [self._envs[i].reset(seed=s, options=o or None)[0]
               for i, s, o in zip(local_ids, seeds, options)]
        return reset_transition(self._mapper(obs), [self._task] * len(obs))

    def step(self, local_ids, actions) -> Transition:
        results = []
        for i, a in zip(local_ids, actions):
            results.append(self._envs[i].step(int(a[0]) if self._discrete else a))
        obs, rew, term, trunc, infos = zip(*results)
        reported = self._check_success and any("success" in i for i in infos)
        if self._check_success and (reported or any(term + trunc)):
            self._check_success = False
            if not reported:  # an episode ended without info["success"]: say so once
                warnings.warn(
                    f"env {self._env_id} ended an episode without info['success']: success_once "
                    f"and success_at_end will read 0 (mean return still measures it); return "
                    f"info['success'] (a bool) from step() to count successes.", EnvWarning,
                    stacklevel=2)
        return Transition(
            obs=self._mapper(list(obs)),
            reward=np.asarray(rew, np.float32),
            terminated=np.asarray(term, bool),
            truncated=np.asarray(trunc, bool),
            success=np.asarray([bool(i.get("success", False)) for i in infos], bool),
        )

    def close(self) -> None:
        for env in self._envs:
            env.close()
        self._envs = []


class GymnasiumEnv(VectorBatchedEnv):
    """N gymnasium envs (``env.type=gym``), in-process (``sync``) or in a pool (``async``).

    Args:
        cfg: a :class:`~rlinf_embodied.envs.configuration_gym.GymEnvConfig`.

    Raises:
        ValueError: unknown id, unsupported spaces, image/state keys not in the observation.
    """

    sub_batch_class: type = GymSubBatch
    """What each process builds as ``sub_batch_class(cfg, env_ids, device)``: a subclass that
    changes what the envs observe (e.g. renders its own camera) sets its own here."""

    def __init__(self, cfg: Any):
        procs = 0 if cfg.vectorization == "sync" else max(1, cfg.num_processes)
        super().__init__(functools.partial(self.sub_batch_class, cfg), cfg, num_processes=procs)
