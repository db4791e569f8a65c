"""Planner: the chosen mode follows the workload, memory limits hold, search is fast."""

import time

import pytest

from rlinf_embodied.runtime.placement import PlacementPlan
from rlinf_embodied.scheduler.cost_model import CostModel, Cycle, Leaf, Temporal
from rlinf_embodied.scheduler.graph import embodied_graph
from rlinf_embodied.scheduler.planner import report_text, search
from rlinf_embodied.scheduler.profiles import GiB, WorkflowProfile, affine_profile
from tests.scheduler import scenarios


def test_temporal_when_balanced_and_memory_heavy():
    graph, prof = scenarios.balanced_memory_heavy()
    r = search(graph, prof, 8)
    assert r.best.mode == "temporal"
    assert r.placement()["groups"] == {"rollout": {"devices": "0-7"}, "actor": {"devices": "0-7"}}
    assert r.placement()["context_switch"] is True
    assert r.best.plan.offload  # 60 GiB rollout + 50 GiB actor shard do not fit together
    # the runtime executes what was planned: the placement file says to offload
    from rlinf_embodied.runtime.placement import PlacementPlan

    assert r.placement()["offload"] is True and PlacementPlan.from_dict(r.placement()).offload
    import dataclasses

    roomy = search(graph, dataclasses.replace(prof, device_memory_bytes=1000 * GiB), 8)
    assert roomy.best.mode == "temporal" and not roomy.best.plan.offload
    assert roomy.placement()["offload"] is False and not PlacementPlan.from_dict(roomy.placement()).offload


def test_spatial_when_one_stage_is_light_and_separable():
    graph, prof = scenarios.light_separable()
    r = search(graph, prof, 8)
    assert r.best.mode == "spatial"
    groups = r.placement()["groups"]
    assert groups["pre"]["devices"] == "0" and groups["train"]["devices"] == "1-7"
    assert r.placement()["context_switch"] is False
    assert r.by_mode["temporal"].time_s > r.best.time_s


def test_hybrid_for_the_embodied_pattern():
    graph, prof = scenarios.embodied_maniskill_like()
    r = search(graph, prof, 8)
    assert r.best.mode == "hybrid"
    assert r.placement()["groups"] == {
        "env": {"devices": "0-3"},
        "rollout": {"devices": "4-7"},
        "actor": {"devices": "0-7"},
    }
    # the two other modes do not fit; the report says why
    assert set(r.rejected) == {"temporal", "spatial"}
    assert "GiB" in r.rejected["temporal"]
    PlacementPlan.from_dict(r.placement()).validate(8)  # the runtime accepts the shape


def test_spatial_names_the_devices_it_needs_below_one_per_node():
    """On fewer devices than nodes every split time-shares a device (a hybrid plan): the
    report names how many devices a spatial plan needs, on 1 device and on 2 alike."""
    graph, prof = scenarios.embodied_maniskill_like()
    import dataclasses

    roomy = dataclasses.replace(prof, device_memory_bytes=1000 * GiB)
    for d in (1, 2):
        r = search(graph, roomy, d)
        assert r.rejected["spatial"] == ("a spatial plan gives each of env, rollout, actor its "
                                         f"own devices: at least 3 (got {d})")
    assert "spatial" in search(graph, roomy, 3).by_mode


def test_infeasible_plan_is_rejected_with_reason():
    graph, prof = scenarios.embodied_maniskill_like()
    cm = CostModel(prof)
    env_rollout = graph.stages()[0]
    shared = Temporal(Cycle(env_rollout, 8, False, 1), Leaf(graph.stages()[1], 8, 64), True)
    reason = cm.infeasible_reason(shared)
    assert reason and "GiB available" in reason and "env@0-7" in reason


def test_nothing_fits_raises_with_reasons_per_mode():
    comps = {n: affine_profile(n, 0.0, 1e-3, 100 * GiB) for n in ("env", "rollout", "actor")}
    prof = WorkflowProfile(comps, device_memory_bytes=80 * GiB)
    with pytest.raises(ValueError, match="No execution plan fits on 4 devices"):
        search(embodied_graph(16, 4), prof, 4)


def test_predicted_time_matches_a_hand_computed_temporal_plan():
    graph, prof = scenarios.balanced_memory_heavy()
    r = search(graph, prof, 8)
    # 100 items per device at 0.01 s each, twice; two swaps of 0.05 s each way; one sync
    expected = 1.0 + 1.0 * 0.97 ** 0 + 2 * (0.05 + 0.05) + 0.01
    assert r.best.time_s == pytest.approx(expected)


@pytest.mark.parametrize("devices", [8, 64, 1024])
def test_search_is_fast(devices):
    graph, prof = scenarios.embodied_maniskill_like()
    graph = embodied_graph(num_envs=32 * devices, rollout_steps=50)
    t0 = time.process_time()
    r = search(graph, prof, devices)
    assert time.process_time() - t0 < 1.0
    assert r.best.time_s > 0


def test_report_lists_runner_ups_and_reasons():
    graph, prof = scenarios.embodied_maniskill_like()
    text = report_text(search(graph, prof, 8))
    assert "Chosen: hybrid" in text and "Runner-ups:" in text and "rejected:" in text
    assert "as a config: placement=hybrid" in text
    assert text.endswith("\n") and "Why: hybrid is the fastest runnable plan" in text
