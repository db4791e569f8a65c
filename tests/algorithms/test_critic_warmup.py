"""trainer.critic_warmup_iterations: the first iterations fit only the critic."""

import pytest
import torch

from rlinf_embodied.algorithms.update import is_critic_parameter, update_policy
from rlinf_embodied.config import ConfigError, load_config
from rlinf_embodied.policies import SpaceSpec, build_policy
from rlinf_embodied.policies.configuration_actor_critic import MLPPolicyConfig

T, N = 6, 8


def _batch(policy, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = {"states": torch.randn(T * N, 3, generator=g)}
    with torch.no_grad():
        out = policy.act(obs, mode="sample")
    r = lambda x: x.reshape(T, N, *x.shape[1:])  # noqa: E731
    values = torch.cat([r(out.values), torch.zeros(1, N)])
    return {
        "forward_inputs": {k: r(v) for k, v in out.forward_inputs.items()},
        "actions": r(out.actions), "logprobs": r(out.logprobs), "values": values,
        "rewards": torch.randn(T, N, generator=g) + 3.0, "valid": torch.ones(T, N, dtype=torch.bool),
        "terminations": torch.zeros(T, N, dtype=torch.bool),
        "truncations": torch.zeros(T, N, dtype=torch.bool),
    }


def _setup(shared_critic=False, normalize_obs=False):
    torch.manual_seed(0)
    spec = SpaceSpec(action_low=(-1.0, -1.0), action_high=(1.0, 1.0), state_dim=3)
    policy = build_policy(MLPPolicyConfig(hidden_sizes=[16], shared_critic=shared_critic,
                                          normalize_obs=normalize_obs), spec)
    cfg = load_config(None, ["policy.type=mlp", "trainer.iterations=5",
                             "trainer.critic_warmup_iterations=2", "trainer.update_epochs=2",
                             "trainer.num_minibatches=2", "algorithm.target_kl=null"])
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2, weight_decay=0.1)
    return policy, cfg, opt


@pytest.mark.parametrize("shared_critic,normalize_obs", [(False, False), (True, True)])
def test_warmup_freezes_the_policy_and_fits_the_value_head(shared_critic, normalize_obs):
    policy, cfg, opt = _setup(shared_critic, normalize_obs)
    batch = _batch(policy)
    before = {n: p.detach().clone() for n, p in policy.state_dict().items()}
    critic = {n for n in before if is_critic_parameter(n)}
    assert critic and critic != set(before)
    m = update_policy(policy, opt, batch, cfg, iteration=1)  # iterations 0 and 1 warm up
    assert m["train/critic_warmup"] == 1.0 and m["train/approx_kl"] == 0.0
    for n, p in policy.state_dict().items():
        if n in critic:
            assert not torch.equal(p, before[n]), n
        else:  # bit-identical: weights (weight decay included) and observation statistics
            assert torch.equal(p, before[n]), n
    # the critic learns: a second warm-up update on the same batch starts from a lower loss
    m2 = update_policy(policy, opt, batch, cfg, iteration=0)
    assert m2["train/value_loss"] < m["train/value_loss"]
    # after the warm-up the policy trains too
    m3 = update_policy(policy, opt, batch, cfg, iteration=2)
    assert m3["train/critic_warmup"] == 0.0
    moved = [n for n, p in policy.state_dict().items() if n not in critic
             and not torch.equal(p, before[n])]
    assert moved


def test_warmup_needs_a_critic_and_fits_in_the_run():
    torch.manual_seed(0)
    spec = SpaceSpec(action_low=(-1.0,), action_high=(1.0,), state_dim=3)
    policy = build_policy(MLPPolicyConfig(hidden_sizes=[8], critic=False), spec)
    cfg = load_config(None, ["policy.type=mlp", "algorithm.advantage=grpo",
                             "trainer.iterations=3", "trainer.critic_warmup_iterations=1"])
    with pytest.raises(ValueError, match="no critic parameters"):
        update_policy(policy, torch.optim.Adam(policy.parameters()), {}, cfg, iteration=0)
    with pytest.raises(ConfigError, match="critic_warmup_iterations"):
        load_config(None, ["trainer.iterations=3", "trainer.critic_warmup_iterations=3"])


def test_critic_lr_gives_the_critic_its_own_rate():
    from rlinf_embodied.algorithms.update import param_groups

    policy, cfg, _ = _setup()
    cfg.trainer.critic_lr, cfg.trainer.lr = 1e-4, 3e-6
    groups = param_groups(policy, cfg.trainer)
    assert [g["lr"] for g in groups] == [3e-6, 1e-4]
    names = {id(p): n for n, p in policy.named_parameters()}
    assert all(is_critic_parameter(names[id(p)]) for p in groups[1]["params"])
    assert len(groups[0]["params"]) + len(groups[1]["params"]) == len(names)
    opt = torch.optim.Adam(groups, lr=cfg.trainer.lr)
    cfg.trainer.update_epochs, cfg.trainer.num_minibatches = 1, 1
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    update_policy(policy, opt, _batch(policy), cfg, iteration=2)  # after the warm-up
    step = {c: max(float((p.detach() - before[n]).abs().max()) for n, p in policy.named_parameters()
                   if is_critic_parameter(n) == c) for c in (False, True)}
    # Adam's first step moves a weight by at most lr (|m / sqrt(v)| <= 1; float32 rounding)
    assert 1.5e-6 < step[False] <= 3e-6 * 1.05 and 5e-5 < step[True] <= 1e-4 * 1.05
    cfg.trainer.critic_lr = None
    assert [g["lr"] for g in param_groups(policy, cfg.trainer)] == [3e-6]


def test_config_rejects_a_warmup_without_a_critic():
    with pytest.raises(ConfigError, match="needs a critic to warm up"):
        load_config("configs/maniskill_pushcube_grpo_mlp.yaml", ["trainer.critic_warmup_iterations=1"])
