"""Direct channel transports: bound keys between worker processes, in one process, over TCP."""

import dataclasses

import numpy as np
import pytest
import ray
import torch

from rlinf_embodied.runtime import Channel, ChannelTimeout, Worker, WorkerGroup
from rlinf_embodied.runtime import channel as channel_mod
from rlinf_embodied.runtime.transports import base, router
from rlinf_embodied.runtime.transports import endpoint as endpoint_mod
from rlinf_embodied.runtime.transports.same_node import SHM_MIN_BYTES
from rlinf_embodied.workers.messages import EndOfStream, PolicyReply, PolicyRequest

from runtime_helpers import wait_until

pytestmark = pytest.mark.timeout(180)


def _items():
    """Messages of every shape the workflow sends: dtypes, views, empty, numpy, shm-sized."""
    return [
        {"obs": {"states": torch.randn(4, 3), "task_descriptions": ["a", "b", "c", "d"]}, "seed": 7},
        torch.arange(12).reshape(3, 4).t(),  # non-contiguous view
        {"b": torch.tensor([True, False]), "bf": torch.randn(5, 3).bfloat16(),
         "e": torch.empty(0, 4), "i8": torch.arange(-3, 3, dtype=torch.int8), "none": None},
        torch.randn(SHM_MIN_BYTES // 4 + 3),  # travels in shared memory on one node
        np.arange(70_000, dtype=np.float64),
        ("tuple", 3, 4.5),
        # the workflow's typed messages (workers/messages.py): tensors, dicts of tensors and
        # lists, a non-contiguous view, a shared-memory-sized tensor, a 0-d tensor, None fields
        PolicyRequest({"states": torch.randn(4, 3), "task_descriptions": ["a", "b", "c", "d"],
                       "rgb": torch.randint(0, 255, (4, 2, 2, 3), dtype=torch.uint8),
                       "big": torch.randn(SHM_MIN_BYTES // 4 + 5), "t": torch.tensor(2.5)},
                      seed=11, reply="e0s1", mode="greedy"),
        PolicyReply(torch.arange(24.0).reshape(4, 6).t(), None, torch.zeros(0), {"h": torch.ones(2, 3)}, ("states",)),
        PolicyReply(torch.randn(2, 3).bfloat16()),  # no numpy dtype: raw bytes, dtype code
        EndOfStream("env[1]"),
    ]


def _same(a, b):
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("caller_reads", [False, True], ids=["reader-thread", "caller-reads"])
@pytest.mark.parametrize("kind", [base.SAME_NODE, base.REMOTE])
def test_framing_round_trips_every_payload_in_order(kind, caller_reads):
    ep = endpoint_mod.Endpoint("node-a", "127.0.0.1")
    ep.expect("inst", 0, caller_reads)
    sender = router.Sender()
    items = _items()
    for i, item in enumerate(items):
        assert sender.send("chan", "inst", ep.address, kind, f"k{i % 2}", item, None)
    sent = {"k0": items[0::2], "k1": items[1::2]}
    got = {k: [ep.take("inst", k, 30)[1] for _ in sent[k]] for k in sent}
    assert all(_same(a, b) for k in sent for a, b in zip(sent[k], got[k]))
    assert ep.take("inst", "k0", 0.05) == (False, None) and ep.held("inst") == 0
    sender.forget("inst")


def test_caller_reads_serves_every_waiting_thread_and_counts_arrivals():
    """With caller_reads the waiting thread reads the sockets: an item for another thread's key
    reaches that thread, what arrived counts as held and is taken together, and a channel's
    keys cannot be bound both ways in one process."""
    import threading

    ep = endpoint_mod.Endpoint("node-a", "127.0.0.1")
    ep.expect("inst", 0, caller_reads=True)
    sender = router.Sender()
    got = {}
    waiters = [threading.Thread(target=lambda k=k: got.setdefault(k, ep.take("inst", k, 60)))
               for k in ("a", "b")]
    for w in waiters:
        w.start()
    for key, item in (("b", torch.ones(2)), ("a", "first")):
        assert sender.send("chan", "inst", ep.address, base.SAME_NODE, key, item, None)
    for w in waiters:
        w.join(60)
    assert got["a"] == (True, "first") and torch.equal(got["b"][1], torch.ones(2))
    for i in range(3):
        sender.send("chan", "inst", ep.address, base.SAME_NODE, "a", i, None)
    wait_until(lambda: ep.held("inst") == 3, what="items to arrive")
    assert ep.take_many("inst", "a", 10, 60) == [0, 1, 2]
    with pytest.raises(ValueError, match="already received here with caller_reads=True"):
        ep.expect("inst", 0, caller_reads=False)
    sender.forget("inst")


def test_transport_follows_placement():
    here = base.Address("node-a", 12345, "tok", "u", "127.0.0.1", 1)
    assert router.choose("node-a", here) == base.SAME_NODE
    assert router.choose("node-b", here) == base.REMOTE
    assert router.choose("node-a", here, force=base.REMOTE) == base.REMOTE
    ep = endpoint_mod.Endpoint("node-a", "127.0.0.1")
    endpoint_mod._endpoint.append(ep)
    try:
        assert router.choose("node-a", ep.address) == base.LOCAL
    finally:
        endpoint_mod._endpoint.remove(ep)


class Peer(Worker):
    def __init__(self, name):
        self.ch = Channel.connect(name)
        self.ch.bind(f"to{self.rank}")

    def echo(self, n, remote=False):
        channel_mod.transport_override[0] = base.REMOTE if remote else None
        for _ in range(n):
            item = self.ch.get(key=f"to{self.rank}", timeout=60)
            self.ch.put(item, key="back")
        return n

    def batch(self, n_first):
        return [len(self.ch.get_batch(key=f"to{self.rank}", timeout=60)) for _ in range(n_first)]

    def held(self):
        return endpoint_mod.endpoint().held(self.ch._instance)

    def pid(self):
        import os

        return os.getpid()


@pytest.fixture
def bound(cluster):
    channel = Channel.create("direct")
    channel.bind("back")  # the driver consumes replies directly too
    group = WorkerGroup(cluster, Peer, "peer", devices="0", init_args=("direct",))
    yield channel, group
    group.shutdown()
    channel.delete()


@pytest.mark.parametrize("remote", [False, True], ids=["unix+shm", "tcp"])
def test_bound_keys_skip_the_queue_between_processes(bound, remote):
    channel, group = bound
    items = _items()
    handle = group.echo(len(items), remote)
    channel_mod.transport_override[0] = base.REMOTE if remote else None
    try:
        for item in items:
            channel.put(item, key="to0")
    finally:
        channel_mod.transport_override[0] = None
    back = [channel.get(key="back", timeout=60) for _ in items]
    assert handle.wait(timeout=60) == [len(items)]
    assert all(_same(a, b) for a, b in zip(items, back))
    assert ray.get(channel._actor.qsize.remote()) == 0  # nothing went through the queue actor


def test_arrivals_are_taken_together_and_late_bind_is_refused(bound):
    channel, group = bound
    for i in range(3):
        channel.put(i, key="to0")
    wait_until(lambda: group.on([0], concurrent=True).held().wait(60) == [3], what="items to arrive")
    assert group.batch(1).wait(timeout=60) == [[3]]  # all three had arrived: one batch
    channel.put("queued", key="unbound")
    with pytest.raises(ValueError, match="key 'unbound' already carries items through the queue"):
        channel.bind("unbound")
    assert channel.get(key="unbound", timeout=30) == "queued"


def test_same_process_hands_the_object_over(cluster):
    channel = Channel.create("in-process")
    channel.bind("k")
    item = {"t": torch.ones(3)}
    channel.put(item, key="k")
    assert channel.qsize() == 1
    assert channel.get(key="k") is item
    with pytest.raises(ChannelTimeout, match="No item arrived on channel 'in-process' within 0.05 s"):
        channel.get(key="k", timeout=0.05)
    channel.delete()


def test_lost_consumer_error_names_channel_and_key(bound):
    channel, group = bound
    pid = group.pid().wait(60)[0]
    channel.put(1, key="to0")  # connected
    group.shutdown()

    def refused():
        try:
            channel.put(2, key="to0")
        except RuntimeError as err:
            assert f"Channel 'direct': the consumer bound to key 'to0' (process {pid})" in str(err)
            return True
        return False

    wait_until(refused, what="the dead consumer's socket to close")
