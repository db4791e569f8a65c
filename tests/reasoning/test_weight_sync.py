"""HF backend vs the FSDP2 actor: after a weight sync their per-token log-probs agree."""

import torch

from rlinf_embodied.config import load_config
from rlinf_embodied.reasoning.config import ReasoningJobConfig
from rlinf_embodied.reasoning.launch import launch_reasoning_groups
from rlinf_embodied.llm.messages import PromptRequest

COLLOCATED = "placement: {context_switch: true, groups: {env: {devices: '0'}, rollout: {devices: '0'}, actor: {devices: '0'}}}"


def _mean_abs(a, b):
    fa = torch.tensor([x for row in a for x in row])
    fb = torch.tensor([x for row in b for x in row])
    assert fa.shape == fb.shape
    return float((fa - fb).abs().mean())


def test_hf_backend_logprobs_follow_actor_weight_syncs(ray_session, tmp_path):
    pfile = tmp_path / "p.yaml"
    pfile.write_text(COLLOCATED + "\n")
    cfg = load_config("configs/reasoning_grpo_tiny.yaml",
                      [f"placement={pfile}", "trainer.sft_batch_size=16", "task.num_train=100"],
                      schema=ReasoningJobConfig)
    g = launch_reasoning_groups(cfg, tmp_path, "sync-test")
    try:
        seqs = [[5, 7, 9, 11, 13, 2, 3, 0], [17, 4, 21, 8, 6], [9, 9, 9, 30, 12, 14, 15]]
        plens = [4, 2, 3]
        g.sync.push(0)
        before = g.rollout.on([0]).score(seqs, plens).wait()[0]
        actor0 = g.actor.logprobs(seqs, plens).wait()[0]
        assert _mean_abs(before, actor0) < 1e-3
        g.actor.sft(3).wait()  # move the actor's weights
        actor1 = g.actor.logprobs(seqs, plens).wait()[0]
        assert _mean_abs(actor1, actor0) > 1e-2  # training changed the actor
        stale = g.rollout.on([0]).score(seqs, plens).wait()[0]
        assert stale == before  # no sync yet: the backend still has the old weights
        g.sync.push(1)
        synced = g.rollout.on([0]).score(seqs, plens).wait()[0]
        assert _mean_abs(synced, actor1) < 1e-3
        assert _mean_abs(synced, before) > 1e-2
        assert g.rollout.on([0]).info().wait()[0] == {"backend": "hf", "version": 1}
        g.actor.sft(3).wait()  # a second sync changes them again
        g.sync.push(2)
        actor2 = g.actor.logprobs(seqs, plens).wait()[0]
        synced2 = g.rollout.on([0]).score(seqs, plens).wait()[0]
        assert _mean_abs(synced2, actor2) < 1e-3 and _mean_abs(synced2, synced) > 1e-2
        # the backend's sampling log-probs are those of its current weights, at temperature 1
        gens = g.rollout.on([0]).evaluate([PromptRequest(0, "u", [5, 7, 9], "1")], False).wait()[0]
        rescored = g.actor.logprobs([gens[0].prompt_ids + gens[0].response_ids], [3]).wait()[0]
        assert _mean_abs([gens[0].logprobs], rescored) < 1e-3
    finally:
        g.shutdown(keep_cluster=True)
