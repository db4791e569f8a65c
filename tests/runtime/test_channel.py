import random

import pytest
import ray
import torch

from rlinf_embodied.runtime import Channel, ChannelTimeout, Worker, WorkerGroup

from runtime_helpers import wait_until

pytestmark = pytest.mark.timeout(180)


class Peer(Worker):
    def produce(self, name, keys, n):
        channel = Channel.connect(name)
        for i in range(n):
            for key in keys:
                channel.put({"i": i, "key": key, "x": torch.full((4,), i)}, key=key)

    def consume_balanced(self, channel, idle_timeout):
        channel.register()
        received = []
        while True:
            try:
                received.append(channel.get(timeout=idle_timeout))
            except ChannelTimeout:
                return received

    def take_with_prefetch(self, channel, key, n):
        reader = channel.with_prefetch()
        return [reader.get(key=key, timeout=30) for _ in range(n)]

    def echo_big(self, channel):
        item = channel.get(key="in")
        channel.put(item["t"] * 2, key="out")


@pytest.fixture(scope="module")
def peers(cluster):
    g = WorkerGroup(cluster, Peer, "peer", devices="0-1")
    yield g
    g.shutdown()


def test_order_per_key(peers):
    channel = Channel.create("ordered")
    peers.on([0]).produce("ordered", ["a", "b"], 30).wait(timeout=60)
    assert channel.qsize() == 60
    got_b = [channel.get(key="b", timeout=30) for _ in range(30)]
    got_a = [channel.get(key="a", timeout=30) for _ in range(30)]
    assert [x["i"] for x in got_b] == list(range(30)) and {x["key"] for x in got_b} == {"b"}
    assert [x["i"] for x in got_a] == list(range(30))
    assert torch.equal(got_a[7]["x"], torch.full((4,), 7))
    with pytest.raises(ChannelTimeout, match="No item arrived on channel 'ordered' within 0.2 s"):
        channel.get(key="a", timeout=0.2)


def test_weighted_balancing_across_two_consumers(peers):
    channel = Channel.create("balanced")
    consumers = peers.consume_balanced(channel, idle_timeout=2.0)
    wait_until(lambda: len(channel.loads()) == 2, what="both consumers to register")
    rng = random.Random(0)
    weights = [rng.choice([1, 2, 8, 16]) for _ in range(150)]
    for i, w in enumerate(weights):
        channel.put((i, w), weight=w)
    received = consumers.wait(timeout=120)
    assert sorted(i for r in received for i, _ in r) == list(range(150))  # each item once
    shares = [sum(w for _, w in r) / sum(weights) for r in received]
    assert all(abs(s - 0.5) <= 0.05 for s in shares), shares  # within 10% of an even split
    assert sorted(channel.loads().values()) == sorted(sum(w for _, w in r) for r in received)


def test_back_pressure_blocks_and_resumes(cluster):
    channel = Channel.create("bounded", maxsize=2)
    channel.put(0)
    channel.put(1)
    blocked = channel.put_async(2)
    ready, _ = ray.wait([blocked], timeout=1.0)
    assert not ready and channel.qsize() == 2
    with pytest.raises(ChannelTimeout, match="stayed full"):
        channel.put(3, timeout=0.2)
    assert channel.get(timeout=30) == 0
    assert ray.get(blocked, timeout=30) is True
    assert [channel.get(timeout=30), channel.get(timeout=30)] == [1, 2]


def test_large_tensors_pass_by_reference_through_workers(peers):
    channel = Channel.create("big", device="cpu")
    big = torch.arange(1 << 18, dtype=torch.float32)  # 1 MiB
    assert not channel._pack({"t": big}, 1.0).inline  # travels through the object store
    assert channel._pack({"t": big[:16]}, 1.0).inline
    handle = peers.on([1]).echo_big(channel)  # a pickled handle works inside workers
    channel.put({"t": big}, key="in")
    assert torch.equal(channel.get(key="out", timeout=60), big * 2)
    handle.wait(timeout=60)


def test_names_are_unique_and_connectable(cluster):
    Channel.create("named")
    with pytest.raises(ValueError, match="Channel 'named' already exists; use Channel.connect"):
        Channel.create("named")
    with pytest.raises(ValueError, match="No channel named 'absent'"):
        Channel.connect("absent")
    assert Channel.connect("named").maxsize == 0


def test_prefetch_never_strands_items(peers):
    channel = Channel.create("read-ahead")
    for i in range(5):
        channel.put(i, key="k")
    # The worker reads 2 with read-ahead; the third request is withdrawn when the method ends
    # and the item it took goes back to the head of the queue.
    assert peers.on([0]).take_with_prefetch(channel, "k", 2).wait(timeout=60) == [[0, 1]]
    assert [channel.get(key="k", timeout=30) for _ in range(3)] == [2, 3, 4]
    # Read-ahead on an empty key is cancelled too: a later item is not swallowed.
    assert peers.on([1]).take_with_prefetch(channel, "k2", 0).wait(timeout=60) == [[]]
    channel.put(1, key="k2")
    assert peers.on([1]).take_with_prefetch(channel, "k2", 1).wait(timeout=60) == [[1]]
    channel.put(2, key="k2")
    assert channel.get(key="k2", timeout=30) == 2
