"""Elastic reasoning rollout: preempted workers' responses continue from their partial tokens
on another worker, and training equals the run without preemptions bit for bit.

The preempted run has 1 reserved + 3 preemptible workers on the driver's node and 8 shards of
2 responses; each iteration the first request to each preemptible worker is the first piece
(``chunk_tokens=1``) of a shard, and the kills hit the 4th-6th preemptible requests: each is a
worker's continuation of its first shard, so 3 preemptions per iteration land on responses
with generated tokens, whatever the timing. The clean run has one reserved worker only.
One case runs one iteration (killed workers are not replaced), the other three, with
replacements joining mid-iteration.
"""

import pytest
import torch
from safetensors.torch import load_file

from rlinf_embodied.config import ElasticConfig, PreemptionConfig, PreemptionEvent, load_config
from rlinf_embodied.reasoning.elastic import ElasticReasoningRunner
from rlinf_embodied.reasoning.config import ReasoningJobConfig

SMALL = ["trainer.sft_steps=10", "trainer.sft_batch_size=16",
         "trainer.eval_every=0", "trainer.save_every=1", "trainer.num_minibatches=2",
         "trainer.micro_batch_size=4", "task.num_train=60", "task.num_test=4",
         "rollout.prompts_per_step=4", "rollout.micro_batch_size=3", "rollout.max_new_tokens=5",
         "algorithm.group_size=4", "algorithm.dynamic_sampling=false",
         "algorithm.overlong_filter=false", "logging.console=false"]


def _run(tmp_path, name, elastic, iters):
    cfg = load_config("configs/reasoning_grpo_tiny.yaml", SMALL + [f"trainer.iterations={iters}"],
                      schema=ReasoningJobConfig)
    runner = ElasticReasoningRunner(cfg, tmp_path / name, elastic=elastic)
    res = runner.run()
    return res, runner.elastic_records, load_file(str(tmp_path / name / "model" / "model.safetensors"))


def _tokens(rec):
    return [{k: r[k] for k in ("group", "sample", "response_ids", "logprobs", "finish_reason")}
            for r in rec["responses"]]


# Both slow: the one-iteration case took 75-93 s on a loaded 2-core machine before the last merge
# of main and 302 s after it (not yet explained), over the default suite's budget.
@pytest.mark.slow
@pytest.mark.parametrize("iters, restart", [(1, "never"), (3, "immediate")])
def test_preempted_responses_continue_and_training_matches_clean_run(ray_session, tmp_path, iters,
                                                                     restart):
    common = dict(preemptible_resource="", shard_responses=2, chunk_tokens=1, wait_for_joins=True)
    clean = ElasticConfig(reserved_workers=1, **common)
    kills = [PreemptionEvent(i, d) for i in range(iters) for d in (3, 4, 5)]
    preempted = ElasticConfig(reserved_workers=1, preemptible_workers=3, **common,
                              preemption=PreemptionConfig(mode="schedule", schedule=kills,
                                                          restart=restart))
    res_c, rec_c, w_c = _run(tmp_path, "clean", clean, iters)
    res_p, rec_p, w_p = _run(tmp_path, "preempted", preempted, iters)

    assert len(rec_p) == len(rec_c) == iters
    migrated = 0
    for rc, rp in zip(rec_c, rec_p):
        keys = [(r["group"], r["sample"]) for r in rp["responses"]]
        assert sorted(keys) == [(g, k) for g in range(4) for k in range(4)]  # each exactly once
        assert _tokens(rp) == _tokens(rc)  # tokens and log-probs bit for bit
        assert rp["metrics"]["elastic/preemptions"] == 3.0
        assert rp["metrics"]["elastic/lost_shards"] == 3.0
        assert rc["metrics"]["elastic/preemptions"] == 0.0
        # every killed piece was a continuation: its responses went on elsewhere from a prefix
        assert rp["metrics"]["elastic/migrated_responses"] >= 3.0
        assert rp["metrics"]["elastic/resumed_tokens"] >= 3.0
        for r in rp["responses"]:  # one worker name per generated piece (token here)
            assert len(r["workers"]) == len(r["response_ids"])
        migrated += rp["metrics"]["elastic/migrated_responses"]
    assert migrated >= 3 * iters
    train = lambda res: [{k: v for k, v in s.items() if k.startswith("train/")} for s in res["steps"]]  # noqa: E731
    assert train(res_p) == train(res_c)
    for k in w_c:
        assert torch.equal(w_p[k], w_c[k]), k
    init = load_file(str(tmp_path / "clean" / "tiny_model" / "model.safetensors"))
    assert any(not torch.equal(init[k], w_c[k]) for k in init)  # the runs trained


def test_reasoning_job_files_take_an_elastic_block():
    """``elastic:`` in a reasoning YAML reaches the runner the CLI picks (``elastic.enabled``)."""
    cfg = load_config("configs/reasoning_grpo_tiny.yaml",
                      ["elastic.enabled=true", "elastic.preemptible_workers=2", "elastic.chunk_tokens=3"],
                      schema=ReasoningJobConfig)
    assert cfg.elastic.enabled and cfg.elastic.preemptible_workers == 2 and cfg.elastic.chunk_tokens == 3
    assert not load_config("configs/reasoning_grpo_tiny.yaml", [], schema=ReasoningJobConfig).elastic.enabled
    with pytest.raises(Exception, match="chunk_tok"):
        load_config("configs/reasoning_grpo_tiny.yaml", ["elastic.chunk_tokenz=3"], schema=ReasoningJobConfig)
