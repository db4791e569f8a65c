"""Every env and policy type in one table: ``type`` -> (config dataclass, implementation).

A type is registered with one line naming both classes as ``"module:Class"`` strings, so that
loading a config imports only the (light) config module and building a component imports its
implementation on first use::

    register_type("policy", "mlp",
                  config="rlinf_embodied.policies.configuration_actor_critic:MLPPolicyConfig",
                  impl="rlinf_embodied.policies.mlp:MLPPolicy",
                  description="actor-critic MLP on states")

Users plug in their own component without registering anything: a ``type`` of the form
``"package.module:Class"`` names an implementation class (a :class:`~rlinf_embodied.policies.Policy`
or a :class:`~rlinf_embodied.envs.BatchedEnv` subclass) whose ``config_class`` attribute is its
config dataclass (a subclass of :class:`~rlinf_embodied.config.PolicyConfig` /
:class:`~rlinf_embodied.config.EnvConfig`)::

    policy:
      type: my_lab.policies:TinyTransformerPolicy   # importable from the working directory
      depth: 2                                      # a field of its config_class

This module imports nothing heavy; it is read by the config loader
(:mod:`rlinf_embodied.config.loading`, config classes), :mod:`rlinf_embodied.envs.registry` and
:mod:`rlinf_embodied.policies.registry` (implementations).
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Dict, List

from rlinf_embodied.config.errors import ConfigError, suggest

__all__ = ["ComponentType", "SECTIONS", "config_class", "impl_class", "register_type", "type_names",
           "types", "user_modules_importable"]

SECTIONS = ("env", "policy")


@dataclass(frozen=True)
class ComponentType:
    """One registered type: ``section`` (``env`` / ``policy``), ``name`` (the config's
    ``type``), ``config`` and ``impl`` as ``"module:Class"`` (or classes), a one-line
    description for ``rlinf-embodied envs list``."""

    section: str
    name: str
    config: object
    impl: object
    description: str = ""


_TYPES: Dict[str, Dict[str, ComponentType]] = {s: {} for s in SECTIONS}


def register_type(section: str, name: str, *, config, impl, description: str = "") -> None:
    """Register ``name`` as a type of ``section`` (see the module docstring).

    Args:
        section: ``"env"`` or ``"policy"``.
        name: the value of the config's ``type`` key.
        config: the config dataclass, or ``"module:Class"``.
        impl: the implementation class (built as ``impl(cfg)`` for envs, ``impl(cfg, spec)``
            for policies), or ``"module:Class"``.
        description: one line for listings.

    Raises:
        ValueError: unknown section, ``name`` containing ``:``, or ``name`` already registered
            with other classes.
    """
    if section not in _TYPES:
        raise ValueError(f"Unknown component section {section!r}; use one of {SECTIONS}.")
    if ":" in name:
        raise ValueError(f"Type names must not contain ':' (got {name!r}); ':' marks module:Class.")
    entry = ComponentType(section, name, config, impl, description)
    old = _TYPES[section].get(name)
    if old is not None and (old.config, old.impl) != (config, impl):
        raise ValueError(f"{section} type {name!r} is already registered ({old.impl}).")
    _TYPES[section][name] = entry


def type_names(section: str) -> List[str]:
    """Sorted names of the registered types of ``section``."""
    return sorted(_TYPES[section])


def types(section: str) -> List[ComponentType]:
    """The registered types of ``section``, sorted by name."""
    return [_TYPES[section][n] for n in type_names(section)]


def user_modules_importable() -> None:
    """Put the working directory on ``sys.path``: user modules next to the job import as
    ``python -m`` would see them (Ray workers start in the driver's directory and do the same)."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())


def _import(target, what: str):
    if not isinstance(target, str):
        return target
    module, _, attr = target.partition(":")
    user_modules_importable()
    try:
        obj = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):
            raise ConfigError(
                f"{what}: cannot import module {module!r}. Make it importable (run from the "
                f"directory that contains it, or add that directory to PYTHONPATH)."
            ) from None
        raise
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{what}: module {module!r} has no attribute {attr!r}.")
        obj = getattr(obj, part)
    return obj


def _unknown(section: str, name: str):
    known = type_names(section)
    hint = suggest(name, known)
    return ConfigError(
        f"Unknown {section}.type {name!r}. Valid types: {', '.join(known)}{hint} "
        f"(or 'package.module:Class' for your own {section})"
    )


def _custom(section: str, name: str) -> type:
    """The implementation class named by a ``module:Class`` type, checked."""
    if ":" not in name or name.startswith(":") or name.endswith(":"):
        raise _unknown(section, name)
    cls = _import(name, f"{section}.type {name!r}")
    cfg_cls = getattr(cls, "config_class", None)
    if not isinstance(cls, type) or cfg_cls is None:
        raise ConfigError(
            f"{section}.type {name!r} must name a class with a `config_class` attribute (its config "
            f"dataclass); got {cls!r}."
        )
    return cls


def config_class(section: str, name: str) -> type:
    """The config dataclass of type ``name`` of ``section`` (imports its module).

    Raises:
        rlinf_embodied.config.ConfigError: unknown type (lists the valid ones and the closest),
            or a ``module:Class`` that cannot be imported or has no ``config_class``.
    """
    entry = _TYPES[section].get(name)
    if entry is None:
        return _custom(section, name).config_class
    return _import(entry.config, f"{section}.type {name!r}")


def impl_class(section: str, name: str) -> type:
    """The implementation class of type ``name`` of ``section`` (imports it on first use).

    Raises:
        rlinf_embodied.config.ConfigError: as :func:`config_class`.
    """
    entry = _TYPES[section].get(name)
    if entry is None:
        return _custom(section, name)
    return _import(entry.impl, f"{section}.type {name!r}")


# --------------------------------------------------------------------------------------------
# Built-in types: one line each (strings only: nothing is imported here).
# --------------------------------------------------------------------------------------------
_E, _P = "rlinf_embodied.envs.", "rlinf_embodied.policies."
register_type("env", "maniskill", config=_E + "configuration_maniskill:ManiSkillEnvConfig",
              impl=_E + "maniskill:ManiSkillEnv",
              description="env.type=maniskill env.env_id=<id>: SAPIEN GPU physics on CUDA, physx_cpu pool otherwise")
register_type("env", "libero", config=_E + "configuration_libero:LiberoEnvConfig",
              impl=_E + "libero:LiberoEnv", description="env.type=libero env.suite=<suite> env.task_ids=[...]")
register_type("env", "gym", config=_E + "configuration_gym:GymEnvConfig",
              impl=_E + "gymnasium_env:GymnasiumEnv",
              description="env.type=gym env.env_id=<id or module:Class> env.kwargs={...}")
register_type("policy", "mlp", config=_P + "configuration_actor_critic:MLPPolicyConfig",
              impl=_P + "mlp:MLPPolicy", description="actor-critic MLP on states")
register_type("policy", "cnn", config=_P + "configuration_actor_critic:CNNPolicyConfig",
              impl=_P + "cnn:CNNPolicy", description="actor-critic CNN on camera images (+ states)")
register_type("policy", "openvla", config=_P + "configuration_openvla:OpenVLAPolicyConfig",
              impl=_P + "openvla:OpenVLAPolicy", description="OpenVLA, autoregressive action tokens")
register_type("policy", "openvla_oft", config=_P + "configuration_openvla:OpenVLAOFTPolicyConfig",
              impl=_P + "openvla_oft:OpenVLAOFTPolicy",
              description="OpenVLA-OFT, parallel decoding of an action chunk")
register_type("policy", "pi0", config=_P + "configuration_pi0:Pi0PolicyConfig", impl=_P + "pi0:Pi0Policy",
              description="pi0, flow-matching VLA (PaliGemma + Gemma action expert)")
register_type("policy", "pi05", config=_P + "configuration_pi0:Pi05PolicyConfig", impl=_P + "pi0:Pi05Policy",
              description="pi0.5, flow-matching VLA with the state in the prompt")
