import os
import signal
import time

import pytest

from rlinf_embodied.runtime import (
    PerRank,
    RemoteError,
    Worker,
    WorkerDiedError,
    WorkerGroup,
    wait_all,
)
from rlinf_embodied.omp import OMP_WAIT_VARS, omp_wait_env

pytestmark = pytest.mark.timeout(180)


class Echo(Worker):
    def __init__(self, scale):
        self.scale = scale
        self.placed_at = [d.global_id for d in self.devices]  # context is ready in __init__

    def info(self, x):
        return self.rank, self.world_size, self.placed_at, x * self.scale

    def fail(self):
        return self._helper_that_fails()

    def _helper_that_fails(self):
        raise ValueError("the remote cause")

    def fail_in_a_library(self):
        import numpy as np

        return np.linalg.inv(np.zeros((2, 2)))  # numpy.linalg.LinAlgError: Singular matrix

    def pid(self):
        return os.getpid()

    def start_environ(self, names):
        """These variables as the process was started with them (what libgomp read)."""
        with open("/proc/self/environ", "rb") as f:
            entries = dict(e.decode().split("=", 1) for e in f.read().split(b"\0") if b"=" in e)
        return {k: entries.get(k) for k in names}

    def sleep(self, seconds):
        time.sleep(seconds)
        return self.rank

    def all_reduce(self):
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t)
        return t.item(), dist.get_backend()


class BadInit(Worker):
    def __init__(self):
        raise RuntimeError("no model here")


@pytest.fixture(scope="module")
def group(cluster):
    g = WorkerGroup(cluster, Echo, "echo", devices="0-1", procs_per_device=2, init_args=(10,))
    yield g
    g.shutdown()


def test_fan_out_fan_in(group):
    handle = group.info(3)
    assert handle.wait(timeout=60) == [
        (0, 4, [0], 30), (1, 4, [0], 30), (2, 4, [1], 30), (3, 4, [1], 30)
    ]
    timing = handle.timing
    assert len(timing.per_rank) == 4 and 0 <= timing.mean <= timing.max


def test_subset_of_ranks_with_per_rank_args(group):
    assert group.on([3, 1]).info(PerRank([1, 2])).wait(timeout=60) == [(3, 4, [1], 10), (1, 4, [0], 20)]
    with pytest.raises(ValueError, match="one value per called rank"):
        group.info(PerRank([1]))
    with pytest.raises(ValueError, match="ranks 0-3; got \\[7\\]"):
        group.on([7])
    with pytest.raises(AttributeError, match="has no method 'nope'; define it on Echo"):
        group.nope()


def test_exception_names_group_rank_method_with_remote_traceback(group):
    with pytest.raises(RemoteError) as info:
        group.on([2]).fail().wait(timeout=60)
    err = info.value
    assert (err.group, err.rank, err.method) == ("echo", 2, "fail")
    assert "echo[rank 2].fail() raised ValueError: the remote cause" in str(err)
    assert "_helper_that_fails" in err.remote_traceback  # the remote frames, not ours


def test_a_library_error_is_reported_once_naming_the_worker(group):
    """What ``train`` prints for a worker's error (``error: `` + short_error) names the worker
    and the error once: the class as the traceback's last line names it, with its module (it
    was 'raised LinAlgError: Singular matrix' and then 'numpy.linalg.LinAlgError: Singular
    matrix' on a second line, the traceback's last line, which differed only in the module)."""
    from rlinf_embodied.runners.errors import short_error

    with pytest.raises(RemoteError) as info:
        group.on([1]).fail_in_a_library().wait(timeout=60)
    line = short_error(info.value)
    assert line.count("Singular matrix") == 1, line
    assert line == "echo[rank 1].fail_in_a_library() raised numpy.linalg.LinAlgError: Singular matrix"
    # the exception keeps the remote traceback, which ends in the same words
    assert info.value.remote_traceback.endswith("numpy.linalg.LinAlgError: Singular matrix\n")


def test_failure_is_raised_again_and_seen_by_wait_all(group):
    failing = group.on([1]).fail()
    for _ in range(2):  # a failed handle keeps raising, it never returns partial results
        with pytest.raises(RemoteError, match=r"echo\[rank 1\].fail\(\)"):
            failing.wait(timeout=60)
    slow = group.on([0], concurrent=True).sleep(6)
    with pytest.raises(RemoteError, match=r"echo\[rank 2\].fail\(\)"):
        wait_all(slow, group.on([2]).fail(), timeout=60)
    assert not slow.done()  # raised at once, not after the sleeping call
    assert slow.wait(timeout=60) == [0]


def test_workers_start_with_a_passive_openmp_wait_policy(group):
    if any(v in os.environ for v in OMP_WAIT_VARS):
        pytest.skip("this environment sets its own OpenMP wait policy (forwarded as is)")
    assert group.start_environ(OMP_WAIT_VARS).wait(timeout=60) == [
        {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None}] * 4


def test_omp_wait_env_forwards_the_launching_environments_choice(monkeypatch):
    for v in OMP_WAIT_VARS:
        monkeypatch.delenv(v, raising=False)
    assert omp_wait_env() == {"OMP_WAIT_POLICY": "PASSIVE"}
    monkeypatch.setenv("GOMP_SPINCOUNT", "10k")
    assert omp_wait_env() == {"GOMP_SPINCOUNT": "10k"}
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert omp_wait_env() == {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "10k"}


def test_init_failure_is_reported(cluster):
    with pytest.raises(RemoteError, match=r"bad\[rank 0\].__init__\(\) raised RuntimeError: no model here"):
        WorkerGroup(cluster, BadInit, "bad", devices="0")


def test_concurrent_lane_overlaps_running_method(group):
    slow = group.on([0]).sleep(3)
    assert group.on([0], concurrent=True).info(1).wait(timeout=2.5)[0][0] == 0
    assert slow.wait(timeout=60) == [0]


def test_killed_worker_raises_while_its_call_runs(cluster):
    g = WorkerGroup(cluster, Echo, "doomed", devices="all", init_args=(1,))
    try:
        pids = g.pid().wait(timeout=60)
        running = g.sleep(120)
        os.kill(pids[1], signal.SIGKILL)
        # No clock: the wait's own timeout (100 s) ends before the surviving rank's 120 s sleep,
        # so a WorkerDiedError (not a timeout) means the death was detected while the call ran,
        # and the message names the dead rank and its method.
        with pytest.raises(WorkerDiedError, match=r"doomed\[rank 1\] died while running sleep\(\)"):
            running.wait(timeout=100)
    finally:
        g.shutdown()


def test_gloo_process_group_all_reduce(cluster):
    g = WorkerGroup(cluster, Echo, "dist", devices="0-1", init_args=(1,))
    try:
        assert g.init_process_group(timeout_s=120) == "gloo"
        assert g.all_reduce().wait(timeout=120) == [(3.0, "gloo"), (3.0, "gloo")]
    finally:
        g.shutdown()
