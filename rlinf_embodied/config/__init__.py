"""Typed configuration: one dataclass per component, YAML files plus Hydra-style overrides.

Every job is a YAML file whose top level matches :class:`JobConfig`. Sections that come in
variants (``env``, ``policy``) carry a ``type`` key that selects the dataclass registered for it in
:mod:`rlinf_embodied.config.components` (or ``package.module:Class`` for a user's own component);
each variant subclasses the section's base class (:class:`EnvConfig`, :class:`PolicyConfig`) and
lives beside its implementation (``envs/configuration_*.py``, ``policies/configuration_*.py``).

Parsing is strict: an unknown key is a :class:`ConfigError` naming the key and the closest valid
one, a value of the wrong type names key, expected type and value, a missing file names the path.
Overrides use the dotted ``key=value`` syntax users know from Hydra
(``env.num_envs=16 algorithm.gamma=0.9``); values are parsed as YAML scalars.

Nothing past the CLI sees a dict: :func:`load_config` returns dataclass instances.

This package's namespace is the public API; its modules, from the ground up:

* :mod:`~rlinf_embodied.config.errors`: :class:`ConfigError`, :class:`ConfigWarning` and the
  helpers that word their messages.
* :mod:`~rlinf_embodied.config.components`: the registry of env and policy types
  (``type`` -> config dataclass, implementation).
* :mod:`~rlinf_embodied.config.sections`: the job's sections (``run``, ``cluster``, ``env``,
  ``policy``, ``algorithm``, ``trainer``, ``eval``, ``logging``).
* :mod:`~rlinf_embodied.config.elastic`: the ``elastic:`` section.
* :mod:`~rlinf_embodied.config.job`: :class:`JobConfig` and its cross-section checks.
* :mod:`~rlinf_embodied.config.overrides`: parsing and checking ``key=value`` overrides.
* :mod:`~rlinf_embodied.config.loading`: :func:`load_config` and friends.
"""

from rlinf_embodied.config.components import config_class
from rlinf_embodied.config.components import type_names as config_types
from rlinf_embodied.config.elastic import ElasticConfig, PreemptionConfig, PreemptionEvent
from rlinf_embodied.config.errors import ConfigError, ConfigWarning, field_type_name, suggest
from rlinf_embodied.config.job import CRITIC_FREE_ADVANTAGES, RESUME_SAFE_KEYS, JobConfig
from rlinf_embodied.config.loading import (
    as_dict,
    config_diff,
    check_registered_env_id,
    load_config,
    peek_top_level,
    save_config,
    shipped_config,
    to_yaml,
)
from rlinf_embodied.config.overrides import check_repeated_overrides, flatten_dotted
from rlinf_embodied.config.sections import (
    AlgorithmConfig,
    ClusterConfig,
    EnvConfig,
    EvalConfig,
    LoggingConfig,
    PolicyConfig,
    RunConfig,
    TrainerConfig,
)

__all__ = [
    "ConfigError",
    "ConfigWarning",
    "check_registered_env_id",
    "check_repeated_overrides",
    "flatten_dotted",
    "field_type_name",
    "peek_top_level",
    "config_class",
    "config_types",
    "shipped_config",
    "suggest",
    "load_config",
    "to_yaml",
    "save_config",
    "as_dict",
    "config_diff",
    "RunConfig",
    "ClusterConfig",
    "EnvConfig",
    "PolicyConfig",
    "AlgorithmConfig",
    "TrainerConfig",
    "EvalConfig",
    "LoggingConfig",
    "CRITIC_FREE_ADVANTAGES",
    "RESUME_SAFE_KEYS",
    "ElasticConfig",
    "PreemptionConfig",
    "PreemptionEvent",
    "JobConfig",
]
