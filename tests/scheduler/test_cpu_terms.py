"""CPU terms of the cost model: the real loop's costs, alternating members on shared cores, the
core-seconds bound of stages that compute at once, and their derivation from a measured loop."""

import dataclasses
import math
from types import SimpleNamespace

import pytest

from rlinf_embodied.scheduler.auto import cpu_cores, with_cpu_terms
from rlinf_embodied.scheduler.cost_model import CostModel, Cycle, Leaf, Spatial, Temporal
from rlinf_embodied.scheduler.graph import chain_graph, embodied_graph
from rlinf_embodied.scheduler.profiles import (
    ComponentProfile,
    MessageProfile,
    WorkflowProfile,
    affine_profile,
)
from rlinf_embodied.scheduler.simulate import simulate

MS = 1e-3


def _profile(cores: int, **extra) -> WorkflowProfile:
    """env 10 ms + 1 ms/env (2 threads per rank), rollout 2 ms + 0.5 ms/env and actor 1 ms per
    sample (torch threads: the node's cores), 0.2 ms per message."""
    comps = {
        "env": affine_profile("env", 10 * MS, 1 * MS, cpu_threads=2.0, **extra.get("env", {})),
        "rollout": affine_profile("rollout", 2 * MS, 0.5 * MS, cpu_threads=2.0,
                                  cpu_threads_per_rank=False, **extra.get("rollout", {})),
        "actor": affine_profile("actor", 0.0, 1 * MS, cpu_threads=2.0, cpu_threads_per_rank=False,
                                **extra.get("actor", {})),
    }
    msgs = MessageProfile((0.0,), {"same_node": (0.2 * MS,)})
    return WorkflowProfile(comps, device_memory_bytes=1e12, messages=msgs, cpu_cores=cores)


def test_leaf_pays_loop_per_round_and_per_doubling_of_ranks():
    _, actor = embodied_graph(16, 50, update_epochs=4, num_minibatches=4).stages()  # 16 x 200
    prof = _profile(2, actor={"loop_s": 3 * MS, "loop_dp_s": 5 * MS})
    cm = CostModel(prof)
    # one rank: 16 rounds of (200 samples x 1 ms + 3 ms)
    assert cm.time(Leaf(actor, 1, 200)) == pytest.approx(16 * (0.200 + 0.003))
    # two ranks: 100 samples each, plus 5 ms of collectives per round
    assert cm.time(Leaf(actor, 2, 100)) == pytest.approx(16 * (0.100 + 0.003 + 0.005))
    assert cm.time(Leaf(actor, 4, 50)) == pytest.approx(16 * (0.050 + 0.003 + 2 * 0.005))


def test_alternating_ring_pays_ring_cost_on_shared_cores_only():
    cycle, _ = embodied_graph(16, 50).stages()
    extra = {"env": {"ring_s": 8 * MS, "loop_s": 1 * MS}, "rollout": {"ring_s": 0.5 * MS}}
    shared = CostModel(_profile(2, **extra))
    gpu = CostModel(_profile(0, **extra))
    env, roll, msg = 0.010 + 0.016, 0.002 + 0.008, 0.0002
    # CPU slots: every call also waits out the partner's spinning threads
    want = 50 * (env + 0.008 + 0.001 + msg + roll + 0.0005 + msg)
    assert shared.time(Cycle(cycle, 1, False, 1)) == pytest.approx(want)
    assert shared.time(Cycle(cycle, 2, True, 1)) == pytest.approx(want)
    # accelerators: no ring cost (the loop cost stays: it is not contention)
    assert gpu.time(Cycle(cycle, 1, False, 1)) == pytest.approx(50 * (env + 0.001 + roll + 2 * msg))
    # the ring cost is never more than the call it slows down
    tiny = CostModel(_profile(2, env={"ring_s": 1.0}))
    assert tiny.member_times(Cycle(cycle, 1, False, 1), 4)[0] == pytest.approx(2 * 0.014 + msg)


def test_pipelined_ring_is_bound_by_core_seconds():
    cycle, _ = embodied_graph(16, 50).stages()
    plan = Cycle(cycle, 2, True, 2)  # 2 micro-batches of 8, env on slot 0, rollout on slot 1
    env8, roll8, msg = 0.010 + 0.008, 0.002 + 0.004, 0.0002
    e = [env8 + msg, roll8 + msg]  # one micro-batch each (no ring cost: the partner computes)
    busy = [2 * e[0], 2 * e[1]]
    # accelerators: the bottleneck (env) never idles
    assert CostModel(_profile(0)).time(plan) == pytest.approx(50 * busy[0] + e[1])
    # 2 shared cores, both members want 2 threads: no faster than all their work in turn
    assert CostModel(_profile(2)).time(plan) == pytest.approx(50 * (busy[0] + busy[1]) + e[1])
    # 4 cores: each member gets its 2 threads at once, so the bound is half the core-seconds
    four = CostModel(_profile(4)).time(plan)
    assert four == pytest.approx(50 * max(busy[0], (busy[0] + busy[1]) / 2) + e[1])
    assert four == pytest.approx(50 * busy[0] + e[1])


def test_chunked_spatial_pipeline_is_bound_by_core_seconds():
    graph = chain_graph({"pre": 64, "train": 64})
    a, b = graph.stages()
    comps = {
        "pre": affine_profile("pre", 0.0, 1 * MS, cpu_threads=1.0),
        "train": affine_profile("train", 0.0, 2 * MS, cpu_threads=2.0, cpu_threads_per_rank=False),
    }
    plan = Spatial(Leaf(a, 1, 64), Leaf(b, 1, 64), chunks=4)
    c = [0.016, 0.032]  # 16 items per chunk
    gpu = WorkflowProfile(comps, device_memory_bytes=1e12)
    assert CostModel(gpu).time(plan) == pytest.approx(sum(c) + 3 * max(c))
    # 2 cores: pre's 1 thread and train's 2 threads would need 3
    cpu = dataclasses.replace(gpu, cpu_cores=2)
    assert CostModel(cpu).time(plan) == pytest.approx(sum(c) + 3 * (c[0] * 0.5 + c[1] * 1.0))
    # one chunk: the stages never overlap, nothing to bound
    one = Spatial(Leaf(a, 1, 64), Leaf(b, 1, 64), chunks=1)
    assert CostModel(cpu).time(one) == pytest.approx(CostModel(gpu).time(one))


def test_simulator_charges_ring_and_loop_like_the_cost_model():
    cycle, actor = embodied_graph(16, 50, update_epochs=2, num_minibatches=2).stages()
    prof = _profile(2, env={"ring_s": 6 * MS, "loop_s": 1 * MS}, rollout={"ring_s": 1 * MS},
                    actor={"loop_s": 2 * MS, "loop_dp_s": 4 * MS})
    for plan in (Temporal(Cycle(cycle, 1, False, 1), Leaf(actor, 1, 400), False),
                 Temporal(Cycle(cycle, 2, True, 1), Leaf(actor, 2, 200), False)):
        assert simulate(plan, prof).iteration_s == pytest.approx(CostModel(prof).iteration_time(plan))


def _cfg(num_processes=2, micro_batch_size=None):
    return SimpleNamespace(
        env=SimpleNamespace(num_envs=16, num_processes=num_processes, obs_mode="state", type="maniskill"),
        policy=SimpleNamespace(action_chunk=1),
        trainer=SimpleNamespace(rollout_steps=50, update_epochs=4, num_minibatches=4,
                                micro_batch_size=micro_batch_size),
    )


def test_with_cpu_terms_derives_ring_and_loop_costs_from_the_measured_loop():
    base = _profile(0)
    msg = 0.0002
    # measured loop: env steps 36 ms per round (26 ms alone), forwards 12 ms per request
    # (10 ms alone), 50 ms of the rollout per round in all; the update takes 16 x 210 ms
    loop = {"env_s": 50 * 0.036, "forward_s": 51 * 0.012, "requests": 51,
            "rollout_s": 50 * 0.050, "train_s": 16 * 0.210 + msg}
    loop_dp = {"train_s": 16 * 0.130 + msg / 2}
    prof = with_cpu_terms(base, _cfg(), 2, loop, loop_dp, 2)
    env, roll, actor = prof["env"], prof["rollout"], prof["actor"]
    assert prof.cpu_cores == 2
    assert (env.cpu_threads, env.cpu_threads_per_rank) == (2.0, True)
    assert (roll.cpu_threads, roll.cpu_threads_per_rank) == (2.0, False)
    assert env.ring_s == pytest.approx(0.010) and roll.ring_s == pytest.approx(0.002)
    assert env.loop_s == pytest.approx(0.050 - 0.036 - 0.012 - 2 * msg)
    assert actor.loop_s == pytest.approx(0.010)  # 210 ms per step, 200 of them forward + backward
    assert actor.loop_dp_s == pytest.approx(0.130 - 0.100 - 0.010)  # at 2 ranks: 100 samples each
    # the model now predicts the loop it was measured on (one rank each, one device slot)
    cycle, act = embodied_graph(16, 50, 4, 4).stages()
    cm = CostModel(prof)
    assert cm.time(Cycle(cycle, 1, False, 1)) == pytest.approx(loop["rollout_s"])
    assert cm.time(Leaf(act, 1, 200)) + prof.message_s(act.in_bytes, False) == pytest.approx(
        loop["train_s"])
    # on accelerators the ring costs go to loop_s (no core sharing to charge them to)
    gpu = with_cpu_terms(base, _cfg(), 0, loop)
    assert gpu.cpu_cores == 0 and gpu["env"].ring_s == 0.0 and gpu["rollout"].ring_s == 0.0
    assert gpu["env"].loop_s == pytest.approx(0.050 - 0.026 - 0.010 - 2 * msg)
    assert CostModel(gpu).time(Cycle(cycle, 1, False, 1)) == pytest.approx(loop["rollout_s"])
    # a dp probe slower than the real loop's steps: the loop's steps set dp_efficiency
    slow = dataclasses.replace(base, components={
        **base.components, "actor": dataclasses.replace(base["actor"], dp_efficiency=0.5)})
    fit = with_cpu_terms(slow, _cfg(), 2, loop, {"train_s": 16 * 0.150 + msg / 2}, 2)
    assert fit["actor"].loop_dp_s == 0.0
    assert fit["actor"].dp_efficiency == pytest.approx(0.100 / 0.140)
    assert CostModel(fit).time(Leaf(act, 2, 100)) == pytest.approx(16 * 0.150)
    # an env stepping in-process keeps one thread busy
    assert with_cpu_terms(base, _cfg(num_processes=0), 2, None)["env"].cpu_threads == 1.0


def test_cpu_cores_counts_the_node_of_cpu_slots_and_zero_for_accelerators():
    def cluster(kind, cpus):
        dev = SimpleNamespace(kind=kind, node_id="n0")
        return SimpleNamespace(device=lambda i: dev, node_cpus=lambda node: cpus)

    import os

    mine = len(os.sched_getaffinity(0))
    assert cpu_cores(cluster("cpu", 1)) == 1
    assert cpu_cores(cluster("cpu", 10_000)) == mine  # never more than this process may use
    assert cpu_cores(cluster("gpu", 64)) == 0


def test_negative_cpu_terms_are_rejected_and_old_profiles_load():
    with pytest.raises(ValueError, match="ring_s"):
        affine_profile("env", 0.01, 0.001, ring_s=-1.0)
    prof = _profile(2, env={"ring_s": 0.004, "loop_s": 0.001})
    back = WorkflowProfile.from_json(prof.to_json())
    assert back == prof and back["env"].ring_s == 0.004 and back.cpu_cores == 2
    # a profile cached before the CPU terms existed loads with all of them 0
    import json

    d = json.loads(prof.to_json())
    del d["cpu_cores"]
    for c in d["components"].values():
        for k in ("cpu_threads", "cpu_threads_per_rank", "ring_s", "loop_s", "loop_dp_s"):
            del c[k]
    old = WorkflowProfile.from_json(json.dumps(d))
    assert old.cpu_cores == 0 and old["env"].loop_time(4) == 0.0
    assert isinstance(old["env"], ComponentProfile) and math.isclose(old["env"].time(16), 0.026)
