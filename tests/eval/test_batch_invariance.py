"""Batch-invariant acting (issue 38): with the switch on, every policy family's actions for a
batch equal, bit for bit, those of each row evaluated alone, so an evaluation's episodes do not
depend on how many envs share a batch.

Tiny policies of every family (MLP, CNN, OpenVLA, OpenVLA-OFT with token and L1 heads, pi0 and pi0.5) are
built from config on CPU; :func:`~rlinf_embodied.policies.base.act_rows` is checked field by
field (actions, log-probs, values, forward_inputs) and
:func:`~rlinf_embodied.eval.acting.policy_act` as evaluations call it (greedy and sampled, with
idle slots).
"""

import numpy as np
import pytest
import torch
from rlinf_embodied.eval.acting import episode_seed, policy_act
from rlinf_embodied.policies.base import ActionOutput, SpaceSpec, act_rows, cat_rows, obs_rows

pytestmark = pytest.mark.timeout(300)

N, H, S = 5, 64, 8
TASKS = ["pick up the black bowl", "open the top drawer", "push the plate", "close it", "lift"]


def _spec(images=True):
    return SpaceSpec(action_low=[-1.0] * 7, action_high=[1.0] * 7, state_dim=S,
                     image_shape=(H, H, 3) if images else None,
                     wrist_image_shape=(H, H, 3) if images else None)


def _obs(images=True, n=N):
    g = torch.Generator().manual_seed(0)
    obs = {"states": torch.randn(n, S, generator=g), "task_descriptions": TASKS[:n]}
    if images:
        obs["main_images"] = torch.randint(0, 256, (n, H, H, 3), dtype=torch.uint8, generator=g)
        obs["wrist_images"] = torch.randint(0, 256, (n, H, H, 3), dtype=torch.uint8, generator=g)
    return obs


def _policy(family):
    from rlinf_embodied.policies.registry import build_policy

    torch.manual_seed(0)
    if family == "mlp":
        from rlinf_embodied.policies.configuration_actor_critic import MLPPolicyConfig

        return build_policy(MLPPolicyConfig(hidden_sizes=[64, 64]), _spec(False)).eval(), False
    if family == "cnn":
        from rlinf_embodied.policies.configuration_actor_critic import CNNPolicyConfig

        cfg = CNNPolicyConfig(hidden_sizes=[64], conv_channels=[8, 16], conv_kernels=[8, 4],
                              conv_strides=[4, 2], image_feature_dim=32, state_feature_dim=32)
        return build_policy(cfg, _spec()).eval(), True
    pytest.importorskip("transformers")
    if family in ("pi0", "pi05"):
        from rlinf_embodied.policies.configuration_pi0 import Pi05PolicyConfig, Pi0PolicyConfig

        cls = Pi0PolicyConfig if family == "pi0" else Pi05PolicyConfig
        cfg = cls(action_chunk=4, action_horizon=4, num_steps=3, critic=True)
        return build_policy(cfg, _spec()).eval(), True
    from rlinf_embodied.policies.configuration_openvla import (
        OpenVLAOFTPolicyConfig,
        OpenVLAPolicyConfig,
    )

    if family == "openvla":
        cfg = OpenVLAPolicyConfig(max_prompt_tokens=80, critic=True)
    else:
        head = "continuous" if family == "oft_l1" else "discrete"
        cfg = OpenVLAOFTPolicyConfig(max_prompt_tokens=80, action_chunk=4, action_head=head,
                                     use_wrist_image=True, use_proprio=True, proprio_dim=S,
                                     logprob_granularity="token", critic=True)
    return build_policy(cfg, _spec()).eval(), True


FAMILIES = ["mlp", "cnn", "openvla", "oft_tokens", "oft_l1", "pi0", "pi05"]


def _same(a, b, what):
    if a is None or b is None:
        assert a is None and b is None, what
    else:
        assert torch.equal(a, b), what


@pytest.mark.parametrize("family", FAMILIES)
def test_act_rows_equals_each_row_alone_and_ignores_its_neighbours(family):
    policy, images = _policy(family)
    obs = _obs(images)
    for mode in ("greedy", "sample"):
        seeds = [100 + i for i in range(N)]
        batch = act_rows(policy, obs, mode, seeds)
        assert isinstance(batch, ActionOutput) and batch.actions.shape[0] == N
        for i in range(N):
            torch.manual_seed(seeds[i])
            alone = policy.act(obs_rows(obs, [i]), mode)
            _same(batch.actions[i:i + 1], alone.actions, f"{mode} actions {i}")
            _same(batch.logprobs[i:i + 1], alone.logprobs, f"{mode} logprobs {i}")
            _same(None if batch.values is None else batch.values[i:i + 1], alone.values, "values")
            assert batch.forward_inputs.keys() == alone.forward_inputs.keys()
            for k, v in alone.forward_inputs.items():
                _same(batch.forward_inputs[k][i:i + 1], v, f"{mode} forward_inputs[{k}] {i}")
        # other neighbours, other order, a smaller batch: every row the same
        perm = [3, 0, 4]
        again = act_rows(policy, obs_rows(obs, perm), mode, [seeds[j] for j in perm])
        _same(again.actions, batch.actions[perm], f"{mode} permuted")
    # the stored forward inputs recompute the rollout's log-probs (training reads them)
    torch.testing.assert_close(policy.evaluate(batch.forward_inputs).logprobs, batch.logprobs,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_eval_act_of_a_batch_equals_each_env_alone(family):
    policy, images = _policy(family)
    obs = _obs(images)
    episodes = [("task", trial, 2) for trial in range(N)]
    for mode in ("greedy", "sample"):
        act = policy_act(policy, mode, seed=7)  # batch_invariant is the default
        assert act.per_episode
        batch = act(obs, episodes)
        assert batch.shape[:1] == (N,) and batch.ndim == 3
        for i in range(N):
            alone = policy_act(policy, mode, seed=7)(obs_rows(obs, [i]), [episodes[i]])
            assert torch.equal(batch[i:i + 1], alone), (mode, i)
        # idle slots (None) are not run and get zero actions; the others do not change
        idle = [e if i % 2 else None for i, e in enumerate(episodes)]
        part = act(obs, idle)
        for i in range(N):
            want = batch[i] if i % 2 else torch.zeros_like(batch[i])
            assert torch.equal(part[i], want), (mode, i)
    # sampled rows are drawn under their episode's seed
    torch.manual_seed(episode_seed(7, "task", 1, 2))
    row = policy.act(obs_rows(obs, [1]), "sample").actions
    assert torch.equal(policy_act(policy, "sample", 7)(obs, episodes)[1:2], row)


def test_switch_off_runs_one_batched_forward():
    policy, _ = _policy("mlp")
    obs = _obs(False)
    calls = []
    real = policy.act
    policy.act = lambda o, mode="sample": calls.append(len(o["states"])) or real(o, mode)
    off = policy_act(policy, "greedy", batch_invariant=False)
    assert not getattr(off, "per_episode", False)
    assert torch.equal(off(obs), real(obs, "greedy").actions)
    assert calls == [N]
    calls.clear()
    policy_act(policy, "greedy")(obs, [("t", i, 0) for i in range(N)])
    assert calls == [1] * N


def test_rows_of_arrays_lists_and_plain_outputs():
    obs = {"states": np.arange(12, dtype=np.float32).reshape(4, 3), "task_descriptions": list("abcd"),
           "scale": 2.0}
    part = obs_rows(obs, [2, 0])
    assert part["states"].tolist() == [[6, 7, 8], [0, 1, 2]] and part["task_descriptions"] == ["c", "a"]
    assert part["scale"] == 2.0
    one = obs_rows(obs, [1])
    assert one["states"].shape == (1, 3) and one["states"].base is None  # a copy, not a view
    assert cat_rows([np.ones((1, 2)), np.zeros((1, 2))]).tolist() == [[1, 1], [0, 0]]

    class Plain:  # a Policy-like object returning bare actions
        def act(self, o, mode="greedy"):
            return torch.as_tensor(o["states"])[:, :2] * 2

    out = act_rows(Plain(), obs, "greedy")
    assert torch.equal(out, torch.as_tensor(obs["states"])[:, :2] * 2)
    with pytest.raises(ValueError, match="one seed per row: 2 seeds for 4 rows"):
        act_rows(Plain(), obs, "sample", seeds=[1, 2])
