"""scripts/gpu_check.py runs anywhere: on a CPU machine every check is skipped with its reason."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_reports_every_check_on_cpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: run `make gpu-check` for the real thing")
    out = subprocess.run([sys.executable, str(ROOT / "scripts/gpu_check.py"), "--quick"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    sys.path.insert(0, str(ROOT / "scripts"))
    from gpu_check import CHECKS

    assert set(result["checks"]) == set(CHECKS) and len(CHECKS) == 7
    assert "vla_sft_rl_miniature" in CHECKS  # the miniature VLA pipeline on CUDA
    assert result["cuda"] is False
    assert result["summary"] == {"ok": 0, "skipped": 7, "failed": 0}
    for name, entry in result["checks"].items():
        assert entry["status"] == "skipped" and entry["reason"].startswith("no CUDA"), name
