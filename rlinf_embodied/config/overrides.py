"""Command-line overrides: Hydra-style dotted ``key=value`` strings (``env.num_envs=16``).

:func:`parse_overrides` turns them into one OmegaConf mapping (values parsed as YAML scalars,
lists or mappings), :func:`check_repeated_overrides` refuses a key given twice, and
:func:`flatten_dotted` lists the dotted keys of a nested mapping.
"""

from __future__ import annotations

from typing import Any, Dict, List

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlinf_embodied.config.errors import ConfigError, one_line

__all__ = ["check_repeated_overrides", "flatten_dotted", "parse_overrides"]


def override_key(override: str) -> str:
    """The dotted key of a ``key=value`` override (``+key=value`` too): ``trainer.lr``."""
    return override.partition("=")[0].strip().lstrip("+")


def check_repeated_overrides(overrides: List[str]) -> None:
    """Refuse a command line that sets one key twice (``trainer.lr=1e-3 ... trainer.lr=3e-4``),
    where the last value would silently win. The CLI checks what the user typed; code that
    composes overrides (``sft-rl``'s RL stage) layers them on purpose and is not checked.

    Raises:
        ConfigError: naming the key and both values.
    """
    seen: Dict[str, str] = {}
    for o in overrides:
        try:  # the parser load_config uses: `trainer={lr: 1e-3}` sets trainer.lr
            parsed = OmegaConf.to_container(OmegaConf.from_dotlist([o.lstrip("+")]))
        except Exception:
            continue  # not key=value, or unparsable: parse_overrides reports it
        for leaf in flatten_dotted(parsed) or [o.split("=", 1)[0].strip().lstrip("+")]:
            # the same key, or a section and a key inside it (`trainer=5 trainer.lr=1e-3`)
            clash = next((k for k in seen if k == leaf or k.startswith(leaf + ".")
                          or leaf.startswith(k + ".")), None)
            if clash is not None:
                raise ConfigError(f"Override key {leaf} is given twice ({seen[clash]} and {o}); "
                                  f"keep one.")
            seen[leaf] = o


def flatten_dotted(d: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """Nested dicts -> ``{"a.b.c": leaf}`` (an empty dict has no leaves)."""
    out: Dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten_dotted(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def parse_overrides(overrides: List[str]) -> DictConfig:
    """The overrides as one mapping (``["a.b=1", "c=[2]"]`` -> ``{a: {b: 1}, c: [2]}``).

    Raises:
        ConfigError: an override that is not ``key=value``, a value that is not valid YAML
            (unclosed quote or bracket), or overrides that contradict each other
            (``a=1 a.b=2``).
    """
    for o in overrides:
        if "=" not in o or o.startswith("="):
            split = (" A list or mapping with spaces was split by the shell: quote the whole "
                     "override ('policy.hidden_sizes=[64, 64]')." if o.rstrip().endswith(("]", "}"))
                     else "")
            raise ConfigError(f"Override {o!r} is not of the form key=value (e.g. "
                              f"env.num_envs=16).{split}")
        key = override_key(o)
        if "" in key.split("."):  # `env.=3` read as the key `env`
            raise ConfigError(f"Override {o!r} has an empty part in its key {key!r}; write "
                              "section.field=value (e.g. env.num_envs=16).")
    for o in overrides:
        try:
            OmegaConf.from_dotlist([o])
        except Exception as e:  # yaml.YAMLError (unclosed quote or bracket), OmegaConf errors
            key, _, value = o.partition("=")
            nested = value.lstrip().startswith("[") and "=" in value
            hint = (f" Overrides inside a list are strings: quote each one "
                    f"({key}='[\"env.task_ids=[2]\", \"trainer.lr=3e-4\"]')." if nested else "")
            raise ConfigError(
                f"Cannot parse override {o!r}: {one_line(e)}. Values are YAML: quote strings "
                f"with special characters (key='a: b') and close brackets (key=[1, 2]).{hint}"
            ) from None
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except (OmegaConfBaseException, ValueError) as e:  # `a=1 a.b=2`, `a=[1] a.b=2`
        raise ConfigError(f"Cannot apply overrides {overrides}: {one_line(e)}") from None

