"""The package's layering holds (import-linter contracts in pyproject.toml) and can be broken.

scripts/lint_imports.py stages the installed layout (envs/, policies/, eval/, configs/ mapped
into rlinf_embodied) and runs the contracts plus a module-level cycle check on it; these tests
run it on this checkout, show that a planted forbidden import or cycle makes it fail, and check
that the staged graph holds every module of the source tree.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "lint_imports.py"
MAX_LINES = 600


def _lint_module():
    spec = importlib.util.spec_from_file_location("lint_imports", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)],
                          capture_output=True, text=True, timeout=300)


def _source_modules(root: Path) -> set:
    """Module names of every .py file under the mapped package folders, as installed."""
    lint = _lint_module()
    mapping = lint.package_dirs(root)
    sources = {(root / d).resolve(): pkg for pkg, d in mapping.items()}
    names = set()
    for src, pkg in sources.items():
        for dirpath, dirnames, filenames in os.walk(src):
            here = Path(dirpath).resolve()
            dirnames[:] = [d for d in dirnames if (here / d).resolve() not in sources
                           and d != "__pycache__"]
            rel = here.relative_to(src).parts
            for f in filenames:
                if f.endswith(".py"):
                    tail = () if f == "__init__.py" else (f[:-3],)
                    names.add(".".join((pkg, *rel, *tail)))
    return names


def _copy_checkout(dest: Path) -> Path:
    """The files lint_imports.py reads (pyproject.toml and the mapped folders' .py files)."""
    lint = _lint_module()
    shutil.copyfile(REPO / "pyproject.toml", dest / "pyproject.toml")
    for folder in set(lint.package_dirs(REPO).values()):
        shutil.copytree(REPO / folder, dest / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def test_contracts_hold_and_no_cycles():
    res = _run(REPO)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "BROKEN" not in out and "KEPT" in out
    assert "No import cycles among" in out


def test_staged_graph_holds_every_module():
    lint = _lint_module()
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        graph = lint.build_graph(lint.stage(REPO, Path(tmp)))
        staged = set(graph.modules)
    expected = _source_modules(REPO)
    # the mapped folders are there: without the staging step these would be missing
    assert {"rlinf_embodied.envs.base", "rlinf_embodied.policies.base",
            "rlinf_embodied.eval.protocols"} <= staged
    assert expected - staged == set()


@pytest.mark.parametrize("where", ["module", "function"])
def test_planted_forbidden_import_fails(tmp_path, where):
    """The runtime importing a workflow breaks the layers: at module level and inside a
    function alike (a lazy import is still a dependency)."""
    root = _copy_checkout(tmp_path)
    target = root / "rlinf_embodied" / "runtime" / "device.py"
    text = target.read_text()
    if where == "module":
        text += "\nimport rlinf_embodied.runners.embodied  # planted\n"
    else:
        text += "\n\ndef _planted():\n    from rlinf_embodied.workers import env_worker\n"
    target.write_text(text)
    res = _run(root)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "BROKEN" in out
    assert "rlinf_embodied.runtime.device" in out


def test_planted_cycle_fails(tmp_path):
    """metrics -> checkpoint -> metrics, through a function-level import, is reported."""
    root = _copy_checkout(tmp_path)
    ck = root / "rlinf_embodied" / "checkpoint.py"
    ck.write_text(ck.read_text() + "\n\ndef _planted():\n    from rlinf_embodied import metrics\n")
    mt = root / "rlinf_embodied" / "metrics.py"
    mt.write_text(mt.read_text() + "\n\ndef _planted():\n    from rlinf_embodied import checkpoint\n")
    res = _run(root)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "import cycle" in out and "rlinf_embodied.checkpoint" in out


def test_no_package_module_over_600_lines():
    lint = _lint_module()
    long = []
    for folder in set(lint.package_dirs(REPO).values()):
        for path in (REPO / folder).rglob("*.py"):
            n = len(path.read_text().splitlines())
            if n > MAX_LINES:
                long.append(f"{path.relative_to(REPO)}: {n} lines")
    assert not long, "split along its seams (../shared/DESIGN.md): " + "; ".join(long)
