"""GRPO/DAPO token-level functions against plain-loop references."""

import math

import pytest
import torch

from rlinf_embodied.algorithms import get_advantage, get_filter, get_loss
from rlinf_embodied.algorithms import RolloutBatch
from rlinf_embodied.algorithms.dapo import (TokenLossBatch, aggregate_token_loss, overlong_reward_penalty,
                                            ppo_token_loss)
from rlinf_embodied.reasoning.config import ReasoningAlgorithmConfig


def _batch(seed, B=6, R=5):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(B, R, generator=g) * 2
    old = lp + 0.4 * torch.randn(B, R, generator=g)
    ref = lp + 0.3 * torch.randn(B, R, generator=g)
    adv = torch.randn(B, generator=g)
    lens = torch.randint(1, R + 1, (B,), generator=g)
    mask = torch.arange(R)[None] < lens[:, None]
    return lp, old, ref, adv, mask


def _loop_loss(lp, old, ref, adv, mask, low, high, agg, kl_coef):
    per_seq, tokens, total = [], 0, 0.0
    kl_sum = 0.0
    for b in range(len(lp)):
        s, n = 0.0, 0
        for t in range(len(lp[b])):
            if not mask[b][t]:
                continue
            r = math.exp(lp[b][t] - old[b][t])
            a = float(adv[b])
            s += max(-a * r, -a * min(max(r, 1 - low), 1 + high))
            d = ref[b][t] - lp[b][t]
            kl_sum += math.exp(d) - d - 1
            n += 1
        tokens += n
        total += s
        per_seq.append((s, n))
    if agg == "token_mean":
        pol = total / tokens
    elif agg == "seq_mean_token_mean":
        pol = sum(s / n for s, n in per_seq if n) / sum(1 for _, n in per_seq if n)
    else:
        pol = sum(s for s, _ in per_seq) / sum(1 for _, n in per_seq if n)
    return pol + kl_coef * kl_sum / tokens


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
@pytest.mark.parametrize("seed", [0, 1])
def test_ppo_token_loss_matches_loop(agg, seed):
    lp, old, ref, adv, mask = _batch(seed)
    cfg = ReasoningAlgorithmConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg=agg, kl_coef=0.1)
    loss, met = get_loss("ppo_token")(TokenLossBatch(logprobs=lp, old_logprobs=old, advantages=adv,
                                                     mask=mask, ref_logprobs=ref), cfg)
    want = _loop_loss(lp.tolist(), old.tolist(), ref.tolist(), adv.tolist(), mask.tolist(), 0.2, 0.28, agg, 0.1)
    assert float(loss) == pytest.approx(want, rel=1e-5)
    assert 0.0 < float(met["clip_fraction"]) < 1.0


def test_token_mean_weighs_long_responses_more_than_seq_mean():
    losses = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[True] * 4, [True, False, False, False]])
    assert float(aggregate_token_loss(losses, mask, "token_mean")) == pytest.approx(4 / 5)
    assert float(aggregate_token_loss(losses, mask, "seq_mean_token_mean")) == pytest.approx(0.5)
    assert float(aggregate_token_loss(losses, mask, "seq_mean_token_sum")) == pytest.approx(2.0)
    # micro-batches with the global denominator add up to the whole batch's mean
    parts = sum(float(aggregate_token_loss(losses[i:i + 1], mask[i:i + 1], "token_mean", 5))
                for i in range(2))
    assert parts == pytest.approx(4 / 5)


def test_clip_higher_lets_positive_advantages_grow_further():
    lp = torch.log(torch.tensor([[1.25]]))
    old = torch.zeros(1, 1)
    mask = torch.ones(1, 1, dtype=torch.bool)
    sym, _ = ppo_token_loss(logprobs=lp, old_logprobs=old, advantages=torch.ones(1), mask=mask,
                                   clip_ratio_low=0.2, clip_ratio_high=0.2)
    hi, _ = ppo_token_loss(logprobs=lp, old_logprobs=old, advantages=torch.ones(1), mask=mask,
                                  clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert float(sym) == pytest.approx(-1.2) and float(hi) == pytest.approx(-1.25)


def test_ppo_token_loss_errors_name_the_fix():
    lp, old, ref, adv, mask = _batch(0)
    with pytest.raises(ValueError, match="kl_coef"):
        ppo_token_loss(logprobs=lp, old_logprobs=old, advantages=adv, mask=mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="loss_agg"):
        ppo_token_loss(logprobs=lp, old_logprobs=old, advantages=adv, mask=mask, loss_agg="x")


def test_grpo_on_responses_with_group_ids_matches_loop():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    groups = torch.tensor([3, 3, 3, 3, 7, 7, 7, 7])
    n = len(rewards)
    rb = RolloutBatch(rewards=rewards[None], valid=torch.ones(1, n, dtype=torch.bool),
                      terminations=torch.ones(1, n, dtype=torch.bool),
                      truncations=torch.zeros(1, n, dtype=torch.bool), group_ids=groups)
    adv = get_advantage("grpo")(rb, ReasoningAlgorithmConfig()).advantages[0]
    for g in (3, 7):
        vals = [float(r) for r, gg in zip(rewards, groups) if gg == g]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
        for i in range(8):
            if groups[i] == g:
                assert float(adv[i]) == pytest.approx((float(rewards[i]) - mean) / (std + 1e-6), rel=1e-5)


def test_dynamic_sampling_keeps_groups_with_unequal_rewards():
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.5, 0.5])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    keep = get_filter("nonuniform_groups")(rewards, groups)
    want = [len({float(rewards[j]) for j in range(8) if groups[j] == groups[i]}) > 1 for i in range(8)]
    assert keep.tolist() == want == [False, False, False, False, True, True, False, False]


def test_overlong_filter_and_soft_penalty_match_loop():
    assert get_filter("complete")(torch.tensor([True, False])).tolist() == [False, True]
    L, buf = 10, 4
    lengths = torch.tensor([3, 6, 7, 9, 10, 12])
    got = overlong_reward_penalty(lengths, L, buf, 0.5).tolist()
    want = []
    for n in lengths.tolist():
        if n <= L - buf:
            want.append(0.0)
        elif n <= L:
            want.append(0.5 * ((L - buf) - n) / buf)
        else:
            want.append(-0.5)
    assert got == pytest.approx(want)
    assert overlong_reward_penalty(lengths, L, 0).tolist() == [0.0] * 6


def test_one_grpo_step_raises_the_logprob_of_rewarded_responses():
    """The update direction end to end on a real (tiny) causal LM: group-normalised advantages
    from the registered estimator, the actor's packing and log-prob code, one AdamW step of the
    ``ppo_token`` loss; the better response of each group gains log-prob, the worse loses."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlinf_embodied.workers.reasoning_actor import pack_responses, token_logprobs

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=1, num_attention_heads=1,
                                         num_key_value_heads=1, tie_word_embeddings=True))
    prompts = [[3, 4, 5], [6, 7, 8]]
    answers = [[10, 11, 1], [12, 1], [13, 14, 15, 1], [16, 1]]  # two per prompt
    seqs = [prompts[i // 2] + a for i, a in enumerate(answers)]
    plen = [3] * 4
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    cfg = ReasoningAlgorithmConfig(group_size=2)
    rb = RolloutBatch(rewards=rewards[None], valid=torch.ones(1, 4, dtype=torch.bool),
                      terminations=torch.ones(1, 4, dtype=torch.bool),
                      truncations=torch.zeros(1, 4, dtype=torch.bool),
                      group_ids=torch.tensor([0, 0, 1, 1]), success=(rewards > 0.5)[None])
    adv = get_advantage("grpo")(rb, cfg).advantages[0]
    assert adv[0] > 0 > adv[1] and adv[3] > 0 > adv[2]
    ids, attn, mask = pack_responses(seqs, plen, pad_id=0)

    def seq_logprob():
        with torch.no_grad():
            lp, _ = token_logprobs(model, ids, attn)
        return (lp * mask).sum(-1)

    before = seq_logprob()
    lp, _ = token_logprobs(model, ids, attn)
    loss, _ = get_loss("ppo_token")(TokenLossBatch(logprobs=lp, old_logprobs=lp.detach(),
                                                   advantages=adv, mask=mask), cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    opt.zero_grad()
    loss.backward()
    opt.step()
    delta = seq_logprob() - before
    assert delta[0] > 0 and delta[3] > 0, delta
    assert delta[1] < 0 and delta[2] < 0, delta
