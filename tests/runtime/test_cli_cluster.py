"""A cluster made with the ``ray`` CLI as docs/elastic.md tells a user (``ray start --head``,
``ray start --address=...`` with Ray's token authentication), here three raylets on one machine:
the head (reserved: driver, placed groups, reserved elastic worker), a reserved worker node
(actor rank 1) and a preemptible node (``--resources='{"preemptible": 1}'``: elastic workers
only). Short elastic jobs run on it through ``rlinf-embodied train cluster.address=...``:

- ``doctor cluster.address=...`` attaches and lists the nodes; without the token it says how
  to give it;
- the reserved worker node's raylet is killed mid-iteration: the run restarts its placed groups
  from the last checkpoint once the node is back and finishes, with the weights of a run
  stopped and resumed there by hand;
- the preemptible node's raylet is killed mid-iteration: the run finishes every iteration,
  every shard's episodes recorded exactly once, training equal to the run without the kill.

Slow (a few minutes on a loaded 2-core machine); ``.ci/run`` runs it. Every Ray process it
starts is killed by pid at the end (tests/runtime/ray_cli_cluster.py), never with ``ray stop``.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_train import assert_same, weights
from tests.runtime.ray_cli_cluster import RayCliCluster

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("rlinf-embodied"))
ITERATIONS = 4
JOB = """
run: {{name: cli_cluster, seed: 7, dir: {run_dir}}}
cluster: {{address: "{address}", num_cpu_devices: 1}}
placement: {placement}
env: {{type: gym, env_id: toy/Countdown-v0, num_envs: 4, max_episode_steps: 5,
      kwargs: {{length: 5, step_sleep_s: 0.1}}}}
policy: {{type: mlp, hidden_sizes: [16]}}
algorithm: {{gamma: 0.9, gae_lambda: 0.95}}
trainer: {{iterations: {iterations}, rollout_steps: 8, update_epochs: 1, num_minibatches: 2,
          eval_every: 0, save_every: 2, keep_checkpoints: 0, restart_wait_s: 240}}
logging: {{tensorboard: false, console: true}}
elastic: {{enabled: true, reserved_workers: 1, preemptible_workers: 2, shard_envs: 1,
          wait_for_joins: true}}
"""
# rank 0 of every group on the head (device 0); actor rank 1 on the reserved worker node
PLACEMENT = ("placement: {context_switch: true, groups: {env: {devices: '0'}, "
             "rollout: {devices: '0'}, actor: {devices: '0-1'}}}\n")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = RayCliCluster(head_cpus=2)
    try:
        c.add_node(1, name="reserved")
        c.add_node(1, {"preemptible": 1}, name="spot")
        yield c
    finally:
        c.shutdown()
    assert not c.pids(), "Ray processes of the test cluster survived its shutdown"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("cli_cluster")


def job(root: Path, cluster: RayCliCluster, name: str, iterations: int = ITERATIONS) -> Path:
    placement = root / "placement.yaml"
    placement.write_text(PLACEMENT)
    path = root / f"{name}.yaml"
    path.write_text(JOB.format(run_dir=root / name, address=cluster.address, placement=placement,
                               iterations=iterations))
    return path


def rows(run_dir: Path):
    p = run_dir / "metrics.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def last_per_iteration(run_dir: Path) -> dict:
    """Iteration -> its last metrics row (iterations run again after a restart replace theirs)."""
    return {r["iteration"]: r for r in rows(run_dir) if "event" not in r}


def train(cluster, args, log: Path, when=None, action=None, timeout=900):
    """Run ``rlinf-embodied train ARGS`` as a user would (the cluster's token in the
    environment); once ``when()`` holds, call ``action()`` (the kill) while it runs."""
    with open(log, "w") as out:
        proc = subprocess.Popen([CLI, "train", *args], cwd=ROOT, env=cluster.env, stdout=out,
                                stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + timeout
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                if when is not None and when():
                    action()
                    when = None
                time.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
                pytest.fail(f"train did not finish within {timeout} s:\n{log.read_text()[-3000:]}")
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log.read_text()
    assert proc.returncode == 0, text[-4000:]
    return text


@pytest.fixture(scope="module")
def clean(cluster, root):
    run_dir = root / "clean"
    text = train(cluster, [str(job(root, cluster, "clean"))], root / "clean.log")
    return run_dir, text


@pytest.mark.slow
def test_doctor_and_plan_list_reserved_and_preemptible_nodes(cluster, root):
    args = [CLI, "doctor", f"cluster.address={cluster.address}", "--json"]
    ok = subprocess.run(args, cwd=ROOT, env=cluster.env, capture_output=True, text=True, timeout=300)
    check = next(c for c in json.loads(ok.stdout)["checks"] if c["name"] == "cluster")
    assert check["status"] == "ok", check
    lines = check["detail"].splitlines()
    assert lines[0].startswith(f"attached to {cluster.address}: 3 node(s) alive (2 reserved")
    assert sum(" reserved " in x for x in lines[1:]) == 2
    assert sum(" preemptible " in x and "preemptible 1" in x for x in lines[1:]) == 1
    no_token = {k: v for k, v in cluster.env.items() if not k.startswith("RAY_AUTH")}
    bad = subprocess.run(args, cwd=ROOT, env=no_token, capture_output=True, text=True, timeout=300)
    check = next(c for c in json.loads(bad.stdout)["checks"] if c["name"] == "cluster")
    assert bad.returncode == 1 and check["status"] == "fail"
    assert "RAY_AUTH_MODE=token" in check["fix"] and "auth_token" in check["fix"]
    plan = subprocess.run([CLI, "plan", str(job(root, cluster, "plan"))], cwd=ROOT, env=cluster.env,
                          capture_output=True, text=True, timeout=300)
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert f"Nodes ({cluster.address}): 2 devices on 2 reserved node(s), 1 preemptible node(s)" in plan.stdout
    assert plan.stdout.count("  reserved ") == 2 and "Devices: 2" in plan.stdout
    assert "no placed groups, elastic workers only" in plan.stdout


@pytest.mark.slow
def test_clean_run_places_nothing_on_the_preemptible_node(clean):
    run_dir, text = clean
    assert "cluster: 2 devices on 2 reserved node(s), 1 preemptible node(s)" in text
    assert "preemptible  " in text and "no placed groups, elastic workers only" in text
    assert len(last_per_iteration(run_dir)) == ITERATIONS
    shards = [s for p in sorted((run_dir / "elastic").glob("iter_*.json"))
              for s in json.loads(p.read_text())["shards"]]
    assert {s["kind"] for s in shards} == {"reserved", "preemptible"}  # the pool used both


@pytest.mark.slow
def test_reserved_node_loss_restarts_from_the_checkpoint_like_a_resume_by_hand(cluster, root, clean):
    run_dir = root / "reserved_kill"
    killed = {}

    def kill():  # mid-iteration 3: after checkpoint 2, then the node comes back
        time.sleep(0.5)
        # the whole node (raylet and workers, as a crashed machine): with the raylet alone,
        # actor rank 1's worker outlived it for seconds and answered iterations 3 and 4 before
        # Ray noticed, so the run ended with no restart (seen once in CI)
        killed["t"] = time.monotonic()
        cluster.kill_node("reserved")
        cluster.restore_node("reserved")

    text = train(cluster, [str(job(root, cluster, "reserved_kill"))], root / "reserved_kill.log",
                 when=lambda: len(rows(run_dir)) >= 2 and (run_dir / "checkpoints" / "iter_000002").is_dir(),
                 action=kill)
    assert killed, "the kill did not happen"
    assert "restart 1/3: lost actor[rank 1] on " in text
    assert "restarting the placed groups from checkpoint iter_000002 (iteration 2)" in text
    assert "done: 4 iterations" in text and "1 restart(s)" in text
    (event,) = [r for r in rows(run_dir) if r.get("event") == "restart"]
    assert event["restart/from_iteration"] == 2 and event["restart/count"] == 1

    # by hand: the clean run stopped at its checkpoint of iteration 2, then `train --resume`
    by_hand = root / "by_hand"
    shutil.copytree(clean[0], by_hand)
    for later in sorted((by_hand / "checkpoints").glob("iter_*"))[1:]:
        shutil.rmtree(later)
    (by_hand / "checkpoints" / "latest").write_text("iter_000002\n")
    train(cluster, ["--resume", str(by_hand)], root / "by_hand.log")
    assert_same(weights(run_dir), weights(by_hand))
    assert_same(weights(run_dir), weights(clean[0]))


@pytest.mark.slow
def test_preemptible_node_loss_loses_and_repeats_no_episode(cluster, root, clean):
    run_dir = root / "spot_kill"
    killed = {}

    def kill():  # mid-iteration 2
        time.sleep(0.3)
        killed["wall"] = time.time()
        killed["t"] = cluster.kill_raylet("spot")

    text = train(cluster, [str(job(root, cluster, "spot_kill"))], root / "spot_kill.log",
                 when=lambda: len(rows(run_dir)) >= 1, action=kill)
    assert killed and "restart" not in text and "done: 4 iterations" in text
    records = [json.loads(p.read_text()) for p in sorted((run_dir / "elastic").glob("iter_*.json"))]
    clean_records = [json.loads(p.read_text()) for p in sorted((clean[0] / "elastic").glob("iter_*.json"))]
    assert len(records) == len(clean_records) == ITERATIONS
    for rec, ref in zip(records, clean_records, strict=True):
        assert [s["shard"] for s in rec["shards"]] == list(range(rec["num_shards"]))
        keys = [(e["env"], e["ordinal"]) for e in rec["episodes"]]
        assert len(keys) == len(set(keys)) and collections.Counter(e["env"] for e in rec["episodes"])
        assert rec["episodes"] == ref["episodes"]  # nothing lost, nothing twice, re-runs identical
    events = [e for rec in records for e in rec["events"]]
    (lost,) = [e for e in events if e["event"] == "node_lost"]  # found by the driver's probe
    detect = lost["at"] - killed["wall"]
    print(f"preemptible node's raylet killed; the pool knew after {detect:.2f} s")
    assert 0 < detect < 10, detect
    a, b = last_per_iteration(run_dir), last_per_iteration(clean[0])
    for it in a:
        assert {k: v for k, v in a[it].items() if k.startswith("train/")} == \
            {k: v for k, v in b[it].items() if k.startswith("train/")}
    assert_same(weights(run_dir), weights(clean[0]))
    if os.environ.get("RLINF_SHOW_LOGS"):
        print(text)
