"""The configuration errors and the pieces their messages are made of.

:class:`ConfigError` (an invalid file, override or value) and :class:`ConfigWarning` (a valid
setting that likely does not do what was meant), plus the helpers that word a message: the
closest valid name (:func:`suggest`), what a value is (:func:`value_kind`), a field's type in
words (:func:`field_type_name`, :func:`readable_type`) and an exception's gist on one line
(:func:`one_line`); :func:`one_line_warnings` prints chosen warning categories as one
``warning: ...`` line. Every other module of :mod:`rlinf_embodied.config` builds on this one.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import typing
from typing import Any, Optional

from omegaconf import DictConfig, ListConfig

__all__ = [
    "ConfigError",
    "ConfigWarning",
    "field_type_name",
    "one_line",
    "one_line_warnings",
    "readable_type",
    "suggest",
    "value_kind",
]


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message says what and how to fix it."""


class ConfigWarning(UserWarning):
    """A valid configuration with a setting that likely does not do what was meant (the
    message says why and what to change); the CLI prints it as one ``warning:`` line."""


def one_line_warnings(categories: tuple, echo=None) -> None:
    """Print warnings of ``categories`` as one ``warning: <message>`` line on stderr (through
    ``echo(text)`` when given), not Python's ``file:line: Category`` form with a source line;
    other warnings keep Python's form. Installing it again in the same process is a no-op."""
    import sys
    import warnings

    show = warnings.showwarning
    if getattr(show, "_one_line", None) == categories:
        return

    def shown(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, categories):
            (echo or (lambda text: print(text, file=sys.stderr, flush=True)))(f"warning: {message}")
        else:
            show(message, category, filename, lineno, file, line)

    shown._one_line = categories
    warnings.showwarning = shown


def suggest(word: str, candidates) -> str:
    """The " Did you mean ...?" hint for the closest of ``candidates``, or an empty string."""
    close = difflib.get_close_matches(str(word), list(candidates), n=1, cutoff=0.5)
    return f". Did you mean {close[0]!r}?" if close else ""


def one_line(e: Exception) -> str:
    """The gist of an exception on one line (YAML's ``problem``, else the first line)."""
    problem = getattr(e, "problem", None)
    if problem:
        return str(problem)
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def value_kind(value: Any) -> str:
    """What a config value is, in words: ``mapping``, ``list`` or its Python type name."""
    if isinstance(value, DictConfig):
        return "mapping"
    return "list" if isinstance(value, ListConfig) else type(value).__name__


def field_type_name(cls: Optional[type], key: Optional[str]) -> str:
    """Readable annotation of dataclass field ``key`` of ``cls`` (e.g. ``int``, ``Optional[int]``)."""
    if cls is None or key is None or not dataclasses.is_dataclass(cls):
        return "a value of the field's type"
    try:
        hint = typing.get_type_hints(cls).get(str(key))
    except Exception:  # noqa: BLE001 - unresolvable annotations
        hint = None
    if hint is None:
        return "a value of the field's type"
    return readable_type(hint)


def readable_type(hint: Any) -> str:
    """``Optional[List[int]]`` -> ``a list of int, or null``; ``Dict[str, Any]`` -> ``a mapping``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        names = [readable_type(a) for a in args if a is not type(None)]
        text = " or ".join(names)
        return f"{text}, or null" if type(None) in args else text
    if origin in (list, tuple, collections.abc.Sequence):
        inner = [a for a in args if a is not Ellipsis]
        return f"a list of {readable_type(inner[0])}" if inner else "a list"
    if origin in (dict, collections.abc.Mapping):
        return "a mapping"
    if hint is Any:
        return "any value"
    if dataclasses.is_dataclass(hint):
        return "a mapping (a config section)"
    return getattr(hint, "__name__", str(hint).replace("typing.", ""))
