"""Env registry: named envs and adapters by string entry points, imported lazily.

Adapters, one per ``env.type`` (``maniskill``, ``libero``, ``gym``; the
:class:`~rlinf_embodied.envs.base.BatchedEnv` class built from an EnvConfig of that type), are
registered with their config dataclass in :mod:`rlinf_embodied.config.components`; a user's own adapter
needs no registration (``env.type: package.module:Class``). This module keeps

* **named envs** (``register_env``), e.g. ``maniskill/PushCube-v1``: an adapter entry point plus
  config defaults and a one-line description, listed by ``rlinf-embodied envs list``.

Nothing here imports a simulator; entry points are imported by :func:`make_env`.

Example::

    env = make_env("toy/PointReach-v0", num_envs=8)          # a named env + overrides
    env = make_env(load_config("configs/x.yaml").env)         # an EnvConfig dataclass
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from rlinf_embodied.config import components
from rlinf_embodied.envs import maniskill_suites as _maniskill_suites

__all__ = ["register_env", "register_adapter", "make_env", "describe_envs", "env_ids", "env_entry",
           "EnvEntry"]


@dataclass(frozen=True)
class EnvEntry:
    """A named env: ``entry_point`` ("module:Class"), config defaults, a one-line description."""

    id: str
    entry_point: str
    description: str
    defaults: Dict[str, Any] = field(default_factory=dict)


_ENVS: Dict[str, EnvEntry] = {}


def register_adapter(type_name: str, config, impl, description: str = "") -> None:
    """Register the BatchedEnv class ``impl`` and its config dataclass ``config`` (classes or
    ``"module:Class"`` strings) as ``env.type=type_name``; see :mod:`rlinf_embodied.config.components`.

    Raises:
        ValueError: if ``type_name`` is already registered with other classes.
    """
    components.register_type("env", type_name, config=config, impl=impl, description=description)


def register_env(id: str, entry_point: str = "", description: str = "", **defaults: Any) -> None:
    """Register a named env.

    Args:
        id: unique name, ``"<family>/<name>"`` by convention (``maniskill/PushCube-v1``).
        entry_point: ``"module:Class"`` of the BatchedEnv; empty uses the adapter of
            ``defaults["type"]``.
        description: one line for ``rlinf-embodied envs list``.
        **defaults: EnvConfig field values; must include ``type``.

    Raises:
        ValueError: missing ``type``, or ``id`` already registered with other values.
    """
    if "type" not in defaults:
        raise ValueError(f"register_env({id!r}) needs type=... (an env config type, e.g. 'gym').")
    entry = EnvEntry(id, entry_point or "", description, dict(defaults))
    if id in _ENVS and _ENVS[id] != entry:
        raise ValueError(f"Env id {id!r} is already registered with different values.")
    _ENVS[id] = entry


def env_ids() -> List[str]:
    """All registered env ids, sorted."""
    return sorted(_ENVS)


def env_entry(id: str) -> Optional[EnvEntry]:
    """The named env ``id`` as ``envs list`` prints it (``toy/PointReach-v0``), or None."""
    return _ENVS.get(id)


def _unknown(kind: str, name: str, known: List[str], fix: str) -> KeyError:
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    return KeyError(f"Unknown {kind} {name!r}.{hint} {fix}")


def make_env(cfg: Any, **overrides: Any):
    """Build a BatchedEnv from an EnvConfig dataclass or a registered env id.

    Args:
        cfg: an EnvConfig (``rlinf_embodied.config``), or a registered id such as
            ``"maniskill/PushCube-v1"``.
        **overrides: EnvConfig field values (e.g. ``num_envs=4``); with an EnvConfig they
            replace its fields (``dataclasses.replace``, so checks run again).

    Returns:
        The env, wrapped in :class:`~rlinf_embodied.envs.wrappers.video.VideoRecorder` when
        ``cfg.video`` is set.

    Raises:
        KeyError: unknown env id (with close matches).
        rlinf_embodied.config.ConfigError: unknown env type (with the valid ones).
        rlinf_embodied.config.ConfigError: invalid field values.
    """
    from rlinf_embodied.config import config_class

    entry_point = ""
    if isinstance(cfg, str):
        if cfg not in _ENVS:
            raise _unknown("env id", cfg, env_ids(),
                           "Run `rlinf-embodied envs list` for the registered ids.")
        entry = _ENVS[cfg]
        values = {**entry.defaults, **overrides}
        cls = config_class("env", values["type"])
        cfg = cls(**values)
        entry_point = entry.entry_point
    elif overrides:
        cfg = dataclasses.replace(cfg, **overrides)
    if entry_point:
        module, _, attr = entry_point.partition(":")
        cls = getattr(importlib.import_module(module), attr)
    else:
        cls = components.impl_class("env", cfg.type)
    env = cls(cfg)
    if getattr(cfg, "video", False):
        from .wrappers.video import VideoRecorder

        env = VideoRecorder(env, cfg.video_dir)
    return env


def describe_envs() -> List[Tuple[str, str]]:
    """``(id, one-line description)`` for ``rlinf-embodied envs list``: named envs, then adapters.

    Adapter rows are patterns (``maniskill/<ManiSkill3 id>``): any id of the simulator works
    through ``env.type`` and ``env.env_id`` / ``env.suite``.
    """
    rows = [(e.id, e.description) for e in sorted(_ENVS.values(), key=lambda e: e.id)]
    patterns = {"maniskill": "maniskill/<any ManiSkill3 id>", "gym": "gym/<any gymnasium id or module:Class>"}
    for t in components.types("env"):
        if t.name in patterns:
            rows.append((patterns[t.name], t.description))
    return rows


# --------------------------------------------------------------------------------------------
# Built-in registrations (strings only: nothing is imported here)
# --------------------------------------------------------------------------------------------
_MANISKILL = {
    "PushCube-v1": "push a cube to a goal region (ManiSkill3, Panda)",
    "PickCube-v1": "pick up a cube and move it to a goal position (ManiSkill3, Panda)",
    "StackCube-v1": "stack the red cube on the green cube (ManiSkill3, Panda)",
    "PullCube-v1": "pull a cube back to a goal region (ManiSkill3, Panda)",
    "PegInsertionSide-v1": "insert a peg into a box's side hole (ManiSkill3, Panda)",
    "PushT-v1": "push a T-shaped block onto a T-shaped goal (ManiSkill3)",
}
for _id, _text in _MANISKILL.items():
    register_env(f"maniskill/{_id}", description=_text, type="maniskill", env_id=_id)

_LIBERO = {
    "libero_spatial": "LIBERO-Spatial: 10 tasks, same objects, different layouts (220 steps)",
    "libero_object": "LIBERO-Object: 10 pick-and-place tasks over different objects (280 steps)",
    "libero_goal": "LIBERO-Goal: 10 tasks, same scene, different goals (300 steps)",
    "libero_10": "LIBERO-10 (LIBERO-Long): 10 long-horizon tasks (520 steps)",
    "libero_90": "LIBERO-90: 90 short tasks over 20 scenes (400 steps)",
}
for _suite, _text in _LIBERO.items():
    register_env(f"libero/{_suite}", description=_text, type="libero", suite=_suite)
# language-conditioned ManiSkill suites (envs/maniskill_suites.py; the VLA SFT -> RL miniature)
for _suite in _maniskill_suites.SUITES.values():
    register_env(f"maniskill/{_suite.name}", type="maniskill", suite=_suite.name,
                 description=f"{_suite.description} (ManiSkill3 suite, {_suite.max_episode_steps} "
                             "steps)")

register_env("toy/PointReach-v0", type="gym", env_id="toy/PointReach-v0",
             description="2-D point reaching a target; continuous actions, state obs, learnable in ~20k steps")
register_env("toy/Countdown-v0", type="gym", env_id="toy/Countdown-v0",
             description="deterministic step counter for exact-value tests (reward t, ends at t=length)")
register_env("gym/CartPole-v1", type="gym", env_id="CartPole-v1",
             description="gymnasium CartPole: balance a pole on a moving cart; 2 discrete "
                         "actions (push left / right), one integer per env (A = 1)")
register_env("gym/Pendulum-v1", type="gym", env_id="Pendulum-v1",
             description="gymnasium Pendulum (Box actions)")
