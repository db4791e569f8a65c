"""Tiny end-to-end reasoning runs on real Ray workers and FSDP2 (gloo): the same records under
collocated and disaggregated placement, with and without elastic pipelining."""

import json

import pytest
import torch
from safetensors.torch import load_file

from rlinf_embodied.config import load_config
from rlinf_embodied.reasoning.config import ReasoningJobConfig
from rlinf_embodied.reasoning.runner import ReasoningRunner

SMALL = ["trainer.iterations=2", "trainer.sft_steps=30", "trainer.sft_batch_size=32",
         "trainer.eval_every=2", "trainer.save_every=1", "trainer.num_minibatches=2",
         "trainer.micro_batch_size=4", "task.num_train=100", "task.num_test=8",
         "rollout.prompts_per_step=4", "rollout.micro_batch_size=3", "algorithm.group_size=4",
         "algorithm.dynamic_sampling=false", "algorithm.kl_coef=0.01",
         "algorithm.entropy_coef=0.01", "logging.console=false"]
RUNS = {
    "collocated": ["placement=collocated", "rollout.pipelining=false"],
    "collocated_pipelined": ["placement=collocated", "rollout.pipelining=true"],
    "disaggregated_pipelined": ["placement=disaggregated", "cluster.num_cpu_devices=3",
                                "rollout.pipelining=true"],
}


def _records(res):
    return [{k: v for k, v in s.items() if not k.startswith("time/") and "per_s" not in k}
            for s in res["steps"]]


def test_placements_and_pipelining_give_the_same_run(ray_session, tmp_path):
    out = {}
    for name, extra in RUNS.items():
        cfg = load_config("configs/reasoning_grpo_tiny.yaml", SMALL + extra, schema=ReasoningJobConfig)
        res = ReasoningRunner(cfg, tmp_path / name).run()
        saved = json.loads((tmp_path / name / "results.json").read_text())
        assert saved["backend"] == "hf" and saved["pipelining"] == ("pipelined" in name)
        assert (tmp_path / name / "curves.png").stat().st_size > 0
        out[name] = (res, load_file(str(tmp_path / name / "model" / "model.safetensors")))
    base_res, base_w = out["collocated"]
    steps = base_res["steps"]
    assert len(steps) == 2 and all(s["train/responses"] == 16 for s in steps)
    assert all(0.0 <= s["rollout/reward"] <= 1.0 for s in steps)
    init = load_file(str(tmp_path / "collocated" / "tiny_model" / "model.safetensors"))
    assert any(not torch.equal(init[k], base_w[k]) for k in init)  # the run trained
    for name, (res, w) in out.items():
        for got, want in zip(_records(res), _records(base_res), strict=True):
            assert got == pytest.approx(want, rel=1e-5, abs=1e-6), name
        assert [e["reward"] for e in res["eval"]] == [e["reward"] for e in base_res["eval"]]
        for k in base_w:
            torch.testing.assert_close(w[k], base_w[k], rtol=0, atol=1e-6, msg=f"{name}: {k}")


@pytest.mark.slow
def test_hybrid_placement_runs_with_two_actor_ranks(ray_session, tmp_path):
    """Hybrid: reward on device 0, rollout on 1, the actor on both (2 FSDP ranks that own
    alternate groups). Step 1's rollout is the collocated one's; training then differs only by
    how the two ranks split minibatches."""
    runs = {}
    for name, extra in {"collocated": ["placement=collocated"],
                        "hybrid": ["placement=hybrid", "cluster.num_cpu_devices=2"]}.items():
        cfg = load_config("configs/reasoning_grpo_tiny.yaml", SMALL + extra, schema=ReasoningJobConfig)
        runs[name] = ReasoningRunner(cfg, tmp_path / name).run()
    first = {k: v for k, v in runs["hybrid"]["steps"][0].items() if k.startswith("rollout/") and "per_s" not in k}
    assert first == {k: runs["collocated"]["steps"][0][k] for k in first}
    assert len(runs["hybrid"]["steps"]) == 2 and runs["hybrid"]["steps"][1]["train/responses"] == 8
