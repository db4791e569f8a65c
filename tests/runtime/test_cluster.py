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


def test_embedded_ray_runs_workers_at_normal_priority(tmp_path):
    """Ray's default worker niceness is 15; an embedded cluster starts them at 0 (a fresh
    process: the test session's Ray is already up)."""
    import os
    import subprocess
    import sys

    script = (
        "import os, ray\n"
        "from rlinf_embodied.runtime import Cluster\n"
        "c = Cluster(num_cpus=1, num_cpu_devices=1, log_to_driver=False)\n"
        "print('nice', ray.get(ray.remote(lambda: os.nice(0)).remote()))\n"
        "c.shutdown()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_worker_niceness"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=240, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"nice {os.nice(0)}" in out.stdout  # the driver's own niceness, not Ray's 15
