"""What SFT -> RL on the language-conditioned suite needs from the flow-matching VLAs (π0,
π0.5), the checks tests/policies/test_vla_sft_rl.py makes of OpenVLA and OFT: the flow-matching
SFT loss of demonstrated chunks falls on a fixed batch, the demos' statistics travel with the
LeRobot-layout checkpoint and are read back (greedy actions equal), rollout log-probs equal the
training-mode recomputation, and one GRPO update follows the advantage's sign."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from rlinf_embodied.policies import build_policy, load_policy, save_policy
from rlinf_embodied.policies.base import SpaceSpec

from rlinf_embodied.algorithms.update import logprob_mismatch
from rlinf_embodied.config import load_config
from tests.policies.grpo_step import one_group_update
from rlinf_embodied.policies.configuration_pi0 import Pi05PolicyConfig, Pi0PolicyConfig

pytestmark = pytest.mark.timeout(300)

N, H, K = 8, 32, 2
SPEC = SpaceSpec(action_low=[-1.0] * 7, action_high=[1.0] * 7, state_dim=8, image_shape=(H, H, 3))
# the suite pipelines' settings at the tiny preset's size (32 px, width 64, depth 2)
FAMILIES = {
    "pi0": lambda **kw: Pi0PolicyConfig(action_horizon=4, action_chunk=K, num_steps=3,
                                        use_wrist_image=False, max_token_len=48, **kw),
    "pi05": lambda **kw: Pi05PolicyConfig(action_horizon=4, action_chunk=K, num_steps=3,
                                          use_wrist_image=False, max_token_len=112, **kw),
}
RL_CONFIG = {"pi0": "configs/maniskill_lang3_grpo_pi0_finetune.yaml",
             "pi05": "configs/maniskill_lang3_grpo_pi05_finetune.yaml"}


def make(family: str, **kw):
    torch.manual_seed(0)
    return build_policy(FAMILIES[family](dtype="float32", **kw), SPEC)


def make_obs(n=N, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"main_images": torch.randint(0, 256, (n, H, H, 3), dtype=torch.uint8, generator=g),
            "states": torch.randn(n, 8, generator=g) * 0.1,
            "task_descriptions": [("push", "pull")[i % 2] + " the cube to the goal region"
                                  for i in range(n)]}


def demo_batch(seed=1):
    """Demo-like chunks (N, K, 7): small deltas and a +-1 gripper, and their statistics in the
    layout of RGBDemoDataset.statistics."""
    g = torch.Generator().manual_seed(seed)
    actions = torch.rand(N, K, 7, generator=g) * 0.2 - 0.1
    actions[..., -1] = torch.where(torch.rand(N, K, generator=g) > 0.5, 1.0, -1.0)
    flat, states = actions.reshape(-1, 7), make_obs()["states"]

    def entry(x):
        return {"mean": x.mean(0).tolist(), "std": x.std(0).tolist(),
                "q01": torch.quantile(x, 0.01, dim=0).tolist(),
                "q99": torch.quantile(x, 0.99, dim=0).tolist()}

    return actions, {"demo": {"action": entry(flat), "proprio": entry(states)}}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_rollout_logprobs_equal_training_recomputation(family):
    """The rollout worker acts in eval mode, the actor recomputes in train mode: same numbers."""
    p = make(family)
    p.eval()
    torch.manual_seed(1)
    out = p.act(make_obs(), mode="sample")
    assert out.logprobs.shape == (N, K, 7) and bool(torch.isfinite(out.logprobs).all())
    p.train()
    ev = p.evaluate(out.forward_inputs)
    valid = torch.ones(N, dtype=torch.bool)
    assert logprob_mismatch(ev.logprobs, out.logprobs, valid) < 1e-4
    # the check sees a disagreement: the chains scored at another Flow-SDE noise level
    p.config = dataclasses.replace(p.config, noise_level=1.0)
    assert logprob_mismatch(p.evaluate(out.forward_inputs).logprobs, out.logprobs, valid) > 1e-2


@pytest.mark.parametrize("family", list(FAMILIES))
def test_one_update_follows_the_advantage_sign(family):
    """One GRPO update (the suite's RL config) on a fixed batch: the log-probs of chunks with
    positive advantages rise and those with negative ones fall, on average and (on this seeded
    batch; measured: the smallest change is 6e-4) for every sample. All samples come from one
    observation, as a GRPO group's first step does."""
    p = make(family)
    obs = make_obs(n=1)
    obs = {k: (v * N if isinstance(v, list) else v.expand(N, *v.shape[1:]).clone()) for k, v in obs.items()}
    torch.manual_seed(2)
    out = p.act(obs, mode="sample")
    cfg = load_config(RL_CONFIG[family], [
        "algorithm.group_size=8", "algorithm.filter_low=null", "algorithm.filter_high=null",
        "algorithm.target_kl=null", "trainer.update_epochs=1", "trainer.num_minibatches=1"])
    up, down, metrics = one_group_update(p, out, cfg, lr=1e-3)
    assert metrics["train/rollout_logprob_diff_max"] < 1e-4
    assert float(up.mean()) > 0 > float(down.mean()), (up, down)
    assert bool((up > 0).all()) and bool((down < 0).all()), (up, down)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_sft_fits_demo_chunks_and_statistics_travel_with_the_checkpoint(family, tmp_path):
    p = make(family)
    actions, stats = demo_batch()
    p.set_dataset_statistics(stats, "demo")
    assert p.config.unnorm_key == "demo" and p.unnorm_key == "demo"
    nz = p.normalizer
    assert torch.allclose(nz.action_mean, torch.tensor(stats["demo"]["action"]["mean"]))
    assert torch.allclose(nz.state_q99, torch.tensor(stats["demo"]["proprio"]["q99"]))
    fi = p.demo_forward_inputs(make_obs(), actions)
    assert torch.equal(fi["demo_actions"], actions)

    # a fixed batch: the same chunks, flow times and noise at every step (measured: the loss
    # falls to about 0.15 of its first value in 15 steps for both families)
    p.train()
    opt = torch.optim.Adam(p.parameters(), lr=3e-3)
    losses = []
    for _ in range(16):
        torch.manual_seed(123)
        out = p.sft_loss(fi)
        assert out.metrics is None and out.values is None
        losses.append(float(out.loss.detach()))
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    assert losses[-1] < 0.5 * losses[0], losses
    # statistics and weights travel with LeRobot's layout and are read back
    vla = p.save_pretrained_like(tmp_path / "vla", step=40)
    assert (vla / "policy_preprocessor.json").is_file()
    q = build_policy(dataclasses.replace(p.config, pretrained=str(vla)), SPEC)
    assert q.unnorm_key == "demo" and q.layout == "lerobot"
    for name in ("state_mean", "state_std", "state_q01", "state_q99",
                 "action_mean", "action_std", "action_q01", "action_q99"):
        assert torch.equal(getattr(q.normalizer, name), getattr(nz, name)), name
    p.eval()
    q.eval()
    greedy = p.act(make_obs(seed=3), mode="greedy").actions
    assert torch.allclose(q.act(make_obs(seed=3), mode="greedy").actions, greedy, atol=1e-5)
    # the pipeline's sft/policy: its policy.pretrained is the published directory
    p.config = dataclasses.replace(p.config, pretrained=str(vla))
    r = load_policy(save_policy(p, tmp_path / "policy"), map_location="cpu").eval()
    assert torch.allclose(r.act(make_obs(seed=3), mode="greedy").actions, greedy, atol=1e-5)


class _Demos:
    """The RGBDemoDataset surface train_vla_bc reads, over fixed tensors."""

    def __init__(self):
        obs = make_obs()
        self.main_images, self.states = obs["main_images"], obs["states"]
        self.texts = obs["task_descriptions"]
        self.actions = demo_batch()[0][:, 0]

    def __len__(self):
        return N

    def obs(self, idx):
        return {"main_images": self.main_images[idx], "states": self.states[idx],
                "task_descriptions": [self.texts[int(i)] for i in idx]}

    def chunks(self, idx, k):
        steps = torch.clamp(idx[:, None] + torch.arange(k)[None, :], max=N - 1)
        return self.actions[steps]


def test_vla_sft_loop_trains_a_flow_policy():
    from rlinf_embodied.sft.config import BCConfig
    from rlinf_embodied.sft.vla_bc import train_vla_bc

    p = make("pi0")
    p.set_dataset_statistics(demo_batch()[1], "demo")
    before = {k: v.clone() for k, v in p.state_dict().items()}
    out = train_vla_bc(p, _Demos(), BCConfig(steps=3, batch_size=4, image_shift=2),
                       log=lambda *_: None)
    assert out["bc/steps"] == 3 and out["bc/loss"] > 0 and "bc/token_accuracy" not in out
    assert any(not torch.equal(before[k], v) for k, v in p.state_dict().items())
    assert torch.equal(before["normalizer.action_mean"], p.state_dict()["normalizer.action_mean"])
