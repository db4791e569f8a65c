"""Strict loading: YAML files plus overrides in, config dataclasses out; and back to YAML.

:func:`load_config` reads a job file (a path or a shipped config's name, :func:`shipped_config`),
applies ``key=value`` overrides (:mod:`rlinf_embodied.config.overrides`), resolves the variant
sections (``env``, ``policy``) by their ``type`` through :mod:`rlinf_embodied.config.components`
and validates it against the schema (default :class:`~rlinf_embodied.config.job.JobConfig`).
OmegaConf's errors are translated into one-line :class:`~rlinf_embodied.config.errors.ConfigError`
messages: an unknown key names the closest valid one, a wrong type names key, expected type and
value. :func:`to_yaml`, :func:`save_config` and :func:`as_dict` go the other way.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from rlinf_embodied.config.components import SECTIONS, config_class
from rlinf_embodied.config.errors import (
    ConfigError,
    field_type_name,
    one_line,
    suggest,
    value_kind,
)
from rlinf_embodied.config.job import JobConfig
from rlinf_embodied.config.overrides import override_key, parse_overrides

__all__ = [
    "as_dict",
    "config_diff",
    "check_registered_env_id",
    "load_config",
    "peek_top_level",
    "save_config",
    "shipped_config",
    "to_yaml",
]

def shipped_config(name: str | os.PathLike) -> Optional[Path]:
    """The shipped job config ``name`` (``maniskill_pushcube_ppo_mlp``, with or without
    ``.yaml`` or a leading ``configs/``; an SFT pipeline also without its ``sft/``), or None;
    works from an installed wheel too."""
    from rlinf_embodied.configs import ROOT

    if os.fspath(name).startswith(("./", "../")) or os.path.isabs(name):
        return None  # an explicit path names a file, never a shipped config
    p = Path(name)
    if p.parts[:1] == ("configs",):
        p = Path(*p.parts[1:])
    if not p.name:  # "configs" itself, "", "."
        return None
    # with_suffix would replace ".5b" of "reasoning_grpo_qwen2.5_0.5b": append instead
    p = p if p.suffix in (".yaml", ".yml") else p.with_name(p.name + ".yaml")
    for cand in (ROOT / p, ROOT / "sft" / p) if len(p.parts) == 1 else (ROOT / p,):
        if cand.is_file():
            return cand
    return None


def peek_top_level(path: str | os.PathLike) -> Optional[DictConfig]:
    """The raw top-level mapping of a job file (a path or a shipped config name), unvalidated,
    to tell which schema it needs; None when it is missing, not YAML or not a mapping (the
    strict loader then reports why)."""
    p = Path(path)
    p = p if p.is_file() else shipped_config(path)
    if p is None:
        return None
    try:
        raw = OmegaConf.load(p)
    except Exception:  # noqa: BLE001 - invalid YAML: the strict loader reports it
        return None
    return raw if isinstance(raw, DictConfig) else None


def _missing_config_message(p: Path) -> str:
    """One line for a job file that does not exist: the closest shipped config (job or SFT
    pipeline, ``configs/sft/``) and every shipped name."""
    import difflib

    from rlinf_embodied.configs import ROOT

    names = sorted(x.relative_to(ROOT).with_suffix("").as_posix() for x in ROOT.rglob("*.yaml")
                   if x.parent.name != "placement")
    asked = Path(*p.parts[1:]) if p.parts[:1] == ("configs",) else p
    close = difflib.get_close_matches(asked.with_suffix("").as_posix(), names, n=1, cutoff=0.6)
    where = f"Config file not found: {p} (absolute: {p.resolve()})."
    if close and Path("configs", f"{close[0]}.yaml").is_file():  # the checkout's own, from its root
        return f"{where} Did you mean configs/{close[0]}.yaml?"
    if close:  # elsewhere the shipped config's name is what resolves
        return (f"{where} Did you mean {Path(close[0]).name} (the shipped "
                f"configs/{close[0]}.yaml; its name alone works from any directory)?")
    return (f"{where} Shipped configs (a name alone works too, from any directory: "
            f"maniskill_pushcube_ppo_mlp, maniskill_lang3_sft_rl_oft): {', '.join(names)}.")


def _read_yaml(path: str | os.PathLike) -> DictConfig:
    p = Path(path)
    if not p.exists() and shipped_config(path) is not None:
        p = shipped_config(path)
    if not p.exists():
        raise ConfigError(_missing_config_message(p))
    if p.is_dir():
        raise ConfigError(f"Config path {p} is a directory; pass a YAML file.")
    from rlinf_embodied.configs import ROOT

    if p.resolve().parent == (ROOT / "placement").resolve():
        raise ConfigError(f"{p} is a placement layout, not a job config: a job selects it with "
                          f"placement={p.stem} (e.g. `rlinf-embodied config show "
                          f"maniskill_pushcube_ppo_mlp placement={p.stem}`).")
    try:
        cfg = OmegaConf.load(p)
    except Exception as e:  # yaml.YAMLError and friends
        where = getattr(e, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
        raise ConfigError(f"Config file {p} is not valid YAML: {one_line(e)}{at}.") from None
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"Config file {p} must hold a mapping at the top level.")
    if str(cfg.get("format", "")).startswith("rlinf-embodied-eval/"):  # eval/results.py FORMAT
        raise ConfigError(f"{p} is an evaluation results file, not a job config; `rlinf-embodied "
                          f"eval compare {p} OTHER.json` compares it, a job is a YAML such as "
                          "maniskill_pushcube_ppo_mlp.")
    if not cfg:
        raise ConfigError(
            f"Config file {p} is empty; start from a shipped job (e.g. "
            f"configs/maniskill_pushcube_ppo_mlp.yaml) and change what you need."
        )
    return cfg


def _schema_for(schema_cls: type, raw: DictConfig | None) -> Any:
    """Structured schema of ``schema_cls`` with polymorphic sections resolved by their type."""
    base = OmegaConf.structured(schema_cls)
    if not dataclasses.is_dataclass(schema_cls):
        return base
    for f in dataclasses.fields(schema_cls):
        if f.name not in SECTIONS:  # sections whose dataclass is chosen by their ``type`` key
            continue
        node = raw.get(f.name) if raw is not None else None
        explicit = isinstance(node, DictConfig) and "type" in node
        type_name = str(node["type"]) if explicit else OmegaConf.select(base, f"{f.name}.type")
        cls = config_class(f.name, type_name)
        OmegaConf.set_struct(base, False)
        base[f.name] = OmegaConf.structured(cls)
        OmegaConf.set_struct(base, True)
    return base


def _open_free_dicts(node: DictConfig) -> None:
    """Let ``Dict[str, Any]`` fields (e.g. ``env.kwargs``) take any key; dataclass sections
    stay strict."""
    for key in list(node.keys()):
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            if child._metadata.object_type in (dict, None):
                OmegaConf.set_struct(child, False)
            else:
                _open_free_dicts(child)


def _free_dict_overrides(schema: DictConfig, overrides: List[str], parsed: DictConfig) -> Dict[str, Any]:
    """The overrides that give a whole ``Dict[str, Any]`` field (``env.kwargs={size: 16}``,
    ``env.image_keys={}``), by dotted key with their value from ``parsed`` (the parsed
    overrides): they replace the field's mapping from the YAML file and the defaults instead of
    merging into it (``env.kwargs.size=16`` still sets one key)."""
    out: Dict[str, Any] = {}
    for o in overrides:
        key = override_key(o)
        node = OmegaConf.select(schema, key, default=None, throw_on_missing=False)
        value = OmegaConf.select(parsed, key, default=None)
        if (isinstance(node, DictConfig) and node._metadata.object_type in (dict, None)
                and isinstance(value, DictConfig)):
            out[key] = OmegaConf.to_container(value)
    return out


def _valid_keys(schema: DictConfig, full_key: str) -> List[str]:
    parent = full_key.rsplit(".", 1)[0] if "." in full_key else ""
    node = OmegaConf.select(schema, parent) if parent else schema
    return list(node.keys()) if isinstance(node, DictConfig) else []


def _variants_with_field(section: str, field: str) -> List[str]:
    """The registered types of a variant section (env, policy) whose config has ``field``."""
    from rlinf_embodied.config.components import type_names

    if section not in SECTIONS:
        return []
    owners = []
    for name in type_names(section):
        try:
            cls = config_class(section, name)
        except Exception:  # noqa: BLE001 - an optional dependency missing: no hint from it
            continue
        if dataclasses.is_dataclass(cls) and field in {f.name for f in dataclasses.fields(cls)}:
            owners.append(name)
    return owners


def _example(key: str, before: Any) -> str:
    """`` (e.g. trainer.lr=0.0003)``: the config's own value of ``key`` as an example of its
    type (bools as YAML writes them); "" when that value is not a plain scalar."""
    if not isinstance(before, (bool, int, float, str)):
        return ""
    return f" (e.g. {key}={str(before).lower() if isinstance(before, bool) else before})"


MAX_LISTED_OVERRIDES = 6
"""An error lists a config's overrides up to this many; of more (an SFT pipeline's RL stage
passes ~20, most of them the pipeline's own) it names only the one that set the failing key."""


def _source(label: str, overrides: List[str], key: str = "") -> str:
    """Where a config error comes from: ``label`` (the file) and its overrides, all of them
    when few, else their count and the last one that sets ``key``."""
    if not overrides:
        return label
    if len(overrides) <= MAX_LISTED_OVERRIDES:
        return f"{label} + overrides {overrides}"
    setting = [o for o in overrides if key and override_key(o) == key]
    return f"{label} + {len(overrides)} overrides" + (f", {setting[-1]!r} among them" if setting else "")


def _translate(e: OmegaConfBaseException, schema: DictConfig, label: str,
               overrides: List[str]) -> ConfigError:
    key = getattr(e, "full_key", None) or ""
    source = _source(label, overrides, key)
    if isinstance(e, ConfigKeyError) and key:
        valid = _valid_keys(schema, key)
        leaf = key.rsplit(".", 1)[-1]
        section = key.rsplit(".", 1)[0] if "." in key else "top level"
        prefix = f"{section}." if "." in key else ""
        hint = suggest(leaf, valid).replace("'", f"'{prefix}", 1) if suggest(leaf, valid) else ""
        name, colon, _ = leaf.partition(":")
        if colon and name in valid:  # {lr:1e-3}: YAML reads one key "lr:1e-3" without the space
            hint = f" (YAML needs a space after the colon: {{{name}: ...}})."
        owners = _variants_with_field(section, leaf)
        if owners:  # env.control_mode on a gym env: a field of another kind
            current = OmegaConf.select(schema, f"{section}.type", default=None)
            retyped = any(override_key(o) == f"{section}.type"
                          for o in overrides)
            hint = (f" ({key} is a field of {section}.type={' / '.join(owners)}, not of "
                    f"{section}.type={current}: the {section} section holds one kind's fields; "
                    + (f"drop {key}, or start from a config of {section}.type={current} rather "
                       f"than changing {section}.type by override)." if retyped else
                       f"drop {key}, or start from a config of {section}.type={' or '.join(owners)})."))
        return ConfigError(
            f"Unknown config key {key!r} in {source}{hint or '.'} Valid keys of {section}: "
            f"{', '.join(sorted(valid))}."
        )
    if isinstance(e, ValidationError) and key:
        expected = field_type_name(getattr(e, "object_type", None), getattr(e, "key", None))
        value = getattr(e, "value", None)
        if type(value).__name__ == "AnyNode":  # OmegaConf's untyped node: name what it holds
            value = value._value()
        shown = "null" if value is None else repr(value)
        kind = "" if shown == "null" else f" ({value_kind(value)})"
        try:  # the value the config had before: an example of the type
            before = OmegaConf.select(schema, key, default=None, throw_on_missing=False)
        except Exception:  # noqa: BLE001 - an interpolation or a missing value: no example
            before = None
        example = _example(key, before) if not isinstance(before, type(value)) else ""
        return ConfigError(
            f"Wrong type for config key {key!r} in {source}: expected {expected}, got {shown}{kind}"
            f"{example}."
        )
    return ConfigError(f"Invalid config in {source}: {one_line(e)}")


def load_config(
    path: str | os.PathLike | None = None,
    overrides: Optional[List[str]] = None,
    schema: type = JobConfig,
) -> Any:
    """Load a YAML job file, apply ``key=value`` overrides, validate, return dataclasses.

    Args:
        path: YAML file; None starts from the schema's defaults.
        overrides: dotted overrides, e.g. ``["env.num_envs=16", "trainer.lr=1e-4"]``.
        schema: top-level dataclass (default :class:`JobConfig`).

    Returns:
        An instance of ``schema`` (nested dataclasses, variants resolved by ``type``).

    Raises:
        ConfigError: missing file, invalid YAML, unknown key (with the closest valid key),
            wrong type (with key, expected type and value), unknown variant type, or a
            cross-field check of a section's ``__post_init__``.
    """
    overrides = list(overrides or [])
    raw = _read_yaml(path) if path is not None else OmegaConf.create({})
    ov = parse_overrides(overrides)
    label = str(path) if path is not None else "defaults"
    source = _source(label, overrides)
    try:
        merged_raw = OmegaConf.merge(raw, ov)
        structured = _schema_for(schema, merged_raw)
    except (OmegaConfBaseException, TypeError) as e:  # `env: 3` in the file, `env.num_envs=4`
        raise (_container_mismatch(overrides, ov, raw, schema, source)
               or ConfigError(f"Invalid config in {source}: {one_line(e)}")) from None
    _open_free_dicts(structured)
    _reject_int_bools(structured, merged_raw, source)
    try:
        cfg = OmegaConf.merge(structured, merged_raw)
        for key, value in _free_dict_overrides(structured, overrides, ov).items():
            OmegaConf.update(cfg, key, value, merge=False)
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        cause = e
        # to_object wraps __post_init__ errors; surface ours unchanged.
        inner = e.__cause__ or e.__context__
        if isinstance(inner, ConfigError):
            raise inner from None
        raise (_container_mismatch(overrides, ov, raw, schema, source)
               or _translate(cause, structured, label, overrides)) from None
    except ConfigError:
        raise
    except TypeError as e:  # e.g. a mapping given for a list field
        raise (_container_mismatch(overrides, ov, raw, schema, source)
               or ConfigError(f"Invalid config in {source}: {one_line(e)}")) from None
    _reject_nan(obj)
    return obj


def _container_mismatch(overrides: List[str], ov: DictConfig, raw: DictConfig, schema: type,
                        source: str) -> Optional[ConfigError]:
    """The error for the first override whose shape does not fit its key: a mapping or a list
    where the field holds something else ("Wrong type"; OmegaConf reports only "Cannot merge
    incompatible container types") or a plain value for a whole section (``trainer=1``;
    OmegaConf: "Merge error: int is not a subclass of TrainerConfig"); None when no override
    is such a one."""

    try:
        structured = _schema_for(schema, raw)
    except Exception:  # noqa: BLE001 - the file itself is malformed: nothing to compare with
        return None
    for o in overrides:
        key = override_key(o)
        new = OmegaConf.select(ov, key, default=None)
        old = OmegaConf.select(raw, key, default=None)
        if old is None:
            old = OmegaConf.select(structured, key, default=None, throw_on_missing=False)
        section = OmegaConf.select(structured, key, default=None, throw_on_missing=False)
        cls = getattr(getattr(section, "_metadata", None), "object_type", None)
        if (new is not None and not isinstance(new, (DictConfig, ListConfig))
                and isinstance(section, DictConfig) and cls not in (dict, None)):
            # `trainer=1`: OmegaConf says "Merge error: int is not a subclass of TrainerConfig"
            fields = sorted(section.keys())
            variant = f"; {key}.type=... picks its kind" if "type" in fields else ""
            return ConfigError(
                f"Config key {key!r} is a section, not a value (got {o.partition('=')[2].strip()!r} "
                f"in {source}): set its fields one by one, {key}.<field>=value{variant}. Fields of "
                f"{key}: {', '.join(fields)}.")
        if (new is None or old is None or not isinstance(new, (DictConfig, ListConfig))
                or value_kind(new) == value_kind(old)):
            continue  # a plain value of the wrong type is reported by _translate
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(structured, parent) if parent else structured
        cls = getattr(getattr(node, "_metadata", None), "object_type", None)
        expected = field_type_name(cls, leaf)
        shown = o.partition("=")[2].strip()
        return ConfigError(f"Wrong type for config key {key!r} in {source}: expected {expected}, "
                           f"got {shown} ({value_kind(new)}){_example(key, old)}.")
    return None


def _reject_int_bools(schema: DictConfig, raw: DictConfig, source: str, prefix: str = "") -> None:
    """Refuse a number for a bool field (``policy.critic=2``): OmegaConf turns any int into a
    bool (non-zero is true), so a typo or a count given for a switch would pass silently.

    Raises:
        ConfigError: naming the key, the value and ``true`` / ``false``.
    """
    from omegaconf.nodes import BooleanNode

    for key in raw.keys():
        value = raw._get_node(key)
        field = schema._get_node(key) if isinstance(schema, DictConfig) and key in schema else None
        if field is None:
            continue
        if isinstance(value, DictConfig) and isinstance(field, DictConfig):
            if field._metadata.object_type not in (dict, None):
                _reject_int_bools(field, value, source, f"{prefix}{key}.")
        elif isinstance(field, BooleanNode) and not value._is_interpolation():
            v = value._value()
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                raise ConfigError(f"Wrong type for config key '{prefix}{key}' in {source}: "
                                  f"expected bool, got {v!r} ({type(v).__name__}); write "
                                  f"{prefix}{key}=true or {prefix}{key}=false.")


def _reject_nan(obj: Any, prefix: str = "") -> None:
    """NaN passes every range check (all comparisons are False): refuse it in any field."""
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            _reject_nan(v, f"{prefix}{f.name}.")
        elif isinstance(v, float) and v != v:
            raise ConfigError(f"{prefix}{f.name} is NaN; give a number.")


def to_yaml(cfg: Any) -> str:
    """Resolved YAML text of a config dataclass (what ``config show`` prints)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def save_config(cfg: Any, run_dir: str | os.PathLike, name: str = "config.yaml") -> Path:
    """Write the resolved config into ``run_dir`` atomically (temp file, then rename; mode
    0644 like the run's other files)."""
    from rlinf_embodied.checkpoint import atomic_write_text

    return atomic_write_text(Path(run_dir) / name, to_yaml(cfg))


def as_dict(cfg: Any) -> Dict[str, Any]:
    """Plain-dict view of a config dataclass (for logging and hashing only)."""
    out = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    assert isinstance(out, dict)
    return out


def config_diff(a: Any, b: Any, skip: tuple = ("run.",)) -> list[str]:
    """``key: a -> b`` for every flattened dotted key where config dataclasses ``a`` and ``b``
    differ, keys starting with any of ``skip`` left out (sorted by key)."""
    from rlinf_embodied.config.overrides import flatten_dotted

    fa, fb = flatten_dotted(as_dict(a)), flatten_dotted(as_dict(b))
    keys = [k for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k) and not k.startswith(skip)]
    return [f"{k}: {fa.get(k)!r} -> {fb.get(k)!r}" for k in keys]


def check_registered_env_id(env_id: str, family: str, imports: str = "gymnasium",
                            more: str = "") -> None:
    """Raise if ``env_id`` is not in gymnasium's registry (after the caller imported the
    simulator that registers its envs), suggesting the closest registered ids and the command
    that lists them (this interpreter, importing ``imports`` first); ``more`` ends the message.

    Raises:
        ConfigError: for an unregistered id.
    """
    import difflib
    import shlex
    import sys

    import gymnasium as gym

    if env_id in gym.registry:
        return
    close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
    listing = shlex.quote(f"import {imports}; print(sorted(gymnasium.registry))")
    raise ConfigError(f"env.env_id={env_id!r} is not a registered {family} env.{hint} "
                      f"List them with: {shlex.quote(sys.executable)} -c {listing}"
                      + (f" {more}" if more else ""))
