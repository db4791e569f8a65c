"""Component types: built-ins resolve through one table; a user's own policy and env type from a
module outside the package work by config alone (tests/plugins/lab_components.py)."""

import pytest
import torch

from rlinf_embodied.config import components
from rlinf_embodied.config import ConfigError, load_config
from rlinf_embodied.envs import make_env
from rlinf_embodied.policies import build_policy, load_policy, save_policy
from rlinf_embodied.policies.base import SpaceSpec

POLICY = "tests.plugins.lab_components:ScaledMLPPolicy"
ENV = "tests.plugins.lab_components:FixedGoalEnv"


def test_builtin_types_resolve_config_and_implementation():
    assert components.type_names("env") == ["gym", "libero", "maniskill"]
    assert components.type_names("policy") == ["cnn", "mlp", "openvla", "openvla_oft", "pi0", "pi05"]
    from rlinf_embodied.policies.configuration_actor_critic import MLPPolicyConfig
    from rlinf_embodied.policies.mlp import MLPPolicy

    assert components.config_class("policy", "mlp") is MLPPolicyConfig
    assert components.impl_class("policy", "mlp") is MLPPolicy
    assert MLPPolicy.config_class is MLPPolicyConfig


def test_unknown_type_lists_the_valid_ones_and_the_escape_hatch():
    with pytest.raises(ConfigError, match=r"Unknown policy.type 'mpl'.*mlp.*Did you mean 'mlp'.*module:Class"):
        load_config(None, ["policy.type=mpl"])
    with pytest.raises(ConfigError, match="cannot import module 'no_such_pkg.mod'"):
        load_config(None, ["policy.type=no_such_pkg.mod:Thing"])
    with pytest.raises(ConfigError, match="has no attribute 'Missing'"):
        load_config(None, ["policy.type=tests.plugins.lab_components:Missing"])
    with pytest.raises(ConfigError, match="config_class"):
        load_config(None, ["policy.type=tests.plugins.lab_components:dataclass"])


def test_user_policy_and_env_by_config_alone(tmp_path):
    cfg = load_config(None, [f"policy.type={POLICY}", "policy.action_scale=0.25",
                             "policy.hidden_sizes=[16]", f"env.type={ENV}", "env.num_envs=3",
                             "env.goal_radius=0.3"])
    assert type(cfg.policy).__name__ == "ScaledMLPPolicyConfig" and cfg.policy.action_scale == 0.25
    assert type(cfg.env).__name__ == "FixedGoalEnvConfig" and cfg.env.goal_radius == 0.3
    # strict keys still hold for the user's dataclass
    with pytest.raises(ConfigError, match=r"Unknown config key 'policy.action_scal'.*policy.action_scale"):
        load_config(None, [f"policy.type={POLICY}", "policy.action_scal=1"])
    env = make_env(cfg.env)
    try:
        assert type(env).__name__ == "FixedGoalEnv"
        obs, _ = env.reset(seed=0)
        assert obs["states"].shape == (3, 4)
        spec = SpaceSpec(action_low=(-1.0, -1.0), action_high=(1.0, 1.0), state_dim=4)
        torch.manual_seed(0)
        policy = build_policy(cfg.policy, spec)
        greedy = policy.act(obs, mode="greedy").actions
        torch.manual_seed(0)
        from rlinf_embodied.policies.mlp import MLPPolicy

        plain = MLPPolicy(cfg.policy, spec).act(obs, mode="greedy").actions
        assert torch.allclose(greedy, 0.25 * plain)
        env.step(greedy[:, 0])
    finally:
        env.close()
    # a checkpoint of the user's policy reloads through its module:Class type
    save_policy(policy, tmp_path / "p")
    again = load_policy(tmp_path / "p")
    assert type(again).__name__ == "ScaledMLPPolicy" and again.config.action_scale == 0.25
    assert torch.allclose(again.act(obs, mode="greedy").actions, greedy)


CAMERA = "tests.plugins.lab_components:CameraReachEnv"


def test_user_subbatch_renders_once_per_chunk():
    """A user's SubBatch with the optional pair (tests/plugins: CameraReachSubBatch): a chunk
    renders once, an episode that ends inside it is observed where it ended, and rewards, flags
    and observations equal an always-observing env's."""
    from tests.plugins.lab_components import CameraReachSubBatch

    K, limit = 4, 6  # the second chunk hits the time limit after 2 of its 4 steps
    overrides = [f"env.type={CAMERA}", "env.num_envs=3", "env.vectorization=sync",
                 f"env.max_episode_steps={limit}", "env.image_size=8"]
    chunked = make_env(load_config(None, overrides).env)
    observed = make_env(load_config(None, overrides).env)
    try:
        assert type(chunked).__name__ == "CameraReachEnv"
        torch.manual_seed(0)
        acts = torch.rand(3, 2 * K, 2) * 2 - 1
        chunked.reset(seed=5)
        observed.reset(seed=5)
        singles = [observed.step(acts[:, t]) for t in range(limit)]
        CameraReachSubBatch.renders = 0
        obs, rew, te, tr, info = chunked.chunk_step(acts[:, :K])
        assert CameraReachSubBatch.renders == 3  # one image per env, not one per step
        assert torch.equal(rew, torch.stack([s[1] for s in singles[:K]], 1))
        for key in ("states", "main_images"):
            assert torch.equal(obs[key], singles[K - 1][0][key]), key
        assert obs["main_images"].shape == (3, 8, 8, 3) and obs["main_images"].max() == 255
        obs, rew, te, tr, info = chunked.chunk_step(acts[:, K:])
        assert info["num_substeps"].tolist() == [limit - K] * 3 and tr[:, limit - K - 1].all()
        assert CameraReachSubBatch.renders == 6  # observe() after the episodes ended mid-chunk
        for key in ("states", "main_images"):
            assert torch.equal(obs[key], singles[-1][0][key]), key
    finally:
        chunked.close()
        observed.close()
