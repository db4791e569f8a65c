"""Config of the gymnasium adapter (envs/gymnasium_env.py), ``env.type: gym``.

Registered by type in :mod:`rlinf_embodied.config.components`; loaded lazily by the config loader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List

from rlinf_embodied.config import ConfigError, EnvConfig


@dataclass
class GymEnvConfig(EnvConfig):
    """Any gymnasium env: a registered id or a ``module:Class`` entry point."""

    type: str = "gym"
    env_id: str = "CartPole-v1"
    """Gymnasium id or ``module:Class``."""
    kwargs: Dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the env constructor."""
    vectorization: str = "sync"
    """``sync``: all envs in this process (cheap envs); ``async``: a pool of
    ``num_processes`` subprocesses (heavy envs, started with ``start_method``)."""
    image_keys: Dict[str, str] = field(default_factory=dict)
    """For Dict observations: env key -> ``main_images`` / ``wrist_images``."""
    state_keys: List[str] = field(default_factory=list)
    """For Dict observations: keys concatenated into ``states``; empty = every non-image Box
    key, in sorted order."""
    task_description: str = ""
    """Language instruction reported in ``task_descriptions``."""

    def check_available(self) -> None:
        """``env_id`` is a registered gymnasium id (the toy envs included) or an importable
        ``module:Class`` (the same resolution the env workers do), and ``kwargs`` names only
        arguments its constructor takes.

        Raises:
            ConfigError: for an unknown id (with close matches), an unimportable class, or an
                argument the constructor does not take (with close matches).
        """
        from rlinf_embodied.config.components import user_modules_importable
        from rlinf_embodied.envs.gymnasium_env import _entry_point_class, register_toy_envs

        user_modules_importable()
        try:
            if _entry_point_class(self.env_id) is None and ":" not in self.env_id:
                register_toy_envs()
                from rlinf_embodied.config import check_registered_env_id

                check_registered_env_id(
                    self.env_id, "gymnasium",
                    more=("(toy envs: rlinf-embodied envs list). An id registered in your own "
                          "module needs the module:id form, e.g. my_lab.envs:"
                          f"{self.env_id if '/' not in self.env_id else 'MyEnv-v0'}."))
        except ConfigError:
            raise
        except ValueError as e:
            raise ConfigError(f"env.env_id: {e}") from None
        from rlinf_embodied.envs.gymnasium_env import unknown_kwargs

        why = unknown_kwargs(self.env_id, dict(self.kwargs))
        if why:
            raise ConfigError(why)

    def __post_init__(self):
        super().__post_init__()
        if self.vectorization not in ("sync", "async"):
            raise ConfigError(
                f"env.vectorization must be sync or async (got {self.vectorization!r})."
            )
        bad = {k: v for k, v in self.image_keys.items() if v not in ("main_images", "wrist_images")}
        if bad:
            raise ConfigError(
                f"env.image_keys values must be main_images or wrist_images (got {bad})."
            )
