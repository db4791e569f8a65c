"""Learning check (slow, a person can watch it): the tiny model learns the shipped arithmetic
task. Held-out reward after SFT warm-up + GRPO must clearly beat the warm-up alone.

    .venv/bin/python -m pytest tests/reasoning/test_learning.py -m slow -s
    # or watch the same job through the CLI:
    rlinf-embodied train configs/reasoning_grpo_tiny.yaml

Writes ``results.json`` (before/after numbers) and ``curves.png`` into the run directory
(``$RLINF_LEARNING_DIR`` or a pytest temp dir).
"""

import os
from pathlib import Path

import pytest

from rlinf_embodied.config import load_config
from rlinf_embodied.reasoning.config import ReasoningJobConfig
from rlinf_embodied.reasoning.runner import ReasoningRunner


@pytest.mark.slow
def test_tiny_model_learns_arithmetic(ray_session, tmp_path):
    run_dir = Path(os.environ.get("RLINF_LEARNING_DIR", tmp_path / "learn"))
    cfg = load_config("configs/reasoning_grpo_tiny.yaml", ["logging.console=true"],
                      schema=ReasoningJobConfig)
    res = ReasoningRunner(cfg, run_dir).run()
    before, after = res["eval"][0]["reward"], res["eval"][-1]["reward"]
    print(f"held-out reward: {before:.3f} after SFT warm-up -> {after:.3f} after "
          f"{len(res['steps'])} GRPO steps; curve: {run_dir / 'curves.png'}")
    assert after >= before + 0.15, res["eval"]
