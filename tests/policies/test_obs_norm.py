"""Running observation normalisation (``policy.normalize_obs``): exact statistics, applied
after each update, carried by checkpoints, identical on every actor rank."""

import os

import pytest
import torch
import torch.multiprocessing as mp
from rlinf_embodied.policies import SpaceSpec, build_policy, load_policy, save_policy
from rlinf_embodied.policies.normalization import ObsNormalizer

from rlinf_embodied.algorithms.update import update_policy
from rlinf_embodied.config import load_config

SPEC = SpaceSpec(action_low=(-1.0, -1.0), action_high=(1.0, 1.0), state_dim=3)


def _states(n, seed):
    g = torch.Generator().manual_seed(seed)
    # dims on very different scales, as in ManiSkill states (radians, centimetres, offsets)
    return torch.randn(n, 3, generator=g, dtype=torch.float64) * torch.tensor([1.0, 0.02, 5.0]) \
        + torch.tensor([0.5, 0.1, -3.0])


def test_running_moments_equal_those_of_all_rows():
    norm = ObsNormalizer(3)
    parts = [_states(n, s) for n, s in ((7, 0), (1, 1), (40, 2))]
    for p in parts:
        norm.update(p.float())
    allx = torch.cat([p.float().double() for p in parts])
    torch.testing.assert_close(norm.mean, allx.mean(0), rtol=0, atol=1e-12)
    torch.testing.assert_close(norm.var, allx.var(0, unbiased=False), rtol=1e-10, atol=1e-14)
    assert float(norm.count) == 48.0
    x = torch.tensor([[0.5, 0.1, -3.0], [100.0, 0.1, -3.0]])
    out = norm(x)
    want = (x.double() - allx.mean(0)) / torch.sqrt(allx.var(0, unbiased=False) + 1e-8)
    torch.testing.assert_close(out[0], want[0].float())
    assert out.dtype == torch.float32 and float(out[1, 0]) == 10.0  # clipped at +10
    with pytest.raises(ValueError, match=r"\(B, S=3\)"):
        norm.update(torch.zeros(4, 2))


def _batch(policy, T=6, N=4, seed=0):
    """A time-major trajectory dict from the policy itself (rewards: a function of the state)."""
    obs = _states(T * N, seed).float().reshape(T, N, 3)
    outs = [policy.act({"states": obs[t]}) for t in range(T)]
    valid = torch.ones(T, N, dtype=torch.bool)
    valid[2, 1] = valid[4, 3] = False
    last = policy.predict_values({"states": obs[-1]})
    return {
        "actions": torch.stack([o.actions for o in outs]),
        "logprobs": torch.stack([o.logprobs for o in outs]),
        "values": torch.stack([o.values for o in outs] + [last]),
        "forward_inputs": {k: torch.stack([o.forward_inputs[k] for o in outs])
                           for k in outs[0].forward_inputs},
        "rewards": obs[..., 0].clone(),
        "terminations": torch.zeros(T, N, dtype=torch.bool),
        "truncations": torch.zeros(T, N, dtype=torch.bool),
        "valid": valid,
    }


def test_update_policy_takes_in_the_batch_after_the_update(tmp_path):
    cfg = load_config(None, ["policy.type=mlp", "policy.hidden_sizes=[16]", "policy.normalize_obs=true",
                             "trainer.update_epochs=2", "trainer.num_minibatches=2"])
    torch.manual_seed(0)
    policy = build_policy(cfg.policy, SPEC)
    assert policy.obs_norm is not None and float(policy.obs_norm.count) == 0.0
    batch = _batch(policy)
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    update_policy(policy, opt, batch, cfg, iteration=0)
    rows = batch["forward_inputs"]["states"].reshape(-1, 3)[batch["valid"].reshape(-1)].double()
    assert float(policy.obs_norm.count) == 22.0  # 24 rows, 2 invalid
    torch.testing.assert_close(policy.obs_norm.mean, rows.mean(0), rtol=0, atol=1e-12)
    # the statistics change what the policy computes, and a checkpoint carries them
    x = {"states": _states(5, 9).float()}
    plain = build_policy(load_config(None, ["policy.type=mlp", "policy.hidden_sizes=[16]"]).policy, SPEC)
    plain.load_state_dict({k: v for k, v in policy.state_dict().items() if "obs_norm" not in k})
    assert not torch.allclose(plain.act(x, mode="greedy").actions, policy.act(x, mode="greedy").actions)
    loaded = load_policy(save_policy(policy, tmp_path / "p"))
    torch.testing.assert_close(loaded.obs_norm.var, policy.obs_norm.var, rtol=0, atol=0)
    torch.testing.assert_close(loaded.act(x, mode="greedy").actions, policy.act(x, mode="greedy").actions,
                               rtol=0, atol=0)


def _rank(rank, port, out_dir):
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        cfg = load_config(None, ["policy.type=mlp", "policy.hidden_sizes=[16]", "policy.normalize_obs=true"])
        torch.manual_seed(0)
        policy = build_policy(cfg.policy, SPEC)
        fully_shard(policy)
        policy.update_obs_stats({"states": _states(5 + 3 * rank, rank).float()})
        torch.save({k: policy.obs_norm.state_dict()[k].clone() for k in ("mean", "var", "count")},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_two_fsdp_ranks_end_with_the_statistics_of_both_batches(tmp_path):
    port = 29700 + os.getpid() % 200
    mp.start_processes(_rank, args=(port, str(tmp_path)), nprocs=2, start_method="spawn")
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    both = torch.cat([_states(5, 0).float(), _states(8, 1).float()]).double()
    for r in (r0, r1):
        assert float(r["count"]) == 13.0
        torch.testing.assert_close(r["mean"], both.mean(0), rtol=0, atol=1e-12)
        torch.testing.assert_close(r["var"], both.var(0, unbiased=False), rtol=1e-10, atol=1e-14)
