"""algorithm.log_std_anneal_to: the Gaussian log-std is capped by a linearly lowered ceiling."""

import pytest
import torch

from rlinf_embodied.algorithms.update import cap_log_std, log_std_ceiling, update_policy
from rlinf_embodied.config import ConfigError, load_config
from rlinf_embodied.policies import SpaceSpec, build_policy
from rlinf_embodied.policies.configuration_actor_critic import MLPPolicyConfig

from tests.algorithms.test_critic_warmup import _batch, fsdp2_root


def _cfg(*extra):
    return load_config(None, ["policy.type=mlp", "policy.init_log_std=-0.5", "trainer.iterations=4",
                              "trainer.update_epochs=2", "trainer.num_minibatches=2",
                              "algorithm.target_kl=null", "algorithm.log_std_anneal_to=-1.5", *extra])


def _policy():
    torch.manual_seed(0)
    spec = SpaceSpec(action_low=(-1.0, -1.0), action_high=(1.0, 1.0), state_dim=3)
    return build_policy(MLPPolicyConfig(hidden_sizes=[16], init_log_std=-0.5), spec)


def test_the_ceiling_falls_linearly_from_init_to_the_target():
    cfg = _cfg()
    assert [log_std_ceiling(cfg, i) for i in range(6)] == pytest.approx([-0.75, -1.0, -1.25, -1.5, -1.5, -1.5])
    assert log_std_ceiling(load_config(None, ["policy.type=mlp"]), 3) is None


def test_updates_cap_the_log_std_and_report_the_ceiling():
    cfg = _cfg()
    policy = _policy()
    (log_std,) = policy.log_std_parameters()
    assert log_std is policy.action_head.log_std
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    batch = _batch(policy)
    for it in range(4):
        m = update_policy(policy, opt, batch, cfg, iteration=it)
        ceiling = -0.5 - 0.25 * (it + 1)
        assert m["train/log_std_ceiling"] == pytest.approx(ceiling)
        assert float(log_std.detach().max()) <= ceiling + 1e-7
    assert torch.allclose(log_std.detach(), torch.full_like(log_std, -1.5))
    # below the ceiling the log-std is left as learned
    with torch.no_grad():
        log_std.copy_(torch.tensor([-3.0, -0.2]))
    cap_log_std(policy, -1.0)
    assert log_std.detach().tolist() == [-3.0, -1.0]


def test_without_the_option_nothing_is_capped():
    cfg = _cfg("algorithm.log_std_anneal_to=null")
    policy = _policy()
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    m = update_policy(policy, opt, _batch(policy), cfg, iteration=3)
    assert "train/log_std_ceiling" not in m
    assert float(policy.action_head.log_std.detach().max()) > -1.5


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="must be <= policy.init_log_std=-0.5"):
        _cfg("algorithm.log_std_anneal_to=0.0")
    with pytest.raises(ConfigError, match="needs a Gaussian policy"):
        load_config(None, ["policy.type=openvla", "algorithm.log_std_anneal_to=-1"])
    discrete = build_policy(MLPPolicyConfig(hidden_sizes=[8]), SpaceSpec(action_n=3, state_dim=2))
    assert discrete.log_std_parameters() == []
    with pytest.raises(ValueError, match="has none"):
        cap_log_std(discrete, -1.0)


def test_fsdp2_sharded_log_std_is_capped(tmp_path):
    """On an FSDP2 root (its unsharded parameters registered after a no-grad forward) the cap
    reaches the sharded log-std that the optimizer steps and the state dict holds."""
    cfg = _cfg()
    policy = _policy()
    batch = _batch(policy)
    with fsdp2_root(policy, tmp_path):
        opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
        with torch.no_grad():
            policy.act({"states": torch.randn(4, 3)}, mode="sample")
        update_policy(policy, opt, batch, cfg, iteration=1)
        log_std = policy.state_dict()["action_head.log_std"]
        full = log_std.full_tensor() if hasattr(log_std, "full_tensor") else log_std
        assert torch.allclose(full, torch.full_like(full, -1.0))
