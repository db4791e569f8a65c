"""Policy registry by ``policy.type``, and checkpoint save/load in safetensors.

Policy types (config dataclass + class) are registered in :mod:`rlinf_embodied.config.components` as
``"module:Class"`` strings, so importing this package never imports a large model's dependencies
(``openvla`` pulls transformers only when built).

Checkpoint directory layout::

    model.safetensors   the state dict (weights and persistent buffers)
    spec.yaml           the SpaceSpec the policy was built for
    paths.yaml          only when some path field of policy.yaml is relative to this directory
                        (see below): ``relative_to_checkpoint: [pretrained, ...]``
    policy.yaml         the policy config (its ``type`` selects the class); written last, so a
                        directory with policy.yaml is a complete checkpoint

Every file is written to a temporary file in the same directory, then renamed over the target.

A run directory moves as a whole: a path field of the config (:data:`PATH_FIELDS`, e.g. an SFT ->
RL pipeline's ``pretrained: <run>/sft/vla``) that lies inside the run directory the checkpoint is
part of (:func:`run_root`) is stored relative to the checkpoint directory (``../vla``,
``../../../../sft/vla``) and listed in ``paths.yaml``; :func:`load_policy` resolves the listed
fields against the directory it loads from, so a moved or copied run reads its own files. Paths
outside the run are stored as given (absolute, or relative to the working directory as the config
said), and a relative path *not* listed in ``paths.yaml`` (every checkpoint written before it
existed) keeps meaning the working directory's, so older checkpoints load as before.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Optional

import torch
import yaml
from rlinf_embodied.policies.base import Policy, SpaceSpec
from safetensors.torch import load_file, save_file

from rlinf_embodied.checkpoint import atomic_write, atomic_write_text
from rlinf_embodied.config import components
from rlinf_embodied.config import ConfigError, PolicyConfig, config_class, load_config, to_yaml

__all__ = [
    "CONFIG_FILE",
    "PATHS_FILE",
    "PATH_FIELDS",
    "SPEC_FILE",
    "WEIGHTS_FILE",
    "PolicyCheckpointError",
    "build_policy",
    "check_checkpoint",
    "load_policy",
    "policy_class",
    "policy_types",
    "register_policy",
    "run_root",
    "save_policy",
]

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "policy.yaml"
SPEC_FILE = "spec.yaml"
PATHS_FILE = "paths.yaml"
PATH_FIELDS = ("pretrained", "tokenizer")
"""Policy config fields that name directories of files (configuration_openvla.py: ``pretrained``;
configuration_pi0.py: ``pretrained``, ``tokenizer``); ``checkpoint`` is never saved."""
_RELATIVE_KEY = "relative_to_checkpoint"


class PolicyCheckpointError(ValueError):
    """A policy checkpoint is missing, incomplete, or does not fit the requested policy."""


class PolicyTypeError(PolicyCheckpointError):
    """The checkpoint holds a policy of another type than the one asked for (``saved_type``,
    ``expected_type``), so that a caller can name its own way of setting the type."""

    def __init__(self, message: str, saved_type: str | None, expected_type: str):
        super().__init__(message)
        self.saved_type, self.expected_type = saved_type, expected_type


def register_policy(type_name: str, config, impl, description: str = "") -> None:
    """Register a policy type: its config dataclass and :class:`Policy` class (or
    ``"module:Class"`` strings). Built-in types are registered in
    :mod:`rlinf_embodied.config.components`; a user's own policy needs no registration
    (``policy.type: package.module:Class``).

    Raises:
        ValueError: if ``type_name`` is already registered with other classes.
    """
    components.register_type("policy", type_name, config=config, impl=impl,
                             description=description)


def policy_types() -> list[str]:
    """Sorted names of the registered policy types."""
    return components.type_names("policy")


def policy_class(type_name: str) -> type:
    """The :class:`Policy` subclass of ``type_name`` (imports it on first use).

    Raises:
        ConfigError: for an unknown type, listing the valid ones.
    """
    return components.impl_class("policy", type_name)


def _as_config_class(cfg: PolicyConfig, cls: type) -> PolicyConfig:
    """``cfg`` as an instance of ``cls``: a bare :class:`PolicyConfig` (e.g. a Python default)
    is upgraded, keeping its common fields and the variant's defaults for the rest."""
    if isinstance(cfg, cls):
        return cfg
    if type(cfg) is PolicyConfig:
        common = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(PolicyConfig)}
        return cls(**common)
    raise PolicyCheckpointError(
        f"policy.type {cfg.type!r} needs a {cls.__name__}, got a {type(cfg).__name__}; "
        "build the config with load_config or the matching dataclass."
    )


def build_policy(cfg: PolicyConfig, spec: SpaceSpec) -> Policy:
    """Build the policy of ``cfg.type`` for ``spec``; load ``cfg.checkpoint`` when set.

    Args:
        cfg: the policy config (its ``type`` selects the class).
        spec: spaces of the env the policy acts in.

    Returns:
        A :class:`Policy` on CPU (move it with ``.to(device)``).

    Raises:
        ValueError: for an unknown type.
        PolicyCheckpointError: if ``cfg.checkpoint`` holds another policy type, another spec,
            or weights that do not fit ``cfg``'s architecture.
    """
    cls = policy_class(cfg.type)
    cfg = _as_config_class(cfg, cls.config_class)
    policy = cls(cfg, spec)
    if cfg.checkpoint:
        saved_cfg, saved_spec = _read_meta(Path(cfg.checkpoint), expected_type=cfg.type)
        if not saved_spec.matches(spec):
            raise PolicyCheckpointError(
                f"Checkpoint {cfg.checkpoint} was saved for {saved_spec} but the env gives "
                f"{spec}; use a checkpoint trained on this env."
            )
        _load_weights(policy, Path(cfg.checkpoint), saved_cfg)
    return policy


# --------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------
def save_policy(policy: Policy, directory: str | os.PathLike) -> Path:
    """Write ``policy`` to ``directory`` (created if needed): weights, spec, then config.

    A path field of the config inside the run directory ``directory`` is part of
    (:func:`run_root`) is written relative to ``directory`` and listed in ``paths.yaml``, so that
    the checkpoint follows its run when the run is moved or copied; other paths as given.

    Args:
        policy: any registered :class:`Policy`.
        directory: checkpoint directory; existing files are replaced atomically.

    Returns:
        The directory as a :class:`~pathlib.Path`.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in policy.state_dict().items()}
    atomic_write(
        directory / WEIGHTS_FILE, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"})
    )
    atomic_write_text(directory / SPEC_FILE, yaml.safe_dump(policy.spec.to_dict(), sort_keys=False))
    cfg, relative = _relative_paths(dataclasses.replace(policy.config, checkpoint=None), directory)
    if relative:
        atomic_write_text(directory / PATHS_FILE, yaml.safe_dump({_RELATIVE_KEY: relative}))
    else:  # a checkpoint written over: its old list would reinterpret this config's paths
        (directory / PATHS_FILE).unlink(missing_ok=True)
    atomic_write_text(directory / CONFIG_FILE, to_yaml(cfg))
    return directory


def run_root(directory: str | os.PathLike) -> Optional[Path]:
    """The run directory a checkpoint directory is part of (symlinks resolved), by the layouts
    that write checkpoints, or None for a directory elsewhere:

    * ``RUN/checkpoints/NAME/policy`` (:mod:`rlinf_embodied.checkpoint`): ``RUN``; when ``RUN`` is
      an SFT -> RL pipeline's RL stage ``PIPE/rl`` (``PIPE/sft`` exists), ``PIPE``, whose
      ``sft/`` the RL run starts from;
    * ``PIPE/sft/NAME`` (the SFT stage's ``sft/policy``): ``PIPE``.
    """
    d = Path(directory).resolve()
    if d.parent.name == "sft":
        return d.parent.parent
    if d.parent.parent.name == "checkpoints":
        run = d.parents[2]
        return run.parent if run.name == "rl" and (run.parent / "sft").is_dir() else run
    return None


def _relative_paths(cfg: PolicyConfig, directory: Path) -> tuple[PolicyConfig, list[str]]:
    """``cfg`` with its :data:`PATH_FIELDS` that lie inside :func:`run_root` of ``directory``
    made relative to ``directory``, and the names of those fields."""
    root = run_root(directory)
    if root is None:
        return cfg, []
    here, moved = directory.resolve(), {}
    for key in PATH_FIELDS:
        value = getattr(cfg, key, None)
        target = Path(value).resolve() if value else None  # a relative one: the working dir's
        if target is not None and target.is_relative_to(root):
            moved[key] = os.path.relpath(target, here)
    return (dataclasses.replace(cfg, **moved) if moved else cfg), sorted(moved)


def _policy_dir_hint(directory: Path) -> str:
    """What to point ``policy.checkpoint`` at when ``directory`` is a training run or one of
    its checkpoints (the policy is in ``checkpoints/iter_*/policy``)."""
    from rlinf_embodied.checkpoint import latest_checkpoint

    if (directory / "policy" / CONFIG_FILE).is_file():
        return f"it is a training checkpoint: set policy.checkpoint={directory / 'policy'}."
    if (directory / "checkpoints").is_dir():
        latest = latest_checkpoint(directory)
        if latest is not None:
            return (f"it is a training run: set policy.checkpoint={latest / 'policy'} (its "
                    "latest checkpoint).")
    return "check policy.checkpoint."


def _read_meta(directory: Path, expected_type: str | None) -> tuple[PolicyConfig, SpaceSpec]:
    """The saved config and spec of a checkpoint, type-checked against ``expected_type``."""
    cfg_path, spec_path = directory / CONFIG_FILE, directory / SPEC_FILE
    for p in (cfg_path, spec_path, directory / WEIGHTS_FILE):
        if not p.is_file():
            raise PolicyCheckpointError(
                f"{p} is missing: {directory} is not a complete policy checkpoint (written by "
                f"save_policy); {_policy_dir_hint(directory)}"
            )
    raw = yaml.safe_load(cfg_path.read_text()) or {}
    saved_type = raw.get("type")
    if expected_type is not None and saved_type != expected_type:
        raise PolicyTypeError(
            f"Checkpoint {directory} holds a {saved_type!r} policy but policy.type is "
            f"{expected_type!r}; set policy.type={saved_type} or point policy.checkpoint at a "
            f"{expected_type} checkpoint.", saved_type, expected_type)
    try:
        cfg = load_config(cfg_path, schema=config_class("policy", saved_type))
    except ConfigError as e:
        raise PolicyCheckpointError(f"Cannot read {cfg_path}: {e}") from None
    spec = SpaceSpec.from_dict(yaml.safe_load(spec_path.read_text()) or {})
    return _resolve_paths(cfg, directory), spec


def _relative_fields(directory: Path) -> list[str]:
    """The fields ``paths.yaml`` of ``directory`` lists as relative to it ([] without one)."""
    path = directory / PATHS_FILE
    if not path.is_file():
        return []
    listed = (yaml.safe_load(path.read_text()) or {}).get(_RELATIVE_KEY) or []
    return [k for k in listed if k in PATH_FIELDS]


def _resolve_paths(cfg: PolicyConfig, directory: Path) -> PolicyConfig:
    """``cfg`` read from ``directory`` with the fields that ``paths.yaml`` lists resolved
    against ``directory`` (absolute; an absolute value stays as it is)."""
    base, resolved = directory.resolve(), {}
    for key in _relative_fields(directory):
        value = getattr(cfg, key, None)
        if value:
            resolved[key] = os.path.normpath(base / value)
    return dataclasses.replace(cfg, **resolved) if resolved else cfg


def check_checkpoint(directory: str | os.PathLike, expected_type: str | None = None) -> None:
    """What :func:`load_policy` checks before it builds anything (the files are there, the saved
    type is ``expected_type``), for a job to refuse a bad ``policy.checkpoint`` before it starts
    workers.

    Raises:
        PolicyCheckpointError: as :func:`load_policy` would (the message names the fix).
    """
    _read_meta(Path(directory), expected_type)


def _load_weights(policy: Policy, directory: Path, saved_cfg: PolicyConfig) -> None:
    try:
        state = load_file(str(directory / WEIGHTS_FILE), device="cpu")
    except Exception as e:  # noqa: BLE001 - SafetensorError (truncated / not safetensors), OSError
        raise PolicyCheckpointError(
            f"{directory / WEIGHTS_FILE} cannot be read ({str(e).strip().splitlines()[0]}); the "
            f"file is damaged or truncated: use another checkpoint of the run (its "
            f"checkpoints/iter_N directories: eval --policy RUN/checkpoints/iter_N, or "
            f"policy.checkpoint=RUN/checkpoints/iter_N/policy)."
        ) from None
    try:
        policy.load_state_dict(state, strict=True)
    except RuntimeError as e:
        diff = {
            f.name: (getattr(saved_cfg, f.name), getattr(policy.config, f.name, None))
            for f in dataclasses.fields(saved_cfg)
            if f.name != "checkpoint"
            and getattr(saved_cfg, f.name) != getattr(policy.config, f.name, None)
        }
        hint = ", ".join(f"policy.{k}={v[0]} (you have {v[1]})" for k, v in diff.items())
        raise PolicyCheckpointError(
            f"The weights in {directory} do not fit the configured policy. "
            + (f"Set {hint} to match the checkpoint. " if hint else "")
            + f"({e})"
        ) from None


def load_policy(
    directory: str | os.PathLike,
    expected_type: str | None = None,
    map_location: str | torch.device = "cpu",
) -> Policy:
    """Rebuild a policy saved by :func:`save_policy` (its own config and spec; the path fields
    that ``paths.yaml`` lists are resolved against ``directory``).

    Args:
        directory: checkpoint directory.
        expected_type: the ``policy.type`` the caller wants; None accepts any.
        map_location: device to put the policy on.

    Returns:
        The policy, in train mode on ``map_location``.

    Raises:
        PolicyCheckpointError: for a missing file, a type other than ``expected_type`` (the
            message names both types), a path relative to the checkpoint that leads nowhere
            (moved without its run), or weights that do not fit the saved config.
    """
    directory = Path(directory)
    cfg, spec = _read_meta(directory, expected_type)
    for key in _relative_fields(directory):
        value = getattr(cfg, key, None)
        if value and not Path(value).exists():
            raise PolicyCheckpointError(
                f"{directory} names policy.{key} relative to itself, as a file of its run "
                f"directory, but {value} does not exist: the checkpoint was moved or copied "
                f"without its run directory; move the whole run, or put that directory back.")
    policy = policy_class(cfg.type)(cfg, spec)
    _load_weights(policy, directory, cfg)
    return policy.to(map_location)
