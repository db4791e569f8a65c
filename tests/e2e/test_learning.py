"""Learning that holds (issue 16).

The slow test trains the main job for real (several minutes on 2 cores; the 3-seed numbers
are in benchmarks/bench_learning.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
MAIN = ROOT / "configs" / "maniskill_pushcube_ppo_mlp.yaml"


@pytest.mark.slow
def test_main_job_solves_pushcube_and_stays_solved(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "rlinf_embodied.cli", "train", str(MAIN), f"run.dir={run}",
         "trainer.target_success=null", "trainer.max_time_s=null", "eval.num_videos=0"],
        cwd=ROOT, capture_output=True, text=True, timeout=3600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    evals = sorted((json.loads(p.read_text()) for p in (run / "eval").glob("iter_*.json")),
                   key=lambda r: r["iteration"])
    solved = [r for r in evals if r["success_once"] >= 0.95]
    assert solved, [r["success_once"] for r in evals]
    last = evals[-1]
    assert last["success_once"] >= 0.9 and last["success_at_end"] >= 0.85, last
