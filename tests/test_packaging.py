"""The install shape: package-dir mapping, import names, every package listed."""

import importlib
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAPPING = {"rlinf_embodied": "rlinf_embodied", "rlinf_embodied.envs": "envs",
           "rlinf_embodied.policies": "policies", "rlinf_embodied.eval": "eval",
           "rlinf_embodied.configs": "configs"}


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


def test_wheel_installed_outside_the_repo_shows_a_shipped_config(tmp_path):
    """A wheel (not the editable clone) carries the YAML files: `config show` of a shipped config
    by name works from another directory, and its placement resolves inside the package."""
    import subprocess

    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(ROOT)], check=True, cwd=tmp_path,
                   capture_output=True)
    (wheel,) = wheels.glob("rlinf_embodied-*.whl")
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(target), str(wheel)], check=True, capture_output=True)
    code = (
        "import rlinf_embodied, sys; from pathlib import Path;"
        f"assert Path(rlinf_embodied.__file__).is_relative_to({str(target)!r}), rlinf_embodied.__file__;"
        "from rlinf_embodied.runners.setup import resolve_placement;"
        "print(resolve_placement('collocated'));"
        "from rlinf_embodied.cli import app; sys.argv=['rlinf-embodied','config','show',"
        "'maniskill_pushcube_ppo_mlp','env.num_envs=4']; app()"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0] == str(target / "rlinf_embodied" / "configs" / "placement" / "collocated.yaml")
    assert "num_envs: 4" in out.stdout and "env_id: PushCube-v1" in out.stdout
