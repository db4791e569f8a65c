"""The install shape: package-dir mapping, import names, every package listed."""

import importlib
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAPPING = {"rlinf_embodied": "rlinf_embodied", "rlinf_embodied.envs": "envs",
           "rlinf_embodied.policies": "policies", "rlinf_embodied.eval": "eval"}


@pytest.mark.parametrize("name", sorted(MAPPING))
def test_import_names_map_to_directories(name):
    mod = importlib.import_module(name)
    assert Path(mod.__file__).resolve().parent == (ROOT / MAPPING[name]).resolve()


def test_every_package_is_listed_in_pyproject():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert cfg["package-dir"] == MAPPING
    listed = set(cfg["packages"])
    found = set()
    for name, top in MAPPING.items():
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    missing = sorted(found - listed)
    assert not missing, f"add {missing} to [tool.setuptools] packages in pyproject.toml"


def test_importing_core_imports_no_simulator_or_model():
    code = ("import sys, rlinf_embodied, rlinf_embodied.config, rlinf_embodied.cli;"
            "bad=[m for m in ('mani_skill','sapien','libero','robosuite','mujoco','transformers',"
            "'timm','ray') if m in sys.modules]; print(bad); assert not bad, bad")
    import subprocess
    subprocess.run([sys.executable, "-c", code], check=True)
