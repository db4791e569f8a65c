"""CLI: --version, config show (and its errors), doctor --json."""

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

import rlinf_embodied
from rlinf_embodied.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def test_version():
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and rlinf_embodied.__version__ in r.stdout


def test_config_show_resolves_overrides(tmp_path):
    p = tmp_path / "j.yaml"
    p.write_text("env:\n  num_envs: 4\n")
    r = runner.invoke(app, ["config", "show", str(p), "env.num_envs=12", "trainer.lr=0.01"])
    assert r.exit_code == 0, r.output
    assert "num_envs: 12" in r.stdout and "lr: 0.01" in r.stdout


def test_config_show_errors_are_clear(tmp_path):
    r = runner.invoke(app, ["config", "show", str(tmp_path / "missing.yaml")])
    assert r.exit_code == 2 and "missing.yaml" in r.output
    p = tmp_path / "j.yaml"
    p.write_text("algorithm:\n  gama: 0.9\n")
    r = runner.invoke(app, ["config", "show", str(p)])
    assert r.exit_code == 2 and "gamma" in r.output


def test_doctor_json_reports_every_check():
    # A real run: probes SAPIEN, MuJoCo and LIBERO in subprocesses.
    p = subprocess.run([sys.executable, "-m", "rlinf_embodied.cli", "doctor", "--json"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    data = json.loads(p.stdout)
    names = [c["name"] for c in data["checks"]]
    for expected in ("python", "torch", "ray", "pins", "sapien_render", "mujoco_render",
                     "libero", "gpu_render_mapping"):
        assert expected in names
    for c in data["checks"]:
        assert c["status"] in ("ok", "warn", "fail")
        assert set(c) == {"name", "status", "required", "detail", "fix"}
        if c["status"] != "ok":
            assert c["fix"], c
    failed = [c for c in data["checks"] if c["status"] == "fail" and c["required"]]
    assert data["ok"] == (not failed)
    assert p.returncode == (1 if failed else 0)
    # This machine is set up by scripts/setup.sh: everything must pass here.
    assert data["ok"], failed


def test_doctor_failure_has_fix(monkeypatch):
    from rlinf_embodied import doctor
    monkeypatch.setattr(doctor, "_version", lambda dist: None)
    c = doctor.check_sapien()
    assert c.status == "warn" and not c.required and "maniskill" in c.fix
    monkeypatch.setattr(doctor, "CHECKS", [lambda: doctor.Check("x", "fail", True, "d", "do y")])
    out = json.loads(doctor.format_checks(doctor.run_checks(), as_json=True))
    assert out["ok"] is False and out["checks"][0]["fix"] == "do y"
