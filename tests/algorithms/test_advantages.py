"""Advantage estimators against plain Python loop references (exact to 1e-6)."""

import math
import random

import pytest
import torch

from rlinf_embodied.algorithms import (
    advantage_names,
    dynamic_sampling,
    gae,
    get_advantage,
    get_filter,
    get_loss,
    grpo,
    reinforce_pp,
)
from rlinf_embodied.algorithms.advantages import gae_estimator

T, N = 9, 6


def _rand(seed, shape=(T, N)):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64)


def _flags(seed, p, shape=(T, N)):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g, dtype=torch.float64) < p


def gae_reference(rewards, values, term, trunc, final, valid, gamma, lam):
    """Per env, backwards over time, with Python floats."""
    r, v, te, tr = rewards.tolist(), values.tolist(), term.tolist(), trunc.tolist()
    fv = final.tolist() if final is not None else None
    ok = valid.tolist() if valid is not None else [[True] * N for _ in range(T)]
    adv = [[0.0] * N for _ in range(T)]
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            if not ok[t][n]:
                running = 0.0
                continue
            if te[t][n]:
                boot = 0.0
            elif tr[t][n] and fv is not None:
                boot = fv[t][n]
            else:
                boot = v[t + 1][n]
            delta = r[t][n] + gamma * boot - v[t][n]
            cont = 0.0 if (te[t][n] or tr[t][n]) else 1.0
            running = delta + gamma * lam * cont * running
            adv[t][n] = running
    ret = [[adv[t][n] + v[t][n] for n in range(N)] for t in range(T)]
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("use_final", [False, True])
@pytest.mark.parametrize("use_valid", [False, True])
def test_gae_matches_loop(seed, use_final, use_valid):
    rewards, values = _rand(seed), _rand(seed + 100, (T + 1, N))
    term, trunc = _flags(seed + 1, 0.15), _flags(seed + 2, 0.15)
    final = _rand(seed + 3) if use_final else None
    valid = ~_flags(seed + 4, 0.2) if use_valid else None
    adv, ret = gae(
        rewards, values, term, trunc, final_values=final, valid=valid, gamma=0.9, gae_lambda=0.8
    )
    ref_adv, ref_ret = gae_reference(rewards, values, term, trunc, final, valid, 0.9, 0.8)
    torch.testing.assert_close(adv, ref_adv, atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, ref_ret, atol=1e-6, rtol=0)


def test_gae_t_rows_plus_next_values_equals_t_plus_one_rows():
    rewards, values = _rand(7), _rand(8, (T + 1, N))
    term, trunc = _flags(9, 0.2), _flags(10, 0.2)
    a1, r1 = gae(rewards, values, term, trunc, gamma=0.8, gae_lambda=0.9)
    a2, r2 = gae(rewards, values[:T], term, trunc, next_values=values[T], gamma=0.8, gae_lambda=0.9)
    torch.testing.assert_close(a1, a2, atol=0, rtol=0)
    torch.testing.assert_close(r1, r2, atol=0, rtol=0)


def test_gae_truncation_bootstraps_termination_does_not():
    # One env, T = 2: the episode ends after step 0; step 1 belongs to the next episode.
    rewards = torch.tensor([[1.0], [0.0]], dtype=torch.float64)
    values = torch.tensor([[0.5], [3.0], [7.0]], dtype=torch.float64)
    final = torch.tensor([[2.0], [0.0]], dtype=torch.float64)
    no = torch.zeros(2, 1, dtype=torch.bool)
    yes0 = torch.tensor([[True], [False]])
    g = 0.9
    adv_term, _ = gae(rewards, values, yes0, no, final_values=final, gamma=g, gae_lambda=1.0)
    adv_trunc, _ = gae(rewards, values, no, yes0, final_values=final, gamma=g, gae_lambda=1.0)
    adv_next, _ = gae(rewards, values, no, yes0, gamma=g, gae_lambda=1.0)  # NEXT_STEP layout
    assert adv_term[0, 0].item() == pytest.approx(1.0 - 0.5)
    assert adv_trunc[0, 0].item() == pytest.approx(1.0 + g * 2.0 - 0.5)
    assert adv_next[0, 0].item() == pytest.approx(1.0 + g * 3.0 - 0.5)
    # The recursion does not cross the boundary: step 1's advantage is not in step 0's.
    assert adv_term[1, 0].item() == pytest.approx(0.0 + g * 7.0 - 3.0)


def test_gae_invalid_reset_step_is_zero_and_cuts():
    rewards = torch.tensor([[1.0], [5.0], [1.0]], dtype=torch.float64)
    values = torch.tensor([[0.0], [2.0], [0.0], [0.0]], dtype=torch.float64)
    trunc = torch.tensor([[True], [False], [False]])
    valid = torch.tensor([[True], [False], [True]])
    adv, ret = gae(
        rewards, values, torch.zeros_like(trunc), trunc, valid=valid, gamma=1.0, gae_lambda=1.0
    )
    assert adv[:, 0].tolist() == pytest.approx([1.0 + 2.0, 0.0, 1.0])
    assert ret[1, 0].item() == pytest.approx(2.0)


def test_gae_shape_errors_name_the_fix():
    with pytest.raises(ValueError, match="next_values"):
        gae(_rand(0), _rand(1), _flags(2, 0.1))
    with pytest.raises(ValueError, match="values must be"):
        gae(_rand(0), _rand(1, (T + 2, N)), _flags(2, 0.1))


def grpo_reference(scores, group_ids, std_normalize, eps=1e-6):
    out = []
    for i, s in enumerate(scores):
        members = [scores[j] for j in range(len(scores)) if group_ids[j] == group_ids[i]]
        if len(members) == 1:
            out.append(0.0)
            continue
        mean = sum(members) / len(members)
        a = s - mean
        if std_normalize:
            var = sum((m - mean) ** 2 for m in members) / (len(members) - 1)
            a = a / (math.sqrt(var) + eps)
        out.append(a)
    return out


@pytest.mark.parametrize("std_normalize", [True, False])
def test_grpo_contiguous_groups_match_loop(std_normalize):
    scores = _rand(3, (12,))
    adv, ret = grpo(scores, 4, std_normalize=std_normalize)
    ref = grpo_reference(scores.tolist(), [i // 4 for i in range(12)], std_normalize)
    torch.testing.assert_close(adv, torch.tensor(ref, dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, scores)


@pytest.mark.parametrize("std_normalize", [True, False])
def test_grpo_group_ids_with_singletons_match_loop(std_normalize):
    ids = torch.tensor([5, 5, 9, 2, 2, 2, 7, 5])  # groups 9 and 7 have one member
    scores = _rand(4, (8,))
    adv, _ = grpo(scores, ids, std_normalize=std_normalize)
    ref = grpo_reference(scores.tolist(), ids.tolist(), std_normalize)
    torch.testing.assert_close(adv, torch.tensor(ref, dtype=torch.float64), atol=1e-6, rtol=0)
    assert adv[2].item() == 0.0 and adv[6].item() == 0.0


def test_grpo_group_size_one_gives_zero_and_equal_scores_give_zero():
    assert grpo(_rand(0, (5,)), 1)[0].abs().max().item() == 0.0
    assert grpo(torch.ones(6, dtype=torch.float64), 3)[0].abs().max().item() == 0.0


def test_grpo_per_step_rewards_sum_valid_steps_and_broadcast():
    rewards, valid = _rand(5, (T, 8)), ~_flags(6, 0.3, (T, 8))
    adv, ret = grpo(rewards, 4, valid=valid)
    scores = [sum(rewards[t, n].item() for t in range(T) if valid[t, n]) for n in range(8)]
    ref = grpo_reference(scores, [n // 4 for n in range(8)], True)
    for t in range(T):
        for n in range(8):
            expect = ref[n] if valid[t, n] else 0.0
            assert adv[t, n].item() == pytest.approx(expect, abs=1e-6)
            assert ret[t, n].item() == pytest.approx(scores[n], abs=1e-6)


def test_grpo_rejects_indivisible_groups():
    with pytest.raises(ValueError, match="multiple of the group size"):
        grpo(_rand(0, (10,)), 4)


def reinforce_pp_reference(rewards, term, trunc, valid, gamma, eps=1e-8):
    r, te, tr, ok = rewards.tolist(), term.tolist(), trunc.tolist(), valid.tolist()
    ret = [[0.0] * N for _ in range(T)]
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            if not ok[t][n]:
                running = 0.0
                continue
            cont = 0.0 if (te[t][n] or tr[t][n]) else 1.0
            running = r[t][n] + gamma * cont * running
            ret[t][n] = running
    vals = [ret[t][n] for t in range(T) for n in range(N) if ok[t][n]]
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((x - mean) ** 2 for x in vals) / len(vals))
    adv = [
        [(ret[t][n] - mean) / (std + eps) if ok[t][n] else 0.0 for n in range(N)] for t in range(T)
    ]
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


@pytest.mark.parametrize("seed", range(3))
def test_reinforce_pp_matches_loop(seed):
    rewards, term, trunc = _rand(seed), _flags(seed + 1, 0.15), _flags(seed + 2, 0.15)
    valid = ~_flags(seed + 3, 0.2)
    adv, ret = reinforce_pp(rewards, term, trunc, valid=valid, gamma=0.95)
    ref_adv, ref_ret = reinforce_pp_reference(rewards, term, trunc, valid, 0.95)
    torch.testing.assert_close(adv, ref_adv, atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, ref_ret, atol=1e-6, rtol=0)


def test_dynamic_sampling_matches_loop():
    rng = random.Random(0)
    success = torch.tensor([rng.random() < 0.5 for _ in range(24)])
    keep = dynamic_sampling(success, 4, low=0.1, high=0.9)
    for g in range(6):
        rate = success[4 * g : 4 * g + 4].double().mean().item()
        assert keep[4 * g : 4 * g + 4].tolist() == [0.1 <= rate <= 0.9] * 4
    all_same = torch.tensor([True] * 4 + [False] * 4 + [True, False, False, True])
    assert dynamic_sampling(all_same, 4).tolist() == [False] * 8 + [True] * 4
    with pytest.raises(ValueError, match="filter_low"):
        dynamic_sampling(success, 4, low=0.9, high=0.1)


def test_registry_lookup_and_unknown_names():
    assert {"gae", "grpo", "reinforce_pp"} <= set(advantage_names())
    assert get_advantage("gae") is gae_estimator
    assert get_filter("dynamic_sampling") is dynamic_sampling
    with pytest.raises(ValueError, match="Valid advantage names: gae, grpo, reinforce_pp"):
        get_advantage("gea")
    with pytest.raises(ValueError, match="Valid loss names: ppo"):
        get_loss("nope")
