import pytest

from rlinf_embodied.runtime import Cluster
from rlinf_embodied.runtime.cluster import DEFAULT_NUM_CPU_DEVICES
from rlinf_embodied.runtime.device import collective_backend, torch_device, visibility_env


def test_cpu_node_gets_device_slots(cluster):
    assert cluster.num_devices == DEFAULT_NUM_CPU_DEVICES
    assert [d.global_id for d in cluster.devices] == list(range(cluster.num_devices))
    assert {d.kind for d in cluster.devices} == {"cpu"}
    assert [d.local_index for d in cluster.devices] == list(range(cluster.num_devices))
    assert "cpu devices [0, 1, 2]" in cluster.describe()
    with pytest.raises(IndexError, match="outside this cluster's devices 0-2"):
        cluster.device(3)


def test_attaching_twice_keeps_ray_running(cluster):
    other = Cluster(num_cpu_devices=1)
    assert not other.owns_ray and other.num_devices == 1
    other.shutdown()
    assert Cluster().num_devices == DEFAULT_NUM_CPU_DEVICES  # still up


def test_device_helpers_are_cpu_safe(cluster):
    cpu = cluster.devices[:2]
    assert collective_backend(cpu) == "gloo"
    assert torch_device(cpu) == "cpu" and visibility_env(cpu) == {}
