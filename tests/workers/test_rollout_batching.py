"""The rollout worker can answer requests that arrive together with one forward."""

import pytest
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
    # a policy whose greedy mode draws noise (π0, policy.greedy_noise=fresh): greedy alone too
    assert [[r.seed for r in b] for b in _batches(reqs, greedy_draws=True)] == [[1], [2], [3], [4], [5, 6], [7]]
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


def test_replies_leave_out_the_observation_and_the_env_puts_it_back():
    from rlinf_embodied.runtime.transports.codec import decode, encode
    from rlinf_embodied.workers.messages import restore_echoes

    worker = _worker()
    req = _request(3, 21)
    reply = worker._answer(req)
    assert reply.echoed == ("states",) and set(reply.forward_inputs) == {"action_samples"}
    # what crosses the channel: no states tensor among the out-of-band buffers
    _, buffers = encode(("e0s0", reply))
    assert sorted(b.nbytes for b in buffers) == sorted(
        t.numel() * t.element_size() for t in (reply.actions, reply.logprobs, reply.values,
                                               reply.forward_inputs["action_samples"]))
    meta, buffers = encode(("e0s0", reply))
    back = restore_echoes(decode(meta, [bytearray(b) for b in buffers])[1], req.obs)
    assert back.echoed == () and back.forward_inputs["states"] is req.obs["states"]
    # the restored inputs recompute the rollout's log-probs exactly
    torch.testing.assert_close(worker.policy.evaluate(back.forward_inputs).logprobs, reply.logprobs,
                               rtol=0, atol=0)
    # joined greedy requests: every part echoes its own request's observation
    group = [_request(n, seed, "greedy") for n, seed in ((2, 31), (1, 32))]
    for r, part in zip(group, worker._answer_batch(group)):
        assert part.echoed == ("states",)
        assert torch.equal(restore_echoes(part, r.obs).forward_inputs["states"], r.obs["states"])
    with pytest.raises(KeyError, match="did not send"):
        restore_echoes(reply, {"pixels": torch.zeros(3, 1)})


def test_row_seeds_answer_each_env_as_a_batch_of_one_and_are_never_joined():
    """A batch-invariant evaluation request (row_seeds): each env's answer is that of its row
    alone under its own seed, whatever the batch and the request's seed."""
    import dataclasses

    worker = _worker()
    seeds = (5, 6, 7, 8)
    for mode in ("greedy", "sample"):
        req = dataclasses.replace(_request(4, 41, mode), row_seeds=seeds)
        reply = worker._answer(req)
        other = worker._answer(dataclasses.replace(req, seed=99))  # the request seed is unused
        assert torch.equal(reply.actions, other.actions)
        for i in range(4):
            alone = _request(1, seeds[i], mode)
            alone = dataclasses.replace(alone, obs={k: v[i:i + 1] for k, v in req.obs.items()})
            one = worker._answer(alone)  # seeded with its own seed, batch of one
            assert torch.equal(reply.actions[i:i + 1], one.actions), (mode, i)
            assert torch.equal(reply.logprobs[i:i + 1], one.logprobs), (mode, i)
            assert torch.equal(reply.values[i:i + 1], one.values), (mode, i)
    greedy = [dataclasses.replace(_request(2, s, "greedy"), row_seeds=(1, 2)) for s in (51, 52)]
    assert [[r.seed for r in b] for b in _batches(greedy)] == [[51], [52]]
