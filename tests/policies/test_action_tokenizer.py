"""Action tokens, q01/q99 un-normalisation and gripper conventions (policies/action_tokenizer.py)."""

import numpy as np
import pytest
import torch
from rlinf_embodied.policies.action_tokenizer import (
    ActionNormalizer,
    ActionTokenizer,
    GripperConvention,
    select_norm_stats,
)


def test_round_trip_within_half_a_bin():
    tok = ActionTokenizer(vocab_size=32000, n_bins=256)
    a = torch.rand(10_000, 7, generator=torch.Generator().manual_seed(0)) * 2 - 1
    a[0] = -1.0
    a[1] = 1.0
    ids = tok.encode(a)
    assert ids.min() >= 32000 - 256 and ids.max() < 32000
    err = (tok.decode(ids) - a).abs().max().item()
    assert err <= tok.bin_width / 2 + 1e-6


def test_matches_the_published_numpy_convention():
    """token = V - digitize(a, linspace(-1, 1, 256)); decode via centres[clip(V - t - 1)]."""
    v = 768
    tok = ActionTokenizer(vocab_size=v, n_bins=256)
    a = np.random.default_rng(1).uniform(-1.2, 1.2, size=(500,))
    edges = np.linspace(-1, 1, 256)
    centres = (edges[:-1] + edges[1:]) / 2
    ref_ids = v - np.digitize(np.clip(a, -1, 1), edges)
    ids = tok.encode(torch.tensor(a)).numpy()
    np.testing.assert_array_equal(ids, ref_ids)
    ref_dec = centres[np.clip(v - ref_ids - 1, 0, centres.shape[0] - 1)]
    np.testing.assert_allclose(tok.decode(torch.tensor(ids)).numpy(), ref_dec, atol=1e-7)


def test_bins_slice_the_logits_and_reject_other_ids():
    tok = ActionTokenizer(vocab_size=768)
    logits = torch.arange(832.0).expand(2, -1)
    sl = tok.action_logits(logits)
    assert sl.shape == (2, 256) and sl[0, 0] == 512 and sl[0, -1] == 767
    assert torch.equal(tok.bins_to_tokens(torch.tensor([0, 255])), torch.tensor([512, 767]))
    with pytest.raises(ValueError, match="outside the action range"):
        tok.tokens_to_bins(torch.tensor([100]))
    with pytest.raises(ValueError):
        ActionTokenizer(vocab_size=100)


def test_unnormalize_matches_formula_and_mask():
    q01 = [-0.5, -1.0, 0.0, -0.1]
    q99 = [0.5, 2.0, 1.0, 0.3]
    mask = [True, True, True, False]
    norm = ActionNormalizer(q01, q99, mask)
    x = torch.tensor([[-1.0, 0.0, 0.5, 0.7], [1.0, -0.25, -1.0, -0.7]])
    out = norm.unnormalize(x)
    lo, hi = torch.tensor(q01), torch.tensor(q99)
    ref = 0.5 * (x + 1) * (hi - lo) + lo
    assert torch.allclose(out[:, :3], ref[:, :3])
    assert torch.equal(out[:, 3], x[:, 3])  # mask False: passes through
    assert torch.allclose(norm.normalize(out)[:, :3], x[:, :3], atol=1e-6)
    with pytest.raises(ValueError, match="does not match"):
        norm.unnormalize(torch.zeros(2, 7))


def test_gripper_conventions():
    a = torch.tensor([[0.0, 0.8], [0.0, 0.2]])
    libero = GripperConvention.libero().apply(a)
    assert libero[:, 1].tolist() == [-1.0, 1.0]  # 0.8 -> 0.6 -> +1 -> inverted -1
    assert torch.equal(GripperConvention().apply(a), a)
    inv = GripperConvention(invert=True).apply(a)
    assert torch.equal(inv[:, 1], -a[:, 1]) and torch.equal(inv[:, 0], a[:, 0])


def test_select_norm_stats_errors_name_the_fix():
    stats = {"a": {"action": {}}, "b": {"action": {}}}
    with pytest.raises(ValueError, match="unnorm_key"):
        select_norm_stats(stats, None)
    with pytest.raises(ValueError, match="valid keys"):
        select_norm_stats(stats, "c")
    assert select_norm_stats({"a": {"x": 1}}, None) == {"x": 1}
