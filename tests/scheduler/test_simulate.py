"""The cost model's closed forms agree with the discrete-event simulator.

Stated tolerance: 5% relative on random profiles, work sizes and every plan the planner
ranks (the two differ only where items do not split evenly into chunks, micro-batches and
ranks: the cost model uses continuous fractions, the simulator integer shares). Exact (1e-9)
when everything divides.
"""

import random

import pytest

from rlinf_embodied.scheduler.cost_model import CostModel, Cycle, Leaf, Spatial, Temporal
from rlinf_embodied.scheduler.graph import chain_graph, embodied_graph
from rlinf_embodied.scheduler.planner import search
from rlinf_embodied.scheduler.profiles import GiB, WorkflowProfile, affine_profile
from rlinf_embodied.scheduler.simulate import simulate

TOLERANCE = 0.05


def _random_profile(rng: random.Random, names) -> WorkflowProfile:
    comps = {}
    for n in names:
        sizes = tuple(sorted(rng.sample(range(1, 512), 4)))
        base = affine_profile(n, rng.uniform(0, 0.05), rng.uniform(1e-5, 1e-2), rng.uniform(0, 20) * GiB,
                              rng.uniform(0, 0.1) * GiB, batch_sizes=sizes,
                              onload_s=rng.uniform(0, 1), offload_s=rng.uniform(0, 1),
                              dp_efficiency=rng.uniform(0.9, 1.0))
        # non-linear times: perturb each point, keep positive
        comps[n] = base.__class__(**{**base.__dict__, "time_s": tuple(t * rng.uniform(0.7, 1.3) for t in base.time_s)})
    return WorkflowProfile(comps, device_memory_bytes=1e15, weight_sync_s=rng.uniform(0, 0.5),
                           link_bandwidth_Bps=rng.uniform(1e8, 1e10), link_latency_s=1e-4)


@pytest.mark.parametrize("seed", range(12))
def test_cost_model_agrees_with_simulator_on_random_profiles(seed):
    rng = random.Random(seed)
    if seed % 2:
        graph = embodied_graph(rng.randint(3, 300), rng.randint(1, 20), rng.randint(1, 3),
                               obs_bytes=rng.uniform(0, 1e5), action_bytes=32, sample_bytes=1e3)
    else:
        graph = chain_graph({"a": rng.randint(5, 900), "b": rng.randint(5, 900), "c": rng.randint(5, 900)}, 1e3)
    prof = _random_profile(rng, [n.name for n in graph.nodes])
    result = search(graph, prof, rng.choice([2, 3, 4, 8, 12]))
    cm = CostModel(prof)
    for cand in result.alternatives:
        sim = simulate(cand.plan, prof).iteration_s
        assert cm.iteration_time(cand.plan) == pytest.approx(sim, rel=TOLERANCE), cand.plan


def test_exact_when_everything_divides():
    graph = embodied_graph(64, 10)
    cycle, actor = graph.stages()
    comps = {n: affine_profile(n, 0.01, 1e-3, onload_s=0.2, offload_s=0.1) for n in ("env", "rollout", "actor")}
    prof = WorkflowProfile(comps, device_memory_bytes=1e12, weight_sync_s=0.3)
    cm = CostModel(prof)
    plans = [
        Temporal(Cycle(cycle, 4, True, 4), Leaf(actor, 4, 32), True),
        Temporal(Cycle(cycle, 4, False, 2), Leaf(actor, 4, 32), False),
        Spatial(Cycle(cycle, 2, True, 2), Leaf(actor, 2, 16), 4),
    ]
    for p in plans:
        assert cm.iteration_time(p) == pytest.approx(simulate(p, prof).iteration_s, rel=1e-9)


def test_jitter_changes_time_but_stays_close():
    graph = embodied_graph(64, 10)
    cycle, actor = graph.stages()
    comps = {n: affine_profile(n, 0.01, 1e-3) for n in ("env", "rollout", "actor")}
    prof = WorkflowProfile(comps, device_memory_bytes=1e12)
    plan = Temporal(Cycle(cycle, 2, True, 2), Leaf(actor, 2, 64), False)
    a, b = simulate(plan, prof).iteration_s, simulate(plan, prof, jitter=0.1, seed=1).iteration_s
    assert a != b and b == pytest.approx(a, rel=0.15)
    with pytest.raises(ValueError, match="jitter"):
        simulate(plan, prof, jitter=1.5)
