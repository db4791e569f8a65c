"""MkDocs hook: the configuration reference page, generated from the config dataclasses.

Registered in ``mkdocs.yml`` (``hooks:``). At build time it imports the job-level config
dataclasses (the training job's :class:`~rlinf_embodied.config.JobConfig` and every section
reachable from its fields, the env and policy configs registered by ``type``, the reasoning job,
the SFT -> RL pipeline) and writes ``reference/configuration.md``: per section a table of key,
type, default and the field's docstring. A field docstring is the string literal right under the
field in the class body (read with :mod:`ast` from :func:`inspect.getsource`); a field without
one fails the build (:class:`UndocumentedField`), so the page cannot drift from the code.

``tests/test_docs.py`` imports this file by path and calls :func:`render_reference`.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import textwrap
import typing
from typing import Any, Callable, Dict, List, Optional, Tuple

PAGE = "reference/configuration.md"


class UndocumentedField(ValueError):
    """A config field (or section class) has no docstring; the message names each one and where."""


# --------------------------------------------------------------------------------------------
# Reading the classes
# --------------------------------------------------------------------------------------------
def _class_node(cls: type) -> ast.ClassDef:
    src = textwrap.dedent(inspect.getsource(cls))
    node = ast.parse(src).body[0]
    assert isinstance(node, ast.ClassDef), cls
    return node


def class_doc(cls: type) -> Optional[str]:
    """The class docstring written in the source (not the signature dataclasses invents)."""
    return ast.get_docstring(_class_node(cls))


def field_docs(cls: type) -> Dict[str, Optional[str]]:
    """Field name -> docstring for every field of dataclass ``cls``.

    Bases are read first; a subclass that redeclares a field (e.g. to change its default)
    without a docstring keeps the base's. A field documented nowhere maps to None.
    """
    docs: Dict[str, Optional[str]] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = _class_node(klass).body
        for stmt, nxt in zip(body, body[1:] + [None]):
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            doc = None
            if (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                doc = inspect.cleandoc(nxt.value.value)
            if doc or stmt.target.id not in docs:
                docs[stmt.target.id] = doc
    return docs


def _where(cls: type, name: str) -> str:
    """``file:line`` of field ``name``'s declaration in ``cls`` or its nearest base."""
    for klass in cls.__mro__:
        if name in getattr(klass, "__annotations__", {}):
            try:
                lines, start = inspect.getsourcelines(klass)
            except (OSError, TypeError):
                break
            for i, line in enumerate(lines):
                if re.match(rf"\s+{re.escape(name)}\s*:", line):
                    return f"{inspect.getsourcefile(klass)}:{start + i}"
    return inspect.getsourcefile(cls) or "?"


# --------------------------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------------------------
def _sections_of(hint: Any) -> List[type]:
    """Dataclasses inside a type hint (``Foo``, ``Optional[Foo]``, ``List[Foo]``)."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return [hint]
    out: List[type] = []
    for arg in typing.get_args(hint):
        out += _sections_of(arg)
    return out


def type_name(hint: Any) -> str:
    """A type hint as a user reads it in YAML terms: ``int or null``, ``list[int]`` (no ``|``:
    it would split the table cell)."""
    if hint is type(None):
        return "null"
    if hint is Any:
        return "any"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or (origin is not None and getattr(origin, "__name__", "") == "UnionType"):
        return " or ".join(type_name(a) for a in args)
    if origin in (list, List):
        return f"list[{type_name(args[0])}]" if args else "list"
    if origin in (dict, Dict):
        return f"dict[{', '.join(type_name(a) for a in args)}]" if args else "dict"
    if origin in (tuple, Tuple):
        return f"tuple[{', '.join(type_name(a) for a in args)}]"
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in args)
    return getattr(hint, "__name__", str(hint).replace("typing.", ""))


def _yaml_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"' if value == "" or value.strip() != value else value
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml_value(v)}" for k, v in value.items()) + "}"
    if dataclasses.is_dataclass(value):
        return "(section)"
    return repr(value)


def default_text(f: dataclasses.Field) -> str:
    """The field's default as YAML, in backticks (a section reads ``(section)``)."""
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return "required"
    text = _yaml_value(value)
    return text if text == "(section)" else f"`{text}`"


_ROLE = re.compile(r":(?:class|func|mod|meth|data|attr|obj):`~?([^`]+)`")


def md_text(doc: str) -> str:
    """A docstring as one Markdown table cell: reST roles and ``literals`` to `code`, one line."""
    text = _ROLE.sub(r"`\1`", doc)
    text = text.replace("``", "`")
    text = " ".join(text.split())
    return text.replace("|", "\\|")


def _first_paragraph(doc: str) -> str:
    return doc.split("\n\n")[0] if doc else ""


def _anchor(key: str) -> str:
    return "cfg-" + re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------
class _Renderer:
    def __init__(self) -> None:
        self.out: List[str] = []
        self.missing: List[str] = []
        self.seen: Dict[type, Tuple[str, str]] = {}  # class -> (key, anchor) of its first table
        self.job_id = ""

    def anchor(self, key: str) -> str:
        return _anchor(f"{self.job_id} {key}")

    def _check_class(self, cls: type) -> str:
        doc = class_doc(cls)
        if not doc:
            self.missing.append(f"class {cls.__module__}.{cls.__qualname__} "
                               f"({inspect.getsourcefile(cls)}): no class docstring")
            return ""
        return doc

    def table(self, cls: type, prefix: str, names: Optional[List[str]] = None,
              base: Optional[type] = None) -> List[Tuple[str, type]]:
        """Rows of ``cls``'s fields (those in ``names`` if given); returns the sub-sections."""
        docs = field_docs(cls)
        hints = typing.get_type_hints(cls)
        rows = ["| key | type | default | description |", "|---|---|---|---|"]
        subs: List[Tuple[str, type]] = []
        for f in dataclasses.fields(cls):
            if names is not None and f.name not in names:
                continue
            key = f"{prefix}{f.name}"
            hint = hints[f.name]
            secs = _sections_of(hint)
            if secs:  # a section: documented by its class docstring, rendered under its own heading
                doc = docs.get(f.name) or _first_paragraph(self._check_class(secs[0]))
                for sec in secs:
                    subs.append((key + ("[]" if typing.get_origin(hint) in (list, List) else ""), sec))
                link = f" ([`{key}`](#{self.anchor(key)}))"
                rows.append(f"| `{key}` | {type_name(hint)} | {default_text(f)} | "
                            f"{md_text(doc)}{link} |")
                continue
            doc = docs.get(f.name)
            if not doc:
                self.missing.append(f"{cls.__module__}.{cls.__qualname__}.{f.name} "
                                   f"({_where(cls, f.name)})")
                doc = ""
            rows.append(f"| `{key}` | {type_name(hint)} | {default_text(f)} | {md_text(doc)} |")
        self.out += rows + [""]
        return subs

    def section(self, key: str, cls: type, level: int,
                variants: Optional[Dict[str, type]] = None) -> None:
        """Heading, class docstring and table of ``cls`` at ``key``; then its sub-sections."""
        h = "#" * level
        self.out.append(f"{h} `{key}` {{#{self.anchor(key)}}}")
        self.out.append("")
        if cls in self.seen:
            first_key, first_anchor = self.seen[cls]
            self.out += [f"Same fields as [`{first_key}`](#{first_anchor}) above "
                         f"(`{cls.__name__}`).", ""]
            return
        self.seen[cls] = (key, self.anchor(key))
        doc = self._check_class(cls)
        self.out += [f"`{cls.__module__}.{cls.__qualname__}`: {md_text(doc)}", ""]
        subs = self.table(cls, key + ".")
        for sub_key, sub_cls in subs:
            self.section(sub_key, sub_cls, min(level + 1, 6))
        for name, vcls in (variants or {}).items():
            self.variant(key, cls, name, vcls, min(level + 1, 6))

    def variant(self, key: str, base: type, name: str, cls: type, level: int) -> None:
        """A registered ``type`` of a section: the fields it adds or gives another default."""
        h = "#" * level
        vkey = f"{key}.type: {name}"
        self.out += [f"{h} `{vkey}` {{#{self.anchor(key + '-type-' + name)}}}", ""]
        doc = self._check_class(cls)
        self.out += [f"`{cls.__module__}.{cls.__qualname__}`: {md_text(doc)} "
                     f"Also takes every field of [`{key}`](#{self.anchor(key)}).", ""]
        base_fields = {f.name: f for f in dataclasses.fields(base)}
        names = [f.name for f in dataclasses.fields(cls)
                 if f.name not in base_fields or f.name == "type"
                 or default_text(f) != default_text(base_fields[f.name])]
        subs = self.table(cls, key + ".", names)
        for sub_key, sub_cls in subs:
            self.section(sub_key, sub_cls, min(level + 1, 6))

    def job(self, title: str, cls: type, intro: str,
            variants: Dict[str, Dict[str, type]]) -> None:
        """A whole job file: its top-level keys, then each section."""
        self.job_id = cls.__name__
        self.out += [f"## {title} {{#{_anchor(cls.__name__)}}}", ""]
        doc = self._check_class(cls)
        self.out += [f"`{cls.__module__}.{cls.__qualname__}`: {md_text(doc)} {intro}", ""]
        subs = self.table(cls, "")
        for key, sub in subs:
            self.section(key, sub, 3, variants.get(key))


def _components() -> Tuple[Callable[[str], list], Callable[[str, str], type]]:
    """``(types, config_class)`` of the component registry."""
    from rlinf_embodied.config.components import config_class, types

    return types, config_class


def _registered_variants() -> Dict[str, Dict[str, type]]:
    types, config_class = _components()
    return {section: {t.name: config_class(section, t.name) for t in types(section)}
            for section in ("env", "policy")}


def _jobs() -> List[Tuple[str, type, str]]:
    """(title, top-level class, one sentence) of every job file kind that is installed."""
    from rlinf_embodied.config import JobConfig

    jobs = [("Training job", JobConfig,
             "Read by `rlinf-embodied train`, `config show` and `plan`.")]
    for title, module, name, intro in (
        ("Reasoning job", "rlinf_embodied.reasoning.config", "ReasoningJobConfig",
         "A YAML with `workflow: reasoning` (`configs/reasoning_*.yaml`)."),
        ("SFT -> RL pipeline", "rlinf_embodied.sft.config", "SFTJobConfig",
         "`configs/sft/*.yaml` (`rlinf-embodied demos | sft | finetune | sft-rl`)."),
    ):
        try:
            jobs.append((title, getattr(importlib.import_module(module), name), intro))
        except (ImportError, AttributeError):
            continue
    return jobs


HEADER = """# Configuration reference

<!-- Generated by docs/hooks/config_reference.py at build time: do not edit. -->

Every key a job YAML accepts, generated from the field docstrings of the config dataclasses
when the site is built, so it always matches the code. Parsing is strict: an unknown key is an
error naming the closest valid one. Keys are written here as `key=value` overrides take them
(`env.num_envs=16`); in a YAML file they nest (`env: {num_envs: 16}`). Sections that come in
variants (`env`, `policy`) list the common fields first, then what each registered `type` adds
(or gives another default); `rlinf-embodied config show CONFIG.yaml` prints a job with every
default filled in. How the loader works: [Training and configs](../training.md#configuration).
"""


def render_reference(jobs: Optional[List[Tuple[str, type, str]]] = None,
                     variants: Optional[Dict[str, Dict[str, type]]] = None) -> str:
    """The reference page as Markdown.

    Args:
        jobs: (title, top-level dataclass, intro sentence) per job kind; default: the training
            job, the reasoning job and the SFT -> RL pipeline.
        variants: section key -> {type name: config class}; default: the component registry's
            env and policy types (used for every job that has an ``env`` / ``policy`` section).

    Raises:
        UndocumentedField: a field without a docstring, or a section class without a class
            docstring; the message lists each one with its file and line.
    """
    r = _Renderer()
    r.out.append(HEADER)
    variants = _registered_variants() if variants is None else variants
    for title, cls, intro in (_jobs() if jobs is None else jobs):
        r.job(title, cls, intro, variants)
    if r.missing:
        raise UndocumentedField(
            "Config fields without a docstring (write the string literal right under the field: "
            "what it sets, its unit, when to change it):\n  " + "\n  ".join(r.missing))
    return "\n".join(r.out) + "\n"


# --------------------------------------------------------------------------------------------
# MkDocs hook
# --------------------------------------------------------------------------------------------
def on_files(files, config):
    """Add the generated reference page to the site's files (before the nav is built)."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render_reference()))
    return files
