"""Host staging helpers of runtime/device.py on the channel's typed messages (dataclasses)."""

import torch

from rlinf_embodied.runtime import device as dev
from rlinf_embodied.workers.messages import EndOfStream, PolicyReply, PolicyRequest


def _reply() -> PolicyReply:
    return PolicyReply(actions=torch.arange(6.0).view(2, 1, 3), logprobs=torch.ones(2, 1),
                       values=None, forward_inputs={"states": torch.full((2, 4), 2.0)})


def test_map_tensors_reaches_into_dataclass_messages():
    seen = []
    out = dev.map_tensors(_reply(), lambda t: seen.append(tuple(t.shape)) or t * 10)
    assert isinstance(out, PolicyReply)
    assert sorted(seen) == [(2, 1), (2, 1, 3), (2, 4)]
    assert out.actions[1, 0].tolist() == [30.0, 40.0, 50.0]
    assert out.logprobs.sum().item() == 20.0
    assert out.values is None
    assert out.forward_inputs["states"][0, 0].item() == 20.0
    req = PolicyRequest(obs={"states": torch.zeros(3, 2), "task_descriptions": ["a", "b", "c"]},
                        seed=7, reply="e0s0", mode="greedy")
    moved = dev.map_tensors(req, lambda t: t + 1)
    assert (moved.seed, moved.reply, moved.mode) == (7, "e0s0", "greedy")
    assert moved.obs["states"].tolist() == [[1.0, 1.0]] * 3
    assert moved.obs["task_descriptions"] == ["a", "b", "c"]
    assert req.obs["states"].sum().item() == 0.0  # the original is not modified


def test_payload_nbytes_counts_dataclass_fields():
    # 6 + 2 + 8 float32 values, the None field 8 bytes, dict key "states" 6 bytes
    assert dev.payload_nbytes(_reply(), unknown=1 << 30) == 4 * (6 + 2 + 8) + 8 + 6
    assert dev.payload_nbytes(EndOfStream("env[0]"), unknown=1 << 30) == len("env[0]")


def test_cpu_process_stages_nothing():
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # pragma: no cover - GPU hosts
        staged, moved = dev.staged_to_host(dev.map_tensors(_reply(), lambda t: t.cuda()))
        assert moved and staged.actions.device.type == "cpu"
        return
    assert not dev.accelerator_initialized()
    reply = _reply()
    staged, moved = dev.staged_to_host(reply)
    assert not moved and staged is reply  # nothing walked or copied
