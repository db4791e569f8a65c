"""Real multi-node Ray on this machine (a head raylet + a second raylet with its own resources):
placement across nodes, and losing a node in the middle of a rollout.

The scenarios run in a fresh process with their own cluster, so the session's shared Ray
(tests/conftest.py) is never touched. The main-job scenarios (tests/runtime/multinode_scenarios.py)
are slow: three raylets (head, a reserved and a preemptible worker node) and three short runs of
the main job (about 6 minutes on a loaded 2-core machine). The default-suite one (tests/elastic/multinode_resume_scenario.py, about 35 s) kills
the second node under a resumable shard and checks where each piece ran.
"""

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlinf_embodied.elastic.multinode import LocalMultiNodeCluster  # noqa: F401 - importable

SCRIPT = Path(__file__).with_name("multinode_scenarios.py")
RESUME = Path(__file__).parents[1] / "elastic" / "multinode_resume_scenario.py"


def test_node_loss_mid_shard_resumes_from_the_last_reported_state_on_the_head():
    proc = subprocess.run([sys.executable, str(RESUME)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    head, second, piece, steps = out["head"], out["second"], out["piece"], out["steps"]
    assert head != second and out["killed_nodes"] == [second]
    assert len(out["live_worker_nodes"]) == 1 and out["live_worker_nodes"] != [second]  # it came back
    it0, it1 = out["iterations"]
    for it in (it0, it1):
        assert it["results"] == it["expected"]  # every shard once, exact
        for log in it["logs"]:  # each reported piece once, in order: no position re-run
            assert [p for _, p in log] == list(range(0, steps, piece))
    assert it0["metrics"]["elastic/preemptions"] == 1.0
    # the killed worker's shard: its first pieces on the second node, then the head went on
    # from the last reported position (not from 0)
    moved = [log for log in it0["logs"] if {n for n, _ in log} == {second, head}]
    assert len(moved) == 1
    nodes = [n for n, _ in moved[0]]
    cut = nodes.index(head)
    assert cut >= 1 and set(nodes[:cut]) == {second} and set(nodes[cut:]) == {head}
    new = out["live_worker_nodes"][0]  # the returned node (may join within iteration 0)
    assert {n for log in it0["logs"] for n, _ in log} <= {head, second, new}
    # iteration 1: the returned node's new worker served shards again (placement across nodes)
    assert {n for log in it1["logs"] for n, _ in log} == {head, new}
    assert it1["metrics"]["elastic/workers_preemptible"] == 1.0


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    root = tmp_path_factory.mktemp("multinode")
    proc = subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_main_job_trains_with_env_workers_on_the_reserved_worker_node(scenarios):
    p = scenarios["placed"]
    assert p["env_nodes"] == [scenarios["reserved_worker"]]  # not the preemptible node
    assert p["rollout_nodes"] == p["actor_nodes"] == [scenarios["head"]]
    # 4 envs x 2 iterations x 19 counted steps (20 queries, one of them the autoreset step
    # after each 10-step episode)
    assert p["iterations"] == 2 and p["env_steps"] == 2 * 4 * 19


def _episode_keys(record):
    return [(e["env"], e["ordinal"]) for e in record["episodes"]]


@pytest.mark.slow
def test_killing_the_node_mid_rollout_loses_and_duplicates_nothing(scenarios):
    killed, clean = scenarios["elastic"]["killed"], scenarios["elastic"]["clean"]
    assert killed["iterations"] == clean["iterations"] == 2
    assert scenarios["killed_nodes"] == [scenarios["second"]]
    assert len(scenarios["live_worker_nodes"]) == 1  # the node came back (a new raylet)
    assert scenarios["live_worker_nodes"] != scenarios["killed_nodes"]
    it0 = killed["records"][0]
    events = collections.Counter(e["event"] for e in it0["events"])
    assert events["preempt"] == 1
    lost = [e for e in it0["events"] if e["event"] == "lost" and e["shard"] is not None]
    assert lost, "the kill landed while a shard was in flight"
    for rec_k, rec_c in zip(killed["records"], clean["records"], strict=True):
        assert [s["shard"] for s in rec_k["shards"]] == [0, 1, 2, 3]
        keys = _episode_keys(rec_k)
        assert len(keys) == len(set(keys))  # nothing counted twice
        assert rec_k["episodes"] == rec_c["episodes"]  # nothing lost, re-runs identical
        assert {e["env"] for e in rec_k["episodes"]} == {0, 1, 2, 3}
    # the re-run shards ran on surviving capacity; iteration 1 used the returned node again
    assert any(s["attempts"] == 2 for s in it0["shards"])
    assert killed["metrics"][1]["elastic/workers_preemptible"] == 2.0  # back on the new node
    assert any(s["kind"] == "preemptible" for s in killed["records"][1]["shards"])
    for mk, mc in zip(killed["metrics"], clean["metrics"], strict=True):
        assert {k: v for k, v in mk.items() if k.startswith("train/")} == \
            {k: v for k, v in mc.items() if k.startswith("train/")}
