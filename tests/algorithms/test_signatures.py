"""The one signature per kind: registered estimators and losses take typed batches, and a new
estimator + loss plug into the shared update without touching a worker."""

import dataclasses

import pytest
import torch

from rlinf_embodied.algorithms import (
    Advantages,
    LossBatch,
    RolloutBatch,
    dynamic_sampling,
    gae,
    get_advantage,
    get_loss,
    grpo,
    ppo_loss,
    register_advantage,
    register_loss,
)
from rlinf_embodied.algorithms.update import update_policy
from rlinf_embodied.config import AlgorithmConfig, load_config
from rlinf_embodied.policies import SpaceSpec, build_policy
from rlinf_embodied.policies.configuration_actor_critic import MLPPolicyConfig

T, N = 6, 8


def _rollout(seed=0, values=True):
    g = torch.Generator().manual_seed(seed)
    term = torch.rand(T, N, generator=g) < 0.15
    return RolloutBatch(
        rewards=torch.randn(T, N, generator=g),
        valid=torch.rand(T, N, generator=g) > 0.1,
        terminations=term,
        truncations=(torch.rand(T, N, generator=g) < 0.1) & ~term,
        values=torch.randn(T + 1, N, generator=g) if values else None,
        group_ids=torch.arange(N) // 4,
        success=torch.rand(T, N, generator=g) < 0.3,
    )


def test_gae_estimator_is_gae_with_the_config():
    b = _rollout()
    cfg = AlgorithmConfig(gamma=0.9, gae_lambda=0.8)
    out = get_advantage("gae")(b, cfg)
    adv, ret = gae(b.rewards, b.values, b.terminations, b.truncations, valid=b.valid,
                   gamma=0.9, gae_lambda=0.8)
    assert torch.equal(out.advantages, adv) and torch.equal(out.returns, ret)
    assert out.minibatch_normalize is True
    # bootstrap_terminations: terminations count as truncations
    out2 = get_advantage("gae")(b, dataclasses.replace(cfg, bootstrap_terminations=True,
                                                       normalize_advantages=False))
    adv2, _ = gae(b.rewards, b.values, torch.zeros_like(b.terminations),
                  b.terminations | b.truncations, valid=b.valid, gamma=0.9, gae_lambda=0.8)
    assert torch.equal(out2.advantages, adv2) and out2.minibatch_normalize is False
    with pytest.raises(ValueError, match="critic"):
        get_advantage("gae")(_rollout(values=False), cfg)


def test_grpo_estimator_filters_groups_by_success_band():
    b = _rollout(1, values=False)
    cfg = AlgorithmConfig(advantage="grpo", group_size=4, filter_low=0.1, filter_high=0.9)
    out = get_advantage("grpo")(b, cfg)
    adv, _ = grpo(b.rewards, b.group_ids, valid=b.valid)
    keep = dynamic_sampling(b.success.any(0).float(), b.group_ids, low=0.1, high=0.9)
    assert torch.equal(out.advantages, adv)
    assert torch.equal(out.valid, b.valid & keep.unsqueeze(0))
    assert out.minibatch_normalize is False


def test_ppo_objective_reads_kl_and_ratio_level_from_the_config():
    g = torch.Generator().manual_seed(3)
    logp, old, ref = (torch.randn(5, 2, 3, generator=g) * 0.1 for _ in range(3))
    adv = torch.randn(5, generator=g)
    mask = torch.tensor([True, True, False, True, True])
    cfg = AlgorithmConfig(kl_coef=0.05, ratio_level="chunk", clip_ratio_high=0.28)
    batch = LossBatch(logprobs=logp, old_logprobs=old, advantages=adv, mask=mask,
                      granularity="token", ref_logprobs=ref)
    loss, _ = get_loss("ppo")(batch, cfg)
    want, _ = ppo_loss(logprobs=logp, old_logprobs=old, advantages=adv, mask=mask,
                       ref_logprobs=ref, kl_coef=0.05, ratio_level="chunk",
                       clip_ratio_high=0.28)
    assert loss.item() == pytest.approx(want.item(), abs=1e-9)
    per_token, _ = get_loss("ppo")(batch, dataclasses.replace(cfg, ratio_level=None))
    assert per_token.item() != pytest.approx(loss.item(), abs=1e-6)


@register_advantage("test_all_ones")
def _all_ones(batch: RolloutBatch, cfg) -> Advantages:
    ones = torch.ones_like(batch.rewards)
    return Advantages(ones, ones, torch.ones_like(batch.valid))


@register_loss("test_reinforce")
def _reinforce(batch: LossBatch, cfg):
    lp = batch.logprobs.reshape(batch.logprobs.shape[0], -1).sum(1)
    loss = -(lp * batch.advantages)[batch.mask].mean()
    return loss, {"loss": loss.detach()}


def test_new_estimator_and_loss_plug_into_the_shared_update():
    """Advantage +1 everywhere with a REINFORCE loss raises the log-prob of the taken actions."""
    torch.manual_seed(0)
    spec = SpaceSpec(action_low=(-1.0, -1.0), action_high=(1.0, 1.0), state_dim=3)
    policy = build_policy(MLPPolicyConfig(hidden_sizes=[16], critic=False), spec)
    cfg = load_config(None, ["algorithm.advantage=test_all_ones", "algorithm.loss=test_reinforce",
                             "trainer.update_epochs=3", "trainer.num_minibatches=2",
                             "policy.type=mlp", "policy.critic=false"])
    obs = {"states": torch.randn(T * N, 3)}
    with torch.no_grad():
        out = policy.act(obs, mode="sample")
    batch = {
        "forward_inputs": {k: v.reshape(T, N, *v.shape[1:]) for k, v in out.forward_inputs.items()},
        "actions": out.actions.reshape(T, N, *out.actions.shape[1:]),
        "logprobs": out.logprobs.reshape(T, N, *out.logprobs.shape[1:]),
        "rewards": torch.zeros(T, N), "valid": torch.ones(T, N, dtype=torch.bool),
        "terminations": torch.zeros(T, N, dtype=torch.bool),
        "truncations": torch.zeros(T, N, dtype=torch.bool),
    }
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    metrics = update_policy(policy, opt, batch, cfg, iteration=0)
    assert metrics["train/minibatches"] == 6.0
    with torch.no_grad():
        after = policy.evaluate(out.forward_inputs, out.actions).logprobs
    assert after.sum() > out.logprobs.sum() + 1.0
