"""trainer.critic_warmup_iterations: the first iterations fit only the critic."""

import contextlib

import pytest
import torch

from rlinf_embodied.algorithms.update import update_policy
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


def _critic_names(policy):
    ids = {id(p) for p in policy.critic_parameters()}
    return {n for n, p in policy.named_parameters() if id(p) in ids}


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
    critic = _critic_names(policy)
    assert critic and critic != set(before)
    actor = [p for n, p in policy.named_parameters() if n not in critic]
    grads = []  # backward computes no gradient of a frozen (actor) parameter
    hooks = [p.register_hook(lambda g: grads.append(g)) for p in actor]
    m = update_policy(policy, opt, batch, cfg, iteration=1)  # iterations 0 and 1 warm up
    for h in hooks:
        h.remove()
    assert grads == [] and all(p.requires_grad for p in policy.parameters())  # restored
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
    cfg = load_config(None, ["policy.type=mlp", "algorithm.advantage=grpo", "algorithm.group_size=2",
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
    assert {names[id(p)] for p in groups[1]["params"]} == _critic_names(policy)
    assert len(groups[0]["params"]) + len(groups[1]["params"]) == len(names)
    opt = torch.optim.Adam(groups, lr=cfg.trainer.lr)
    cfg.trainer.update_epochs, cfg.trainer.num_minibatches = 1, 1
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    update_policy(policy, opt, _batch(policy), cfg, iteration=2)  # after the warm-up
    critic = _critic_names(policy)
    step = {c: max(float((p.detach() - before[n]).abs().max()) for n, p in policy.named_parameters()
                   if (n in critic) == c) for c in (False, True)}
    # Adam's first step moves a weight by at most lr (|m / sqrt(v)| <= 1; float32 rounding)
    assert 1.5e-6 < step[False] <= 3e-6 * 1.05 and 5e-5 < step[True] <= 1e-4 * 1.05
    cfg.trainer.critic_lr = None
    assert [g["lr"] for g in param_groups(policy, cfg.trainer)] == [3e-6]


def test_config_rejects_a_warmup_without_a_critic():
    with pytest.raises(ConfigError, match="needs a critic to warm up"):
        load_config("configs/maniskill_pushcube_grpo_mlp.yaml", ["trainer.critic_warmup_iterations=1"])


def test_warmup_restores_requires_grad_when_the_update_raises():
    policy, cfg, opt = _setup()
    frozen = next(p for n, p in policy.named_parameters() if n not in _critic_names(policy))
    frozen.requires_grad_(False)  # frozen by the user (a VLA's base weights): stays frozen
    with pytest.raises(KeyError):
        update_policy(policy, opt, {"rewards": torch.zeros(T, N)}, cfg, iteration=0)
    assert [p.requires_grad for p in policy.parameters()].count(False) == 1
    assert not frozen.requires_grad


@pytest.mark.parametrize("shared", [False, True])
def test_critic_parameters_are_the_value_head_and_own_trunk(shared):
    torch.manual_seed(0)
    spec = SpaceSpec(action_low=(-1.0,), action_high=(1.0,), state_dim=3)
    policy = build_policy(MLPPolicyConfig(hidden_sizes=[8, 8], shared_critic=shared), spec)
    want = {"value_head.weight", "value_head.bias"} | (
        set() if shared else {f"critic_trunk.{n}" for n, _ in policy.critic_trunk.named_parameters()})
    assert _critic_names(policy) == want and len(want) == (2 if shared else 6)
    none = build_policy(MLPPolicyConfig(hidden_sizes=[8], critic=False), spec)
    assert none.critic_parameters() == []
    cfg = load_config(None, ["policy.type=mlp", "trainer.critic_lr=1e-4"])
    with pytest.raises(ValueError, match="no critic parameters"):
        from rlinf_embodied.algorithms.update import param_groups

        param_groups(none, cfg.trainer)


def test_vla_critic_parameters_are_its_value_head():
    pytest.importorskip("transformers")
    from rlinf_embodied.config import config_class

    spec = SpaceSpec(action_low=[-1.0] * 7, action_high=[1.0] * 7, state_dim=8,
                     image_shape=(32, 32, 3))
    policy = build_policy(config_class("policy", "openvla")(type="openvla", preset="tiny",
                                                            critic=True), spec)
    assert _critic_names(policy) == {f"value_head.{n}" for n, _ in
                                     policy.value_head.named_parameters()}


@contextlib.contextmanager
def fsdp2_root(policy, tmp_path):
    """``policy`` as an FSDP2 root (``act`` / ``evaluate`` registered) in a one-rank gloo process
    group, destroyed on exit; skips when this process already has a process group."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    # a file store, not a fixed TCP port that another process on the machine may hold
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        fully_shard(policy)
        for name in ("act", "evaluate"):
            register_fsdp_forward_method(policy, name)
        yield policy
    finally:
        dist.destroy_process_group()


def test_fsdp2_sharded_policy_groups_and_warmup_after_an_act(tmp_path):
    """A sharded root keeps its unsharded parameters registered after a no-grad forward; the
    optimizer groups and the warm-up freeze must still take the sharded ones it steps."""
    from rlinf_embodied.algorithms.update import make_optimizer

    policy, cfg, _ = _setup(normalize_obs=True)
    cfg.trainer.critic_lr = 1e-3
    batch = _batch(policy)
    critic = _critic_names(policy)
    with fsdp2_root(policy, tmp_path):
        with torch.no_grad():
            policy.act({"states": torch.randn(4, 3)}, mode="sample")
        opt, _ = make_optimizer(policy, cfg.trainer)
        full = lambda: {n: v.full_tensor().clone() if hasattr(v, "full_tensor")  # noqa: E731
                        else v.clone() for n, v in policy.state_dict().items()}
        before = full()
        update_policy(policy, opt, batch, cfg, iteration=0)  # warm-up
        after = full()
        assert {n for n in before if not torch.equal(after[n], before[n])} == critic
        update_policy(policy, opt, batch, cfg, iteration=2)  # both groups train
        moved = {n for n, v in full().items() if not torch.equal(v, after[n])}
        assert critic < moved and "actor_trunk.0.weight" in moved
