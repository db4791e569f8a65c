"""The rollout worker can answer requests that arrive together with one forward."""

import torch

from rlinf_embodied.policies.configuration_actor_critic import MLPPolicyConfig
from rlinf_embodied.policies import build_policy
from rlinf_embodied.policies.base import SpaceSpec
from rlinf_embodied.workers.messages import EndOfStream, PolicyReply, PolicyRequest
from rlinf_embodied.workers.rollout_worker import RolloutWorker, _batches


def _request(n, seed, mode="sample", values_only=False, reply="e0s0"):
    g = torch.Generator().manual_seed(seed)
    obs = {"states": torch.randn(n, 5, generator=g), "task_descriptions": [f"t{seed}"] * n}
    return PolicyRequest(obs=obs, seed=seed, reply=reply, mode=mode, values_only=values_only)


def _worker():
    torch.manual_seed(0)
    spec = SpaceSpec(action_low=[-1.0] * 3, action_high=[1.0] * 3, state_dim=5)
    worker = RolloutWorker.__new__(RolloutWorker)  # the answering logic only, no Ray actor
    worker.policy = build_policy(MLPPolicyConfig(hidden_sizes=[32, 32]), spec).eval()
    worker._has_critic = True
    return worker


def test_only_requests_without_sampling_are_joined():
    reqs = [_request(2, 1), _request(2, 2), _request(3, 3, "greedy"), _request(1, 4, "greedy"),
            _request(2, 5, values_only=True), _request(2, 6, values_only=True), _request(2, 7, "greedy")]
    assert [[r.seed for r in b] for b in _batches(reqs)] == [[1], [2], [3, 4], [5, 6], [7]]
    assert _batches([]) == []
    assert PolicyRequest(obs={}, seed=0, reply="x").num_envs == 0 and reqs[2].num_envs == 3
    assert EndOfStream("env[0]") == EndOfStream("env[0]")  # compared by value


def test_joined_forward_matches_one_forward_per_request():
    worker = _worker()
    for kind in ({"mode": "greedy"}, {"values_only": True}):
        group = [_request(n, seed, **kind) for n, seed in ((2, 11), (3, 12), (1, 13))]
        joint = worker._answer_batch(group)
        alone = [worker._answer(r) for r in group]
        assert len(joint) == 3
        for j, a in zip(joint, alone):
            assert isinstance(j, PolicyReply)
            for field in ("actions", "logprobs", "values"):
                x, y = getattr(j, field), getattr(a, field)
                # equal up to float32 rounding: BLAS picks its kernel by batch size, which is
                # why joining is opt-in (RolloutWorker join_forwards)
                assert (x is None and y is None) or torch.allclose(x, y, rtol=1e-5, atol=1e-6), field
            assert (j.forward_inputs or {}).keys() == (a.forward_inputs or {}).keys()
            for k in (a.forward_inputs or {}):
                assert torch.allclose(j.forward_inputs[k].float(), a.forward_inputs[k].float(), rtol=1e-5, atol=1e-6), k
    # a sampling request keeps its own seed: the same request gives the same actions
    r = _request(4, 21)
    assert torch.equal(worker._answer_batch([r])[0].actions, worker._answer(r).actions)
