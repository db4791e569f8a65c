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


def test_preemptible_nodes_get_no_device_ids_and_placement_errors_name_the_nodes(cluster, monkeypatch):
    """A node advertising the preemptible resource hosts no placed group: it gets no device
    id, start-up says so, and a placement that needs its devices is one error line naming the
    reserved and the preemptible nodes (issue 37)."""
    import rlinf_embodied.runtime.cluster as mod
    from rlinf_embodied.config import ConfigError
    from rlinf_embodied.runners.setup import check_plan_fits
    from rlinf_embodied.runtime import PlacementPlan

    real = mod._alive_nodes()
    spot = {**real[0], "NodeID": "f" * 56, "NodeManagerAddress": "10.0.0.9",
            "Resources": {"CPU": 8.0, "preemptible": 1.0}}
    monkeypatch.setattr(mod, "_alive_nodes", lambda: real + [spot])
    monkeypatch.setattr(mod, "raylet_gone", lambda node, timeout=0.2: False)  # 10.0.0.9 is fake
    c = Cluster(num_cpu_devices=1, preemptible_resource="preemptible")
    assert c.num_devices == 1 and c.preemptible_nodes == [spot]
    text = c.describe()
    assert text.splitlines()[0] == "cluster: 1 devices on 1 reserved node(s), 1 preemptible node(s)"
    assert "preemptible  10.0.0.9 (ffffffff): no placed groups, elastic workers only" in text
    plan = PlacementPlan.from_dict({"groups": {"env": {"devices": "1"}, "rollout": {"devices": "0"},
                                               "actor": {"devices": "0-1"}}})
    with pytest.raises(ConfigError) as err:
        check_plan_fits(c, plan)
    msg = str(err.value)
    assert "\n" not in msg and "outside this cluster's devices 0-0" in msg
    assert f"reserved nodes: {real[0]['NodeManagerAddress']} ({real[0]['NodeID'][:8]}) device 0" in msg
    assert msg.endswith("preemptible nodes, which take no placed group: 10.0.0.9 (ffffffff))")
    # without a preemptible resource every node is reserved
    assert Cluster(num_cpu_devices=1, preemptible_resource="").num_devices == 2


def test_raylet_gone_only_when_its_port_refuses():
    """The driver's node-loss probe: a refused node-manager port is a dead raylet; a listening
    one, or a node entry it cannot read, is not taken as gone."""
    import socket

    from rlinf_embodied.runtime.cluster import raylet_gone

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        node = {"NodeManagerAddress": "127.0.0.1", "NodeManagerPort": s.getsockname()[1]}
        assert not raylet_gone(node)
    assert raylet_gone(node)  # closed now: refused
    assert not raylet_gone({"NodeManagerAddress": "127.0.0.1"})
