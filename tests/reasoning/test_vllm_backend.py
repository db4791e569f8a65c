"""The vLLM rollout backend against the real vLLM engine on CPU (runs in ``.venv-vllm``).

One engine for the module (start-up is the dominant cost: about 15 s on 2 idle cores). The
actor is an HF ``Qwen2ForCausalLM`` on CPU trained for a few AdamW steps between weight syncs;
its per-token log-probs (``hf_backend.response_logprobs``, the actor's forward) are the
reference vLLM must reproduce after each sync. ``make test`` runs this file with
``.venv-vllm/bin/python -m pytest -m vllm``; in the main venv (no vLLM) it is skipped.
"""

from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM lives in .venv-vllm (scripts/setup.sh section 4)")

import torch  # noqa: E402

pytestmark = pytest.mark.vllm

TOL = 1e-3  # mean abs log-prob difference vLLM vs HF allowed by the issue (float32 both sides)


def _mean_abs(a, b):
    flat_a = [x for row in a for x in row]
    flat_b = [x for row in b for x in row]
    assert len(flat_a) == len(flat_b) > 0
    return sum(abs(x - y) for x, y in zip(flat_a, flat_b)) / len(flat_a)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlinf_embodied.llm.backends import make_backend
    from rlinf_embodied.reasoning.config import ReasoningRolloutConfig
    from rlinf_embodied.llm.tiny_model import build_tiny_model

    model_dir = build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    actor = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation="eager")
    cfg = ReasoningRolloutConfig(backend="vllm", max_model_len=128, gpu_memory_utilization=0.05)
    backend = make_backend("vllm", str(model_dir), cfg)
    yield backend, actor, tok
    backend.close()


def _hf_scores(actor, seqs, plens, pad_id):
    from rlinf_embodied.llm.hf_backend import response_logprobs

    actor.eval()
    return response_logprobs(actor, seqs, plens, pad_id)


def _train(actor, seqs, plens, steps, lr, seed):
    """A few AdamW steps of next-token loss on the response tokens (the actor's update)."""
    torch.manual_seed(seed)
    actor.train()
    opt = torch.optim.AdamW(actor.parameters(), lr=lr)
    L = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), L), dtype=torch.long)
    labels = torch.full((len(seqs), L), -100, dtype=torch.long)
    for b, (s, p) in enumerate(zip(seqs, plens)):
        ids[b, :len(s)] = torch.tensor(s)
        labels[b, p:len(s)] = torch.tensor(s[p:])
    for _ in range(steps):
        loss = actor(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    actor.eval()
    return {k: v.detach().clone() for k, v in actor.state_dict().items()}


def test_weight_sync_logprobs_match_actor_and_generation(setup):
    backend, actor, tok = setup
    eos = tok.eos_token_id
    assert backend.name == "vllm" and backend.version == 0
    prompts = [tok.encode(q) for q in ("3+4=", "12-5=", "7+7=", "20-9=")]
    answers = [tok.encode(a) + [eos] for a in ("7", "7", "14", "11")]
    seqs = [p + a for p, a in zip(prompts, answers)]
    plens = [len(p) for p in prompts]

    # version 0: the engine's weights are the model directory's, the same as the actor's
    v0 = backend.score(seqs, plens)
    assert [len(r) for r in v0] == [len(a) for a in answers]
    assert _mean_abs(v0, _hf_scores(actor, seqs, plens, tok.pad_token_id)) < TOL

    # sync 1: the actor learned to answer and stop; vLLM must now score like the actor
    sd1 = _train(actor, seqs, plens, steps=40, lr=3e-3, seed=1)
    ref1 = _hf_scores(actor, seqs, plens, tok.pad_token_id)
    backend.update_weights(sd1, version=1)
    assert backend.version == 1
    v1 = backend.score(seqs, plens)
    assert _mean_abs(v1, ref1) < TOL
    assert _mean_abs(v1, v0) > 0.5, "the sync did not change vLLM's weights"

    # generation under the synced weights: per-token log-probs are the actor's, finish reasons
    # follow EOS / the length limit, and the weight version is stamped on every response
    gens = backend.generate(prompts, max_new_tokens=6, temperature=1.0, top_p=1.0, seed=3,
                            greedy=True)
    assert [g.index for g in gens] == list(range(len(prompts)))
    assert [g.prompt_ids for g in gens] == prompts
    stopped = [g for g in gens if g.finish_reason == "stop"]
    assert len(stopped) >= 3, [(g.response_ids, g.finish_reason) for g in gens]
    for g in gens:
        assert g.version == 1 and len(g.logprobs) == len(g.response_ids) >= 1
        if g.finish_reason == "stop":
            assert g.response_ids[-1] == eos and eos not in g.response_ids[:-1]
        else:
            assert g.finish_reason == "length" and len(g.response_ids) == 6
    gseqs = [g.prompt_ids + g.response_ids for g in gens]
    assert _mean_abs([g.logprobs for g in gens],
                     _hf_scores(actor, gseqs, plens, tok.pad_token_id)) < TOL
    short = backend.generate(prompts, max_new_tokens=1, temperature=1.0, top_p=1.0, seed=3)
    assert all(g.finish_reason == "length" and len(g.response_ids) == 1 for g in short)

    # sync 2 (a different update) changes the log-probs again, and they still match the actor
    wrong = [p + tok.encode(a) + [eos] for p, a in zip(prompts[:2], ("8", "6"))]
    sd2 = _train(actor, wrong, plens[:2], steps=20, lr=3e-3, seed=2)
    ref2 = _hf_scores(actor, seqs, plens, tok.pad_token_id)
    backend.update_weights(sd2, version=2)
    v2 = backend.score(seqs, plens)
    assert backend.version == 2
    assert _mean_abs(v2, ref2) < TOL
    assert _mean_abs(v2, v1) > 0.5, "the second sync did not change vLLM's weights"
    assert all(g.version == 2 for g in backend.generate(
        prompts[:1], max_new_tokens=2, temperature=1.0, top_p=1.0, seed=0))


def test_sampling_seeded_and_streamed(setup):
    backend, _, tok = setup
    prompts = [tok.encode(q) for q in ("1+2=", "9-3=", "4+15=", "6-6=", "2+2=", "8+1=")]
    kw = {"max_new_tokens": 8, "temperature": 1.0, "top_p": 0.9, "seed": 11}
    a = backend.generate(prompts, **kw)
    b = backend.generate(prompts, **kw)
    assert [g.response_ids for g in a] == [g.response_ids for g in b]
    c = backend.generate(prompts, **{**kw, "seed": 12})
    assert [g.response_ids for g in a] != [g.response_ids for g in c]
    streamed = list(backend.generate_stream(prompts, **kw))
    assert sorted(g.index for g in streamed) == list(range(len(prompts)))
    by_index = {g.index: g for g in streamed}
    for g in a:
        assert by_index[g.index].response_ids == g.response_ids
        assert by_index[g.index].finish_reason == g.finish_reason
        # log-probs are untempered and bounded; the sampled token has a finite log-prob
        assert all(-50 < x <= 0 for x in g.logprobs)
    # an abandoned stream aborts its remaining requests: the engine takes the next call
    it = backend.generate_stream(prompts, **kw)
    next(it)
    it.close()
    assert not backend.llm.llm_engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="prompt_len"):
        backend.score([[1, 2]], [3])


def test_core_package_imports_under_numpy2():
    """The runtime core has no simulator or numpy<2 dependency: every module of the package
    imports in the vLLM venv (numpy 2)."""
    import importlib
    import pkgutil

    import numpy

    import rlinf_embodied

    assert int(numpy.__version__.split(".")[0]) >= 2
    failed = {}
    for m in pkgutil.walk_packages(rlinf_embodied.__path__, "rlinf_embodied."):
        try:
            importlib.import_module(m.name)
        except Exception as e:  # noqa: BLE001 - report every failing module at once
            failed[m.name] = f"{type(e).__name__}: {e}"
    assert not failed, failed


@pytest.mark.slow
def test_vllm_rollout_worker_follows_fsdp_actor_syncs(ray_session, tmp_path):
    """The same check through the runtime: the vLLM engine inside the rollout worker (a Ray
    actor) takes the FSDP2 actor's weights by WeightSync; its log-probs follow the actor's."""
    from rlinf_embodied.config import load_config
    from rlinf_embodied.reasoning.config import ReasoningJobConfig
    from rlinf_embodied.reasoning.launch import launch_reasoning_groups

    pfile = tmp_path / "p.yaml"
    pfile.write_text("placement: {context_switch: true, groups: {env: {devices: '0'}, "
                     "rollout: {devices: '0'}, actor: {devices: '0'}}}\n")
    cfg = load_config("configs/reasoning_grpo_tiny.yaml",
                      [f"placement={pfile}", "rollout.backend=vllm", "rollout.max_model_len=128",
                       "rollout.gpu_memory_utilization=0.05", "trainer.sft_batch_size=16",
                       "task.num_train=100"], schema=ReasoningJobConfig)
    g = launch_reasoning_groups(cfg, tmp_path, "vllm-sync-test")
    try:
        assert g.backend == "vllm"
        seqs = [[5, 7, 9, 11, 13, 2, 3, 0], [17, 4, 21, 8, 6], [9, 9, 9, 30, 12, 14, 15]]
        plens = [4, 2, 3]
        g.sync.push(0)
        before = g.rollout.on([0]).score(seqs, plens).wait()[0]
        assert _mean_abs(before, g.actor.logprobs(seqs, plens).wait()[0]) < TOL
        scores = [before]
        for version in (1, 2):
            g.actor.sft(3).wait()
            g.sync.push(version)
            synced = g.rollout.on([0]).score(seqs, plens).wait()[0]
            assert _mean_abs(synced, g.actor.logprobs(seqs, plens).wait()[0]) < TOL
            assert _mean_abs(synced, scores[-1]) > 1e-2
            scores.append(synced)
        assert g.rollout.on([0]).info().wait()[0] == {"backend": "vllm", "version": 2}
    finally:
        g.shutdown(keep_cluster=True)
