"""Check the package's import layering: import-linter's contracts, then no module-level cycles.

    python scripts/lint_imports.py            # what `make lint` and .ci/run run
    python scripts/lint_imports.py --root DIR # check another checkout (the planted-import test)

Why a staging step: setuptools' ``package-dir`` maps the top-level folders ``envs/``,
``policies/``, ``eval/`` and ``configs/`` into ``rlinf_embodied`` (see ``[tool.setuptools]`` in
pyproject.toml), but import-linter (through grimp) builds its graph by walking the root package's
directory, which does not contain them: run on the source tree it would silently skip a third of
the modules. So the ``.py`` files are copied into a temporary tree laid out as the installed
package (the mapping is read from pyproject.toml, so it cannot drift) and the contracts in
``[tool.importlinter]`` run against that tree. ``test_every_module_is_checked`` in
tests/test_layering.py checks that the staged graph holds every module of the source tree.

Cycles are checked on the same graph: grimp records every import statement, including those
inside functions, so a lazy import that dodges a cycle at import time is still reported. Exits
1 on a broken contract or a cycle, naming the modules.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def package_dirs(root: Path) -> dict:
    """``{package name: source folder}`` from pyproject's ``[tool.setuptools] package-dir``."""
    meta = tomllib.loads((root / "pyproject.toml").read_text())
    return dict(meta["tool"]["setuptools"]["package-dir"])


def stage(root: Path, dest: Path) -> Path:
    """Copy every ``.py`` file of ``root``'s mapped packages into ``dest`` in the installed layout.

    Returns ``dest``. Folders mapped to a subpackage are skipped when walking their parent, so a
    module is staged once, under its installed name.
    """
    mapping = package_dirs(root)
    sources = {(root / d).resolve(): pkg for pkg, d in mapping.items()}
    for src, pkg in sources.items():
        target = dest.joinpath(*pkg.split("."))
        for dirpath, dirnames, filenames in os.walk(src):
            here = Path(dirpath).resolve()
            # a subfolder that is itself mapped elsewhere is staged under its own name
            dirnames[:] = [
                d for d in dirnames
                if (here / d).resolve() not in sources and d != "__pycache__"
            ]
            rel = here.relative_to(src)
            for f in filenames:
                if f.endswith(".py"):
                    out = target / rel / f
                    out.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(here / f, out)
    return dest


def module_cycles(graph) -> list:
    """Strongly connected components of more than one module in a grimp graph, each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):  # iterative Tarjan: the graph is small but recursion depth is not bounded
        work = [(v, iter(sorted(graph.find_modules_directly_imported_by(v))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in graph.modules:
                    continue
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                    advanced = True
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))

    for m in sorted(graph.modules):
        if m not in index:
            visit(m)
    return out


def build_graph(staged: Path):
    """grimp's graph of the staged ``rlinf_embodied`` (external packages left out).

    grimp finds the package through the import system, so an ``rlinf_embodied`` already
    imported in this process (from the editable install, whose package folder lacks the mapped
    ``envs/``, ``policies/``, ``eval/``) would shadow the staged copy: those entries are taken
    out of ``sys.modules`` while the graph is built and put back afterwards.
    """
    import importlib

    saved = {k: sys.modules.pop(k) for k in list(sys.modules)
             if k == "rlinf_embodied" or k.startswith("rlinf_embodied.")}
    sys.path.insert(0, str(staged))
    importlib.invalidate_caches()
    try:
        import grimp

        return grimp.build_graph("rlinf_embodied", cache_dir=None)
    finally:
        sys.path.remove(str(staged))
        for k in [k for k in sys.modules if k == "rlinf_embodied" or k.startswith("rlinf_embodied.")]:
            del sys.modules[k]
        sys.modules.update(saved)
        importlib.invalidate_caches()


def check(root: Path) -> int:
    """Run the contracts and the cycle check on ``root``; returns the exit status (0 = clean)."""
    with tempfile.TemporaryDirectory(prefix="rlinf-lint-") as tmp:
        staged = stage(root, Path(tmp))
        shutil.copyfile(root / "pyproject.toml", staged / "pyproject.toml")
        env = dict(os.environ, PYTHONPATH=str(staged))
        lint = shutil.which("lint-imports", path=os.path.dirname(sys.executable)) or "lint-imports"
        rc = subprocess.call([lint, "--no-cache", "pyproject.toml"], cwd=staged,
                             env=env)
        graph = build_graph(staged)
        cycles = module_cycles(graph)
        for comp in cycles:
            print(f"import cycle ({len(comp)} modules, imports inside functions included): "
                  + " -> ".join(comp))
        if not cycles:
            print(f"No import cycles among {len(graph.modules)} modules "
                  "(imports inside functions included).")
        return 1 if (rc or cycles) else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=REPO, help="checkout to check (default: this)")
    args = ap.parse_args()
    sys.exit(check(args.root.resolve()))


if __name__ == "__main__":
    main()
