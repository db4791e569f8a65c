"""Policy registry by ``policy.type``, and checkpoint save/load in safetensors.

Policy types (config dataclass + class) are registered in :mod:`rlinf_embodied.config.components` as
``"module:Class"`` strings, so importing this package never imports a large model's dependencies
(``openvla`` pulls transformers only when built).

Checkpoint directory layout::

    model.safetensors   the state dict (weights and persistent buffers)
    spec.yaml           the SpaceSpec the policy was built for
    policy.yaml         the policy config (its ``type`` selects the class); written last, so a
                        directory with policy.yaml is a complete checkpoint

Every file is written to a temporary file in the same directory, then renamed over the target.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch
import yaml
from rlinf_embodied.policies.base import Policy, SpaceSpec
from safetensors.torch import load_file, save_file

from rlinf_embodied.checkpoint import atomic_write, atomic_write_text
from rlinf_embodied.config import components
from rlinf_embodied.config import ConfigError, PolicyConfig, config_class, load_config, to_yaml

__all__ = [
    "CONFIG_FILE",
    "SPEC_FILE",
    "WEIGHTS_FILE",
    "PolicyCheckpointError",
    "build_policy",
    "check_checkpoint",
    "load_policy",
    "policy_class",
    "policy_types",
    "register_policy",
    "save_policy",
]

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "policy.yaml"
SPEC_FILE = "spec.yaml"


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
    cfg = dataclasses.replace(policy.config, checkpoint=None)
    atomic_write_text(directory / CONFIG_FILE, to_yaml(cfg))
    return directory


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
    return cfg, spec


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
    """Rebuild a policy saved by :func:`save_policy` (its own config and spec).

    Args:
        directory: checkpoint directory.
        expected_type: the ``policy.type`` the caller wants; None accepts any.
        map_location: device to put the policy on.

    Returns:
        The policy, in train mode on ``map_location``.

    Raises:
        PolicyCheckpointError: for a missing file, a type other than ``expected_type`` (the
            message names both types), or weights that do not fit the saved config.
    """
    directory = Path(directory)
    cfg, spec = _read_meta(directory, expected_type)
    policy = policy_class(cfg.type)(cfg, spec)
    _load_weights(policy, directory, cfg)
    return policy.to(map_location)
