"""Profiler: synthetic components, cache round trip, and a real Ray worker group."""

import json
import time

import pytest

from rlinf_embodied.scheduler.profiler import (
    PROFILE_FILE,
    FunctionComponent,
    WorkerGroupComponent,
    load_profile,
    profile_component,
    profile_workflow,
    save_profile,
)


def _sleep_env(batch):
    time.sleep(0.002 + 0.001 * batch)
    return 1000.0 * batch  # bytes


def test_sleep_component_is_linear_in_batch():
    prof = profile_component(FunctionComponent("env", _sleep_env, static_bytes=10.0), [1, 16, 64], repeats=3)
    assert prof.batch_sizes == (1, 16, 64)
    # a sleep never ends early; a loaded machine may make it late (loose upper bound)
    assert 0.066 <= prof.time(64) < 0.066 + 0.05
    assert prof.time_s[0] < prof.time_s[2]
    assert prof.peak_bytes == (1000.0, 16000.0, 64000.0) and prof.static_bytes == 10.0


def test_matmul_component_and_cache_round_trip(tmp_path):
    import torch

    w = torch.randn(64, 64)

    def forward(batch):
        with torch.no_grad():
            (torch.randn(batch, 64) @ w).sum()

    moved = []
    comp = FunctionComponent("rollout", forward, onload=lambda: moved.append("on"),
                             offload=lambda: moved.append("off"))
    wf = profile_workflow([comp, FunctionComponent("env", _sleep_env)],
                          {"rollout": [1, 32], "env": [1, 8]}, device_memory_bytes=1e9,
                          weight_sync=lambda: None, repeats=1)
    assert moved.count("on") == 3 and wf.source == "measured"
    save_profile(tmp_path, "k1", wf)
    save_profile(tmp_path, "k2", wf)  # other keys are kept
    assert set(json.loads((tmp_path / PROFILE_FILE).read_text())) == {"k1", "k2"}
    back = load_profile(tmp_path, "k1")
    assert back.components == wf.components and back.source.startswith("cached (measured")
    assert load_profile(tmp_path, "nope") is None
    assert not list(tmp_path.glob("*.tmp"))


def test_corrupt_cache_names_the_fix(tmp_path):
    (tmp_path / PROFILE_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="delete it to re-profile"):
        load_profile(tmp_path, "k")


def test_worker_group_component_on_real_ray(ray_session):
    from rlinf_embodied.runtime.cluster import Cluster
    from rlinf_embodied.runtime.worker import Worker, WorkerGroup

    class SleepEnv(Worker):
        def step(self, batch):
            time.sleep(0.01 + 0.002 * batch)
            return 100.0 * batch

    cluster = Cluster(num_cpu_devices=1)  # the session's Ray
    group = WorkerGroup(cluster, SleepEnv, "env", devices="0")
    try:
        prof = profile_component(WorkerGroupComponent("env", group, "step"), [1, 200], repeats=2)
        # sleeps of 12 ms and 410 ms, timed inside the worker: a loaded machine only adds (a
        # 12 ms sleep measured 143 ms beside a training run), so the gap is wide
        assert 0.012 <= prof.time_s[0] < 0.4 and 0.41 <= prof.time_s[1] < 2.0
        assert prof.time_s[1] > prof.time_s[0]
        assert prof.peak_bytes == (100.0, 20000.0)
    finally:
        group.shutdown()


def test_profile_messages_measures_a_real_channel_round_trip(ray_session):
    """Two probe worker processes exchange items through real runtime channels; the profile
    prices the job's messages, and the channels and workers are gone afterwards."""
    import ray

    from rlinf_embodied.runtime.cluster import Cluster
    from rlinf_embodied.scheduler.cost_model import CostModel, Cycle, Leaf, Temporal
    from rlinf_embodied.scheduler.graph import embodied_graph
    from rlinf_embodied.scheduler.profiler import message_payload, profile_messages
    from rlinf_embodied.scheduler.profiles import WorkflowProfile, affine_profile

    assert message_payload(4096)["obs"]["t0"].numel() == 1024
    assert [t.numel() for t in message_payload(4096, tensors=4)["obs"].values()] == [256] * 4
    msgs = profile_messages(Cluster(num_cpu_devices=1), [4096, 256 * 1024], repeats=4, warmup=1)
    assert msgs.payload_bytes == (4096.0, 262144.0)
    assert set(msgs.hop_s) == {"same_node", "same_process"} == set(msgs.per_tensor_s)
    assert all(0 < t < 60 for ts in msgs.hop_s.values() for t in ts)
    assert all(0 <= t < 60 for t in msgs.per_tensor_s.values())
    assert msgs.source.startswith("measured: runtime Channel round trips")
    live = [a for a in ray.util.list_named_actors() if "probe-" in a]
    assert not live, live  # both probe channels deleted

    # the measured cost enters the prediction once per message sent
    cycle, actor = embodied_graph(16, 5, 1, obs_bytes=256, action_bytes=324, sample_bytes=344,
                                  obs_tensors=1, action_tensors=4, sample_tensors=10).stages()
    comps = {n: affine_profile(n, 1e-3, 1e-4) for n in ("env", "rollout", "actor")}
    plan = Temporal(Cycle(cycle, 1, False, 1), Leaf(actor, 1, 80), False)
    free = CostModel(WorkflowProfile(comps, 1e12)).iteration_time(plan)
    priced = CostModel(WorkflowProfile(comps, 1e12, messages=msgs)).iteration_time(plan)
    per_round = msgs.time(16 * 256, "same_node") + msgs.time(16 * 324, "same_node", tensors=4)
    handoff = msgs.time(16 * 5 * 344, "same_node", tensors=10)
    assert msgs.time(16 * 324, "same_node", tensors=4) == pytest.approx(
        msgs.time(16 * 324, "same_node") + 3 * msgs.per_tensor_s["same_node"])
    assert priced - free == pytest.approx(5 * per_round + handoff)
