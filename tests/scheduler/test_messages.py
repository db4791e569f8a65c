"""The cost model's channel-message term: measured message costs, their effect on plans."""

import dataclasses
import json

import pytest

from rlinf_embodied.scheduler.cost_model import CostModel, Cycle, Leaf, Spatial, Temporal
from rlinf_embodied.scheduler.graph import embodied_graph
from rlinf_embodied.scheduler.planner import granularity, search
from rlinf_embodied.scheduler.profiles import (
    GiB,
    MessageProfile,
    WorkflowProfile,
    affine_profile,
)
from rlinf_embodied.scheduler.simulate import simulate

T, N = 10, 64


def _graph():
    return embodied_graph(N, T, 1, obs_bytes=256, action_bytes=600, sample_bytes=800)


def _with_hop(prof: WorkflowProfile, hop_s: float) -> WorkflowProfile:
    return dataclasses.replace(prof, messages=MessageProfile((0.0,), {"same_node": (hop_s,)}))


def _pipelining_profile() -> WorkflowProfile:
    """env and rollout each fill most of a device (they cannot share one) and cost the same
    per env, so splitting them and pipelining micro-batches pays - unless messages are dear."""
    comps = {
        "env": affine_profile("env", 0.0, 1e-3, 50 * GiB),
        "rollout": affine_profile("rollout", 0.0, 1e-3, 50 * GiB),
        "actor": affine_profile("actor", 1e-3, 1e-5, 20 * GiB, shard_static=True),
    }
    return WorkflowProfile(comps, device_memory_bytes=80 * GiB)


def test_message_profile_interpolates_and_falls_back():
    m = MessageProfile((100.0, 1100.0), {"same_node": (1e-3, 2e-3), "same_process": (1e-4, 1e-4)})
    assert m.time(0, "same_node") == 1e-3  # never below the fixed part
    assert m.time(600, "same_node") == pytest.approx(1.5e-3)
    assert m.time(2100, "same_node") == pytest.approx(3e-3)  # last slope beyond
    assert m.time(600, "cross_node") == pytest.approx(1.5e-3)  # not measured: same_node
    per = MessageProfile((100.0,), {"same_node": (1e-3,)}, per_tensor_s={"same_node": 2e-4})
    assert per.time(100, "same_node", tensors=4) == pytest.approx(1e-3 + 3 * 2e-4)
    prof = WorkflowProfile({}, 1.0, link_bandwidth_Bps=1e6, link_latency_s=0.0, messages=m,
                           devices_per_node=8)
    assert prof.message_s(600, apart=True, devices=8) == pytest.approx(1.5e-3)
    # across nodes: the same-node message plus the link transfer (600 B at 1 MB/s)
    assert prof.message_s(600, apart=True, devices=16) == pytest.approx(1.5e-3 + 6e-4)
    with pytest.raises(ValueError, match="one of"):
        MessageProfile((1.0,), {"far_away": (1.0,)})
    with pytest.raises(ValueError, match="one time per payload size"):
        MessageProfile((1.0, 2.0), {"same_node": (1.0,)})


def test_profile_json_round_trip_keeps_messages_and_reads_old_files():
    prof = _with_hop(_pipelining_profile(), 2e-3)
    back = WorkflowProfile.from_json(prof.to_json())
    assert back.messages == prof.messages and back.components == prof.components
    old = json.loads(prof.to_json())
    del old["messages"], old["devices_per_node"]  # a profile cached before messages existed
    assert WorkflowProfile.from_json(json.dumps(old)).messages is None


def test_prediction_grows_by_exactly_the_messages_sent():
    """Collocated: per round each of m micro-batches sends its observations and gets its
    action chunks (2 messages), and the trajectories go to the actor once."""
    cycle, actor = _graph().stages()
    base = _pipelining_profile()
    for m in (1, 2, 4):
        plan = Temporal(Cycle(cycle, 1, False, m), Leaf(actor, 1, 64), True)
        times = [CostModel(_with_hop(base, h)).iteration_time(plan) for h in (0.0, 1e-3, 5e-3)]
        assert times[0] < times[1] < times[2]
        assert times[2] - times[1] == pytest.approx((T * m * 2 + 1) * 4e-3)
    # disaggregated: the same messages between disjoint devices
    plan = Spatial(Cycle(cycle, 2, True, 1), Leaf(actor, 1, 64), 1)
    a, b = (CostModel(_with_hop(base, h)).iteration_time(plan) for h in (1e-3, 3e-3))
    assert b - a == pytest.approx((T * 2 + 1) * 2e-3)


def test_plan_ranking_changes_when_messages_get_expensive():
    graph, base = _graph(), _pipelining_profile()
    cheap = search(graph, _with_hop(base, 1e-5), 2)
    dear = search(graph, _with_hop(base, 1e-2), 2)
    # cheap messages: 8 micro-batches keep env and rollout busy; dear: each one costs 2
    # messages per round, so fewer micro-batches win
    assert granularity(cheap.best.plan)["pipeline_stages"] == 8
    assert granularity(dear.best.plan)["pipeline_stages"] == 2
    cycle, actor = graph.stages()
    p8, p2 = (Temporal(Cycle(cycle, 2, True, m), Leaf(actor, 2, 320), False) for m in (8, 2))
    cm_cheap, cm_dear = CostModel(_with_hop(base, 1e-5)), CostModel(_with_hop(base, 1e-2))
    assert cm_cheap.iteration_time(p8) < cm_cheap.iteration_time(p2)
    assert cm_dear.iteration_time(p8) > cm_dear.iteration_time(p2)


@pytest.mark.parametrize("split,m", [(False, 1), (False, 4), (True, 1), (True, 4)])
def test_simulator_agrees_with_the_message_term(split, m):
    cycle, actor = _graph().stages()
    prof = _with_hop(_pipelining_profile(), 3e-3)
    inner = Cycle(cycle, 2 if split else 1, split, m)
    for plan in (Temporal(inner, Leaf(actor, inner.devices, 64), False),
                 Spatial(inner, Leaf(actor, 1, 64), 2)):
        assert CostModel(prof).iteration_time(plan) == pytest.approx(
            simulate(plan, prof).iteration_s, rel=1e-9)


def test_plan_for_placement_follows_the_shipped_placements():
    from rlinf_embodied.config import load_config
    from rlinf_embodied.runners.setup import resolve_placement
    from rlinf_embodied.runtime.placement import PlacementPlan
    from rlinf_embodied.scheduler.auto import message_sizes, plan_for_placement

    cfg = load_config("configs/maniskill_pushcube_ppo_mlp.yaml")
    plans = {
        name: plan_for_placement(cfg, PlacementPlan.from_yaml(resolve_placement(name)), nd)
        for name, nd in (("collocated", 1), ("disaggregated", 3), ("hybrid", 2))
    }
    col, dis, hyb = plans["collocated"], plans["disaggregated"], plans["hybrid"]
    assert isinstance(col, Temporal) and col.offload and not col.left.split
    assert (col.left.devices, col.right.devices, col.right.batch) == (1, 1, 100)  # 800 / 8
    assert isinstance(dis, Spatial) and dis.left.split and dis.chunks == 1
    assert (dis.left.devices, dis.right.devices) == (2, 1)
    assert isinstance(hyb, Temporal) and hyb.left.split and hyb.right.devices == 2
    assert hyb.right.batch == 50  # each of 2 actor ranks trains 400 samples in 8 minibatches
    sizes = message_sizes(cfg)
    assert sizes == sorted(sizes) and len(sizes) == 9  # obs + reply for 4 stream sizes, trajectory
