"""Losses against plain Python loop references (exact to 1e-6)."""

import itertools
import math

import pytest
import torch

from rlinf_embodied.algorithms import k3_kl, ppo_loss, ppo_policy_loss, value_loss
from rlinf_embodied.algorithms.utils import sum_to_level

B, K, A = 7, 3, 4


def _rand(seed, shape, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64) * scale


def _entries(shape):
    return list(itertools.product(*[range(s) for s in shape]))


def policy_loss_reference(logp, old, adv, mask, low, high, dual):
    """Loop over the entries of the ratio's shape; adv and mask are per query (B,)."""
    total, count, clipped = 0.0, 0, 0
    for idx in _entries(logp.shape):
        if mask is not None and not mask[idx[0]]:
            continue
        a = adv[idx[0]].item()
        r = math.exp(logp[idx].item() - old[idx].item())
        loss = max(-a * r, -a * min(max(r, 1 - low), 1 + high))
        if dual is not None and a < 0:
            loss = min(loss, -dual * a)
        total += loss
        count += 1
        clipped += (r < 1 - low) or (r > 1 + high)
    return total / count, clipped / count


@pytest.mark.parametrize("level", ["token", "action", "chunk"])
@pytest.mark.parametrize("dual", [None, 3.0])
@pytest.mark.parametrize("use_mask", [False, True])
def test_ppo_policy_loss_matches_loop(level, dual, use_mask):
    logp_tok = _rand(0, (B, K, A), 0.3)
    old_tok = logp_tok + _rand(1, (B, K, A), 0.3)
    adv = _rand(2, (B,), 2.0)
    mask = torch.tensor([True, False, True, True, False, True, True]) if use_mask else None
    loss, metrics = ppo_policy_loss(
        logp_tok,
        old_tok,
        adv,
        mask,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        dual_clip=dual,
        ratio_level=level,
    )
    ref, ref_clip = policy_loss_reference(
        sum_to_level(logp_tok, level), sum_to_level(old_tok, level), adv, mask, 0.2, 0.28, dual
    )
    assert loss.item() == pytest.approx(ref, abs=1e-6)
    assert metrics["clip_fraction"].item() == pytest.approx(ref_clip, abs=1e-6)


def test_dual_clip_bounds_negative_advantage_loss():
    logp, old = torch.tensor([3.0], dtype=torch.float64), torch.tensor([0.0], dtype=torch.float64)
    adv = torch.tensor([-1.0], dtype=torch.float64)
    plain, _ = ppo_policy_loss(logp, old, adv)
    dual, m = ppo_policy_loss(logp, old, adv, dual_clip=3.0)
    assert plain.item() == pytest.approx(math.exp(3.0))
    assert dual.item() == pytest.approx(3.0)
    assert m["dual_clip_fraction"].item() == 1.0


def test_clip_higher_is_asymmetric():
    old = torch.zeros(2, dtype=torch.float64)
    logp = torch.log(torch.tensor([1.25, 1.25], dtype=torch.float64))
    adv = torch.ones(2, dtype=torch.float64)
    sym, _ = ppo_policy_loss(logp, old, adv, clip_ratio_low=0.2, clip_ratio_high=0.2)
    higher, _ = ppo_policy_loss(logp, old, adv, clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert sym.item() == pytest.approx(-1.2)
    assert higher.item() == pytest.approx(-1.25)


def test_per_step_mask_and_advantages_broadcast():
    logp, old = _rand(3, (B, K), 0.2), _rand(4, (B, K), 0.2)
    adv = _rand(5, (B, K))
    mask = _rand(6, (B, K)) > 0
    loss, _ = ppo_policy_loss(logp, old, adv, mask)
    total, count = 0.0, 0
    for b, k in _entries((B, K)):
        if mask[b, k]:
            r, a = math.exp(logp[b, k].item() - old[b, k].item()), adv[b, k].item()
            total += max(-a * r, -a * min(max(r, 0.8), 1.2))
            count += 1
    assert loss.item() == pytest.approx(total / count, abs=1e-6)


def test_ratio_level_finer_than_logprobs_raises():
    with pytest.raises(ValueError, match="logprob_granularity"):
        ppo_policy_loss(_rand(0, (B, K)), _rand(1, (B, K)), _rand(2, (B,)), ratio_level="token")


@pytest.mark.parametrize("clip", [None, 0.3])
def test_value_loss_matches_loop(clip):
    values, returns, old = _rand(7, (B,)), _rand(8, (B,)), _rand(9, (B,))
    mask = torch.tensor([True, True, False, True, True, True, False])
    loss, _ = value_loss(values, returns, old, mask, value_clip=clip)
    total, count = 0.0, 0
    for b in range(B):
        if not mask[b]:
            continue
        v, r, o = values[b].item(), returns[b].item(), old[b].item()
        err = (v - r) ** 2
        if clip is not None:
            err = max(err, (o + min(max(v - o, -clip), clip) - r) ** 2)
        total += 0.5 * err
        count += 1
    assert loss.item() == pytest.approx(total / count, abs=1e-6)


def test_k3_kl_matches_loop_and_is_nonnegative():
    logp, ref = _rand(10, (B, K)), _rand(11, (B, K))
    kl = k3_kl(logp, ref)
    vals = [
        math.exp(ref[i].item() - logp[i].item()) - (ref[i].item() - logp[i].item()) - 1
        for i in _entries((B, K))
    ]
    assert kl.item() == pytest.approx(sum(vals) / len(vals), abs=1e-6)
    assert min(vals) >= 0.0


def test_ppo_loss_is_the_weighted_sum_of_its_parts():
    logp, old, ref = _rand(12, (B, K, A), 0.2), _rand(13, (B, K, A), 0.2), _rand(14, (B, K, A), 0.2)
    adv, values, returns, old_v = (_rand(s, (B,)) for s in (15, 16, 17, 18))
    entropy = _rand(19, (B, K, A)).abs()
    mask = torch.tensor([True] * 5 + [False] * 2)
    kw = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "dual_clip": 3.0, "ratio_level": "action"}
    loss, metrics = ppo_loss(
        logprobs=logp,
        old_logprobs=old,
        advantages=adv,
        mask=mask,
        entropy=entropy,
        values=values,
        returns=returns,
        old_values=old_v,
        ref_logprobs=ref,
        value_clip=0.2,
        value_coef=0.5,
        entropy_coef=0.01,
        kl_coef=0.1,
        **kw,
    )
    pg, _ = ppo_policy_loss(logp, old, adv, mask, **kw)
    vf, _ = value_loss(values, returns, old_v, mask, value_clip=0.2)
    ent = sum_to_level(entropy, "action")[mask].mean()
    kl = k3_kl(sum_to_level(logp, "action"), sum_to_level(ref, "action"), mask)
    assert loss.item() == pytest.approx((pg + 0.5 * vf - 0.01 * ent + 0.1 * kl).item(), abs=1e-9)
    assert set(metrics) >= {
        "policy_loss",
        "value_loss",
        "entropy",
        "kl_ref",
        "approx_kl",
        "clip_fraction",
        "loss",
    }


def test_ppo_loss_critic_free_and_errors():
    logp, old, adv = _rand(0, (B,)), _rand(1, (B,)), _rand(2, (B,))
    loss, metrics = ppo_loss(logprobs=logp, old_logprobs=old, advantages=adv)
    assert "value_loss" not in metrics and torch.isfinite(loss)
    with pytest.raises(ValueError, match="kl_coef"):
        ppo_loss(logprobs=logp, old_logprobs=old, advantages=adv, kl_coef=0.1)
    with pytest.raises(ValueError, match="returns"):
        ppo_loss(logprobs=logp, old_logprobs=old, advantages=adv, values=logp)
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_policy_loss(logp, old, adv, dual_clip=0.5)


def test_policy_gradient_at_ratio_one():
    logp = _rand(0, (B,)).requires_grad_()
    adv = _rand(1, (B,))
    loss, metrics = ppo_policy_loss(logp, logp.detach(), adv)
    loss.backward()
    torch.testing.assert_close(logp.grad, -adv / B)
    assert metrics["approx_kl"].item() == 0.0
