"""The docs stay true: the configuration reference covers every config field, and every shell
command in README.md and docs/**/*.md is run or validated.

Commands come from the ```bash / ```sh blocks (a line ending in ``\\`` continues; ``#`` starts a
comment). Each is classified (:func:`classify`):

- ``run``: a quick ``rlinf-embodied`` command (``--help``, ``--version``, ``config show``,
  ``envs list``, ``plan``, ``eval protocols``), invoked in-process; it must exit 0;
- ``validate``: a long or input-dependent ``rlinf-embodied`` command (``train``, ``eval``,
  ``eval compare``, ``demos``, ``sft``, ``finetune``, ``sft-rl``, ``doctor``): its flags are
  parsed by the real click command (``make_context``, which parses without invoking) and its
  config file must exist and load with the given overrides through the loader the CLI uses;
- ``make``: each target must be a Makefile target; ``script``: ``bash scripts/...`` must exist;
- ``python``: ``python -m pytest`` paths, ``python -m module`` and ``python benchmarks/*.py``
  (the script exists, its ``--flags`` are its own, bench_learning's ``key=value`` overrides load
  on the main job);
- ``external``: another tool's command (Ray's CLI, TensorBoard, apt-get, shell builtins), listed
  in :data:`EXTERNAL` with why it is in the docs; installed ones must exist in the venv.

Anything else fails with a message saying how to classify it. Commands that take minutes must
carry a ``# long`` comment in the docs (:data:`LONG_CLI`, :data:`LONG_MAKE`, benchmarks).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import shlex
import subprocess
import sys
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOOK = ROOT / "docs" / "hooks" / "config_reference.py"
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

CLI_PROGS = ("rlinf-embodied", ".venv/bin/rlinf-embodied", ".venv-vllm/bin/rlinf-embodied")
PYTHONS = ("python", "python3", ".venv/bin/python", ".venv-vllm/bin/python")
# CLI commands that finish in seconds: run for real.
RUN_CLI = {"config show", "envs list", "eval protocols", "plan"}
# CLI commands that are long (or need a machine, a run directory or results files): validated.
VALIDATE_CLI = {"train", "eval", "eval compare", "doctor", "demos", "sft", "finetune", "sft-rl"}
LONG_CLI = {"train", "eval", "demos", "sft", "finetune", "sft-rl"}
LONG_MAKE = {"demo", "test", "test-all", "bench", "gpu-check", "setup"}
# Other tools' commands the docs show, and why; a venv path must exist.
EXTERNAL = {
    ".venv/bin/ray": "Ray's CLI: starting a multi-node cluster (docs/elastic.md)",
    "scp": "copying the head's Ray token to the other machines (docs/elastic.md)",
    "mkdir": "making the folder the copied Ray token goes to (docs/elastic.md)",
    ".venv/bin/tensorboard": "viewing a run's TensorBoard logs",
    ".venv/bin/pip": "installing a user's own package",
    "apt-get": "the one system step before `make setup` on a bare Debian 12",
    "source": "shell builtin: activating the venv",
    "export": "shell builtin: setting an environment variable",
}
MAIN_JOB = "configs/maniskill_pushcube_ppo_mlp.yaml"


def _load_hook():
    spec = importlib.util.spec_from_file_location("docs_config_reference", HOOK)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


hook = _load_hook()


# --------------------------------------------------------------------------------------------
# The configuration reference
# --------------------------------------------------------------------------------------------
def _keys(cls: type, prefix: str = "") -> List[str]:
    """Dotted keys of every leaf field of dataclass ``cls`` (lists of sections as ``key[]``)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        key, hint = prefix + f.name, hints[f.name]
        inner = [a for a in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(a)]
        if inner:
            sub = key + ("[]" if typing.get_origin(hint) is list else "")
            out += [key] + _keys(inner[0], sub + ".")
        else:
            out.append(key)
    return out


@pytest.fixture(scope="module")
def reference() -> str:
    return hook.render_reference()


def test_reference_lists_every_field_of_every_job_section(reference):
    from rlinf_embodied.config import JobConfig
    from rlinf_embodied.reasoning.config import ReasoningJobConfig

    keys = _keys(JobConfig) + _keys(ReasoningJobConfig)
    types, config_class = hook._components()
    for section in ("env", "policy"):
        for t in types(section):
            keys += _keys(config_class(section, t.name), section + ".")
    missing = [k for k in keys if f"| `{k}` |" not in reference]
    assert not missing, f"not in the generated reference: {missing}"
    assert "`env.type: maniskill`" in reference and "`policy.type: openvla_oft`" in reference


@dataclass
class _DocSection:
    """A section for the generator tests."""

    documented: int = 1
    """Has a docstring."""
    bare: int = 2


@dataclass
class _DocSubclass(_DocSection):
    """Redeclares ``documented`` without a docstring: it keeps the base's."""

    documented: int = 3
    bare: int = 4
    """Documented here."""


@dataclass
class _DocJob:
    """A job for the generator tests."""

    section: _DocSection = field(default_factory=_DocSection)
    other: Optional[_DocSubclass] = None


def test_a_field_without_docstring_fails_the_generator():
    with pytest.raises(hook.UndocumentedField, match=r"_DocSection\.bare \(.*test_docs\.py:\d+\)"):
        hook.render_reference(jobs=[("Test job", _DocJob, "")], variants={})
    docs = hook.field_docs(_DocSubclass)
    assert docs == {"documented": "Has a docstring.", "bare": "Documented here."}


def test_reference_renders_type_default_and_docstring():
    md = hook.render_reference(jobs=[("Test job", _DocJobOk, "")], variants={})
    assert "| `other.documented` | int | `3` | Has a docstring. |" in md
    assert "| `other.bare` | int | `4` | Documented here. |" in md
    assert "| `other.maybe` | int or null | `null` | A `literal` and `pkg.Cls`. |" in md


@dataclass
class _DocSubclassOk(_DocSubclass):
    """Everything documented."""

    maybe: Optional[int] = None
    """A ``literal`` and :class:`~pkg.Cls`."""


@dataclass
class _DocJobOk:
    """A job whose fields all have docstrings."""

    other: _DocSubclassOk = field(default_factory=_DocSubclassOk)


def test_site_builds_strict(tmp_path):
    """`make docs`: no broken link or anchor, every page in the nav (mkdocs.yml validation)."""
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d",
                        str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                       env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "site" / "reference" / "configuration" / "index.html").exists()


# --------------------------------------------------------------------------------------------
# Code blocks and links
# --------------------------------------------------------------------------------------------
_FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    lines: List[str]


def code_blocks(path: Path) -> List[Block]:
    """The fenced code blocks of a Markdown file."""
    blocks, cur, fence = [], None, ""
    for i, line in enumerate(path.read_text().splitlines(), 1):
        m = _FENCE.match(line)
        if cur is None and m:
            cur, fence = Block(path, i, m.group(2), []), m.group(1)
        elif cur is not None and line.strip().startswith(fence) and not line.strip().strip(fence[0]):
            blocks.append(cur)
            cur = None
        elif cur is not None:
            cur.lines.append(line)
    return blocks


@dataclass
class Command:
    where: str  # file:line
    text: str  # as written (continuations joined), comment included
    argv: List[str]

    @property
    def long(self) -> bool:
        return re.search(r"#\s*long\b", self.text) is not None


def commands(block: Block) -> List[Command]:
    out, buf, start = [], "", 0
    for k, line in enumerate(block.lines):
        if not buf:
            start = block.line + 1 + k
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        text, buf = buf.strip(), ""
        if not text or text.startswith("#"):
            continue
        rel = block.path.relative_to(ROOT)
        out.append(Command(f"{rel}:{start}", text, shlex.split(text, comments=True)))
    return out


ALL_BLOCKS = [b for p in DOC_FILES for b in code_blocks(p)]
ALL_COMMANDS = [c for b in ALL_BLOCKS if b.lang in ("bash", "sh") for c in commands(b)]


def test_every_code_block_names_its_language():
    """A block without a language could hide a command from the checks below: a synopsis with
    placeholders is ```text, a command users type is ```bash."""
    bare = [f"{b.path.relative_to(ROOT)}:{b.line}" for b in ALL_BLOCKS if not b.lang]
    assert not bare, f"code blocks without a language (use bash, text, yaml, python): {bare}"
    odd = [f"{b.path.relative_to(ROOT)}:{b.line} ({b.lang})" for b in ALL_BLOCKS
           if b.lang in ("shell", "console", "zsh")]
    assert not odd, f"write shell commands in ```bash blocks so they are checked: {odd}"


def test_python_blocks_parse():
    import ast

    for b in ALL_BLOCKS:
        if b.lang == "python":
            ast.parse("\n".join(b.lines), filename=f"{b.path}:{b.line}")


def _slug(text: str) -> str:
    """Python-Markdown's toc slug of a heading."""
    text = re.sub(r"[^\w\s-]", "", re.sub(r"`", "", text)).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_readme_links_resolve():
    """README.md is not part of the site build: its links into docs/ are checked here."""
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text()):
        if re.match(r"\w+://", target):
            continue
        path, _, anchor = target.partition("#")
        p = ROOT / path
        if not p.exists():
            bad.append(target)
        elif anchor:
            heads = [_slug(h) for h in re.findall(r"^#+ (.*?)(?: \{#.*\})?$", p.read_text(), re.M)]
            if anchor not in heads:
                bad.append(target)
    assert not bad, f"README links that do not resolve: {bad}"


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------
def _strip_env(argv: List[str]) -> List[str]:
    i = 0
    while i < len(argv) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[i]):
        i += 1
    return argv[i:]


def cli_args(argv: List[str]) -> Optional[List[str]]:
    """The arguments after the program when ``argv`` runs the rlinf-embodied CLI, else None."""
    if argv[0] in CLI_PROGS:
        return argv[1:]
    if argv[0] in PYTHONS and argv[1:3] == ["-m", "rlinf_embodied.cli"]:
        return argv[3:]
    return None


def parse_cli(args: List[str]):
    """(command path, context) of ``args`` parsed by the real click command, without running it.

    Raises:
        click's UsageError for an unknown command or option, a bad value, a missing argument.
    """
    import typer.main

    from rlinf_embodied.cli import app

    ctx = typer.main.get_command(app).make_context("rlinf-embodied", list(args))
    path: List[str] = []
    while hasattr(ctx.command, "resolve_command"):
        rest = [*getattr(ctx, "_protected_args", getattr(ctx, "protected_args", [])), *ctx.args]
        if not rest:
            break
        name, sub, rest = ctx.command.resolve_command(ctx, rest)
        ctx = sub.make_context(name, rest, parent=ctx)
        path.append(name)
    return " ".join(path), ctx


def classify(cmd: Command) -> str:
    """``run``, ``validate``, ``make``, ``script``, ``python`` or ``external`` (module doc).

    Raises:
        AssertionError: a command no rule covers, with how to classify it.
    """
    argv = _strip_env(cmd.argv)
    args = cli_args(argv)
    if args is not None:
        if "--help" in args or args == ["--version"]:
            return "run"
        name, _ = parse_cli(args)
        if name in RUN_CLI:
            return "run"
        if name in VALIDATE_CLI:
            return "validate"
        raise AssertionError(
            f"{cmd.where}: `rlinf-embodied {name}` is not classified: add it to RUN_CLI in "
            f"tests/test_docs.py if it finishes in seconds on any machine (it is then run), or "
            f"to VALIDATE_CLI (and LONG_CLI if it takes minutes) and teach validate_cli() what "
            f"to check without running it.")
    if argv[0] == "make":
        return "make"
    if argv[0] == "bash" and len(argv) > 1 and argv[1].startswith(("scripts/", ".ci/")):
        return "script"
    if argv[0] in PYTHONS and len(argv) > 1:
        return "python"
    if argv[0] in EXTERNAL:
        return "external"
    raise AssertionError(
        f"{cmd.where}: cannot classify `{cmd.text}`. Write rlinf-embodied commands as "
        f"`.venv/bin/rlinf-embodied ...`; for another tool's command add the program to "
        f"EXTERNAL in tests/test_docs.py with why the docs show it; otherwise add a rule to "
        f"classify() that checks it.")


def _makefile_targets() -> set:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z0-9_.-]+):(?!=)", text, re.M))


def validate_cli(cmd: Command, args: List[str]) -> None:
    """Parse the flags, and load the config file a long command names with its overrides."""
    from rlinf_embodied.config import load_config

    name, ctx = parse_cli(args)
    p = ctx.params
    if name == "train":
        config, overrides = p.get("config"), list(p.get("overrides") or [])
        if config and "=" in config and not (ROOT / config).exists():
            overrides.insert(0, config)  # `train --resume RUN key=value`, as the CLI reads it
            config = None
        if p.get("resume"):  # the run directory comes from an earlier command: check the keys
            assert config is None, f"{cmd.where}: `train CONFIG --resume` in the docs"
            load_config(None, overrides)
            return
        assert config and (ROOT / config).is_file(), f"{cmd.where}: no config file {config!r}"
        from rlinf_embodied.reasoning.config import load_job_config

        load_job_config(ROOT / config, overrides)
    elif name in ("demos", "sft", "finetune", "sft-rl"):
        from rlinf_embodied.sft.pipeline import load_sft_config, rl_job_config

        config = p["config"]
        assert (ROOT / config).is_file(), f"{cmd.where}: no config file {config!r}"
        cfg = load_sft_config(str(ROOT / config), list(p.get("overrides") or []))
        if name in ("finetune", "sft-rl"):
            rl_job_config(cfg)
    elif name == "doctor":  # its cluster.address=... / elastic.preemptible_resource=... load
        load_config(None, list(p.get("overrides") or []))
    # eval, eval compare: the flags parsed; their inputs (a run, results files) come from
    # elsewhere; doctor's machine and cluster too.


def run_cli(cmd: Command, args: List[str]) -> None:
    from typer.testing import CliRunner

    from rlinf_embodied.cli import app

    show = warnings.showwarning  # the CLI's callback patches it for one-line config warnings
    try:
        result = CliRunner().invoke(app, args)
    finally:
        warnings.showwarning = show
    out = getattr(result, "output", "")
    assert result.exit_code == 0, f"{cmd.where}: `{cmd.text}` exited {result.exit_code}:\n{out}" + (
        f"\n{result.exception!r}" if result.exception else "")


def check_python(cmd: Command, argv: List[str]) -> None:
    if argv[1] == "-m":
        module, rest = argv[2], argv[3:]
        if module == "pytest":
            for a in rest:
                if not a.startswith("-") and ("/" in a or a.endswith(".py")):
                    assert (ROOT / a.split("::")[0]).exists(), f"{cmd.where}: no test path {a}"
            return
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        assert importlib.util.find_spec(module) is not None, f"{cmd.where}: no module {module}"
        return
    script = ROOT / argv[1]
    assert script.is_file(), f"{cmd.where}: no script {argv[1]}"
    source = script.read_text()
    for a in argv[2:]:
        if a.startswith("--"):
            flag = a.split("=")[0]
            assert f'"{flag}"' in source, f"{cmd.where}: {argv[1]} has no option {flag}"
    if argv[1].startswith("benchmarks/"):
        assert cmd.long, f"{cmd.where}: mark the benchmark `# long` in the docs"
    if script.name == "bench_learning.py":  # its key=value overrides apply to the main job
        from rlinf_embodied.config import load_config

        load_config(ROOT / MAIN_JOB, [a for a in argv[2:] if not a.startswith("-") and "=" in a])


@pytest.mark.parametrize("cmd", ALL_COMMANDS, ids=[c.where for c in ALL_COMMANDS])
def test_docs_command(cmd: Command, monkeypatch):
    monkeypatch.chdir(ROOT)  # commands are written for the repository root
    argv = _strip_env(cmd.argv)
    kind = classify(cmd)
    if kind in ("run", "validate"):
        args = cli_args(argv)
        if kind == "validate":
            name = parse_cli(args)[0]
            if name in LONG_CLI:
                assert cmd.long, f"{cmd.where}: `{cmd.text}` takes minutes: mark it `# long`"
            validate_cli(cmd, args)
        else:
            run_cli(cmd, args)
    elif kind == "make":
        targets = [a for a in argv[1:] if not a.startswith("-") and "=" not in a]
        unknown = set(targets) - _makefile_targets()
        assert targets and not unknown, f"{cmd.where}: no Makefile target {sorted(unknown)}"
        if set(targets) & LONG_MAKE:
            assert cmd.long, f"{cmd.where}: `{cmd.text}` takes minutes: mark it `# long`"
    elif kind == "script":
        assert (ROOT / argv[1]).is_file(), f"{cmd.where}: no script {argv[1]}"
    elif kind == "python":
        check_python(cmd, argv)
    else:  # external
        if argv[0].startswith(".venv"):
            assert (ROOT / argv[0]).exists(), f"{cmd.where}: {argv[0]} is not installed by setup"
        if argv[0] == "source":
            assert (ROOT / argv[1]).exists(), f"{cmd.where}: no file {argv[1]}"


def test_docs_have_commands():
    """The extraction works: the README's quick start and the pages' commands are found."""
    texts = [c.text for c in ALL_COMMANDS]
    assert any(t.startswith("make demo") for t in texts)
    assert sum(c.where.startswith("docs/") for c in ALL_COMMANDS) > 20
