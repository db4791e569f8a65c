"""rlinf_embodied.envs: batched simulator environments behind one contract.

Importing this package is cheap: it never imports a simulator (ManiSkill, LIBERO, gymnasium
envs are imported by :func:`make_env` when an env is built).

Public API:
    BatchedEnv, AutoresetMode, ActionSpec, EnvSpec, EnvError   the contract (base.py)
    make_env, register_env, describe_envs                      the registry (registry.py)
"""

from .base import ActionSpec, AutoresetMode, BatchedEnv, EnvError, EnvSpec
from .registry import describe_envs, make_env, register_env

__all__ = [
    "ActionSpec",
    "AutoresetMode",
    "BatchedEnv",
    "EnvError",
    "EnvSpec",
    "describe_envs",
    "make_env",
    "register_env",
]
