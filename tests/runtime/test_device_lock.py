import pytest

from rlinf_embodied.runtime import Channel, DeviceLock, Worker, WorkerGroup

from runtime_helpers import wait_until

pytestmark = pytest.mark.timeout(180)


class Phase(Worker):
    """Records its own protocol steps and checks it holds the device while loaded."""

    def __init__(self):
        self.steps = []

    def _holds(self):
        if not self.context_switch:
            return True
        return DeviceLock.connect().holder(self.devices[0].global_id) == self.name

    def onload(self):
        assert self._holds()
        self.steps.append("onload")

    def offload(self):
        assert self._holds()
        self.steps.append("offload")

    def produce_when_waited(self, channel, waiters):
        lock = DeviceLock.connect()
        with self.device_lock():
            self.steps.append("work")
            while lock.num_waiters(0) < waiters:
                pass  # hold the device until both rivals queue up
            channel.put("data")
        return self.steps

    def work(self, consumes):
        with self.device_lock(consumes=consumes):
            self.steps.append("work")
        return self.steps


def test_dependency_aware_priority_trace(cluster):
    groups = {n: WorkerGroup(cluster, Phase, n, devices="0", context_switch=True)
              for n in ("parent", "bystander", "child")}
    try:
        lock = DeviceLock.connect()
        lock.clear_trace()
        x = Channel.create("x")
        parent = groups["parent"].produce_when_waited(x, 2)
        wait_until(lambda: lock.holder(0) == "parent[0]", what="the parent to hold device 0")
        bystander = groups["bystander"].work(["y"])  # arrives first, consumes something else
        wait_until(lambda: lock.num_waiters(0) == 1, what="the bystander to queue")
        child = groups["child"].work(["x"])  # arrives second, consumes what the parent puts
        for handle in (parent, bystander, child):
            assert handle.wait(timeout=60) == [["onload", "work", "offload"]]
        assert [(w, e) for _, d, w, e in lock.trace() if d == 0] == [
            ("parent[0]", "request"), ("parent[0]", "acquire"),
            ("bystander[0]", "request"), ("child[0]", "request"),
            ("parent[0]", "release"),
            ("child[0]", "acquire"), ("child[0]", "release"),  # the consumer of x goes first
            ("bystander[0]", "acquire"), ("bystander[0]", "release"),
        ]
        assert x.get(timeout=30) == "data"
    finally:
        for g in groups.values():
            g.shutdown()


def test_without_context_switch_onload_once_and_no_lock(cluster):
    g = WorkerGroup(cluster, Phase, "solo", devices="1")
    try:
        lock = DeviceLock.connect()
        lock.clear_trace()
        assert g.work([]).wait(timeout=60) == [["onload", "work"]]
        assert g.work([]).wait(timeout=60) == [["onload", "work", "work"]]
        assert lock.trace() == []
    finally:
        g.shutdown()


def test_resident_context_switch_takes_turns_without_offloading(cluster):
    """placement ``offload: false``: the lock still serialises the groups, state stays put."""
    groups = {n: WorkerGroup(cluster, Phase, n, devices="0", context_switch=True, offload=False)
              for n in ("first", "second")}
    try:
        lock = DeviceLock.connect()
        lock.clear_trace()
        for _ in range(2):
            for g in groups.values():
                g.work([]).wait(timeout=60)
        assert groups["first"].work([]).wait(timeout=60) == [["onload", "work", "work", "work"]]
        events = [(w, e) for _, d, w, e in lock.trace() if d == 0 and e in ("acquire", "release")]
        assert events[:4] == [("first[0]", "acquire"), ("first[0]", "release"),
                              ("second[0]", "acquire"), ("second[0]", "release")]
    finally:
        for g in groups.values():
            g.shutdown()
