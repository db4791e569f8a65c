"""Policy contract conformance: shapes, act/evaluate log-prob equality, checkpoints."""

import dataclasses
import os

import gymnasium as gym
import numpy as np
import pytest
import torch
from rlinf_embodied.policies import (
    ActionOutput,
    PolicyCheckpointError,
    SpaceSpec,
    build_policy,
    load_policy,
    policy_types,
    save_policy,
)

from rlinf_embodied.config import PolicyConfig
from rlinf_embodied.policies.configuration_actor_critic import CNNPolicyConfig, MLPPolicyConfig

N, S = 5, 6
LOW, HIGH = [-1.0, -2.0, 0.0], [1.0, 2.0, 5.0]
SMALL_CNN = {
    "conv_channels": [8, 16],
    "conv_kernels": [3, 3],
    "conv_strides": [2, 2],
    "image_feature_dim": 32,
    "state_feature_dim": 16,
    "hidden_sizes": [32],
}
BOX = {"action_low": LOW, "action_high": HIGH}
DISCRETE = {"action_n": 4}
MAIN, WRIST = (24, 24, 3), (16, 20, 3)

CASES = {
    "mlp_box_clip": (MLPPolicyConfig(), SpaceSpec(**BOX, state_dim=S)),
    "mlp_box_tanh_k4_token": (
        MLPPolicyConfig(action_transform="tanh", action_chunk=4, logprob_granularity="token"),
        SpaceSpec(**BOX, state_dim=S),
    ),
    "mlp_box_clip_k3_chunk_shared": (
        MLPPolicyConfig(action_chunk=3, logprob_granularity="chunk", shared_critic=True),
        SpaceSpec(**BOX, state_dim=S),
    ),
    "mlp_discrete": (MLPPolicyConfig(hidden_sizes=[64, 64]), SpaceSpec(**DISCRETE, state_dim=S)),
    "mlp_discrete_k2_no_critic": (
        MLPPolicyConfig(action_chunk=2, critic=False),
        SpaceSpec(**DISCRETE, state_dim=S),
    ),
    "cnn_box_main": (CNNPolicyConfig(**SMALL_CNN), SpaceSpec(**BOX, image_shape=MAIN)),
    "cnn_box_wrist_state_k2": (
        CNNPolicyConfig(**SMALL_CNN, action_chunk=2, logprob_granularity="token"),
        SpaceSpec(**BOX, state_dim=S, image_shape=MAIN, wrist_image_shape=WRIST),
    ),
    "cnn_discrete_wrist": (
        CNNPolicyConfig(**SMALL_CNN),
        SpaceSpec(**DISCRETE, image_shape=MAIN, wrist_image_shape=WRIST),
    ),
}


def make_obs(spec: SpaceSpec, n=N, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = {"task_descriptions": ["push the cube"] * n}
    if spec.state_dim:
        obs["states"] = torch.randn(n, spec.state_dim, generator=g) * 3
    for key, shape in (("main_images", spec.image_shape), ("wrist_images", spec.wrist_image_shape)):
        if shape is not None:
            obs[key] = torch.randint(0, 256, (n, *shape), generator=g, dtype=torch.uint8)
    return obs


def build(name):
    cfg, spec = CASES[name]
    torch.manual_seed(0)
    return build_policy(cfg, spec), spec


def expected_logprob_shape(policy):
    k, a = policy.action_chunk, policy.spec.action_dim
    return {"token": (N, k, a), "action": (N, k), "chunk": (N,)}[policy.granularity]


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("mode", ["sample", "greedy"])
def test_act_shapes_and_bounds(name, mode):
    policy, spec = build(name)
    out = policy.act(make_obs(spec), mode=mode)
    assert isinstance(out, ActionOutput)
    assert out.actions.shape == (N, policy.action_chunk, spec.action_dim)
    assert out.logprobs.shape == expected_logprob_shape(policy)
    assert out.logprobs.dtype == torch.float32 and torch.isfinite(out.logprobs).all()
    if policy.config.critic:
        assert out.values.shape == (N,)
    else:
        assert out.values is None
    if spec.discrete:
        assert out.actions.dtype == torch.int64
        assert ((out.actions >= 0) & (out.actions < spec.action_n)).all()
    else:
        assert (out.actions >= torch.tensor(LOW)).all() and (
            out.actions <= torch.tensor(HIGH)
        ).all()
    for v in out.forward_inputs.values():
        assert isinstance(v, torch.Tensor) and v.shape[0] == N and not v.requires_grad


@pytest.mark.parametrize("name", list(CASES))
def test_evaluate_reproduces_rollout_logprobs(name):
    policy, spec = build(name)
    out = policy.act(make_obs(spec), mode="sample")
    ev = policy.evaluate(out.forward_inputs, out.actions)
    torch.testing.assert_close(ev.logprobs, out.logprobs, atol=1e-6, rtol=0)
    assert ev.entropy.shape == out.logprobs.shape
    if out.values is not None:
        torch.testing.assert_close(ev.values, out.values, atol=1e-6, rtol=0)
    # Re-batched (a minibatch permutation) still matches entry by entry.
    perm = torch.randperm(N)
    sub = {k: v[perm] for k, v in out.forward_inputs.items()}
    torch.testing.assert_close(
        policy.evaluate(sub, out.actions[perm]).logprobs, out.logprobs[perm], atol=1e-6, rtol=0
    )
    # Gradient flows to the weights.
    (ev.logprobs.sum() + (ev.values.sum() if ev.values is not None else 0)).backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.parameters())


def test_clip_mode_scores_the_unclipped_sample():
    policy, spec = build("mlp_box_clip")
    with torch.no_grad():
        policy.action_head.log_std.fill_(1.0)  # wide: many samples fall outside the bounds
    out = policy.act(make_obs(spec), mode="sample")
    raw = out.forward_inputs["action_samples"]
    assert (raw.abs() > 1).any(), "test needs samples outside the bounds"
    mu = policy.action_head.mean(policy.actor_trunk(out.forward_inputs["states"])).view(N, 1, 3)
    ref = torch.distributions.Normal(mu, torch.ones_like(mu) * np.e).log_prob(raw).sum(-1)
    torch.testing.assert_close(out.logprobs, ref, atol=1e-5, rtol=0)


def test_tanh_mode_applies_jacobian():
    policy, spec = build("mlp_box_tanh_k4_token")
    out = policy.act(make_obs(spec), mode="sample")
    u = out.forward_inputs["action_samples"]
    head = policy.action_head
    mu = head.mean(policy.actor_trunk(out.forward_inputs["states"])).view(N, 4, 3)
    std = head.log_std.exp().view(1, 4, 3)
    ref = torch.distributions.Normal(mu, std).log_prob(u) - torch.log1p(-(torch.tanh(u) ** 2))
    torch.testing.assert_close(out.logprobs, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["mlp_discrete", "cnn_discrete_wrist", "mlp_box_tanh_k4_token"])
def test_evaluate_from_env_actions_without_samples(name):
    policy, spec = build(name)
    out = policy.act(make_obs(spec), mode="greedy")
    inputs = {k: v for k, v in out.forward_inputs.items() if k != "action_samples"}
    ev = policy.evaluate(inputs, out.actions)
    torch.testing.assert_close(ev.logprobs, out.logprobs, atol=1e-3, rtol=0)


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_is_deterministic_and_sample_varies(name):
    policy, spec = build(name)
    obs = make_obs(spec)
    g1, g2 = policy.act(obs, "greedy"), policy.act(obs, "greedy")
    assert torch.equal(g1.actions, g2.actions)
    if not spec.discrete:
        samples = [policy.act(obs, "sample").actions for _ in range(2)]
        assert not torch.equal(samples[0], samples[1])


@pytest.mark.parametrize(
    "name",
    [
        "mlp_box_clip",
        "mlp_discrete",
        "cnn_box_wrist_state_k2",
        "cnn_discrete_wrist",
        "mlp_discrete_k2_no_critic",
    ],
)
def test_save_load_gives_identical_greedy_actions(name, tmp_path):
    policy, spec = build(name)
    with torch.no_grad():  # move away from the init so a fresh build would differ
        for p in policy.parameters():
            p.add_(0.1 * torch.randn_like(p))
    save_policy(policy, tmp_path / "ckpt")
    assert sorted(os.listdir(tmp_path / "ckpt")) == [
        "model.safetensors",
        "policy.yaml",
        "spec.yaml",
    ]
    loaded = load_policy(tmp_path / "ckpt", expected_type=policy.config.type)
    assert type(loaded) is type(policy) and loaded.config == policy.config
    assert loaded.spec.matches(spec)
    obs = make_obs(spec, seed=3)
    a, b = policy.act(obs, "greedy"), loaded.act(obs, "greedy")
    assert torch.equal(a.actions, b.actions)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=0, rtol=0)
    # build_policy with policy.checkpoint set loads the same weights.
    cfg = dataclasses.replace(policy.config, checkpoint=str(tmp_path / "ckpt"))
    assert torch.equal(build_policy(cfg, spec).act(obs, "greedy").actions, a.actions)


def test_load_type_mismatch_names_both_types(tmp_path):
    policy, _ = build("mlp_box_clip")
    save_policy(policy, tmp_path)
    with pytest.raises(
        PolicyCheckpointError, match="holds a 'mlp' policy but policy.type is 'cnn'"
    ):
        load_policy(tmp_path, expected_type="cnn")
    cfg = CNNPolicyConfig(**SMALL_CNN, checkpoint=str(tmp_path))
    with pytest.raises(PolicyCheckpointError, match="set policy.type=mlp"):
        build_policy(cfg, SpaceSpec(**BOX, state_dim=S, image_shape=MAIN))


def test_checkpoint_architecture_and_spec_mismatch(tmp_path):
    policy, spec = build("mlp_box_clip")
    save_policy(policy, tmp_path)
    with pytest.raises(PolicyCheckpointError, match=r"policy.hidden_sizes=\[256, 256, 256\]"):
        build_policy(MLPPolicyConfig(hidden_sizes=[32], checkpoint=str(tmp_path)), spec)
    with pytest.raises(PolicyCheckpointError, match="trained on this env"):
        build_policy(MLPPolicyConfig(checkpoint=str(tmp_path)), SpaceSpec(**BOX, state_dim=S + 1))
    with pytest.raises(PolicyCheckpointError, match="not a complete policy checkpoint"):
        load_policy(tmp_path / "missing")
    # a training run or one of its checkpoints: the message names the policy folder to use
    from rlinf_embodied.checkpoint import checkpoint_dir

    run = tmp_path / "run"
    for it in ("iter_000010", "iter_000020"):
        with checkpoint_dir(run, it) as d:
            save_policy(policy, d / "policy")
    latest = run / "checkpoints" / "iter_000020"
    with pytest.raises(PolicyCheckpointError, match=f"a training run: set policy.checkpoint={latest}/policy"):
        load_policy(run)
    with pytest.raises(PolicyCheckpointError, match=f"a training checkpoint: set policy.checkpoint={latest}/policy"):
        load_policy(latest)


def test_save_is_atomic_and_overwrites(tmp_path):
    policy, _ = build("mlp_discrete")
    save_policy(policy, tmp_path)
    save_policy(policy, tmp_path)
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_registry_and_errors():
    assert {"mlp", "cnn"} <= set(policy_types())
    with pytest.raises(ValueError, match="Valid types"):
        build_policy(PolicyConfig(type="nope"), SpaceSpec(**BOX, state_dim=S))
    # A bare PolicyConfig (Python default) is upgraded to the variant's dataclass.
    p = build_policy(PolicyConfig(type="mlp", action_chunk=2), SpaceSpec(**BOX, state_dim=S))
    assert isinstance(p.config, MLPPolicyConfig) and p.action_chunk == 2
    with pytest.raises(ValueError, match="state observations"):
        build_policy(MLPPolicyConfig(), SpaceSpec(**BOX, image_shape=MAIN))
    with pytest.raises(ValueError, match="main_images"):
        build_policy(CNNPolicyConfig(), SpaceSpec(**BOX, state_dim=S))
    with pytest.raises(ValueError, match="finite action bounds"):
        build_policy(
            MLPPolicyConfig(action_transform="tanh"),
            SpaceSpec(action_low=[-np.inf], action_high=[np.inf], state_dim=S),
        )
    with pytest.raises(ValueError, match="too small"):
        build_policy(CNNPolicyConfig(), SpaceSpec(**BOX, image_shape=(16, 16, 3)))
    policy, spec = build("mlp_box_clip")
    with pytest.raises(ValueError, match="needs obs\\['states'\\]"):
        policy.act({"main_images": torch.zeros(2, 8, 8, 3, dtype=torch.uint8)})
    with pytest.raises(ValueError, match="act mode"):
        policy.act(make_obs(spec), mode="argmax")


def test_unbounded_box_is_not_clipped():
    spec = SpaceSpec(action_low=[-np.inf, -1.0], action_high=[np.inf, 1.0], state_dim=S)
    torch.manual_seed(0)
    policy = build_policy(MLPPolicyConfig(init_log_std=2.0), spec)
    acts = torch.cat([policy.act(make_obs(spec, seed=i)).actions for i in range(20)])
    assert acts[..., 0].abs().max() > 1.0 and acts[..., 1].abs().max() <= 1.0


def test_spec_from_gymnasium_spaces_and_obs():
    box = gym.spaces.Box(low=np.array([-1, -2], np.float32), high=np.array([1, 2], np.float32))
    assert SpaceSpec.from_spaces(box, state_dim=3) == SpaceSpec(
        action_low=[-1, -2], action_high=[1, 2], state_dim=3
    )
    spec = SpaceSpec.from_obs(make_obs(CASES["cnn_discrete_wrist"][1]), gym.spaces.Discrete(4))
    assert spec == CASES["cnn_discrete_wrist"][1]
    assert SpaceSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ValueError, match="exactly one action space"):
        SpaceSpec(state_dim=3)
    with pytest.raises(ValueError, match="Unsupported action space"):
        SpaceSpec.from_spaces(gym.spaces.MultiBinary(3))


def test_fsdp2_evaluate_outputs_are_not_views():
    """FSDP2 warns "returned a view tensor" (an in-place op would drop its pre-backward hook)
    when a sharded forward method returns views; Evaluation copies them."""
    import warnings

    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    from rlinf_embodied.config import load_config
    from rlinf_embodied.policies import build_policy
    from rlinf_embodied.policies.base import Evaluation, SpaceSpec

    base = torch.randn(4, 1, requires_grad=True)
    ev = Evaluation(base[:, 0], base.sum(1), base[:, 0] * 2)
    assert ev.logprobs._base is None and ev.values._base is None
    torch.testing.assert_close(ev.logprobs, base[:, 0])
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29633", rank=0, world_size=1)
    try:
        cfg = load_config(None, ["policy.type=mlp", "policy.hidden_sizes=[16]"])
        p = build_policy(cfg.policy, SpaceSpec(action_low=(-1.0, -1.0), action_high=(1.0, 1.0), state_dim=3))
        fully_shard(p)
        for name in ("act", "evaluate"):
            register_fsdp_forward_method(p, name)
        with torch.no_grad():
            out = p.act({"states": torch.randn(5, 3)})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ev = p.evaluate(out.forward_inputs, out.actions)
            (ev.logprobs.sum() + ev.values.sum()).backward()
        assert not [w for w in caught if "view tensor" in str(w.message)]
    finally:
        dist.destroy_process_group()
